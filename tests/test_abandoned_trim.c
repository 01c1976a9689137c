/* test_abandoned_trim: an exited thread's page that empties is kept for
 * threads that start later, for the purge delay; meanwhile the purger
 * gives back all of it but what a fresh page would use (docs/DESIGN.md,
 * "Thread life cycle"). Run with HAKMEM_PURGE_DELAY_MS=1000: the purger passes
 * every 500 ms, the page goes back to its region only after 1 s empty, and
 * the region's free slabs after another second, so memory that leaves
 * within 1.5 s of the page emptying was trimmed, not released.
 */
#define _GNU_SOURCE
#include "api.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define BLOCK 1000 /* class 1024: 64 blocks in a 64 KiB page */
#define NBLOCKS 60
#define SMALL_BLOCK 24 /* class 32 */
#define NSMALL 1900    /* 59 KiB of them */

static unsigned char *blocks[NBLOCKS];
static unsigned char *small[NSMALL];

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Every block of the thread is touched; all but the first of each kind are
 * freed here, the first by another thread once this thread has exited:
 * the pages are abandoned in use and empty afterwards. */
static void *thread_main(void *arg) {
  (void)arg;
  for (int i = 0; i < NBLOCKS; i++) {
    blocks[i] = (unsigned char *)API(malloc)(BLOCK);
    CHECK(blocks[i] != NULL, "malloc(%d) failed", BLOCK);
    memset(blocks[i], 0x6b, BLOCK);
  }
  for (int i = 0; i < NSMALL; i++) {
    small[i] = (unsigned char *)API(malloc)(SMALL_BLOCK);
    CHECK(small[i] != NULL, "malloc(%d) failed", SMALL_BLOCK);
    memset(small[i], 0x6c, SMALL_BLOCK);
  }
  for (int i = 1; i < NBLOCKS; i++) API(free)(blocks[i]);
  for (int i = 1; i < NSMALL; i++) API(free)(small[i]);
  return NULL;
}

static void *free_firsts(void *arg) {
  (void)arg;
  API(free)(blocks[0]);
  API(free)(small[0]);
  return NULL;
}

/* lowest and highest address of a set of blocks */
static void span_of(unsigned char **b, int n, size_t size, uintptr_t *lo, uintptr_t *hi) {
  *lo = UINTPTR_MAX;
  *hi = 0;
  for (int i = 0; i < n; i++) {
    uintptr_t a = (uintptr_t)b[i];
    if (a < *lo) *lo = a;
    if (a + size > *hi) *hi = a + size;
  }
}

int main(void) {
  if (hkt_hardened()) { /* no trimming there, pages carve in random order */
    printf("test_abandoned_trim: hardened mode, skipped\n");
    return 0;
  }

  pthread_t t;
  int rc = pthread_create(&t, NULL, thread_main, NULL);
  CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  pthread_join(t, NULL);

  uintptr_t lo, hi, slo, shi;
  span_of(blocks, NBLOCKS, BLOCK, &lo, &hi);
  span_of(small, NSMALL, SMALL_BLOCK, &slo, &shi);
  CHECK(hi - lo <= 64 * 1024 && shi - slo <= 64 * 1024, "blocks not in one page each: %zu and %zu bytes",
        (size_t)(hi - lo), (size_t)(shi - slo));
  size_t before = hkt_resident_pages(lo, hi), sbefore = hkt_resident_pages(slo, shi);
  CHECK(before >= 14 && sbefore >= 14, "the blocks were written: %zu and %zu pages resident", before, sbefore);

  /* remote frees into the abandoned pages, from a thread that exits (a
   * thread keeps blocks it frees of other threads' pages for its own
   * mallocs until then): now they are empty */
  rc = pthread_create(&t, NULL, free_firsts, NULL);
  CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  pthread_join(t, NULL);
  double t0 = now_s();
  size_t after = before, safter = sbefore;
  while (hkt_timed_purges() && now_s() - t0 < 1.5 && (after > 2 || safter > 2)) {
    usleep(10 * 1000);
    after = hkt_resident_pages(lo, hi);
    safter = hkt_resident_pages(slo, shi);
  }
  printf("test_abandoned_trim: resident pages %zu -> %zu (1000 B blocks), %zu -> %zu (24 B blocks) in %.0f ms\n",
         before, after, sbefore, safter, (now_s() - t0) * 1e3);
  /* a fresh page carves one OS page of 1000 B or 24 B blocks */
  CHECK(!hkt_timed_purges() || (after <= 2 && safter <= 2), "empty abandoned pages not trimmed within 1.5 s: %zu and %zu pages resident",
        after, safter);
  return 0;
}
