/* test_purger_start: a purger thread that could not be started (no room
 * for its stack under an address-space limit) is started by a release of
 * memory a purge delay later, once there is room (src/purger.c): a single
 * failure must not leave the process without timed purges for good. */
#include "api.h"

#include <sys/resource.h>
#include <time.h>

#define MiB ((size_t)1 << 20)

/* a number from /proc/self/status ("Threads:", "VmSize:" in KiB) */
static long status_field(const char *name) {
  FILE *f = fopen("/proc/self/status", "r");
  CHECK(f != NULL, "cannot open /proc/self/status");
  char line[256];
  long v = -1;
  size_t n = strlen(name);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, name, n) == 0) v = atol(line + n);
  fclose(f);
  CHECK(v >= 0, "no %s in /proc/self/status", name);
  return v;
}

int main(void) {
  const char *thread = getenv("HAKMEM_PURGE_THREAD");
  if (thread != NULL && atoi(thread) == 0) {
    printf("test_purger_start: HAKMEM_PURGE_THREAD=0, nothing to test\n");
    return 0;
  }
  unsigned char *p = (unsigned char *)API(malloc)(8 * MiB); /* (mapped before the limit) */
  CHECK(p != NULL, "malloc(8 MiB) failed");
  p[0] = 1;
  CHECK(status_field("Threads:") == 1, "a thread was started before any memory was released");

  /* 1. no room for a thread's stack: the free's start of the purger fails */
  struct rlimit old, tight;
  CHECK(getrlimit(RLIMIT_AS, &old) == 0, "getrlimit");
  tight = old;
  tight.rlim_cur = (rlim_t)status_field("VmSize:") * 1024 + 64 * 1024;
  CHECK(setrlimit(RLIMIT_AS, &tight) == 0, "setrlimit");
  API(free)(p); /* cached: the first release of memory, which starts the purger */
  long during = status_field("Threads:");
  CHECK(setrlimit(RLIMIT_AS, &old) == 0, "setrlimit (raise)");
  CHECK(during == 1, "the purger started with no room for its stack (%ld threads)", during);

  /* 2. a purge delay later (HAKMEM_PURGE_DELAY_MS, 100 by default), the next release starts it */
  const char *d = getenv("HAKMEM_PURGE_DELAY_MS");
  long delay = d ? atol(d) : 100;
  struct timespec ts = {(delay + 20) / 1000, ((delay + 20) % 1000) * 1000000L};
  nanosleep(&ts, NULL);
  p = (unsigned char *)API(malloc)(8 * MiB);
  CHECK(p != NULL, "malloc(8 MiB) failed after the limit was raised");
  p[0] = 2;
  API(free)(p);
  /* (the failed pthread_create made the C library take the process for
   * threaded: free() then leaves the start to a malloc slow path, here the
   * first block of a class) */
  void *q = API(malloc)(3000);
  CHECK(q != NULL, "malloc(3000) failed");
  API(free)(q);
  long after = status_field("Threads:");
  printf("test_purger_start: threads %ld with no room for a stack, %ld after the next release\n", during, after);
  CHECK(after == 2, "the purger was not started again after a failed start (%ld threads)", after);
  printf("test_purger_start: all passed\n");
  return 0;
}
