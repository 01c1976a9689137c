/* test_growth_purge: free slabs that a growing program cannot reuse go back
 * to the OS while it grows, without waiting for the purge delay (region.c,
 * "purging on growth").
 *
 * Run with HAKMEM_PURGE_DELAY_MS=1000000 and HAKMEM_PURGE_THREAD=0, so that
 * no delayed purge can be what lowers RSS. 64 blocks of 192 KiB (a span of 4
 * slabs each) are written, every other one is freed (holes of 4 slabs, too
 * short for what follows), then 8 blocks of 640 KiB are allocated (spans of
 * 11 slabs: clean slabs of a new region; the live spans grow by more than a
 * quarter, which is what counts as growth). RSS must fall by most of what
 * the freed blocks held beyond what the heap keeps, and every block must
 * keep its contents.
 */
#define _GNU_SOURCE
#include "api.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define N 64
#define SMALL (192 * KiB)
#define BIG (640 * KiB)
#define NBIG 8

int main(void) {
  const char *delay = getenv("HAKMEM_PURGE_DELAY_MS");
  CHECK(delay != NULL && atol(delay) >= 1000000, "run with HAKMEM_PURGE_DELAY_MS=1000000 (ctest sets it)");
  unsigned char *p[N], *big[NBIG];
  for (int i = 0; i < N; i++) {
    p[i] = (unsigned char *)API(malloc)(SMALL);
    CHECK(p[i] != NULL, "malloc(%zu) failed", SMALL);
    hkt_fill(p[i], SMALL, (uint64_t)i);
  }
  for (int i = 0; i < N; i += 2) API(free)(p[i]);
  size_t before = hkt_rss_bytes();
  for (int i = 0; i < NBIG; i++) {
    big[i] = (unsigned char *)API(malloc)(BIG);
    CHECK(big[i] != NULL, "malloc(%zu) failed", BIG);
    big[i][0] = 1; /* one OS page each: the new blocks add almost nothing */
  }
  size_t after = hkt_rss_bytes();
  /* 32 x 192 KiB freed; the heap keeps up to 2 MiB of empty spans (8 of
   * them) and 2 MiB of blocks in empty pages left in their class's queue
   * (10) for reuse; the other 14 are free slabs. Most of those must be
   * purged: some may share the region the big blocks went to. */
  size_t expect = 10 * SMALL;
  printf("test_growth_purge: RSS %.1f -> %.1f MiB while growing (expected a drop of at least %.1f MiB)\n",
         (double)before / (double)MiB, (double)after / (double)MiB, (double)expect / (double)MiB);
  CHECK(after + expect <= before, "free slabs stay resident while the program grows: RSS %.1f -> %.1f MiB",
        (double)before / (double)MiB, (double)after / (double)MiB);
  for (int i = 1; i < N; i += 2) {
    size_t bad = hkt_verify(p[i], SMALL, (uint64_t)i);
    CHECK(bad == HKT_OK, "live block %d corrupted at byte %zu", i, bad);
    API(free)(p[i]);
  }
  for (int i = 0; i < NBIG; i++) {
    memset(big[i], 0x5a, BIG);
    API(free)(big[i]);
  }
  /* the purged slabs are reusable: calloc of the freed size is zero */
  for (int i = 0; i < N; i++) {
    unsigned char *z = (unsigned char *)API(calloc)(1, SMALL);
    CHECK(z != NULL, "calloc failed");
    for (size_t k = 0; k < SMALL; k += 512) CHECK(z[k] == 0, "calloc block not zero at %zu", k);
    p[i] = z;
  }
  for (int i = 0; i < N; i++) API(free)(p[i]);
  printf("test_growth_purge [%s]: all passed\n", API_MODE);
  return 0;
}
