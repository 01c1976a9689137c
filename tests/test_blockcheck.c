/* test_blockcheck: free()'s test of a block start (src/internal.h,
 * hk_is_carved_block) against plain division.
 *
 * The test is one multiply and one compare, with a bound that the page
 * keeps as blocks are carved. It must accept exactly the starts of the
 * carved blocks for every block size a page can have (8 B to a 1 MiB span
 * block, padded and span-sized blocks included), for every pointer within
 * the page's 4 MiB region (below the page's first block too), and reject
 * everything on a page that is not live. A wrong answer would let free()
 * take an interior or never-allocated pointer as a block. */
#include "../src/internal.h"
#include "test_util.h"

#include <stdio.h>
#include <stdlib.h>

#define SPAN_MAX ((uint32_t)17 << HK_SLAB_SHIFT) /* 16 slabs + a colour slab */
#define REGION ((int64_t)HK_REGION_SIZE)

static long failures, checked;

static void set_page(hk_page *pg, uintptr_t start, uint32_t bs, uint32_t cap) {
  pg->start = start;
  pg->block_size = bs;
  pg->div_magic = hk_div_magic(bs);
  pg->capacity = cap;
  hk_page_set_carved(pg);
}

static void expect(const hk_page *pg, int64_t off, uint32_t cap) {
  uint32_t bs = pg->block_size;
  bool want = off >= 0 && off < (int64_t)cap * bs && off % bs == 0;
  bool got = hk_is_carved_block(pg, pg->start + (uintptr_t)off);
  checked++;
  if (got != want && failures++ < 10)
    fprintf(stderr, "test_blockcheck: block size %u, %u carved, offset %lld: got %d, want %d\n", bs, cap,
            (long long)off, got, want);
  /* the plain divisibility test (free_invalid, realloc) */
  if (off >= 0 && off < ((int64_t)1 << 32)) {
    bool div = hk_is_block_start(pg, (uint32_t)off);
    if (div != (off % bs == 0) && failures++ < 10)
      fprintf(stderr, "test_blockcheck: block size %u, offset %lld: divisible %d\n", bs, (long long)off, div);
  }
}

/* Offsets around every carved block, past the end, and below the start. */
static void sweep(uint32_t bs, uint32_t cap) {
  hk_page pg = {0};
  uintptr_t start = (uintptr_t)0x7f1234400000 + HK_SLAB_SIZE + 64 * 7;
  set_page(&pg, start, bs, cap);
  int64_t step[] = {0, 1, 7, 8, 15, 16, -1, -8, -16, (int64_t)bs / 2, (int64_t)bs - 8};
  for (int64_t k = 0; k <= (int64_t)cap + 2; k++)
    for (size_t i = 0; i < sizeof step / sizeof step[0]; i++) expect(&pg, k * bs + step[i], cap);
  for (int64_t back = 1; back < REGION; back = back * 3 + 5) expect(&pg, -back, cap);
  for (int64_t fwd = (int64_t)cap * bs; fwd < REGION; fwd = fwd * 2 + 8) expect(&pg, fwd, cap);
}

/* Every offset from -4 MiB to +4 MiB. */
static void exhaustive(uint32_t bs) {
  hk_page pg = {0};
  uint32_t cap = SPAN_MAX / bs;
  set_page(&pg, (uintptr_t)0x7f1234400000 + HK_SLAB_SIZE, bs, cap);
  for (int64_t off = -REGION; off < REGION; off++) {
    bool want = off >= 0 && off < (int64_t)cap * bs && off % bs == 0;
    if (hk_is_carved_block(&pg, pg.start + (uintptr_t)off) != want && failures++ < 10)
      fprintf(stderr, "test_blockcheck: block size %u, offset %lld wrong\n", bs, (long long)off);
  }
  checked += 2 * REGION;
}

int main(void) {
  uint32_t sizes[4096];
  unsigned n = 0;
  for (uint32_t bs = 8; bs <= 4096; bs += 8) sizes[n++] = bs;
  for (uint32_t p = 8; p <= (1u << 21); p *= 2) {
    sizes[n++] = p;
    if (p > 16) sizes[n++] = p - 16, sizes[n++] = p + 16, sizes[n++] = p + p / 4, sizes[n++] = p + p / 2 + 64;
  }
  /* span blocks: a span of slabs less a colour */
  for (uint32_t s = 1; s <= 17; s++) sizes[n++] = (s << HK_SLAB_SHIFT) - 64 * (s % 8), sizes[n++] = s << HK_SLAB_SHIFT;
  uint64_t rng = 12345;
  while (n < sizeof sizes / sizeof sizes[0]) sizes[n++] = 8 + (uint32_t)(hkt_rand(&rng) % (SPAN_MAX - 8));

  for (unsigned i = 0; i < n; i++) {
    uint32_t bs = sizes[i], reserved = SPAN_MAX / bs;
    if (reserved == 0) continue;
    uint32_t caps[] = {0, 1, 2, reserved / 2, reserved - 1, reserved};
    for (size_t c = 0; c < sizeof caps / sizeof caps[0]; c++) sweep(bs, caps[c]);
  }
  uint32_t full[] = {16, 48, 1040, 65536, 1u << 20, 3u << 16};
  for (size_t i = 0; i < sizeof full / sizeof full[0]; i++) exhaustive(full[i]);

  /* a page that is not live, or the zero slot the page table's 0 leads to */
  hk_page dead = {0};
  for (int64_t off = -REGION; off < REGION; off += 4093) {
    if (hk_is_carved_block(&dead, (uintptr_t)off) && failures++ < 10)
      fprintf(stderr, "test_blockcheck: the zero page took offset %lld\n", (long long)off);
  }
  hk_page pg = {0};
  set_page(&pg, 0x7f0000410000, 64, 100);
  hk_page_clear_carved(&pg);
  for (int64_t off = 0; off < 6400; off += 64) {
    if (hk_is_carved_block(&pg, pg.start + (uintptr_t)off) && failures++ < 10)
      fprintf(stderr, "test_blockcheck: a cleared page took offset %lld\n", (long long)off);
  }

  if (failures) {
    fprintf(stderr, "test_blockcheck: %ld wrong of %ld\n", failures, checked);
    return 1;
  }
  printf("test_blockcheck: %ld offsets over %u block sizes: ok\n", checked, n);
  return 0;
}
