/* test_steady_pages: a class whose live blocks fill their pages, its blocks
 * replaced at random (a free of one, a malloc of the same size), as a
 * program with a steady count of objects of one type replaces them
 * (src/queue.c: page_scant, hk_heap_next_page_malloc, stash_put).
 *
 * 200,000 blocks of 256 B (pages of 256 blocks), then 2,000,000 random
 * replacements. Checked:
 * - the stash takes no block of these pages: a page of SCANT_MIN_BLOCKS or
 *   more gathers its frees in its queue until the page search takes it
 *   back, instead of one stash put and take per block;
 * - fewer than one page search per 8 replacements: each page made current
 *   serves a share of free blocks, not the one block just freed into it;
 * - the spans serving pages stay within 1.15x the live bytes;
 * - every block keeps the tag written into it (its index and the round).
 *
 * Linked with libhakmem.a (malloc replaced, internal names visible). */
#define _GNU_SOURCE
#include "../src/internal.h"
#include "api.h"

#define N 200000
#define ROUNDS 2000000
#define SIZE 256

static uint64_t *blocks[N];
static uint64_t last[N]; /* the round that wrote each block */

static void put(unsigned i, uint64_t round) {
  blocks[i] = malloc(SIZE);
  CHECK(blocks[i] != NULL, "malloc(%d) failed", SIZE);
  blocks[i][0] = i;
  blocks[i][SIZE / 8 - 1] = round;
}

int main(void) {
  for (unsigned i = 0; i < N; i++) put(i, 0);
  hk_heap *h = hk_tls.heap;
  CHECK(h != NULL && h != &hk_heap_empty, "no heap after %d mallocs", N);
  uint32_t searches0 = h->searches;
  uint64_t rng = 42, stashed = 0;
  for (uint64_t r = 1; r <= ROUNDS; r++) {
    unsigned i = (unsigned)(hkt_rand(&rng) % N);
    CHECK(blocks[i][0] == i && blocks[i][SIZE / 8 - 1] == last[i], "block %u changed", i);
    free(blocks[i]);
    put(i, r);
    last[i] = r;
    if (r % 1000 == 0) stashed += h->stash_parked_blocks;
  }
  uint32_t searches = h->searches - searches0;
  struct hak_stats st;
  CHECK(hak_stats_get(&st, sizeof st) == 0, "hak_stats_get failed");
  printf("test_steady_pages: %u page searches for %d replacements, pages %.3fx the live bytes\n", searches, ROUNDS,
         (double)st.page_bytes / (double)st.small_live_bytes);
  CHECK(stashed == 0, "the stash held blocks of 256-block pages (%llu, summed over samples)",
        (unsigned long long)stashed);
  CHECK(searches < ROUNDS / 8, "%u page searches for %d replacements", searches, ROUNDS);
  CHECK(st.page_bytes <= st.small_live_bytes + st.small_live_bytes / 20 * 3, "pages of %llu bytes for %llu live",
        st.page_bytes, st.small_live_bytes);
  for (unsigned i = 0; i < N; i++) {
    CHECK(blocks[i][0] == i && blocks[i][SIZE / 8 - 1] == last[i], "block %u changed", i);
    free(blocks[i]);
  }
  printf("test_steady_pages: OK\n");
  return 0;
}
