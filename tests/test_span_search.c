/* test_span_search: a heap growing over many regions finds each new span
 * without reading every region (src/region.c, search).
 *
 * 20,000 blocks of 100,000 bytes (pages of several blocks over several
 * slabs, about 500 regions, 2 GB of address space; each block written at
 * its two ends only), all live: every region the heap grows over keeps a
 * leftover of free slabs too short for the next page. With no committed
 * run of the span's length anywhere (nothing was freed), the search stops
 * at the first region in use with a clean run, the newest: the regions it
 * reads per search stay well under the number of regions, where reading
 * every region with free slabs would make them about half of it. Then
 * every block's ends are checked and the blocks freed.
 *
 * Linked with libhakmem.a (malloc replaced, internal names visible). */
#define _GNU_SOURCE
#include "../src/internal.h"
#include "api.h"

#define N 20000
#define SIZE 100000

static unsigned char *blocks[N];

int main(void) {
  uint64_t searches0 = hk_load_relaxed(&hk_stats.span_searches);
  uint64_t reads0 = hk_load_relaxed(&hk_stats.span_search_reads);
  uint64_t regions0 = hk_load_relaxed(&hk_stats.regions_mapped);
  for (int i = 0; i < N; i++) {
    blocks[i] = malloc(SIZE);
    CHECK(blocks[i] != NULL, "malloc(%d) #%d failed", SIZE, i);
    blocks[i][0] = (unsigned char)i;
    blocks[i][SIZE - 1] = (unsigned char)(i >> 8);
  }
  uint64_t searches = hk_load_relaxed(&hk_stats.span_searches) - searches0;
  uint64_t reads = hk_load_relaxed(&hk_stats.span_search_reads) - reads0;
  uint64_t regions = hk_load_relaxed(&hk_stats.regions_mapped) - regions0;
  printf("test_span_search: %llu regions, %llu span searches, %.1f regions read per search\n",
         (unsigned long long)regions, (unsigned long long)searches, searches ? (double)reads / (double)searches : 0.0);
  CHECK(regions >= 200, "only %llu regions mapped for 2 GB of blocks", (unsigned long long)regions);
  CHECK(searches >= regions, "%llu span searches for %llu regions", (unsigned long long)searches,
        (unsigned long long)regions);
  CHECK(reads <= searches * (regions / 8), "%.1f regions read per span search, with %llu regions",
        (double)reads / (double)searches, (unsigned long long)regions);
  for (int i = 0; i < N; i++) {
    CHECK(blocks[i][0] == (unsigned char)i && blocks[i][SIZE - 1] == (unsigned char)(i >> 8), "block %d changed", i);
    free(blocks[i]);
  }
  printf("test_span_search: OK\n");
  return 0;
}
