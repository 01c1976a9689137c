/* test_lend_timed: a pass over the medium pages that the clock makes due
 * (once per purge delay) lends the free slabs of the pages of a class
 * still in use, all but its current page, before it purges the free
 * blocks' insides (src/lend.c, hk_heap_purge_blocks): slabs lent while
 * their class is busy serve other spans as they are, whereas slabs whose
 * free blocks were purged first, and lent only once the class goes idle,
 * are faulted in again by the spans that take them.
 *
 * 400 blocks of 40 KiB are written and 90 % of them freed; after the purge
 * delay, blocks of 200 KiB are allocated (each a new span, whose slow path
 * runs the pass when it is due), the 40 KiB class marked as having looked
 * for a page since the last pass before each one. Then: slabs were lent,
 * the class's current page lent none, every block kept its contents, and
 * blocks of 40 KiB allocated again do not overlap anything live.
 *
 * Linked with libhakmem.a (internal names visible). HAKMEM_PURGE_DELAY_MS=20
 * (set by ctest). */
#define _GNU_SOURCE
#include "../src/internal.h"
#include "api.h"

#include <time.h>

#define N 400
#define NBIG 32
#define KiB ((size_t)1 << 10)

static hkt_blk small[N], big[NBIG], again[N];

int main(void) {
  const char *delay = getenv("HAKMEM_PURGE_DELAY_MS");
  CHECK(delay != NULL && atoi(delay) == 20, "run with HAKMEM_PURGE_DELAY_MS=20 (ctest sets it)");
  if (hkt_hardened()) {
    printf("test_lend_timed: hardened mode lends nothing; skipped\n");
    return 0;
  }
  for (int i = 0; i < N; i++) hkt_blk_alloc(&small[i], 40 * KiB, (uint64_t)i + 1);
  for (int i = 0; i < N; i++)
    if (i % 10 != 0) {
      hkt_blk_check(&small[i], "freed block");
      free(small[i].p);
    }
  hk_heap *h = hk_heap_get();
  CHECK(h != NULL, "no heap");
  unsigned cls = hk_size_class(40 * KiB);
  struct timespec nap = {0, 40 * 1000 * 1000}; /* twice the purge delay */
  nanosleep(&nap, NULL);
  uint64_t lent_before = atomic_load(&hk_stats.slabs_lent);
  for (int i = 0; i < NBIG; i++) {
    h->class_searched[cls] = h->purge_passes; /* in use: it looked for a page since the last pass */
    hkt_blk_alloc(&big[i], 200 * KiB, (uint64_t)i + 1000);
  }
  uint64_t lent = atomic_load(&hk_stats.slabs_lent) - lent_before;
  CHECK(lent > 0, "the timed pass lent no free slab of a class in use");
  hk_page *cur = h->queues[cls].first;
  CHECK(cur == NULL || cur->lent == 0, "the class's current page lent slabs");
  for (int i = 0; i < N; i += 10) hkt_blk_check(&small[i], "survivor");
  for (int i = 0; i < NBIG; i++) hkt_blk_check(&big[i], "200 KiB block");
  for (int i = 0; i < N; i++) hkt_blk_alloc(&again[i], 40 * KiB, (uint64_t)i + 5000);
  for (int i = 0; i < N; i += 10) hkt_blk_check(&small[i], "survivor");
  for (int i = 0; i < NBIG; i++) hkt_blk_check(&big[i], "200 KiB block");
  for (int i = 0; i < N; i++) {
    hkt_blk_check(&again[i], "block allocated after the lending");
    free(again[i].p);
  }
  for (int i = 0; i < N; i += 10) free(small[i].p);
  for (int i = 0; i < NBIG; i++) free(big[i].p);
  printf("test_lend_timed: ok (%llu slabs lent by the timed pass)\n", (unsigned long long)lent);
  return 0;
}
