/* test_guards: the guard pages of a small region fault, seen from inside
 * the process (a SIGSEGV handler that jumps back; no fork, so that it runs
 * under qemu's user mode too, where test_misuse cannot). Slab 0 of a region
 * in the arena holds its header, with guards on either side (region.c):
 * the bytes just below slab 1, where the region's first blocks are, must
 * fault on a read and on a write, and so must the last bytes of the region
 * in hardened mode (HK_GUARD). And the first blocks themselves must not. */
#include "api.h"

#include <setjmp.h>
#include <stdbool.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static sigjmp_buf back;
static volatile sig_atomic_t faults;

static void on_segv(int sig) {
  (void)sig;
  faults++;
  siglongjmp(back, 1);
}

/* Whether an access to the byte at p faults. */
static bool access_faults(volatile char *p, bool write) {
  volatile int before = faults;
  if (sigsetjmp(back, 1) == 0) {
    if (write) *p = 0x41;
    else (void)*p;
  }
  return faults != before;
}

/* Whether reading and writing the byte at p fault (both must agree). */
static bool faults_at(volatile char *p) {
  bool read_faults = access_faults(p, false), write_faults = access_faults(p, true);
  CHECK(read_faults == write_faults, "at %p a read %s and a write %s", (void *)p, read_faults ? "faults" : "does not",
        write_faults ? "faults" : "does not");
  return read_faults;
}

int main(void) {
  const char *arena = getenv("HAKMEM_ARENA_MB");
  if (arena != NULL && atol(arena) < 1024) {
    /* (regions mapped outside the arena: their header sits at their base,
     * the guard after it; the write below slab 1 is tested in the arena) */
    printf("test_guards: HAKMEM_ARENA_MB=%s, nothing to test\n", arena);
    return 0;
  }
  const char *secure = getenv("HAKMEM_SECURE");
  bool hardened = secure != NULL && atoi(secure) > 0;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_segv;
  sigemptyset(&sa.sa_mask);
  CHECK(sigaction(SIGSEGV, &sa, NULL) == 0, "sigaction: %s", strerror(errno));
  CHECK(sigaction(SIGBUS, &sa, NULL) == 0, "sigaction: %s", strerror(errno));

  char *first = hkt_block_at_region_offset(hkt_region_blocks_start());
  CHECK(first != NULL, "no 4000-byte block at the start of a region's blocks in 16 MiB of them");
  CHECK(!faults_at(first) && !faults_at(first + 3999), "the block itself faults");
  for (size_t below = 1; below <= 8 * KiB; below += 4 * KiB - 1)
    CHECK(faults_at(first - below), "%zu bytes below a region's first block: no guard page", below);
  printf("test_guards: the 8 KiB below a region's first block fault, the block does not (pages of %zu KiB)\n",
         hkt_page() / KiB);

  if (hkt_region_blocks_end(hardened) < 4 * MiB) {
    /* (slab 63 unused, its last page a guard) */
    char *region = (char *)((uintptr_t)first & ~(uintptr_t)(4 * MiB - 1));
    CHECK(faults_at(region + 4 * MiB - 1), "the last byte of a region: no guard page (hardened %d)", hardened);
    printf("test_guards: the last byte of a region faults\n");
  }
  return 0;
}
