/* test_big_heap: a heap of small and medium blocks past the arena's 64 GiB
 * (src/region.c: region records in chunks; regions beyond the arena), and
 * the mappings its regions take (commit_slot: guards without mappings of
 * their own, where the kernel has them).
 *
 * 1. 256 MiB of 100,000-byte blocks: where the kernel has MADV_GUARD_INSTALL
 *    (Linux 6.13), the regions add a few mappings in all, not four each
 *    (/proc/self/maps); their guards still fault (test_misuse).
 * 2. 68 GiB of address space in blocks of 960 KiB, each written at its
 *    first byte (about 300 MB resident): every malloc succeeds, and every
 *    block keeps its byte; then all are freed. Skipped where the kernel's
 *    limit on mappings would stop it first (no MADV_GUARD_INSTALL) or an
 *    address-space limit is set. */
#define _GNU_SOURCE
#include "api.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static int mappings(void) {
  FILE *f = fopen("/proc/self/maps", "r");
  CHECK(f != NULL, "cannot read /proc/self/maps");
  char line[512];
  int n = 0;
  while (fgets(line, sizeof line, f)) n++;
  fclose(f);
  return n;
}

/* As hakmem finds out (src/os.c): the advice is taken, and a system call
 * that reads the guard fails (qemu's user mode takes the advice and
 * installs nothing). */
static bool light_guards(void) {
  char *p = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "mmap failed");
  bool ok = madvise(p + 4096, 4096, 102 /* MADV_GUARD_INSTALL */) == 0 &&
            syscall(SYS_faccessat, AT_FDCWD, p + 4096, F_OK, 0) != 0 && errno == EFAULT;
  munmap(p, 3 * 4096);
  return ok;
}

int main(void) {
  bool light = light_guards();
  enum { SMALL_N = (int)(256 * MiB / 100000) };
  static unsigned char *small[SMALL_N];
  int before = mappings();
  for (int i = 0; i < SMALL_N; i++) {
    small[i] = API(malloc)(100000);
    CHECK(small[i] != NULL, "malloc(100000) #%d failed", i);
    small[i][0] = (unsigned char)i;
  }
  int added = mappings() - before;
  printf("test_big_heap: 256 MiB of 100,000 B blocks added %d mappings%s\n", added,
         light ? "" : " (no MADV_GUARD_INSTALL here: four a region)");
  if (light) CHECK(added < 32, "256 MiB of blocks (about 70 regions) added %d mappings", added);
  for (int i = 0; i < SMALL_N; i++) {
    CHECK(small[i][0] == (unsigned char)i, "block %d changed", i);
    API(free)(small[i]);
  }

  struct rlimit as;
  CHECK(getrlimit(RLIMIT_AS, &as) == 0, "getrlimit failed");
  if (!light || as.rlim_cur != RLIM_INFINITY) {
    printf("test_big_heap: 68 GiB skipped (%s)\n", light ? "an address-space limit" : "the limit on mappings would come first");
    return 0;
  }
  const size_t size = 960 << 10;
  const int n = (int)(68 * GiB / size);
  unsigned char **big = API(malloc)((size_t)n * sizeof *big);
  CHECK(big != NULL, "malloc of the table failed");
  for (int i = 0; i < n; i++) {
    big[i] = API(malloc)(size);
    CHECK(big[i] != NULL, "malloc(960 KiB) #%d failed, after %zu GiB", i, (size_t)i * size / GiB);
    big[i][0] = (unsigned char)(i * 7);
  }
  for (int i = 0; i < n; i++) {
    CHECK(big[i][0] == (unsigned char)(i * 7), "block %d changed", i);
    API(free)(big[i]);
  }
  API(free)(big);
  printf("test_big_heap: %d blocks of 960 KiB (68 GiB) allocated, written and freed\n", n);
  return 0;
}
