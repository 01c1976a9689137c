/* Size classes and the page span each class uses.
 *
 * Classes: 8, 16, ..., 128 (8 B apart), then 8 per power of two up to 1 MiB
 * (at most 12.5 % apart), 120 in all. Blocks up to 8 KiB live in one-slab
 * (64 KiB) pages; larger ones in spans of 1..16 slabs, chosen so that the
 * span wastes as little as possible at its end.
 *
 * Where the best span holds a single block (the multiples of 64 KiB up to
 * 960 KiB), the class is coloured: its span gets one slab more, so that the
 * block can start at one of HK_COLORS cache-line offsets (page.c). The slab
 * costs address space only: the block reaches at most one OS page into it. */
#include "internal.h"

uint32_t hk_class_size[HK_NCLASSES];
uint8_t hk_class_slabs[HK_NCLASSES];
uint8_t hk_class_colored[HK_NCLASSES];
uint8_t hk_class_lut[(HK_LUT_MAX + 7) / 8 + 1];
uint8_t hk_class_lut_first[HK_NCLASSES]; /* first slot of hk_class_lut holding each class */
uint8_t hk_class_foreign_max[HK_NCLASSES];

static unsigned span_for(uint32_t bs) {
  if (bs <= 8192) return 1;
  unsigned best = 0;
  uint64_t best_waste = UINT64_MAX;
  unsigned nmin = (unsigned)((bs + HK_SLAB_SIZE - 1) / HK_SLAB_SIZE);
  for (unsigned n = nmin; n <= HK_MAX_SPAN_SLABS; n++) {
    uint64_t span = (uint64_t)n * HK_SLAB_SIZE;
    uint64_t blocks = span / bs;
    uint64_t waste = span - blocks * bs;
    /* compare waste as a fraction of the span: waste/span < best/bestspan */
    if (best == 0 || waste * ((uint64_t)best * HK_SLAB_SIZE) < best_waste * span) {
      best = n;
      best_waste = waste;
    }
    if (waste == 0) break;
  }
  return best;
}

void hk_sizeclass_init(void) {
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    uint32_t size;
    if (c < 16) {
      size = 8 * (c + 1);
    } else {
      unsigned b = 7 + (c - 16) / 8, sub = (c - 16) % 8;
      size = (uint32_t)((8 + sub + 1) << (b - 3));
    }
    hk_class_size[c] = size;
    unsigned n = span_for(size);
    if (size > 8192 && (uint64_t)n * HK_SLAB_SIZE / size == 1 &&
        (uint64_t)n * HK_SLAB_SIZE - size < (uint64_t)HK_COLORS * 64 && n < HK_MAX_SPAN_SLABS) {
      n++;
      hk_class_colored[c] = 1;
    }
    hk_class_slabs[c] = (uint8_t)n;
    /* remote.c links cached blocks through their second word */
    uint32_t fmax = HK_FOREIGN_CLASS_BYTES / size;
    hk_class_foreign_max[c] = (uint8_t)(size < 16 ? 0 : fmax > 64 ? 64 : fmax);
  }
  hk_class_lut[0] = 0;
  for (size_t i = 1; i < sizeof(hk_class_lut); i++) {
    size_t size = i * 8; /* (size + 7) >> 3 == i for sizes in (8i-8, 8i] */
    unsigned c = 0;
    while (hk_class_size[c] < size) c++;
    hk_class_lut[i] = (uint8_t)c;
  }
  for (unsigned c = 0; c < HK_NCLASSES; c++) hk_class_lut_first[c] = sizeof(hk_class_lut) - 1;
  for (size_t i = sizeof(hk_class_lut); i-- > 0;) hk_class_lut_first[hk_class_lut[i]] = (uint8_t)i;
}
