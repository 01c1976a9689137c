/* hakmem internal definitions: the data structures every file shares.
 *
 * Memory layout (see docs/DESIGN.md for the full picture):
 *
 *   region (4 MiB, 4 MiB-aligned)
 *   +--------+--------+--------+-----+--------+
 *   | slab 0 | slab 1 | slab 2 | ... | slab 63|   slab = 64 KiB
 *   +--------+--------+--------+-----+--------+
 *     header   pages of blocks: a page is a span of 1..17 slabs
 *     (hk_region with one hk_page per slab, 8 KiB; only the records of
 *     slabs in use are touched)
 *
 *   large block (> 1 MiB, or alignment > 64 KiB): its own 4 MiB-aligned
 *   mapping, header in the first 4 KiB, user data after it.
 *
 * free() finds a block's page in the page table of the arena, the address
 * space reservation small regions come from (see below); a bitmap with one
 * bit per 4 MiB of address space says whether any other address is ours
 * (large blocks, regions outside the arena).
 */
#ifndef HK_INTERNAL_H
#define HK_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>
#if defined(__has_include)
#if __has_include(<sys/single_threaded.h>)
#include <sys/single_threaded.h>
#define HK_HAVE_SINGLE_THREADED 1
#endif
#endif

/* Everything declared below is internal to the library. -fvisibility=hidden
 * covers only definitions; declaring the globals hidden too lets the fast
 * paths load them directly (mov sym(%rip)) instead of through the GOT. */
#pragma GCC visibility push(hidden)

#define HK_LIKELY(x) __builtin_expect(!!(x), 1)
#define HK_UNLIKELY(x) __builtin_expect(!!(x), 0)
#define HK_INLINE static inline __attribute__((always_inline))
#define HK_NOINLINE __attribute__((noinline))
#define HK_COLD __attribute__((cold, noinline))
#define HK_API __attribute__((visibility("default")))
/* The entry points that inline a fast path start on a 256-byte boundary,
 * so that their speed does not depend on where unrelated changes happen to
 * place them. At the same instruction counts, tiny_hot and mem_16b moved
 * 4-5 % with malloc and free 16- instead of 32-byte aligned (2026-11-25),
 * and tiny_hot lost 28 % with malloc at page offset 0x380 and free at 0x440
 * (64-byte aligned, after an unrelated change elsewhere; 2026-11-26): its
 * samples sat on free's loads of the page record, as if a predictor indexed
 * by the code's address made them wait for earlier stores. Of six
 * placements 64 bytes apart that one was slow; nine on 256-byte boundaries
 * (four tried on purpose) were all as fast as the best. +1.2 KiB of text. */
#define HK_HOT __attribute__((aligned(256)))

/* ---- geometry ---- */
/* 4 MiB regions (2 MiB until 2026-11-26): with the region lists, a
 * thread's spans of 64 KiB-1 MiB find a fitting free run in fewer regions,
 * and the free runs are longer (big_mixed without spares 3.87 -> 4.56
 * Mops/s, peak RSS 79.9 -> 73.9 MiB; 5-run A/B). */
#define HK_REGION_SHIFT 22
#define HK_REGION_SIZE ((uintptr_t)1 << HK_REGION_SHIFT)
#define HK_REGION_MASK (HK_REGION_SIZE - 1)
#define HK_SLAB_SHIFT 16
#define HK_SLAB_SIZE ((uintptr_t)1 << HK_SLAB_SHIFT)
#define HK_SLABS (1 << (HK_REGION_SHIFT - HK_SLAB_SHIFT)) /* per region; slab 0 holds the header */
typedef uint64_t hk_slabmask;            /* one bit per slab of a region */
_Static_assert(HK_SLABS <= 64, "a region's slabs fit in a mask");
#define HK_REGION_LISTS_MIN 8            /* region lists of a lock each: one per CPU the process */
#define HK_REGION_LISTS_MAX 64           /* may run on, within these bounds (region.c) */
#define HK_MAX_SPAN_SLABS 16             /* largest page: 1 MiB */
#define HK_OS_PAGE 4096
#define HK_LARGE_HEADER 4096             /* bytes before a large block's data */
#define HK_SPARE_MAX ((uint32_t)16 << 20)  /* empty spans a heap keeps for reuse (see heap.c) */
#define HK_SPARE_BYTES ((uint32_t)2 << 20) /* ... of which it keeps after a purge delay or a growth purge */
#define HK_HELD_BYTES ((uint32_t)2 << 20)  /* emptied pages a heap keeps in their class queues (carved bytes) */

/* Address space covered by the ownership bitmap (48-bit user space). */
#define HK_VA_BITS 48
#define HK_MAP_BITS (HK_VA_BITS - HK_REGION_SHIFT)

/* ---- size classes ----
 * 8 B, then 16-byte steps up to 128 B (classes 0..8), then 8 classes per
 * power of two (12.5 % apart) up to 1 MiB (classes 9..112): HK_NSIZES
 * classes that sizes map to. Every block above 8 B is 16-aligned, as
 * glibc's are: C++ compilers assume operator new's result is aligned to
 * __STDCPP_DEFAULT_NEW_ALIGNMENT__ (16) and store to it with aligned SSE
 * moves, and C programs rely on malloc's 16. The blocks of the classes
 * from 9 to 60 KiB lie HK_CLASS_PAD bytes apart more than their size
 * (sizeclass.c), and each of them has a twin class without that pad, for
 * aligned allocation only: HK_NCLASSES classes in all. */
#define HK_SMALL_MAX 128
#define HK_SMALL_CLASSES 9               /* 8, 16, 32, ..., 128 */
#define HK_LUT_MAX 1024                  /* sizes served by the lookup table */
#define HK_MEDIUM_MAX ((size_t)1 << 20)  /* largest size-class block */
#define HK_NSIZES 113
#define HK_PAD_FIRST 57                  /* 9 KiB: the first class of pages of several slabs */
#define HK_PAD_LAST 79                   /* 60 KiB: the last class with pages of several blocks */
#define HK_CLASS_PAD 64
#define HK_NCLASSES (HK_NSIZES + HK_PAD_LAST - HK_PAD_FIRST + 1)
#define HK_MAX_ALIGN_CLASS ((size_t)64 << 10) /* larger alignments go to the large tier */

extern uint32_t hk_class_size[HK_NCLASSES];  /* what a block of the class holds (requests up to it) */
extern uint32_t hk_class_block[HK_NCLASSES]; /* how far apart its blocks lie: the size, or size + HK_CLASS_PAD */
extern uint8_t hk_class_twin[HK_NCLASSES];   /* a padded class's twin (0: none) */
extern uint8_t hk_class_slabs[HK_NCLASSES];
/* Non-zero: the class's pages hold one block that starts at one of
 * HK_COLORS cache-line offsets into its span (page.c); the span has a slab
 * more for that (HK_COLORED_SLAB) or wastes 4 KiB or more anyway */
extern uint8_t hk_class_colored[HK_NCLASSES];
enum { HK_COLORED_SLAB = 1, HK_COLORED_IN_SPAN = 2 };
#define HK_COLORS 64
extern uint8_t hk_class_lut[(HK_LUT_MAX + 7) / 8 + 1];
extern uint8_t hk_class_lut_first[HK_NCLASSES];
extern uint8_t hk_class_cache_max[HK_NCLASSES]; /* remote.c's thread cache per class, in blocks (0: none) */

HK_INLINE unsigned hk_size_class(size_t size) {
  if (HK_LIKELY(size <= HK_LUT_MAX)) return hk_class_lut[(size + 7) >> 3];
  unsigned b = 63u - (unsigned)__builtin_clzl(size - 1); /* 2^b < size <= 2^(b+1) */
  unsigned sub = (unsigned)((size - 1) >> (b - 3)) & 7u;
  return HK_SMALL_CLASSES + (b - 7u) * 8u + sub;
}

/* ---- blocks and free lists ----
 * A free block's first word links to the next free block, XOR-ed with its
 * page's secret key (hk_key mixed with the page address and a counter). The encoding lets free() recognise a block
 * that is already free with one compare (see hk_looks_free), and keeps a
 * stray user write from being followed as a valid pointer. */
typedef struct hk_block { uintptr_t link; } hk_block;
extern uintptr_t hk_key;

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

/* ---- pages ----
 * A page is a span of slabs serving one size class for one heap. The owner
 * thread uses `free`, `used` and `capacity` without atomics; other threads
 * only push onto `remote` (one CAS). The low two bits of `remote` hold the
 * page's state, so a remote freer learns atomically whether the owner needs
 * a hint (page parked as full) or nobody owns it (abandoned), and can swap
 * the stack of a parked page it finds all free for "reclaimed" (remote.c);
 * the top 16 bits count the stack's blocks. */
enum { HK_PAGE_NORMAL = 0, HK_PAGE_FULL = 1, HK_PAGE_ABANDONED = 2, HK_PAGE_RECLAIMED = 3 };

#define HK_REMOTE_STATE_MASK ((uintptr_t)3)
/* bits 2..47: the top block of the stack; bits 48..63: how many blocks it
 * holds, so the owner can take the whole stack without walking it */
#define HK_REMOTE_COUNT_SHIFT 48
#define HK_REMOTE_PTR_MASK ((((uintptr_t)1 << HK_REMOTE_COUNT_SHIFT) - 1) & ~HK_REMOTE_STATE_MASK)

struct hk_heap;

/* 128 bytes in two cache lines, split by who writes them. The first is
 * fixed while the page serves a class: everything free() reads to validate
 * a pointer and find the owner, read by every thread that frees into the
 * page. The second is the owner's free list and count (malloc touches only
 * this line) and the remote stack. Other threads' frees thus never read a
 * line the owner keeps writing: with both in one line, every remote free
 * was a cache miss on it (larson). */
typedef struct hk_page {
  /* bytes 0..15 are read for any slab index, including slab 0, whose slot
   * holds the region header instead (zero there, see hk_region) */
  _Atomic uint64_t carved_bound; /* free()'s test of a block start, see hk_is_carved_block;
                                    0: no block carved, or not a live page. Grows while other
                                    threads may read it (relaxed: a plain load) */
  uint16_t back;             /* in a span's later slabs: bytes back to the head slab's hk_page */
  uint8_t nslabs;            /* in a head slab: span length */
  uint8_t cls;
  uint32_t block_size;
  uintptr_t start;           /* first block */
  uint64_t div_magic;        /* hk_div_magic(block_size): the divisibility test's multiplier */
  _Atomic(struct hk_heap *) heap; /* owner; NULL while abandoned */
  uintptr_t key;             /* this page's free-list encoding key */
  uintptr_t free_check;      /* key ^ the region's base: see hk_looks_free */
  uint16_t reserved;         /* blocks that fit in the span */
  uint16_t lent;             /* bit k: the span's slab k is lent back to its region while the page
                                lives (heap.c, lend_free_slabs); never bit 0 */
  _Atomic uint8_t reclaiming; /* a remote freer is giving the parked page back (remote.c) */
  uint8_t untrimmed;         /* heap.c: its span beyond the carved blocks may hold memory to purge */
  uint8_t held;              /* heap.c: an empty page left in its class's queue, in held_bytes */
  uint8_t pad0[1];
  /* second cache line */
  hk_block *free;            /* owner's free list */
  uint32_t used;             /* blocks handed out and not yet returned to `free`, plus a base
                                that says whether the page is parked or current (see below) */
  uint32_t capacity;         /* blocks carved so far (rest is untouched memory) */
  uintptr_t free_key;        /* = key, for malloc, which reads only this line */
  _Atomic uintptr_t remote;  /* remote-free stack | state */
  struct hk_page *next, *prev; /* heap queue, full list or abandoned list */
  uint64_t idle_ms;          /* abandoned and empty since (0: not empty), heap.c */
  _Atomic uint64_t park;     /* parked full: (parks so far << 32) | blocks handed out (remote.c) */
} hk_page;

_Static_assert(sizeof(hk_page) == 128, "hk_page is two cache lines");
_Static_assert(HK_SLAB_SIZE / 8 <= UINT16_MAX, "reserved fits a slab of the smallest blocks");

/* `used` is the count of blocks handed out plus a base that depends on the
 * page's state, chosen so that free's one test, "(int32_t)--used < 0"
 * (compiled to a subtract in memory and a sign jump, where "<= 0" took five
 * instructions), fires exactly when the slow path has work:
 *   HK_USED_NORMAL  -1: the count going to 0 makes it negative (page empty);
 *   HK_USED_FULL    -2^30: always negative: the page is parked on the full
 *                   list and must rejoin its queue;
 *   HK_USED_CURRENT 2^30 - 1: never negative: a single-slab page that is its
 *                   class's current page just stays when it runs empty (with
 *                   a few live blocks per class, as in thread_scaling's 64
 *                   blocks over 23 classes, 6.5 % of frees made that call).
 * A page holds at most 2^17 blocks, so the three ranges never meet. */
#define HK_USED_NORMAL (-1)
#define HK_USED_FULL (-(1 << 30))
#define HK_USED_CURRENT ((1 << 30) - 1)
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
  page->used = (uint32_t)((int32_t)hk_page_used(page) + base);
}
_Static_assert(offsetof(hk_page, pad0) + sizeof(((hk_page *)0)->pad0) == 64 && offsetof(hk_page, free) == 64, "the two lines");

HK_INLINE unsigned hk_page_state(hk_page *page) {
  return (unsigned)(atomic_load_explicit(&page->remote, memory_order_acquire) & HK_REMOTE_STATE_MASK);
}
/* Record what a page about to be parked full has handed out (before the CAS
 * that parks it publishes it). */
HK_INLINE void hk_page_park_note(hk_page *page, uint32_t used) {
  uint64_t parks = atomic_load_explicit(&page->park, memory_order_relaxed) >> 32;
  atomic_store_explicit(&page->park, (parks + 1) << 32 | used, memory_order_relaxed);
}
/* An owner that has not looked for a page for this long is idle: a parked
 * page of its that remote frees empty is given back by the last freer. */
#define HK_IDLE_OWNER_MS 10

/* ---- regions ----
 * The header is the page array. Slab 0 holds the header itself, so
 * pages[0] never describes a page; its slot carries the region's own fields
 * instead, after 16 zero bytes that overlay pages[0].carved_bound and
 * .back so that free() of a pointer into slab 0 (a large block's data, or
 * garbage) sees "not a live page". */
#define HK_MAGIC_REGION 0x686b7267u /* "hkrg" */
enum { HK_KIND_SMALL = 1, HK_KIND_LARGE = 2 };
enum { HK_LARGE_LIVE = 1, HK_LARGE_CACHED = 2 };

typedef struct hk_region {
  union {
    hk_page pages[HK_SLABS];
    struct {
      uint64_t zero_guard[2];    /* = pages[0].carved_bound/back/nslabs/cls/block_size: always 0 */
      uint32_t magic;
      uint32_t kind;
      struct hk_region_info *info; /* small regions: the span search's view (region.c) */
      /* large blocks (large.c) */
      struct hk_region *next, *prev; /* the cache, or the detached list */
      size_t map_size;           /* bytes mapped from the region base */
      size_t user_offset;        /* data starts at base + user_offset */
      size_t user_size;          /* bytes requested */
      uint32_t large_state;
      uint16_t large_zero;       /* data is known to be zero (fresh mapping) */
      uint16_t large_detached;   /* alignment >= 4 MiB: data is outside the header's
                                    4 MiB unit; found through a list, not the bitmap */
      size_t cached_resident;    /* in the cache: data bytes still committed (0 once purged) */
      size_t block_end;          /* live: the block's usable bytes end at base + block_end; a
                                    mapping reused whole keeps its tail beyond for a larger block */
    };
  };
} hk_region;

_Static_assert(sizeof(hk_page) <= HK_LARGE_HEADER, "a large block's header (slot 0) must fit in its 4 KiB");
_Static_assert(offsetof(hk_region, block_end) + 8 <= sizeof(hk_page), "region fields fit in slot 0");
_Static_assert(sizeof(hk_region) == 8192 && 8 * sizeof(hk_region) <= HK_SLAB_SIZE, "a moved header stays in slab 0 (hk_region_of)");

/* ---- the arena and its page table (region.c) ----
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
 * reserved (and if it never is), hk_arena_base is 2^63 (region.c), so the
 * same lookup finds every user address outside the arena. */
#define HK_ARENA_SLABS ((uintptr_t)1 << 20)
#define HK_PAGE_TABLE_BYTES (HK_ARENA_SLABS * sizeof(uintptr_t))
extern char *hk_arena_base;
void hk_region_init(void); /* the arena and the number of region lists */

/* The slab index of p in the page table's range (>= HK_ARENA_SLABS: outside). */
HK_INLINE uintptr_t hk_arena_slab(uintptr_t p) { return (p - (uintptr_t)hk_arena_base) >> HK_SLAB_SHIFT; }
HK_INLINE _Atomic uintptr_t *hk_page_table(void) {
  return (_Atomic uintptr_t *)(hk_arena_base - HK_PAGE_TABLE_BYTES);
}
HK_INLINE hk_page *hk_arena_page(uintptr_t slab) {
  return (hk_page *)(hk_arena_base + atomic_load_explicit(&hk_page_table()[slab], memory_order_relaxed));
}

/* ---- ownership map: one bit per 4 MiB of address space ----
 * In leaves of 2^HK_MAP_LEAF_SHIFT bits (32 KiB, 1 TiB of address space
 * each), made when a mapping first lands in their range (region.c): a flat
 * bitmap of the 256 TiB would be 8 MiB of .bss, which counts against
 * RLIMIT_AS and RLIMIT_DATA whether touched or not. */
#define HK_MAP_LEAF_SHIFT 18
#define HK_MAP_LEAVES ((size_t)1 << (HK_MAP_BITS - HK_MAP_LEAF_SHIFT))
extern _Atomic(_Atomic uint64_t *) hk_region_map[HK_MAP_LEAVES];

HK_INLINE bool hk_region_is_ours(uintptr_t p) {
  uintptr_t idx = p >> HK_REGION_SHIFT;
  if (HK_UNLIKELY(idx >> HK_MAP_BITS)) return false;
  _Atomic uint64_t *leaf = atomic_load_explicit(&hk_region_map[idx >> HK_MAP_LEAF_SHIFT], memory_order_acquire);
  if (leaf == NULL) return false;
  uint64_t w = atomic_load_explicit(&leaf[(idx & (((uintptr_t)1 << HK_MAP_LEAF_SHIFT) - 1)) >> 6], memory_order_relaxed);
  return (w >> (idx & 63)) & 1;
}

/* The 4 MiB unit p lies in: a region's (or large mapping's) first byte. */
HK_INLINE uintptr_t hk_region_base(const void *p) { return (uintptr_t)p & ~HK_REGION_MASK; }

/* Where a region's header (hk_region) lies. A large mapping's, and a small
 * region's outside the arena, at its base. A small region in the arena
 * moves its header into slab 0 (which serves no page), 8 KiB times its
 * slot number mod 8 from the base: at the base of every region, the page
 * records of all regions shared the same sets of the L2 and L3 (their
 * index bits stop below 4 MiB), and free(), which reads the record of the
 * freed block's page, missed the L2 on one free in four under `larson
 * 16`, 80 % of those misses conflicts (cachegrind, 1 MiB 8-way against
 * 64-way). Moved are the regions in the arena's reserved slots: slot
 * below hk_arena_slots, and not a hole, i.e. a slot given back under an
 * address-space limit (region.c, hk_arena_shrink), where a large mapping or
 * a region mapped anywhere may land later with its header at its base. A
 * slot's state never changes while it holds something, so a header is
 * found where it was put. The hole bitmap is written (and read) only after
 * such a shrink: no page of it is touched otherwise.
 * The header (8 KiB: the page array) stays 8 KiB-aligned, so a page
 * record finds its header and slab by masking (hk_page_region). */
#define HK_HEADER_SPOTS 8u
#define HK_ARENA_REGIONS (HK_ARENA_SLABS >> (HK_REGION_SHIFT - HK_SLAB_SHIFT))
extern _Atomic size_t hk_arena_slots; /* reserved region slots, slot 0 included (region.c) */
extern _Atomic bool hk_arena_shrunk;
extern _Atomic uint64_t hk_arena_holes[HK_ARENA_REGIONS / 64];
HK_INLINE uintptr_t hk_region_header_offset(uintptr_t base) {
  uintptr_t slot = (base - (uintptr_t)hk_arena_base) >> HK_REGION_SHIFT;
  if (slot >= atomic_load_explicit(&hk_arena_slots, memory_order_relaxed)) return 0;
  if (HK_UNLIKELY(atomic_load_explicit(&hk_arena_shrunk, memory_order_relaxed)) &&
      (atomic_load_explicit(&hk_arena_holes[slot / 64], memory_order_relaxed) >> (slot % 64)) & 1)
    return 0;
  return (slot % HK_HEADER_SPOTS) * sizeof(hk_region);
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

/* The page a block lives in (valid once the region is known to be ours). */
#define HK_PAGE_SHIFT 7 /* sizeof(hk_page) == 128 */
HK_INLINE hk_page *hk_page_of(hk_region *r, const void *p) {
  /* slab index * 128 in two instructions: shift, mask */
  uintptr_t off = ((uintptr_t)p >> (HK_SLAB_SHIFT - HK_PAGE_SHIFT)) & ((uintptr_t)(HK_SLABS - 1) << HK_PAGE_SHIFT);
  hk_page *meta = (hk_page *)((char *)r + off);
  return (hk_page *)((char *)meta - meta->back);
}

/* The carved blocks' bytes (the owner's view: capacity is its own). */
HK_INLINE uint32_t hk_page_area(const hk_page *page) { return page->capacity * page->block_size; }

/* A block whose first word decodes to an address in its own region looks
 * free already (a double free, unless user data matches by construction);
 * live blocks start with 0 (malloc clears the link) or user data, which
 * decodes to garbage because hk_key is random with its high bits set. A
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
  atomic_store_explicit(&page->carved_bound, cap == 0 ? 0 : (uint64_t)(cap - 1) * e + 1, memory_order_relaxed);
}
/* No block of the page can be freed any more (not a live page). */
HK_INLINE void hk_page_clear_carved(hk_page *page) {
  atomic_store_explicit(&page->carved_bound, 0, memory_order_relaxed);
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
  return (uint64_t)off * page->div_magic < atomic_load_explicit(&((hk_page *)page)->carved_bound, memory_order_relaxed);
}

/* ---- heaps: one per thread ---- */
typedef struct hk_page_queue { hk_page *first, *last; } hk_page_queue;

typedef struct hk_heap_stats {
  uint64_t pages_acquired, pages_released, pages_adopted;
  uint64_t remote_frees;   /* remote frees sent to their page: at once, or flushed from the cache */
  uint64_t cache_reused;   /* freed blocks kept in the thread cache and handed out again */
} hk_heap_stats;

/* Freed blocks a heap keeps for its own mallocs (remote.c): at most
 * this many bytes in all, and per class as hk_class_cache_max says. */
#define HK_CACHE_BYTES ((uint32_t)256 << 10)
#define HK_CACHE_CLASS_BYTES ((uint32_t)16 << 10)


#define HK_LUT_SLOTS ((HK_LUT_MAX + 7) / 8 + 1)
#define HK_GROWN_RING 16
typedef struct hk_heap {
  uint32_t cache_bytes;           /* bytes in the thread cache (cache_first[]) */
  uint32_t cache_remote;          /* blocks of other heaps put into the cache since the last
                                     check (remote.c: leaving cache mode) */
  struct hk_heap *free_owner;     /* what free's fast path finds in page->heap for a block to
                                     take its page's list: this heap, or in cache mode
                                     HK_NO_OWNER(this heap), which no page holds (remote.c);
                                     malloc's first test: is it this heap? */
  hk_page *by_size[HK_LUT_SLOTS]; /* = direct[hk_class_lut[(size + 7) >> 3]]: malloc's
                                     first load for sizes up to 1 KiB, without the table */
  hk_page *direct[HK_NCLASSES];   /* current page per class, never NULL */
  uint32_t fresh_count;           /* pages acquired, for the periodic full scan */
  uint32_t searches;              /* page searches (find_page) */
  hk_page_queue queues[HK_NCLASSES]; /* pages with (maybe) free blocks */
  hk_block *cache_first[HK_NCLASSES]; /* the thread cache of freed blocks (remote.c): each class's
                                     most recently freed first, linked through their second word */
  uint16_t cache_room[HK_NCLASSES]; /* blocks the class may still take: hk_class_cache_max less those
                                     it holds (0 in hk_heap_empty, and for a class without cache:
                                     one test for all) */
  hk_page *full;                  /* parked full pages (doubly linked) */
  uint32_t held_bytes;            /* carved bytes of held pages: held[] and pages marked held */
  uint32_t held[HK_NCLASSES];     /* the class's current page emptied and was left current:
                                     its carved bytes then (0: not so), heap.c */
  uint8_t moving;                 /* realloc is freeing the block it moved (heap.c) */
  void *grown[HK_GROWN_RING];     /* blocks this thread's realloc grew last (alloc.c) */
  uint32_t grown_next;
  uint64_t block_purge_ms;        /* next pass over free medium blocks (purge_free_blocks) */
  uint32_t growth_epoch;          /* hk_growth_epoch at that pass */
  uint32_t purge_passes;          /* passes so far */
  uint32_t purge_calls;           /* calls of the pass that may not be due (clock read on every 8th) */
  uint32_t class_searched[HK_NCLASSES]; /* purge_passes at the class's last page search */
  struct hk_heap *pool_next;      /* free heap pool */
  hk_heap_stats stats;
  /* what other threads read or write, on a line of its own: each remote
   * free reads active_ms, which shared a line with counters and queue heads
   * that the owner writes */
  _Alignas(64) _Atomic uint64_t active_ms; /* when the owner last looked for a page, to 16 searches */
  _Atomic uint32_t remote_hint;   /* a full page received a remote free */
  /* Not zeroed when a heap is reused (heap_new zeroes what comes before
   * remote_hint): the purger walks all_next and takes spare_lock at any time.
   * (Until 2026-11-25 these lay in the zeroed part: each new heap cut the
   * list after itself, so the purger and the growth purge saw the newest
   * heap's spares only.) */
  hk_page *spare[HK_SLABS];       /* empty spans kept for reuse by any class, by length in slabs
                                     (singly linked; spare_lock: the purger takes old ones) */
  uint32_t spare_bytes;           /* spare_lock */
  pthread_mutex_t spare_lock;
  struct hk_heap *all_next;       /* every heap ever made (heap.c: the purger's walk) */
  uint32_t region_list;           /* its number: the region list its spans come from first is this
                                     modulo the lists' count (region.c); fixed
                                     for the heap's memory, so a thread that takes over an exited
                                     thread's heap finds the spans its classes used */
  /* the reaper's (heap.c, hk_heap_reap) */
  _Atomic uint32_t live;          /* a thread owns it: a number of its own for each owner, 0 when none */
  _Atomic int pid;                /* the process tid is a thread of: another one (a fork's
                                     parent) means never reaped, see hk_heap_reap */
  _Atomic int tid;                /* that thread's kernel id (0: never reaped: the shared late
                                     heap, the parent's other threads' heaps in a forked child) */
  _Atomic uint64_t reap_checked_ms; /* when the reaper last asked whether the thread is gone */
} hk_heap;

extern hk_heap hk_heap_empty;     /* every thread starts here: direct[] -> hk_page_empty */

/* (bit 1: heaps are 64-byte aligned; hardened mode tags owners with bit 0) */
#define HK_NO_OWNER(h) ((hk_heap *)((char *)(h) + 2)) /* (= h | 2; a constant for hk_heap_empty) */

/* ---- hardened mode (secure.c) ----
 * HAKMEM_SECURE=1: guard pages, randomised carving order, a canary after
 * every small/medium block checked on free; =2 adds zero-on-free with a
 * write-after-free check on malloc. The fast paths need no test for it:
 * direct[] stays empty (malloc always takes the slow path) and pages store
 * their owner with bit 0 set (free never matches it and takes the slow
 * path). */
extern bool hk_secure;            /* HAKMEM_SECURE >= 1, fixed at initialisation */
extern bool hk_secure_zero;       /* HAKMEM_SECURE == 2 */
#define HK_SECURE_EXTRA 9         /* trailer word + at least one canary byte */
#define HK_GUARD 4096             /* a PROT_NONE page */
HK_INLINE hk_heap *hk_owner_tag(hk_heap *h) { return hk_secure ? (hk_heap *)((uintptr_t)h | 1) : h; }
HK_INLINE hk_heap *hk_owner_untag(hk_heap *h) { return (hk_heap *)((uintptr_t)h & ~(uintptr_t)1); }
void hk_secure_on_alloc(hk_page *page, hk_block *b, size_t size);
void hk_secure_set_size(hk_page *page, hk_block *b, size_t size);
void hk_secure_check_free(hk_page *page, hk_block *b);
size_t hk_secure_size(hk_page *page, hk_block *b);
void hk_secure_shuffle_extend(hk_page *page, uint32_t n);
void *hk_alloc_class(size_t size, unsigned cls);
extern hk_page hk_page_empty;
extern __thread hk_heap *hk_tls_heap __attribute__((tls_model("initial-exec")));

/* ---- the allocator's locks and fork() ----
 * Every lock that hk_fork_prepare takes (init.c) is taken through these.
 * Between hakmem's prepare handler and its parent or child handler, the
 * forking thread holds them all, and the program's own fork handlers that
 * run in that window (those registered before hakmem's: pthread_atfork
 * runs prepare handlers last-registered first, the others first-registered
 * first) may allocate and free. No other thread can be inside a part of the
 * allocator these locks guard then, so the forking thread goes on as if it
 * took each lock, instead of waiting for itself. (A heap's spare_lock is
 * not among them: fork does not take it.) */
extern __thread bool hk_fork_holder __attribute__((tls_model("initial-exec")));
HK_INLINE void hk_lock(pthread_mutex_t *m) {
  if (HK_LIKELY(!hk_fork_holder)) pthread_mutex_lock(m);
}
HK_INLINE void hk_unlock(pthread_mutex_t *m) {
  if (HK_LIKELY(!hk_fork_holder)) pthread_mutex_unlock(m);
}
HK_INLINE bool hk_trylock(pthread_mutex_t *m) { return hk_fork_holder || pthread_mutex_trylock(m) == 0; }

/* ---- options (options.c) ---- */
typedef struct hk_options {
  long stats;             /* HAKMEM_STATS */
  long purge_delay_ms;    /* HAKMEM_PURGE_DELAY_MS */
  long region_reserve;    /* HAKMEM_REGION_RESERVE */
  long large_cache_mb;    /* HAKMEM_LARGE_CACHE_MB */
  long large_cache_max;   /* HAKMEM_LARGE_CACHE_ENTRIES */
  long verbose;           /* HAKMEM_VERBOSE */
  long purge_thread;      /* HAKMEM_PURGE_THREAD */
  long secure;            /* HAKMEM_SECURE */
  long arena_mb;          /* HAKMEM_ARENA_MB */
  long region_lists;      /* HAKMEM_REGION_LISTS */
} hk_options;
extern hk_options hk_opt;
void hk_options_init(void);
void hk_options_print(void);

/* ---- os.c: every system call hakmem makes ---- */
void *hk_os_map_aligned(size_t size, size_t align);   /* NULL on failure */
void *hk_os_reserve(size_t size, size_t align);       /* PROT_NONE address space; NULL on failure */
bool hk_os_commit(void *p, size_t size);
void hk_os_decommit(void *p, size_t size);
void hk_os_unmap(void *p, size_t size);
void hk_os_guard(void *p, size_t size);                /* PROT_NONE */
void hk_os_purge(void *p, size_t size);               /* MADV_DONTNEED */
void *hk_os_remap(void *p, size_t old_size, size_t new_size, size_t align); /* NULL on failure */
bool hk_os_shrink(void *p, size_t old_size, size_t new_size);
bool hk_os_space_limited(size_t need); /* an RLIMIT_AS that a mapping of need bytes fits under */
bool hk_os_space_tight(void);            /* an RLIMIT_AS or RLIMIT_DATA holds */
int hk_os_tid(void);                     /* the calling thread's kernel id */
int hk_os_pid(void);
unsigned hk_os_cpu_count(void);          /* CPUs this process may run on (1 if unknown) */
bool hk_os_thread_gone(int tid, int pid); /* that thread of process pid has exited (pid: this process) */
uint64_t hk_os_now_ms(void);
uint64_t hk_os_random(void);
size_t hk_os_peak_rss_kb(void);
size_t hk_os_current_rss_kb(void);
void hk_os_write_stderr(const char *s, size_t n);

/* The owner's clock (active_ms), read by every thread that frees one of
 * its blocks: written only when the millisecond changed, since each write
 * takes the line from all their caches (larson with 16 threads: the load
 * in the idle-owner test took 27 % of hk_free_to_cache's samples when
 * written every 64 cached mallocs, 12 % so; throughput within noise). */
HK_INLINE void hk_heap_note_active(hk_heap *h) {
  uint64_t now = hk_os_now_ms();
  if (atomic_load_explicit(&h->active_ms, memory_order_relaxed) != now)
    atomic_store_explicit(&h->active_ms, now, memory_order_relaxed);
}

/* ---- error.c ---- */
HK_COLD __attribute__((noreturn)) void hk_fatal(const char *what, const void *p);
HK_COLD __attribute__((noreturn)) void hk_fatal_in(const char *who, const char *what, const void *p);
void hk_warning(const char *msg);
size_t hk_fmt_hex(char *buf, uintptr_t v);
size_t hk_fmt_dec(char *buf, uint64_t v);

/* ---- stats.c ---- */
typedef struct hk_stats {
  _Atomic uint64_t regions_mapped, regions_unmapped, regions_live, regions_peak;
  _Atomic uint64_t slabs_purged, purge_calls, growth_purges;
  _Atomic uint64_t abandoned_released; /* empty pages of exited threads given back */
  _Atomic uint64_t abandoned_trimmed;  /* ... kept, their span's tail given back (heap.c, trim_kept) */
  _Atomic uint64_t spares_released;    /* spare spans unused for a purge delay, given back by the purger */
  _Atomic uint64_t pages_reclaimed;    /* full pages emptied by remote frees, given back by the freer */
  _Atomic uint64_t large_allocs, large_frees, large_cache_hits, large_mapped_bytes, large_peak_bytes;
  _Atomic uint64_t large_unmaps, large_remaps;
  _Atomic uint64_t heaps_created, threads_exited, heaps_reaped;
  _Atomic uint64_t blocks_purged, block_purge_bytes, slabs_lent;
  _Atomic uint64_t spans_deferred;     /* spans given back while their list's lock was taken (region.c) */
} hk_stats_t;
extern hk_stats_t hk_stats;
#define hk_stat_add(field, n) atomic_fetch_add_explicit(&hk_stats.field, (n), memory_order_relaxed)
void hk_stat_peak(_Atomic uint64_t *peak, uint64_t v);
void hk_stats_merge_heap(hk_heap *h);
void hk_stats_print(void);

/* ---- region.c: slab spans, shared by all threads (a lock per region list, off the fast path) ---- */
void hk_region_fork_lock(void);   /* every region lock, in order */
void hk_region_fork_unlock(void);
/* NULL on OOM; dirty: bit k set if the span's slab k may hold committed
 * memory (0: the span is clean); room: prefer a run followed by this many
 * free slabs */
hk_page *hk_region_alloc_span(unsigned nslabs, unsigned cls, hk_slabmask *dirty, unsigned room,
                              unsigned home); /* home: the heap's region list */
extern _Atomic uint32_t hk_growth_epoch; /* moves when the program has grown (region.c) */
void hk_region_free_span(hk_page *page);
void hk_region_free_span_purged(hk_page *page); /* its memory already given back */
void hk_region_lend_slabs(hk_page *page, unsigned lend); /* bit k: the span's slab k (k > 0) */
bool hk_region_grow_span(hk_page *page, unsigned nslabs);   /* take the free slabs after it, if free */
void hk_region_shrink_span(hk_page *page, unsigned nslabs); /* give back its tail slabs */
bool hk_arena_shrink(void);                                  /* unmap the arena's never-used slots */
/* A limit on address space or data holds (asked again whenever a region
 * or a large block is mapped). Every byte mapped counts against such a limit, used or
 * not, so while one holds, blocks from HK_TIGHT_LARGE_MIN up are mapped to
 * their size in the large tier instead of taking a class's rounding, a
 * span's slack and a region's room. */
extern _Atomic bool hk_space_tight;
void hk_space_check(void); /* ask again (before a region or large mapping) */
#define HK_TIGHT_LARGE_MIN ((size_t)64 << 10)
bool hk_region_map_prepare(const void *base);   /* the map can take base (false: out of memory) */
void hk_region_register(void *base);
void hk_region_unregister(void *base);
bool hk_region_purge(bool force);                 /* true if memory was released */
bool hk_region_pending(void);                     /* dirty slabs or spare regions left */

/* ---- purger.c: background return of memory to the OS ---- */
void hk_purger_notify(void);      /* malloc's slow path, realloc, thread exit, malloc_trim */
void hk_purger_notify_free(void); /* free(): may only note that the purger is wanted */
void hk_purger_start(void);       /* a second thread's first malloc, thread exit: start it if it never was */
extern _Atomic int hk_purger_wanted; /* a free released memory before the purger ran */
extern __thread bool hk_purge_poke __attribute__((tls_model("initial-exec")));
/* Wake the purger if this thread released slabs, or start it if a free
 * wanted it; call only with no allocator lock held and the heap consistent
 * (starting the thread may call malloc). Not from free: hk_purger_poke_free. */
HK_INLINE void hk_purger_poke(void) {
  if (HK_UNLIKELY(hk_purge_poke || atomic_load_explicit(&hk_purger_wanted, memory_order_relaxed))) {
    hk_purge_poke = false;
    hk_purger_notify();
  }
}
HK_INLINE void hk_purger_poke_free(void) {
  if (HK_UNLIKELY(hk_purge_poke)) {
    hk_purge_poke = false;
    hk_purger_notify_free();
  }
}
void hk_purger_fork_prepare(void);
void hk_purger_fork_parent(void);
void hk_purger_fork_child(void);

/* ---- page.c ---- */
void hk_page_init(hk_page *page, unsigned cls);
size_t hk_color_offset(void);
/* Slabs (0 or 1) that a page of class cls and nslabs slabs has for its
 * colour: 1 for a class that gets one, in a span of the class's own length
 * (a realloc span block of the same class is a slab shorter) */
HK_INLINE unsigned hk_color_slabs(unsigned cls, unsigned nslabs) {
  return hk_class_colored[cls] == HK_COLORED_SLAB && nslabs == hk_class_slabs[cls] && !hk_secure;
}
/* Such a page's block starts at a colour offset (with or without a slab for it) */
HK_INLINE bool hk_colored_page(unsigned cls, unsigned nslabs) {
  return hk_class_colored[cls] && nslabs == hk_class_slabs[cls] && !hk_secure;
}
uintptr_t hk_page_span_start(const hk_page *page);
/* hk_page_extend carves the blocks of HK_EXTEND_BYTES at a time, or one */
#define HK_EXTEND_BYTES (4u << 10)
HK_INLINE uint32_t hk_extend_blocks(uint32_t block_size) {
  return block_size < HK_EXTEND_BYTES ? HK_EXTEND_BYTES / block_size : 1;
}
bool hk_page_extend(hk_page *page);
uint32_t hk_page_collect(hk_page *page, unsigned new_state);
#define HK_COLLECT_RECLAIMED UINT32_MAX
bool hk_page_contains_free(hk_page *page, hk_block *b);

/* ---- remote.c: frees of other heaps' blocks, the thread cache ---- */
void hk_free_to_cache(hk_block *b, hk_page *page, hk_heap *self); /* (the order free() has them in) */
void *hk_malloc_cached(size_t size, hk_heap *h); /* malloc in cache mode (h->free_owner != h) */
void hk_reclaim_fork_prepare(void);
void hk_reclaim_fork_done(void);
void hk_cache_flush_all(hk_heap *h);
/* The first word of a block that is neither live nor on a free list (in a
 * remote freer's cache, remote.c; dropped with a lent slab, heap.c): it
 * looks free to hk_looks_free, and a free of it is a double free. */
#define HK_FOREIGN_TAG 16 /* inside slab 0, never a block, never a list end */
/* page->key ^ (the region base + HK_FOREIGN_TAG), from the page's own
 * free_check (key ^ base: the base's low bits are clear, so + is ^) */
HK_INLINE uintptr_t hk_foreign_tag(const hk_page *page) { return page->free_check ^ HK_FOREIGN_TAG; }
HK_INLINE bool hk_foreign_tagged(const hk_page *page, const hk_block *b) { return b->link == hk_foreign_tag(page); }

/* ---- heap.c ---- */
void *hk_malloc_slow(size_t size, hk_heap *heap);
hk_heap *hk_heap_get(void);                       /* this thread's heap, created if needed */
void hk_heap_page_emptied(hk_heap *heap, hk_page *page);
void hk_heap_collect(hk_heap *heap, bool release_all);
void hk_heap_reap(void);          /* abandon the heaps whose thread has exited without doing so */
void hk_spares_expire(bool force);  /* purger: give back spare spans unused for a purge delay */
void hk_spares_trim(void);          /* the program grew: give back spares beyond HK_SPARE_BYTES */
bool hk_spares_pending(void);
bool hk_span_block(const hk_page *page);
bool hk_heap_resize_span_block(hk_heap *heap, hk_page *page, size_t size);
void *hk_heap_alloc_span_block(hk_heap *heap, size_t size);
void hk_abandoned_sweep(bool trim, bool force);
uint32_t hk_abandoned_empty(void);                 /* empty pages of exited threads kept now */
extern _Atomic uint32_t hk_abandoned_hint;         /* a remote free reached an abandoned page */
void hk_thread_init_key(void);
extern pthread_mutex_t hk_heap_lock;

/* ---- large.c ---- */
extern pthread_mutex_t hk_large_lock;
void *hk_large_alloc(size_t size, size_t align, bool zero);
void hk_large_free(hk_region *r, void *p);
void *hk_large_realloc(hk_region *r, void *p, size_t size);
bool hk_large_trim(bool force);
bool hk_large_pending(void);
size_t hk_large_usable(hk_region *r);
hk_region *hk_large_find_detached(const void *p);
void hk_large_usage(size_t *mapped, size_t *cached); /* all large mappings, and the cached ones, at one time */
hk_region *hk_region_lookup(const void *p);

/* ---- alloc.c / free.c ---- */
void *hk_alloc_aligned(size_t align, size_t size, bool zero);
void *hk_calloc(size_t n, size_t size);
void *hk_realloc(void *p, size_t size);
void hk_free_slow(void *p);
size_t hk_usable_size(const void *p);
size_t hk_block_size(const void *p, const char *who);
void hk_free_local_checked(hk_heap *heap, hk_page *page, hk_block *b);
void hk_free_local_push(hk_heap *heap, hk_page *page, hk_block *b);
void hk_sizeclass_init(void);
void hk_region_usage(size_t *mapped, size_t *in_use, size_t *peak);
int hk_trim(void);
void hk_release_for_retry(size_t need); /* a mapping of need bytes failed: give back the caches, then retry once */
void hk_mallinfo_bytes(size_t *mapped, size_t *in_use);

/* ---- init.c ---- */
extern _Atomic int hk_init_state;   /* 0 none, 1 running, 2 done */
void hk_init(void);
void hk_fork_prepare(void);
void hk_fork_parent(void);
void hk_fork_child(void);

/* Could another thread exist? glibc says (2.32+); without it, assume so. */
HK_INLINE bool hk_maybe_threaded(void) {
#ifdef HK_HAVE_SINGLE_THREADED
  return !__libc_single_threaded;
#else
  return true;
#endif
}

/* The fork handlers, registered once the process may have a second thread
 * (init.c). calloc checks, for glibc's pthread_create calls it before the
 * new thread exists. */
extern _Atomic int hk_fork_handlers; /* registered (or being registered) */
void hk_fork_handlers_register(void);
HK_INLINE void hk_fork_handlers_check(void) {
  if (HK_UNLIKELY(!atomic_load_explicit(&hk_fork_handlers, memory_order_relaxed)) && hk_maybe_threaded())
    hk_fork_handlers_register();
}

#pragma GCC visibility pop

#endif /* HK_INTERNAL_H */
