/* test_oom: running out of address space (RLIMIT_AS) gives NULL and
 * ENOMEM, corrupts no live block, and what the program frees serves its
 * next requests, of another size too: before a mapping fails for good,
 * hakmem gives back what its caches and its arena reservation hold
 * (docs/DESIGN.md, "Hardened mode and tight mode").
 *
 * First, without a limit: a request larger than the machine's memory and
 * swap gets NULL and ENOMEM, as from glibc (hakmem maps no writable memory
 * with MAP_NORESERVE, so the kernel's overcommit check refuses it), leaves a
 * block being resized intact, and costs the arena nothing (its unused
 * reservation is given up only under an address-space limit); a successful
 * realloc leaves errno alone.
 *
 * The program re-runs itself (HKTEST_OOM_CHILD=1) with the limit set, so
 * that hakmem initialises under it, as in a program started by `ulimit -v`.
 */
#include "api.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>

#define MiB ((size_t)1 << 20)
#define LIMIT (768 * MiB)
#define MAX_BLOCKS (1u << 16)

static unsigned char *blocks[MAX_BLOCKS];

/* Allocate size-byte blocks until malloc fails (ENOMEM), check that every
 * block kept its contents, free them all; returns the bytes obtained. */
static size_t fill(size_t size, const char *what) {
  size_t n = 0;
  int err = 0;
  for (; n < MAX_BLOCKS; n++) {
    errno = 0;
    unsigned char *p = (unsigned char *)API(malloc)(size);
    if (p == NULL) {
      err = errno;
      break;
    }
    /* three bytes: the limit is on address space, not on RSS */
    p[0] = p[size / 2] = p[size - 1] = (unsigned char)((n * 7 + 1) & 0xff);
    blocks[n] = p;
  }
  CHECK(n < MAX_BLOCKS, "%s: %u blocks of %zu bytes and no failure under a %zu MiB limit", what, MAX_BLOCKS, size,
        LIMIT / MiB);
  CHECK(err == ENOMEM, "%s: malloc(%zu) returned NULL with errno %d, expected ENOMEM", what, size, err);
  for (size_t i = 0; i < n; i++) {
    unsigned char want = (unsigned char)((i * 7 + 1) & 0xff);
    CHECK(blocks[i][0] == want && blocks[i][size / 2] == want && blocks[i][size - 1] == want,
          "%s: block %zu changed after the failure", what, i);
  }
  for (size_t i = 0; i < n; i++) API(free)(blocks[i]);
  printf("test_oom: %zu blocks of %zu bytes (%zu MiB) before ENOMEM\n", n, size, n * size / MiB);
  return n * size;
}

static int child(void) {
  size_t medium = fill(20000, "20 KB blocks");
  size_t large = fill(4 * MiB, "4 MiB blocks");
  /* the 20 KB blocks' address space must serve the 4 MiB ones: the arena
   * gives up its unused reservation when a mapping fails under the limit,
   * so 4 MiB blocks fill three quarters of the limit at least */
  CHECK(large >= LIMIT / 4 * 3, "after freeing %zu MiB of 20 KB blocks only %zu MiB of 4 MiB blocks fit under %zu MiB",
        medium / MiB, large / MiB, LIMIT / MiB);
  size_t again = fill(20000, "20 KB blocks again");
  CHECK(again * 2 >= medium, "20 KB blocks: %zu MiB at first, %zu MiB after the 4 MiB ones", medium / MiB,
        again / MiB);
  for (int i = 0; i < 1000; i++) { /* and small blocks work as before */
    void *p = API(malloc)(64);
    CHECK(p != NULL, "malloc(64) failed after the out-of-memory rounds");
    API(free)(p);
  }
  return 0;
}

/* Bytes of inaccessible (PROT_NONE) anonymous mappings: the arena's
 * reservation, mostly. */
static size_t reserved_bytes(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  CHECK(f != NULL, "/proc/self/maps: %s", strerror(errno));
  char line[512];
  size_t total = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8];
    int path = 0;
    if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &path) >= 3 && strcmp(perms, "---p") == 0 &&
        (path == 0 || line[path] == '\n' || line[path] == '\0'))
      total += hi - lo;
  }
  fclose(f);
  return total;
}

static int overcommit_mode(void) {
  FILE *f = fopen("/proc/sys/vm/overcommit_memory", "r");
  int mode = -1;
  if (f != NULL) {
    if (fscanf(f, "%d", &mode) != 1) mode = -1;
    fclose(f);
  }
  return mode;
}

static void huge_requests(void) {
  int mode = overcommit_mode();
  if (mode != 0 && mode != 2) { /* 1: the kernel grants any mapping */
    printf("test_oom: overcommit_memory is %d: huge requests not checked\n", mode);
    return;
  }
  struct sysinfo si;
  CHECK(sysinfo(&si) == 0, "sysinfo: %s", strerror(errno));
  size_t machine = ((size_t)si.totalram + (size_t)si.totalswap) * si.mem_unit;
  size_t huge = (machine * 2 + (1u << 30)) & ~(((size_t)1 << 30) - 1); /* a multiple of 1 GiB */
  void *warm = API(malloc)(64); /* the arena exists */
  size_t before = reserved_bytes();
  errno = 0;
  CHECK(API(malloc)(huge) == NULL && errno == ENOMEM, "malloc(%zu GiB): not NULL/ENOMEM (errno %d)", huge >> 30, errno);
  errno = 0;
  CHECK(API(calloc)(1, huge) == NULL && errno == ENOMEM, "calloc(%zu GiB): not NULL/ENOMEM (errno %d)", huge >> 30, errno);
  errno = 0;
  CHECK(API(aligned_alloc)((size_t)1 << 21, huge) == NULL && errno == ENOMEM,
        "aligned_alloc(2 MiB, %zu GiB): not NULL/ENOMEM (errno %d)", huge >> 30, errno);
  size_t sizes[] = {100000, 4 * MiB};
  for (int i = 0; i < 2; i++) {
    unsigned char *p = (unsigned char *)API(malloc)(sizes[i]);
    CHECK(p != NULL, "malloc(%zu)", sizes[i]);
    hkt_fill(p, sizes[i], 77 + i);
    errno = 0;
    CHECK(API(realloc)(p, huge) == NULL && errno == ENOMEM, "realloc(%zu bytes -> %zu GiB): not NULL/ENOMEM (errno %d)",
          sizes[i], huge >> 30, errno);
    CHECK(hkt_verify(p, sizes[i], 77 + i) == HKT_OK, "realloc(%zu bytes -> %zu GiB) failed and changed the block", sizes[i],
          huge >> 30);
    API(free)(p);
  }
  size_t after = reserved_bytes();
  CHECK(after + ((size_t)1 << 30) >= before, "the huge requests cost %zu MiB of reserved address space",
        (before - after) / MiB);
  /* large blocks grown step by step beside others (some moves, some in
   * place): errno as it was before each successful call */
  void *big[8];
  for (int i = 0; i < 8; i++) big[i] = API(malloc)(2 * MiB);
  for (size_t size = 3 * MiB; size <= 24 * MiB; size += 3 * MiB)
    for (int i = 0; i < 8; i++) {
      errno = EDOM;
      void *q = API(realloc)(big[i], size);
      CHECK(q != NULL && errno == EDOM, "realloc of a large block to %zu MiB: %p, errno %d (EDOM before)", size / MiB,
            q, errno);
      big[i] = q;
    }
  for (int i = 0; i < 8; i++) API(free)(big[i]);
  API(free)(warm);
  printf("test_oom: requests of %zu GiB (memory and swap: %zu MiB): NULL, ENOMEM; reserved address space %zu -> %zu MiB\n",
         huge >> 30, machine / MiB, before / MiB, after / MiB);
}

int main(void) {
  if (getenv("HKTEST_OOM_CHILD")) return child();
  huge_requests();
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    struct rlimit lim = {LIMIT, LIMIT};
    if (setrlimit(RLIMIT_AS, &lim) != 0) _exit(126);
    setenv("HKTEST_OOM_CHILD", "1", 1);
    execl("/proc/self/exe", "test_oom", (char *)NULL);
    _exit(127);
  }
  int st;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
  if (WIFSIGNALED(st)) CHECK(0, "child killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exited with status %d", WEXITSTATUS(st));
  return 0;
}
