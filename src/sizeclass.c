/* Size classes and the page span each class uses.
 *
 * Classes: 8, then 16, 32, ..., 128 (16 B apart: every block above 8 B is
 * 16-aligned), then 8 per power of two up to 1 MiB (at most 12.5 % apart),
 * 113 in all. Blocks up to 8 KiB live in one-slab
 * (64 KiB) pages; larger ones in spans of 1..16 slabs, chosen so that the
 * span wastes as little as possible at its end, except that blocks larger
 * than a slab take the shortest span that wastes at most 1/8 of it (1 to 4
 * blocks a page, where the least waste would take up to 15 slabs for 4
 * blocks). A long span needs as many contiguous free slabs, which a heap
 * fragmented by earlier frees rarely has, so such pages would take fresh
 * memory; and a page of few blocks is whole again, and reusable by any
 * class, sooner. Below a slab, pages of few blocks empty and fill too
 * often (docs/DESIGN.md, Known limits), so there a page holds at least 32
 * or 8 blocks (medium_min_blocks).
 *
 * Where the span holds a single block, the class is coloured: the block
 * starts at one of HK_COLORS cache-line offsets (page.c). If the span
 * wastes less than those 4 KiB (the multiples of 64 KiB up to 960 KiB), it
 * gets one slab more for that, which costs address space only: the block
 * reaches at most one OS page into it.
 *
 * Padded classes (above 8 KiB, pages of several blocks: 9 to 60 KiB, and
 * 72 to 104 KiB, 144 and 208 KiB): their blocks lie HK_CLASS_PAD (64)
 * bytes further apart than their size. Unpadded, such blocks are a
 * multiple of 1 KiB apart, and those of 12, 16, 20 ... KiB a multiple of
 * 4 KiB: the same offset into neighbouring blocks falls in the same L1 set
 * and has the same low 12 address bits, which the core compares to match a
 * load with earlier stores ("4K aliasing"), so a program that indexes two
 * such arrays together, or touches each OS page of one block after
 * another's, pays for both on every access (glibc's 16-byte chunk headers
 * stagger such blocks by themselves). The pad makes a block 64 * an odd
 * number of bytes long, so neighbours start in different sets, and is not
 * the program's: malloc_usable_size reports the class size. Padded blocks
 * are only 64-aligned, so each padded class has an unpadded twin (classes
 * HK_NSIZES..), which only aligned allocation uses (alloc.c). A span filled
 * exactly by its unpadded blocks holds one block fewer, the RSS the pad
 * costs, so only classes of at least 8 blocks a page take a pad that costs
 * a block: the one-slab classes of 4 to 8 KiB (16 or 8 blocks: 1 in 16 or
 * in 8 of every page is too much RSS for it), 96 KiB (2 blocks in 3 slabs)
 * and 160 KiB (2 in 5) stay unpadded. */
#include "internal.h"

uint32_t hk_class_size[HK_NCLASSES];
uint32_t hk_class_block[HK_NCLASSES];
uint8_t hk_class_twin[HK_NCLASSES];
uint8_t hk_class_base[HK_NCLASSES];
uint8_t hk_class_slabs[HK_NCLASSES];
uint8_t hk_class_colored[HK_NCLASSES];
uint8_t hk_class_lut[(HK_LUT_MAX + 7) / 8 + 1];
uint8_t hk_class_lut_first[HK_NCLASSES]; /* first slot of hk_class_lut holding each class */
uint8_t hk_class_lut_end[HK_NCLASSES];   /* one past its last (0 for the classes above HK_LUT_MAX) */
uint8_t hk_class_cache_max[HK_NCLASSES];

/* Blocks between 8 KiB and a slab: pages of at least this many blocks. The
 * least waste alone would give 16 and 32 KiB blocks one-slab pages of 4
 * and 2 blocks, which a program with a few dozen such blocks live exhausts
 * and refills every few operations: each time a page search, the exhausted
 * page parked full and unparked by the next free into it. More blocks a
 * page make those slow paths rarer, at the cost of longer pages that empty
 * less often when a program frees most of its blocks: up to 32 KiB, where
 * the slow paths dominate, 32 blocks; above, where the blocks are large
 * enough that such pages hold much memory, 8. */
static unsigned medium_min_blocks(uint32_t bs) { return bs <= 32768 ? 32 : 8; }

static unsigned span_for(uint32_t bs) {
  if (bs <= 8192) return 1;
  unsigned best = 0;
  uint64_t best_waste = UINT64_MAX;
  unsigned nmin = (unsigned)((bs + HK_SLAB_SIZE - 1) / HK_SLAB_SIZE);
  for (unsigned n = nmin; n <= HK_MAX_SPAN_SLABS; n++) {
    uint64_t span = (uint64_t)n * HK_SLAB_SIZE;
    uint64_t blocks = span / bs;
    uint64_t waste = span - blocks * bs;
    if (bs > HK_SLAB_SIZE && waste * 8 <= span) return n;
    if (bs < HK_SLAB_SIZE && blocks < medium_min_blocks(bs)) continue;
    /* compare waste as a fraction of the span: waste/span < best/bestspan */
    if (best == 0 || waste * ((uint64_t)best * HK_SLAB_SIZE) < best_waste * span) {
      best = n;
      best_waste = waste;
    }
    if (waste == 0) break;
  }
  return best;
}

static uint32_t size_of(unsigned c) {
  if (c < HK_SMALL_CLASSES) return c == 0 ? 8 : 16 * c;
  unsigned b = 7 + (c - HK_SMALL_CLASSES) / 8, sub = (c - HK_SMALL_CLASSES) % 8;
  return (uint32_t)((8 + sub + 1) << (b - 3));
}

/* Whether a class of blocks of this size in spans of n slabs is padded. */
static bool padded_class(uint32_t size, unsigned n) {
  uint64_t span = (uint64_t)n * HK_SLAB_SIZE, blocks = span / size;
  return size > 8192 && blocks >= 2 && (blocks >= 8 || span / (size + HK_CLASS_PAD) == blocks);
}

/* class c of the given size; its span is the unpadded class's, holding a
 * block fewer where the blocks filled it: spans chosen anew for the padded
 * sizes would cost a block that grows through the classes by realloc
 * several times the page faults */
static void set_class(unsigned c, uint32_t size, unsigned n, bool padded, bool twin) {
  hk_class_size[c] = size;
  hk_class_block[c] = size + (padded ? HK_CLASS_PAD : 0);
  if (size > 8192 && (uint64_t)n * HK_SLAB_SIZE / size == 1) {
    if ((uint64_t)n * HK_SLAB_SIZE - size >= (uint64_t)HK_COLORS * 64) {
      hk_class_colored[c] = HK_COLORED_IN_SPAN;
    } else if (n < HK_MAX_SPAN_SLABS) {
      n++;
      hk_class_colored[c] = HK_COLORED_SLAB;
    }
  }
  hk_class_slabs[c] = (uint8_t)n;
  /* remote.c links cached blocks through their second word */
  uint32_t fmax = HK_CACHE_CLASS_BYTES / size;
  /* a twin's blocks would never be taken: malloc never picks the class */
  hk_class_cache_max[c] = (uint8_t)(size < 16 || twin || size > HK_CACHE_BLOCK_MAX ? 0 : fmax > 128 ? 128 : fmax);
}

void hk_sizeclass_init(void) {
  unsigned twin = HK_NSIZES;
  for (unsigned c = 0; c < HK_NSIZES; c++) {
    uint32_t size = size_of(c);
    unsigned n = span_for(size);
    bool padded = padded_class(size, n);
    hk_class_base[c] = (uint8_t)c;
    set_class(c, size, n, padded, false);
    if (!padded) continue;
    if (twin == HK_NCLASSES) hk_fatal("size classes: more padded classes than HK_NTWINS", NULL);
    hk_class_twin[c] = (uint8_t)twin;
    hk_class_base[twin] = (uint8_t)c;
    set_class(twin++, size, n, false, true);
  }
  if (twin != HK_NCLASSES) hk_fatal("size classes: fewer padded classes than HK_NTWINS", NULL);
  hk_class_lut[0] = 0;
  unsigned c = 0; /* (the classes grow with c: each entry's search starts at the last one's class) */
  for (size_t i = 1; i < sizeof(hk_class_lut); i++) {
    size_t size = i * 8; /* (size + 7) >> 3 == i for sizes in (8i-8, 8i] */
    while (hk_class_size[c] < size) c++;
    hk_class_lut[i] = (uint8_t)c;
  }
  for (c = 0; c < HK_NCLASSES; c++) hk_class_lut_first[c] = hk_class_lut_end[c] = 0;
  for (size_t i = sizeof(hk_class_lut); i-- > 0;) {
    c = hk_class_lut[i];
    if (hk_class_lut_end[c] == 0) hk_class_lut_end[c] = (uint8_t)(i + 1);
    hk_class_lut_first[c] = (uint8_t)i;
  }
}
