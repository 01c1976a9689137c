/* The inline operations on hakmem's structures (types.h): size-class
 * lookup, free-list links, the page record's `used` states, and the
 * lookups free() makes from a pointer to its region, page and block. */
#ifndef HK_BLOCK_H
#define HK_BLOCK_H

#include "types.h"
#include "sync.h"
#include "debug.h"

#pragma GCC visibility push(hidden)

/* the tables and globals these operations read */
extern bool hk_secure;                /* HAKMEM_SECURE >= 1, fixed at initialisation */
extern bool hk_secure_zero;           /* HAKMEM_SECURE == 2 */
extern bool hk_thread_stats;          /* HAKMEM_THREAD_STATS, fixed at initialisation (inspect.c) */
extern bool hk_free_checks;           /* hk_secure, or the profiler on: hk_free_to_cache and a page's
                                         emptying have more to do (remote.c, queue.c); one test for both */
extern char *hk_arena_base;
extern _Atomic(_Atomic uint64_t *) hk_region_map[HK_MAP_LEAVES];
extern _Atomic size_t hk_arena_slots; /* reserved region slots, slot 0 included */
extern _Atomic bool hk_arena_shrunk;
extern _Atomic uint64_t hk_arena_holes[HK_ARENA_REGIONS / 64];

/* ---- size classes ---- */
HK_INLINE unsigned hk_size_class(size_t size) {
  if (HK_LIKELY(size <= HK_LUT_MAX)) return hk_class_lut[(size + 7) >> 3];
  unsigned b = 63u - (unsigned)__builtin_clzl(size - 1); /* 2^b < size <= 2^(b+1) */
  unsigned sub = (unsigned)((size - 1) >> (b - 3)) & 7u;
  return HK_SMALL_CLASSES + (b - 7u) * 8u + sub;
}


/* ---- free lists ---- */
HK_INLINE hk_block *hk_link_next(const hk_block *b, uintptr_t key) {
  return (hk_block *)(b->link ^ key);
}
HK_INLINE void hk_link_set(hk_block *b, const hk_block *next, uintptr_t key) {
  b->link = (uintptr_t)next ^ key;
}

/* A list ends at any address whose low 22 bits (HK_REGION_SHIFT) are zero: NULL, or the base
 * of the list's region (slab 0 never holds blocks). Lists end in their
 * region's base, so every free block's link decodes to an address in the
 * block's own 4 MiB region, which is what hk_looks_free tests. */
HK_INLINE bool hk_list_end(const hk_block *b) { return ((uintptr_t)b & HK_REGION_MASK) == 0; }

/* ---- a page's `used` count and states ---- */
HK_INLINE int32_t hk_used_base(int32_t v) {
  return v < -(1 << 29) ? HK_USED_FULL : v >= (1 << 29) ? HK_USED_CURRENT : HK_USED_NORMAL;
}
/* blocks handed out */
HK_INLINE uint32_t hk_page_used(const hk_page *page) {
  int32_t v = (int32_t)page->used;
  return (uint32_t)(v - hk_used_base(v));
}
HK_INLINE bool hk_page_parked(const hk_page *page) { return (int32_t)page->used < -(1 << 29); }
HK_INLINE bool hk_page_is_current(const hk_page *page) { return (int32_t)page->used >= (1 << 29); }
/* Move the page to state `base` (one of HK_USED_*), keeping its count. */
HK_INLINE void hk_page_set_state(hk_page *page, int32_t base) {
  hk_assert(base == HK_USED_NORMAL || base == HK_USED_FULL || base == HK_USED_CURRENT);
  hk_assert(hk_page_used(page) <= page->capacity);
  page->used = (uint32_t)((int32_t)hk_page_used(page) + base);
}
HK_INLINE unsigned hk_page_state(hk_page *page) {
  return (unsigned)(hk_load_acquire(&page->remote) & HK_REMOTE_STATE_MASK);
}
/* Record what a page about to be parked full has handed out (before the CAS
 * that parks it publishes it). */
HK_INLINE void hk_page_park_note(hk_page *page, uint32_t used) {
  uint64_t parks = hk_load_relaxed(&page->park) >> 32;
  hk_store_relaxed(&page->park, (parks + 1) << 32 | used);
}

/* b, the head of the page's free list, is a carved block of the page
 * (hk_is_carved_block), for its owner. The owner reads carved_bound
 * plainly (hk_load_owned): it writes the bound itself as it carves, and
 * the only other writer, a remote freer giving a parked page back
 * (remote.c), clears it on a page that is nobody's current page, which
 * its owner takes up again only after seeing the page's state change
 * (hk_page_reclaimed). False for the list's end (the region base lies below the page's start)
 * and for what a corrupted link decodes to: an address near the block
 * (a few bytes of the link changed) that is not a carved block start fails
 * it exactly; a link overwritten whole decodes, through the key, to a
 * random address, whose low 32 bits pass with odds of about capacity in
 * 2^32. Checked before the block's own link is read, so no corrupted link
 * is followed. */
HK_INLINE bool hk_list_head_ok(const hk_page *page, const hk_block *b) {
  uint32_t off = (uint32_t)((uintptr_t)b - page->start);
  return (uint64_t)off * page->div_magic < hk_load_owned(&page->carved_bound);
}

/* Take the first block of the page's free list, which is not empty, as a
 * live block. */
HK_INLINE hk_block *hk_page_pop(hk_page *page) {
  hk_block *b = page->free;
  hk_assert(!hk_list_end(b));
  page->free = hk_link_next(b, page->free_key);
  b->link = 0; /* a live block must not look free (hk_looks_free) */
  page->used++;
  return b;
}

/* Put live blocks back on their page's free list (n of them, linked from
 * first to last). True when the slow path has work: the page emptied, or it
 * is parked full (see HK_USED_NORMAL). */
HK_INLINE bool hk_page_push_run(hk_page *page, hk_block *first, hk_block *last, uint32_t n, uintptr_t key) {
  hk_assert(hk_page_used(page) >= n); /* more blocks back than were handed out */
  hk_link_set(last, page->free, key);
  page->free = first;
  page->used -= n;
  return HK_UNLIKELY((int32_t)page->used < 0);
}
HK_INLINE bool hk_page_push(hk_page *page, hk_block *b, uintptr_t key) { return hk_page_push_run(page, b, b, 1, key); }

/* ---- from an address to its region and page ----
 * Small regions come from one reservation of address space, the arena.
 * The page table has an entry for each 64 KiB slab of the HK_ARENA_SLABS
 * (64 GiB) from hk_arena_base: the offset from hk_arena_base of the hk_page
 * serving it, so free() finds a block's page with one subtraction, one
 * shift and one load. The table (8 MiB) is mapped just below the arena, in
 * the same reservation, so that the load is addressed from hk_arena_base
 * alone. An entry of 0 (a slab no page has used) leads to
 * offset 0, which is never a page: the arena's first region slot is left
 * unused, its header reading as zeros, i.e. "not a live page" (bound 0).
 * Stale entries are harmless: a slab's entry is rewritten whenever a span
 * takes it, and an entry that still names an old head page either finds it
 * not live or finds the pointer outside that page's carved blocks.
 * Regions that do not fit in the arena are mapped anywhere; free() takes
 * the slow path for them (hk_region_map, below). Until the arena is
 * reserved (and if it never is), hk_arena_base is 2^63 (arena.c), so the
 * same lookup finds every user address outside the arena. */
void hk_region_init(void); /* the arena and the number of region lists */

/* The slab index of p in the page table's range (>= HK_ARENA_SLABS: outside). */
HK_INLINE uintptr_t hk_arena_slab(uintptr_t p) { return (p - (uintptr_t)hk_arena_base) >> HK_SLAB_SHIFT; }
HK_INLINE _Atomic uintptr_t *hk_page_table(void) {
  return (_Atomic uintptr_t *)(hk_arena_base - HK_PAGE_TABLE_BYTES);
}
HK_INLINE hk_page *hk_arena_page(uintptr_t slab) {
  return (hk_page *)(hk_arena_base + hk_load_relaxed(&hk_page_table()[slab]));
}

/* ---- ownership map: one bit per 4 MiB of address space ----
 * In leaves of 2^HK_MAP_LEAF_SHIFT bits (32 KiB, 1 TiB of address space
 * each), made when a mapping first lands in their range (arena.c): a flat
 * bitmap of the 256 TiB would be 8 MiB of .bss, which counts against
 * RLIMIT_AS and RLIMIT_DATA whether touched or not. */

HK_INLINE bool hk_region_is_ours(uintptr_t p) {
  uintptr_t idx = p >> HK_REGION_SHIFT;
  if (HK_UNLIKELY(idx >> HK_MAP_BITS)) return false;
  _Atomic uint64_t *leaf = hk_load_acquire(&hk_region_map[idx >> HK_MAP_LEAF_SHIFT]);
  if (leaf == NULL) return false;
  uint64_t w = hk_load_relaxed(&leaf[(idx & (((uintptr_t)1 << HK_MAP_LEAF_SHIFT) - 1)) >> 6]);
  return (w >> (idx & 63)) & 1;
}

/* The 4 MiB unit p lies in: a region's (or large mapping's) first byte. */
HK_INLINE uintptr_t hk_region_base(const void *p) { return (uintptr_t)p & ~HK_REGION_MASK; }

/* Where a region's header (hk_region) lies. A large mapping's, and a small
 * region's outside the arena, at its base. A small region in the arena
 * moves its header into slab 0 (which serves no page), hk_header_step
 * times one more than its slot number mod hk_header_spots from the base
 * (8 KiB and 6 spots with 4 KiB pages: types.h), and the rest of slab 0
 * stays inaccessible (region.c): no overflow off the end of the region
 * before, nor underflow off the start of the region's blocks, reaches the
 * header without faulting first. (With pages of 32 KiB or more the header
 * stays at the base, and guard pages at the region's end, and with 64 KiB
 * ones in slab 1, take that role: region.c.) At the base of every region, the page
 * records of all regions would share the same sets of the L2 and L3 (their
 * index bits stop below 4 MiB), and free(), which reads the record of the
 * freed block's page, would miss the cache on conflicts between regions.
 * Moved are the regions in the arena's reserved slots: slot
 * below hk_arena_slots, and not a hole, i.e. a slot given back under an
 * address-space limit (arena.c, hk_arena_shrink), where a large mapping or
 * a region mapped anywhere may land later with its header at its base. A
 * slot's state never changes while it holds something, so a header is
 * found where it was put. The hole bitmap is written (and read) only after
 * such a shrink: no page of it is touched otherwise.
 * The header (8 KiB: the page array) stays 8 KiB-aligned, so a page
 * record finds its header and slab by masking (hk_page_region). */
HK_INLINE uintptr_t hk_region_header_offset(uintptr_t base) {
  uintptr_t slot = (base - (uintptr_t)hk_arena_base) >> HK_REGION_SHIFT;
  if (slot >= hk_load_relaxed(&hk_arena_slots)) return 0;
  if (HK_UNLIKELY(hk_load_relaxed(&hk_arena_shrunk)) &&
      (hk_load_relaxed(&hk_arena_holes[slot / 64]) >> (slot % 64)) & 1)
    return 0;
  return (slot % hk_header_spots + 1) * hk_header_step;
}
HK_INLINE hk_region *hk_region_of(const void *p) {
  uintptr_t base = hk_region_base(p);
  return (hk_region *)(base + hk_region_header_offset(base));
}
/* The header a page record lies in, and the record's slab. */
HK_INLINE hk_region *hk_page_region(const hk_page *page) {
  return (hk_region *)((uintptr_t)page & ~(uintptr_t)(sizeof(hk_region) - 1));
}
HK_INLINE unsigned hk_page_slab(const hk_page *page) {
  return (unsigned)(((uintptr_t)page & (sizeof(hk_region) - 1)) / sizeof(hk_page));
}

/* The first byte of a page's span, and its length. */
HK_INLINE uintptr_t hk_page_span_start(const hk_page *page) {
  return hk_region_base(page) + (uintptr_t)hk_page_slab(page) * HK_SLAB_SIZE;
}
HK_INLINE uint32_t hk_page_span_bytes(const hk_page *page) { return (uint32_t)page->nslabs << HK_SLAB_SHIFT; }

/* The page a block lives in (valid once the region is known to be ours). */
HK_INLINE hk_page *hk_page_of(hk_region *r, const void *p) {
  /* slab index * 128 in two instructions: shift, mask */
  uintptr_t off = ((uintptr_t)p >> (HK_SLAB_SHIFT - HK_PAGE_SHIFT)) & ((uintptr_t)(HK_SLABS - 1) << HK_PAGE_SHIFT);
  hk_page *meta = (hk_page *)((char *)r + off);
  return (hk_page *)((char *)meta - meta->back);
}

/* The page of a block hakmem handed out (live, stashed or cached): inside
 * the arena, one load from the page table instead of the region's
 * header. */
HK_INLINE hk_page *hk_block_page(const void *b) {
  uintptr_t slab = hk_arena_slab((uintptr_t)b);
  return HK_LIKELY(slab < HK_ARENA_SLABS) ? hk_arena_page(slab) : hk_page_of(hk_region_of(b), b);
}

/* The carved blocks' bytes (the owner's view: capacity is its own). */
HK_INLINE uint32_t hk_page_area(const hk_page *page) { return page->capacity * page->block_size; }

/* What a block of the page holds for the program (default mode): a padded
 * class's pad is not the program's (sizeclass.c). */
HK_INLINE size_t hk_page_usable(const hk_page *page) {
  return page->block_size == hk_class_block[page->cls] ? hk_class_size[page->cls] : page->block_size;
}

/* A block whose first word decodes to an address in its own region looks
 * free already (a double free, unless user data matches by construction);
 * live blocks start with 0 (malloc clears the link) or user data, which
 * decodes to garbage because page keys are random with their high bits set. A
 * free block's link is (next ^ key), next in the block's region, so
 * link ^ key ^ region base, i.e. link ^ free_check, is below 2^22. */
HK_INLINE bool hk_looks_free(const hk_page *page, const hk_block *b) {
  return ((b->link ^ page->free_check) >> HK_REGION_SHIFT) == 0;
}

/* The test of a block start is one multiply (Lemire, Kaser and Kurz,
 * "Faster remainder by direct computation", 2019). With
 * magic = floor(2^64 / bs) + 1, bs * magic = 2^64 + e for some
 * 0 < e <= bs. For off < 2^32, off * magic mod 2^64 is k * e when
 * off = k * bs (below 2^32, as k * bs < 2^32), and at least magic (above
 * 2^43 for blocks up to 2 MiB) when bs does not divide off. So the product
 * is below magic exactly for multiples of bs, and below
 * (capacity - 1) * e + 1, the page's carved_bound, exactly for the starts
 * of the capacity blocks carved so far: free()'s range test and block test
 * in one compare. */
HK_INLINE uint64_t hk_div_magic(uint32_t bs) {
  uint64_t m = UINT64_MAX / bs + 1; /* ceil(2^64 / bs), e = 0 for a power of two */
  return (bs & (bs - 1)) == 0 ? m + 1 : m;
}
HK_INLINE void hk_page_set_carved(hk_page *page) {
  uint64_t e = page->div_magic * page->block_size; /* mod 2^64 */
  uint32_t cap = page->capacity;
  hk_store_relaxed(&page->carved_bound, cap == 0 ? 0 : (uint64_t)(cap - 1) * e + 1);
}
/* No block of the page can be freed any more (not a live page). */
HK_INLINE void hk_page_clear_carved(hk_page *page) {
  hk_store_relaxed(&page->carved_bound, 0);
}

/* p - page->start is a multiple of the block size (off < 2^32). */
HK_INLINE bool hk_is_block_start(const hk_page *page, uint32_t off) {
  return (uint64_t)off * page->div_magic < page->div_magic;
}

/* a is the start of a block of page carved so far. a - page->start is
 * taken mod 2^32, which is exact when a and the page lie in one 4 MiB
 * region (|a - start| < 2^22: a pointer below start wraps to at least
 * 2^32 - 2^22, no carved offset) or the page is not live (bound 0): true
 * of a page found through the page table or hk_page_of. */
HK_INLINE bool hk_is_carved_block(const hk_page *page, uintptr_t a) {
  uint32_t off = (uint32_t)(a - page->start);
  return (uint64_t)off * page->div_magic < hk_load_relaxed(&((hk_page *)page)->carved_bound);
}


/* ---- owners ----
 * Hardened mode stores a page's owner with bit 0 set, so that free's fast
 * path never matches it and every free takes the slow path's checks. */
HK_INLINE hk_heap *hk_owner_tag(hk_heap *h) { return hk_secure ? (hk_heap *)((uintptr_t)h | 1) : h; }
HK_INLINE hk_heap *hk_owner_untag(hk_heap *h) { return (hk_heap *)((uintptr_t)h & ~(uintptr_t)1); }
/* A page owner's kind, read by a freeing thread: the owner it read may be
 * a heap that a new thread is taking meanwhile (heaps are never unmapped;
 * a stale answer sends the block the slower way), so kind is written and
 * read as a relaxed atomic. */
HK_INLINE uint32_t hk_owner_kind(const hk_heap *owner) { return __atomic_load_n(&owner->kind, __ATOMIC_RELAXED); }

/* The first word of a block that is neither live nor on a free list (in a
 * remote freer's cache, remote.c; dropped with a lent slab, lend.c): it
 * looks free to hk_looks_free, and a free of it is a double free. */
#define HK_FOREIGN_TAG 16 /* inside slab 0, never a block, never a list end */
/* page->key ^ (the region base + HK_FOREIGN_TAG), from the page's own
 * free_check (key ^ base: the base's low bits are clear, so + is ^) */
HK_INLINE uintptr_t hk_foreign_tag(const hk_page *page) { return page->free_check ^ HK_FOREIGN_TAG; }
HK_INLINE bool hk_foreign_tagged(const hk_page *page, const hk_block *b) { return b->link == hk_foreign_tag(page); }

/* ---- page geometry ---- */
/* Slabs (0 or 1) that a page of class cls and nslabs slabs has for its
 * colour: 1 for a class that gets one, in a span of the class's own length
 * (a realloc span block of the same class is a slab shorter) */
HK_INLINE unsigned hk_color_slabs(unsigned cls, unsigned nslabs) {
  return hk_class_colored[cls] == HK_COLORED_SLAB && nslabs == hk_class_slabs[cls] && !hk_secure;
}
/* Such a page's block starts at a colour offset (with or without a slab for it) */
HK_INLINE bool hk_colored_page(unsigned cls, unsigned nslabs) {
  return hk_class_colored[cls] && nslabs == hk_class_slabs[cls];
}
/* A page of one block that fills its span (but a colour slab): realloc
 * resizes it in place (queue.c, hk_heap_resize_span_block). */
HK_INLINE bool hk_span_block(const hk_page *page) {
  return page->reserved == 1 &&
         page->block_size + (hk_color_slabs(page->cls, page->nslabs) << HK_SLAB_SHIFT) == hk_page_span_bytes(page);
}
/* A page of one block of a class coloured inside its span (112-480 KiB,
 * but the classes of whole slabs): realloc shrinks it in place into a span
 * block of a class coloured with a slab, its colour offset kept. */
HK_INLINE bool hk_colored_in_span(const hk_page *page) {
  return hk_class_colored[page->cls] == HK_COLORED_IN_SPAN && page->nslabs == hk_class_slabs[page->cls] && !hk_secure;
}
/* hk_page_extend carves the blocks of HK_EXTEND_BYTES at a time, or one */
#define HK_EXTEND_BYTES (4u << 10)
HK_INLINE uint32_t hk_extend_blocks(uint32_t block_size) {
  return block_size < HK_EXTEND_BYTES ? HK_EXTEND_BYTES / block_size : 1;
}

#pragma GCC visibility pop

#endif /* HK_BLOCK_H */
