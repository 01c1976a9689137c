/* test_lend: pages of medium blocks lend their free slabs to the regions
 * while they live (src/lend.c, lend_free_slabs).
 *
 * Each round: 1000 blocks of 9-60 KiB are written; 90 % of them are freed
 * (in the threaded round by another thread: remote frees); then blocks of
 * 64-256 KiB are allocated until as many bytes are live again. The program
 * grows, the idle classes' pages lend their free slabs, and the new blocks
 * take them. Then: the counter of lent slabs moved; every survivor and
 * every new block keeps its contents; blocks of the first sizes are
 * allocated again (they must not land in the lent slabs: contents checked
 * again) and freed; the survivors and the new blocks stay, so that every
 * round grows. In the first round, in a child, a block that was dropped
 * with a lent slab but starts outside it is freed again: that is a double
 * free, and must abort with hakmem's message. At the end every block is
 * checked once more and freed.
 *
 * Linked with libhakmem.a (malloc replaced, internal names visible).
 * HAKMEM_PURGE_DELAY_MS=1000000 (set by ctest): no timed pass, only the
 * growth pass lends. */
#define _GNU_SOURCE
#include "../src/internal.h"
#include "api.h"

#include <pthread.h>

#define NSMALL 1000
#define ROUNDS 3
#define KiB ((size_t)1 << 10)

static hkt_blk small[NSMALL], big[ROUNDS][4096], again[NSMALL], kept[ROUNDS][NSMALL / 10];
static int nbig[ROUNDS];
static uint64_t rng = 88172645463325252ull;
/* This test's block sizes come from its own xorshift64 sequence, not
 * hkt_rand: the sizes must leave whole slabs of free blocks for the pass to
 * lend, and this sequence does so in every build (gcc and clang). */
static uint64_t lend_rand(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static void alloc_blk(hkt_blk *b, size_t lo, size_t hi, uint64_t seed) {
  hkt_blk_alloc(b, lo + (size_t)(lend_rand() % (hi - lo + 1)), seed);
}

static unsigned char *was[NSMALL]; /* the freed blocks' addresses */

static void free_90(int from, int to) {
  for (int i = from; i < to; i++)
    if (i % 10 != 0) {
      hkt_blk_check(&small[i], "freed block");
      was[i] = small[i].p;
      free(small[i].p);
      small[i].p = NULL;
    }
}

/* A freed block that the lending dropped and tagged: it starts in a slab
 * still its page's (found through the region's records) and carries the tag. */
static unsigned char *find_dropped(void) {
  for (int i = 0; i < NSMALL; i++) {
    if (i % 10 == 0) continue;
    unsigned char *q = was[i];
    hk_page *pg = hk_page_of(hk_region_of(q), q);
    if (pg->block_size != 0 && pg->lent != 0 && (uintptr_t)q >= pg->start && hk_foreign_tagged(pg, (hk_block *)q)) return q;
  }
  return NULL;
}

typedef struct { int from, to; } range;
static void *freer(void *arg) {
  range *r = arg;
  free_90(r->from, r->to);
  return NULL;
}

static void round_of(int round, int threaded, uint64_t seed, int probe) {
  hkt_blk *bigs = big[round];
  size_t live = 0;
  for (int i = 0; i < NSMALL; i++) {
    alloc_blk(&small[i], 9 * KiB, 60 * KiB, seed + (uint64_t)i);
    live += small[i].n;
  }
  size_t freed = 0;
  for (int i = 0; i < NSMALL; i++)
    if (i % 10 != 0) freed += small[i].n;
  if (threaded) {
    pthread_t t;
    range r = {0, NSMALL};
    CHECK(pthread_create(&t, NULL, freer, &r) == 0, "pthread_create failed");
    pthread_join(t, NULL);
  } else {
    free_90(0, NSMALL);
  }
  uint64_t lent_before = atomic_load(&hk_stats.slabs_lent);
  int n = 0;
  for (size_t got = 0; got < freed && n < 4096; n++) {
    alloc_blk(&bigs[n], 64 * KiB, 256 * KiB, seed + 100000 + (uint64_t)n);
    got += bigs[n].n;
  }
  nbig[round] = n;
  CHECK(atomic_load(&hk_stats.slabs_lent) > lent_before, "no slab was lent (round %s)", threaded ? "threaded" : "plain");
  for (int i = 0; i < NSMALL; i += 10) hkt_blk_check(&small[i], "survivor");
  for (int i = 0; i < n; i++) hkt_blk_check(&bigs[i], "new block");
  if (probe) {
    unsigned char *q = find_dropped();
    CHECK(q != NULL, "no dropped block starts outside the lent slabs");
    hkt_expect_double_free(q, "a dropped block");
  }
  for (int i = 0; i < NSMALL; i++) alloc_blk(&again[i], 9 * KiB, 60 * KiB, seed + 200000 + (uint64_t)i);
  for (int i = 0; i < NSMALL; i += 10) hkt_blk_check(&small[i], "survivor");
  for (int i = 0; i < n; i++) hkt_blk_check(&bigs[i], "new block");
  for (int i = 0; i < NSMALL; i++) hkt_blk_check(&again[i], "block allocated after the lending");
  for (int i = 0; i < NSMALL; i++) free(again[i].p);
  /* the survivors and the new blocks stay to the end: each round grows */
  for (int i = 0; i < NSMALL; i += 10) kept[round][i / 10] = small[i];
  (void)live;
}

int main(void) {
  CHECK(getenv("HAKMEM_PURGE_DELAY_MS") != NULL, "run with HAKMEM_PURGE_DELAY_MS=1000000 (ctest sets it)");
  if (hkt_hardened()) {
    printf("test_lend: hardened mode lends nothing; skipped\n");
    return 0;
  }
  round_of(0, 0, 1, 1);
  round_of(1, 1, 2, 0);
  round_of(2, 0, 3, 0);
  for (int r = 0; r < ROUNDS; r++) {
    for (int i = 0; i < NSMALL / 10; i++) {
      hkt_blk_check(&kept[r][i], "survivor at the end");
      free(kept[r][i].p);
    }
    for (int i = 0; i < nbig[r]; i++) {
      hkt_blk_check(&big[r][i], "new block at the end");
      free(big[r][i].p);
    }
  }
  printf("test_lend: ok (%llu slabs lent)\n", (unsigned long long)atomic_load(&hk_stats.slabs_lent));
  return 0;
}
