/* test_link: a program linked with libhakmem.a (hakmem_static) must get
 * hakmem's malloc/free, for its own calls and for the C library's internal
 * allocations (strdup, fopen, getline, ...), and hak_version() must be the
 * project's version (HKT_EXPECTED_VERSION, set by tests/CMakeLists.txt from
 * CMakeLists.txt's project()).
 */
#define _GNU_SOURCE
#include "api.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef HKT_EXPECTED_VERSION
#error "HKT_EXPECTED_VERSION (the project's version) is set by tests/CMakeLists.txt"
#endif

/* hakmem's documented classes: 8, then 16 B steps to 128, then 12.5 % steps */
static size_t class_bound(size_t n) {
  if (n <= 8) return 8;
  if (n <= 128) return (n + 15) & ~(size_t)15;
  unsigned b = 63u - (unsigned)__builtin_clzl(n - 1);
  size_t step = (size_t)1 << (b - 3);
  return (n + step - 1) & ~(step - 1);
}

int main(void) {
  const char *v = hak_version();
  CHECK(v != NULL && strcmp(v, HKT_EXPECTED_VERSION) == 0, "hak_version() = %s, expected %s", v ? v : "(null)",
        HKT_EXPECTED_VERSION);
  printf("test_link: hakmem %s linked statically\n", v);

  /* 1. free() of a stack pointer aborts with a hakmem message: proves free
   *    is hakmem's (glibc says "free(): invalid pointer") */
  int errp[2];
  CHECK(pipe(errp) == 0, "pipe failed");
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);
    dup2(errp[1], 2);
    close(errp[0]);
    close(errp[1]);
    char local[64];
    memset(local, 0, sizeof local);
    free(hkt_opaque_ptr(local));
    _exit(0);
  }
  close(errp[1]);
  char buf[4096];
  size_t len = 0;
  ssize_t n;
  while ((n = read(errp[0], buf + len, sizeof buf - 1 - len)) > 0) len += (size_t)n;
  buf[len] = 0;
  close(errp[0]);
  int st;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid failed");
  CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT, "free(stack pointer) did not abort (status 0x%x); stderr: %s", st,
        buf);
  CHECK(strstr(buf, "hakmem") != NULL, "free(stack pointer) aborted without a hakmem message: %s", buf);

  /* 2. malloc's blocks have hakmem's sizes, and hakmem's API agrees */
  for (size_t sz = 1; sz <= 70000; sz = sz * 3 + 1) {
    void *p = malloc(sz);
    CHECK(p != NULL, "malloc(%zu) failed", sz);
    size_t u = malloc_usable_size(p);
    CHECK(u >= sz && u <= class_bound(sz), "malloc(%zu): usable size %zu, not a hakmem class (max %zu)", sz, u,
          class_bound(sz));
    CHECK(hak_malloc_usable_size(p) == u, "hak_malloc_usable_size %zu != malloc_usable_size %zu",
          hak_malloc_usable_size(p), u);
    free(p);
  }
  void *hp = hak_malloc(1000);
  CHECK(hp != NULL, "hak_malloc failed");
  free(hp); /* same allocator: freeing a hak_malloc block with free is fine */
  void *mp = malloc(1000);
  CHECK(mp != NULL, "malloc failed");
  hak_free(mp);

  /* 3. the C library's own allocations go through hakmem too */
  char big[201];
  memset(big, 'a', 200);
  big[200] = 0;
  char *s = strdup(big);
  CHECK(s != NULL && strcmp(s, big) == 0, "strdup failed");
  size_t u = malloc_usable_size(s);
  CHECK(u >= 201 && u <= class_bound(201), "strdup'ed block has usable size %zu: not from hakmem", u);
  free(s);
  FILE *f = fopen("/proc/self/status", "r");
  CHECK(f != NULL, "fopen failed: %s", strerror(errno));
  char *line = NULL;
  size_t cap = 0;
  int lines = 0;
  while (getline(&line, &cap, f) > 0) lines++;
  CHECK(lines > 5, "read only %d lines", lines);
  CHECK(line != NULL && malloc_usable_size(line) >= cap, "getline buffer");
  free(line);
  fclose(f);
  char *msg = NULL;
  CHECK(asprintf(&msg, "%s-%d", "x", 12345) > 0 && strcmp(msg, "x-12345") == 0, "asprintf");
  free(msg);
  printf("test_link: all passed\n");
  return 0;
}
