/* test_oom: running out of address space (RLIMIT_AS) gives NULL and
 * ENOMEM, corrupts no live block, and what the program frees serves its
 * next requests, of another size too: before a mapping fails for good,
 * hakmem gives back what its caches and its arena reservation hold
 * (docs/DESIGN.md, "Regions, purging and the OS").
 *
 * The program re-runs itself (HKTEST_OOM_CHILD=1) with the limit set, so
 * that hakmem initialises under it, as in a program started by `ulimit -v`.
 */
#include "api.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
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
  /* the 20 KB blocks' address space must serve the 4 MiB ones: while the
   * arena kept its reservation, 476 MiB of them fit under this limit (here,
   * 2026-11-25), 92 MiB after 310 MiB of 20 KB blocks under `ulimit -v
   * 400000` (glibc: 376 and 398) */
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

int main(void) {
  if (getenv("HKTEST_OOM_CHILD")) return child();
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
