/* hakmem's data structures and the constants of its geometry.
 *
 * Memory layout (docs/DESIGN.md has the full picture):
 *
 *   region (4 MiB, 4 MiB-aligned)
 *   +--------+--------+--------+-----+--------+
 *   | slab 0 | slab 1 | slab 2 | ... | slab 63|   slab = 64 KiB
 *   +--------+--------+--------+-----+--------+
 *     header   pages of blocks: a page is a span of 1..16 slabs
 *     (hk_region with one hk_page per slab, 8 KiB; only the records of
 *     slabs in use are touched)
 *
 *   large block (> 1 MiB, or alignment > 64 KiB): its own 4 MiB-aligned
 *   mapping, header in its first page (hk_os_page), user data after it.
 *
 * free() finds a block's page in the page table of the arena, the address
 * space reservation small regions come from; a bitmap with one bit per
 * 4 MiB of address space says whether any other address is ours (large
 * blocks, regions outside the arena). block.h holds the inline operations
 * on these structures, internal.h every module's declarations.
 */
#ifndef HK_TYPES_H
#define HK_TYPES_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

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
 * so that their speed does not depend on where unrelated changes place
 * them: the fast paths are short enough that a predictor indexed by code
 * address can make free's loads of the page record wait on earlier stores
 * at some placements, and none of the 256-byte-aligned ones does. */
#define HK_HOT __attribute__((aligned(256)))

/* ---- geometry ---- */
/* Regions of 4 MiB: a thread's spans of 64 KiB-1 MiB find a fitting free
 * run in few regions, and free runs are long, while a region's header
 * (one record per slab) stays 8 KiB. */
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
#define HK_HUGE_PAGE ((uintptr_t)2 << 20) /* a transparent huge page (x86-64, aarch64 with 4 KiB pages) */
/* The kernel's page: 4 KiB, or 16 or 64 KiB on some aarch64 kernels (read
 * by hk_init before the first mapping, os.c). Every guard, purge, commit
 * and mapping is in whole pages of it: a kernel rounds a length up to its
 * page, and would zero or protect live blocks beside a range that ends
 * inside one. A large block's header and its guard take a page each. */
#define HK_OS_PAGE_MIN 4096
#define HK_OS_PAGE_MAX HK_SLAB_SIZE
extern size_t hk_os_page;
HK_INLINE size_t hk_page_up(size_t n) { return (n + hk_os_page - 1) & ~(hk_os_page - 1); }
HK_INLINE size_t hk_page_down(size_t n) { return n & ~(hk_os_page - 1); }
#define HK_SPARE_MAX ((uint32_t)16 << 20)  /* empty spans a heap keeps for reuse (spares.c) */
#define HK_SPARE_BYTES ((uint32_t)2 << 20) /* ... of which it keeps after a purge delay or a growth purge */
#define HK_SPARE_GROWN_MAX ((uint32_t)48 << 20) /* the spare budget's growth at most (queue.c) */
#define HK_HELD_BYTES ((uint32_t)2 << 20)  /* emptied pages a heap keeps in their class queues (carved bytes) */
#define HK_HELD_GROWN_MAX ((uint32_t)14 << 20) /* that budget's growth at most (queue.c) */

/* Address space covered by the ownership bitmap (48-bit user space). */
#define HK_VA_BITS 48
#define HK_MAP_BITS (HK_VA_BITS - HK_REGION_SHIFT)
/* The largest request any tier takes (64 TiB): beyond it, sizes that add a
 * header or round up could wrap, and no mapping of it can succeed. */
#define HK_MAX_REQUEST ((size_t)1 << 46)

/* ---- size classes ----
 * 8 B, then 16-byte steps up to 128 B (classes 0..8), then 8 classes per
 * power of two (12.5 % apart) up to 1 MiB (classes 9..112): HK_NSIZES
 * classes that sizes map to. Every block above 8 B is 16-aligned, as
 * glibc's are: C++ compilers assume operator new's result is aligned to
 * __STDCPP_DEFAULT_NEW_ALIGNMENT__ (16) and store to it with aligned SSE
 * moves, and C programs rely on malloc's 16. The blocks of the padded
 * classes (above 8 KiB, pages of several blocks: sizeclass.c) lie
 * HK_CLASS_PAD bytes apart more than their size, and each of them has a
 * twin class without that pad, for aligned allocation only: HK_NTWINS
 * twins after the HK_NSIZES classes, HK_NCLASSES classes in all. */
#define HK_SMALL_MAX 128
#define HK_SMALL_CLASSES 9               /* 8, 16, 32, ..., 128 */
#define HK_LUT_MAX 1024                  /* sizes served by the lookup table */
#define HK_LUT_SLOTS ((HK_LUT_MAX + 7) / 8 + 1) /* one per 8 bytes of size */
#define HK_MEDIUM_MAX ((size_t)1 << 20)  /* largest size-class block */
#define HK_NSIZES 113
#define HK_NTWINS 29                     /* padded classes: 9-60 KiB, and 72-104, 144 and 208 KiB but 96 */
#define HK_CLASS_PAD 64
#define HK_NCLASSES (HK_NSIZES + HK_NTWINS)
#define HK_MAX_ALIGN_CLASS ((size_t)64 << 10) /* larger alignments go to the large tier */

extern uint32_t hk_class_size[HK_NCLASSES];  /* what a block of the class holds (requests up to it) */
extern uint32_t hk_class_block[HK_NCLASSES]; /* how far apart its blocks lie: the size, or size + HK_CLASS_PAD */
extern uint8_t hk_class_twin[HK_NCLASSES];   /* a padded class's twin (0: none) */
extern uint8_t hk_class_base[HK_NCLASSES];   /* the class itself, or the padded class a twin stands for */
extern uint8_t hk_class_slabs[HK_NCLASSES];
/* Non-zero: the class's pages hold one block that starts at one of
 * HK_COLORS cache-line offsets into its span (page.c); the span has a slab
 * more for that (HK_COLORED_SLAB) or wastes 4 KiB or more anyway */
extern uint8_t hk_class_colored[HK_NCLASSES];
enum { HK_COLORED_SLAB = 1, HK_COLORED_IN_SPAN = 2 };
#define HK_COLORS 64
extern uint8_t hk_class_lut[HK_LUT_SLOTS];
extern uint8_t hk_class_lut_first[HK_NCLASSES];
extern uint8_t hk_class_lut_end[HK_NCLASSES];
extern uint8_t hk_class_cache_max[HK_NCLASSES]; /* remote.c's thread cache per class, in blocks (0: none) */

/* ---- blocks ----
 * A free block's first word links to the next free block, XOR-ed with its
 * page's key (derived from the process's secret with the page address and
 * a counter, keys.c). The encoding lets free() recognise a block that is
 * already free with one compare (hk_looks_free), and keeps a stray user
 * write from being followed as a valid pointer. */
typedef struct hk_block { uintptr_t link; } hk_block;

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
 * page (and by malloc, which tests its list's head as free() tests a
 * pointer). The second is the owner's free list and count and the remote
 * stack. Other threads' frees thus never read a
 * line the owner keeps writing: in one line, every remote free would miss
 * on it. */
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
                                lives (lend.c, lend_free_slabs); never bit 0 */
  _Atomic uint8_t reclaiming; /* a remote freer is giving the parked page back (remote.c) */
  uint8_t untrimmed : 1;     /* queue.c: its span beyond the carved blocks may hold memory to purge */
  uint8_t rejoined : 1;      /* queue.c: back in its queue from the full list by its owner's free,
                                not current since (page_scant) */
  uint8_t held;              /* queue.c: an empty page left in its class's queue, in held_bytes */
  _Atomic uint8_t sampled;   /* profile.c: a page of one block whose block is a live sample; cleared
                                by the free that drops the sample (hk_page_sample_freed) */
  /* second cache line */
  hk_block *free;            /* owner's free list */
  uint32_t used;             /* blocks handed out and not yet returned to `free`, plus a base
                                that says whether the page is parked or current (see below) */
  uint32_t capacity;         /* blocks carved so far (rest is untouched memory) */
  uintptr_t free_key;        /* = key, for malloc, which reads only this line */
  _Atomic uintptr_t remote;  /* remote-free stack | state */
  struct hk_page *next, *prev; /* heap queue, full list or abandoned list */
  uint64_t idle_ms;          /* abandoned and empty since (0: not empty), abandoned.c; a spare's
                                last use, spares.c; a held page's bytes in held_bytes, queue.c */
  _Atomic uint64_t park;     /* parked full: (parks so far << 32) | blocks handed out (remote.c) */
} hk_page;

_Static_assert(sizeof(hk_page) == 128, "hk_page is two cache lines");
_Static_assert(HK_SLAB_SIZE / 8 <= UINT16_MAX, "reserved fits a slab of the smallest blocks");


/* `used` is the count of blocks handed out plus a base that depends on the
 * page's state, chosen so that free's one test, "(int32_t)--used < 0"
 * (compiled to a subtract in memory and a sign jump; "<= 0" needs five
 * instructions), fires exactly when the slow path has work:
 *   HK_USED_NORMAL  -1: the count going to 0 makes it negative (page empty);
 *   HK_USED_FULL    -2^30: always negative: the page is parked on the full
 *                   list and must rejoin its queue;
 *   HK_USED_CURRENT 2^30 - 1: never negative: a single-slab page that is its
 *                   class's current page just stays when it runs empty (with
 *                   few live blocks per class, pages empty often, and
 *                   keeping the current one saves the slow-path call).
 * A page holds at most 2^17 blocks, so the three ranges never meet. */
#define HK_USED_NORMAL (-1)
#define HK_USED_FULL (-(1 << 30))
#define HK_USED_CURRENT ((1 << 30) - 1)
_Static_assert(offsetof(hk_page, sampled) + sizeof(((hk_page *)0)->sampled) == 64 && offsetof(hk_page, free) == 64, "the two lines");

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
      union {
        struct hk_region_info *info; /* small regions: the span search's view (region.c) */
        /* large blocks: the thread's heap that allocated it (NULL: counted
         * to no thread), for the thread's large counts (large.c) */
        struct hk_heap *large_thread;
      };
      /* large blocks (large.c) */
      struct hk_region *next, *prev; /* the detached list, or a chain of mappings to unmap (large.c) */
      size_t map_size;           /* bytes mapped from the region base */
      size_t user_offset;        /* data starts at base + user_offset */
      size_t user_size;          /* bytes requested */
      uint8_t large_state;
      uint8_t large_guarded;     /* default mode: a guard page follows the header's page (large.c) */
      uint8_t large_zero;        /* data is known to be zero (fresh mapping) */
      uint8_t large_detached;    /* alignment >= 4 MiB: data is outside the header's
                                    4 MiB unit; found through a list, not the bitmap */
      uint8_t large_sampled;     /* live, and sampled by the heap profiler (profile.c) */
      uint8_t large_tail;        /* live, on the list of tails (large.c), through next/prev */
      uint8_t large_floating;    /* hardened mode: the data's base is the page after the
                                    header's guard (blocks aligned to at most LARGE_HEAD), and
                                    the data may start further in: at its colour, and, in a
                                    reused mapping, where it ends at the guard at block_end (large.c) */
      union {
        size_t cached_resident;  /* in the cache: data bytes still committed (0 once purged) */
        uint64_t tail_since_ms;  /* live, on the list of tails: since when */
      };
      size_t block_end;          /* live: the block's usable bytes end at base + block_end; a
                                    mapping reused whole keeps its tail beyond for a larger block */
      union {
        _Atomic uint64_t *block_map; /* hardened mode, small regions: the block map (secure.h),
                                        mapped apart */
        uint32_t large_owner;    /* large blocks: large_thread's ownership number (its `live`)
                                    when it allocated the block */
      };
      /* live large blocks of a heap the program made (user_heap.c): that
       * heap, and its list of them (hk_large_lock) */
      struct hk_heap *large_heap;
      struct hk_region *heap_next, *heap_prev;
    };
  };
} hk_region;

_Static_assert(sizeof(hk_page) <= HK_OS_PAGE_MIN, "a large block's header (slot 0) must fit in its first page");
_Static_assert(offsetof(hk_region, heap_prev) + 8 <= sizeof(hk_page), "region fields fit in slot 0");

/* ---- the arena, its page table and the ownership map (arena.c) ---- */
#define HK_ARENA_SLABS ((uintptr_t)1 << 20)        /* slabs in the arena: 64 GiB */
#define HK_PAGE_TABLE_BYTES (HK_ARENA_SLABS * sizeof(uintptr_t))
#define HK_ARENA_REGIONS (HK_ARENA_SLABS >> (HK_REGION_SHIFT - HK_SLAB_SHIFT))
/* Where an arena region's header may lie in slab 0 (hk_region_of): at one
 * of hk_header_spots offsets, hk_header_step apart from the first, each
 * leaving a page (8 KiB at least) on either side for guards: six with 4 KiB
 * pages, two with 16 KiB ones, and with larger pages only offset 0. */
extern unsigned hk_header_spots;
extern uintptr_t hk_header_step;
_Static_assert(sizeof(hk_region) == 8192 && 8 * sizeof(hk_region) == HK_SLAB_SIZE, "slab 0 holds 8 headers' room");
/* The ownership map's leaves: 2^HK_MAP_LEAF_SHIFT bits (32 KiB, 1 TiB of
 * address space) each, made when a mapping first lands in their range. */
#define HK_MAP_LEAF_SHIFT 18
#define HK_MAP_LEAVES ((size_t)1 << (HK_MAP_BITS - HK_MAP_LEAF_SHIFT))
#define HK_PAGE_SHIFT 7 /* sizeof(hk_page) == 128 */

/* ---- heaps: one per thread ---- */
typedef struct hk_page_queue { hk_page *first, *last; } hk_page_queue;

#define HK_QUARANTINE 32 /* hardened mode: slots of a heap's quarantine (power of 2) */
#define HK_QUARANTINE_BLOCK_MAX ((uint32_t)16 << 10) /* larger blocks skip it */

typedef struct hk_heap_stats {
  uint64_t pages_acquired, pages_released, pages_adopted;
  uint64_t remote_frees;   /* remote frees sent to their page: at once, or flushed from the cache */
  uint64_t cache_reused;   /* freed blocks kept in the thread cache and handed out again */
} hk_heap_stats;

/* Freed blocks a heap keeps for its own mallocs (remote.c): at most
 * this many bytes in all, and per class as hk_class_cache_max says. */
#define HK_CACHE_BYTES ((uint32_t)256 << 10)
#define HK_CACHE_CLASS_BYTES ((uint32_t)16 << 10)
/* Blocks above this size are never cached: another thread's block of
 * that size was mostly written by its allocating thread and seldom read
 * whole by its freer, so reusing it here moves each line it writes from
 * the other core, where its owner's reuse finds them in its own cache.
 * A smaller block is at most 16 lines, and keeping it saves a CAS on its
 * page and its owner's collecting it. */
#define HK_CACHE_BLOCK_MAX 1024u

#define HK_GROWN_RING 16
#define HK_LABEL_MAX 47 /* bytes of a heap's label (hak_label) */
typedef struct hk_heap {
  uint32_t cache_bytes;           /* bytes in the thread cache (cache_first[]) */
  uint32_t cache_remote;          /* blocks of other heaps put into the cache since the last
                                     check (remote.c: leaving cache mode) */
  uint64_t sample_left;           /* in cache mode with the heap profiler on: bytes to the next
                                     sample (the thread's budget is shut then: thread.c), carried
                                     to and from the budget as the mode changes (hk_tls_arm) */
  struct hk_heap *free_owner;     /* what free's fast path finds in page->heap for a block to
                                     take its page's list: this heap, or in cache mode
                                     HK_NO_OWNER(this heap), which no page holds (remote.c);
                                     malloc's first test: is it this heap? Always
                                     HK_NO_OWNER(this heap) in hardened mode (secure.c) */
  hk_page *by_size[HK_LUT_SLOTS]; /* = direct[hk_class_lut[(size + 7) >> 3]]: malloc's
                                     first load for sizes up to 1 KiB, without the table */
  hk_page *direct[HK_NCLASSES];   /* current page per class, never NULL */
  uint32_t fresh_count;           /* pages acquired since the last periodic full scan */
  uint32_t searches;              /* page searches (find_page) */
  hk_page_queue queues[HK_NCLASSES]; /* pages with (maybe) free blocks */
  hk_block *cache_first[HK_NCLASSES]; /* the thread cache of freed blocks (remote.c): each class's
                                     most recently freed first, linked through their second word */
  uintptr_t list_add, list_mul, list_inv; /* the keys of the cache's and the stash's links
                                     (hk_cache_link), derived from the secret anew for each
                                     ownership (heap.c) */
  struct {
    hk_block *block;              /* NULL: a free slot */
    uintptr_t page;               /* its page, bit 0 set for another heap's block */
    uintptr_t tag;                /* what its first word must still be (remote.c) */
  } quarantine[HK_QUARANTINE];    /* hardened mode: blocks the thread freed, not yet back on
                                     their pages (remote.c) */
  uint64_t quarantine_rng;        /* a linear congruential generator's state: which slot the
                                     next freed block takes */
  uint16_t cache_room[HK_NCLASSES]; /* blocks the class may still take: hk_class_cache_max less those
                                     it holds (0 in hk_heap_empty, and for a class without cache:
                                     one test for all) */
  hk_page_queue full;             /* parked full pages */
  uint32_t held_bytes;            /* carved bytes of held pages: held[] and pages marked held */
  uint32_t held[HK_NCLASSES];     /* the class's current page emptied and was left current:
                                     its carved bytes then (0: not so), queue.c */
  hk_block *stash[HK_NCLASSES];   /* freed blocks of pages of one block, and of parked pages of
                                     several, kept live in their page (queue.c); linked through
                                     their second word */
  uint32_t stash_bytes;           /* their block sizes, summed: with held_bytes, within HK_HELD_BYTES
                                     plus held_grown */
  uint32_t held_grown;            /* the held budget's growth (queue.c) */
  uint32_t full_count;            /* pages on `full` (stashed blocks' pages among them) */
  uint32_t full_pages[HK_NCLASSES]; /* of them, the class's */
  uint32_t stash_blocks;          /* blocks in stash[], all classes */
  uint64_t stash_refused[(HK_NCLASSES + 63) / 64]; /* bit c: a freed block of class c was not
                                     stashed for want of held budget since the class last took a span */
  uint64_t held_refused[(HK_NCLASSES + 63) / 64]; /* bit c: an emptied page of class c was not
                                     held for want of held budget since the class last took a span */
  uint16_t stash_count[HK_NCLASSES]; /* blocks in stash[c] (statistics: live blocks, stats.c) */
  struct hk_page *stash_parked;   /* the parked page of several blocks a block was last stashed
                                     from: its next free takes it off the full list (queue.c; only
                                     compared, never read through) */
  uint32_t stash_parked_bytes;    /* the stash's blocks of up to HK_STASH_PARKED_SIZE of parked pages of
                                     several: their bytes (outside the held budget) */
  uint32_t stash_parked_blocks;   /* and their number */
  uint32_t stash_medium_blocks;   /* the stash's larger blocks of parked pages of several (within it) */
  uint32_t spare_grown;           /* the spare budget's growth (queue.c, spares.c) */
  uint64_t spare_refused[(HK_NCLASSES + 63) / 64]; /* bit c: class c gave a span back for want of
                                     spare budget since it last took one from the regions */
  uint8_t review_due;             /* a timed purge pass ran: the next page search flushes the stash
                                     and reviews the held pages (queue.c, pass_review) */
  uint8_t moving;                 /* realloc is freeing the block it moved (alloc.c) */
  uint8_t inherited;              /* HAKMEM_THREAD_STATS: it took over live blocks of an exited
                                     thread (an adopted page in use, a sample heap with samples):
                                     its thread's figures are no longer exact (inspect.c) */
  void *grown[HK_GROWN_RING];     /* blocks this thread's realloc grew last (alloc.c) */
  uint32_t grown_next;
  uint64_t block_purge_ms;        /* next pass over free medium blocks (hk_heap_purge_blocks) */
  uint32_t growth_epoch;          /* hk_growth_epoch at that pass */
  uint32_t purge_passes;          /* passes so far */
  uint32_t purge_calls;           /* calls of the pass that may not be due (clock read on every 8th) */
  uint8_t trim_due;               /* a page of the heap may be untrimmed (hk_page.untrimmed): the next
                                     timed pass walks the full list too */
  uint32_t class_searched[HK_NCLASSES]; /* purge_passes at the class's last page search */
  struct hk_heap *pool_next;      /* free heap pool */
  struct hk_heap *sample_heap;    /* the heap this thread's sampled blocks of size classes come
                                     from (profile.c), made at its first sample; NULL: none yet */
  hk_heap_stats stats;
  /* what other threads read or write, on a line of its own: each remote
   * free reads active_ms, which shared a line with counters and queue heads
   * that the owner writes */
  _Alignas(64) _Atomic uint64_t active_ms; /* when the owner last looked for a page, to 16 searches */
  uint32_t kind;                  /* HK_HEAP_THREAD, or a heap no thread owns whose blocks a
                                     free sends back to their page, never to a cache: the
                                     profiler's sample heap, or a heap the program made */
  _Atomic uint32_t remote_hint;   /* a full page received a remote free */
  /* Not zeroed when a heap is reused (hk_heap_new zeroes what comes before
   * active_ms and sets the three fields above): the purger walks all_next
   * and takes spare_lock at any time, so a reused heap must neither cut the
   * list after itself nor drop its spares, or the purger and the growth
   * purge would miss the heaps beyond it. */
  hk_page *spare[HK_SLABS];       /* empty spans kept for reuse by any class, by length in slabs
                                     (singly linked; spare_lock: the purger takes old ones) */
  uint32_t spare_bytes;           /* spare_lock */
  pthread_mutex_t spare_lock;
  /* the same for the stash's purge (queue.c, hk_heap_stash_purge_idle):
   * a reused heap's stash is empty, its lock free */
  _Atomic uint32_t stash_lock;    /* the owner's changes to the stash, the purger's purge of it */
  uint32_t stash_ops;             /* the owner's stash changes above HK_HELD_BYTES (stash_lock) */
  uint32_t stash_seen_ops;        /* the purger's: stash_ops when it last saw them change ... */
  uint64_t stash_seen_ms;         /* ... and when */
  uint8_t stash_purged;           /* the purger's: the stash's memory was given back since then */
  struct hk_heap *all_next;       /* every heap ever made (spares.c: the purger's walk) */
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
  /* the live large blocks its thread allocated, counted for the owner
   * numbered thread_large_owner (large.c: set, with the counts cleared, by
   * a new owner's first large block; lowered by any thread's free; under
   * hk_large_lock) */
  _Atomic uint64_t thread_large_bytes, thread_large_blocks;
  _Atomic uint32_t thread_large_owner;
  /* the live blocks of its pages, summed by the per-thread statistics' walk
   * numbered tally_walk (inspect.c, under the statistics' hold) */
  uint64_t tally_walk;
  int64_t tally_blocks, tally_bytes;
  /* a heap the program made (HK_HEAP_USER, user_heap.c); set up by hk_user_heap_new */
  _Atomic uint32_t user_lock;     /* every call on the heap but free() runs under it (a spin
                                     lock: user_heap.c) */
  struct hk_region *large_first;  /* its live large blocks (hk_large_lock, large.c) */
  struct hk_heap *user_next, *user_prev; /* the live user heaps (user_heap.c: fork) */
  _Atomic pthread_t visitor;      /* the thread in hak_heap_visit on it (0: none) */
  char user_name[HK_LABEL_MAX + 1]; /* its label (hak_label), or "" */
} hk_heap;

enum { HK_HEAP_THREAD = 0, HK_HEAP_SAMPLES = 1, HK_HEAP_USER = 2, HK_HEAP_DESTROYED = 3 };

/* (bit 1: heaps are 64-byte aligned; hardened mode tags owners with bit 0) */
#define HK_NO_OWNER(h) ((hk_heap *)((char *)(h) + 2)) /* (= h | 2; a constant for hk_heap_empty) */

/* hardened mode (secure.c) */
#define HK_SECURE_EXTRA 16        /* the canary and the trailer word (secure.h) */
#define HK_SECURE_CARVE 16        /* hardened mode carves at least this many blocks at a time */
#define HK_BLOCK_MAP_WORDS (HK_REGION_SIZE / 16 / 64) /* one bit per 16 bytes of a region */
#define HK_BLOCK_MAP_BYTES (2 * HK_BLOCK_MAP_WORDS * 8) /* two maps (secure.h) */

/* ---- options (options.c) ---- */
/* Numbers: atomic, as hak_option_set may change some while other threads
 * read them (each on its own, on slow paths). */
typedef _Atomic long hk_option;
typedef struct hk_options {
  hk_option stats;             /* HAKMEM_STATS */
  hk_option purge_delay_ms;    /* HAKMEM_PURGE_DELAY_MS */
  hk_option region_reserve;    /* HAKMEM_REGION_RESERVE */
  hk_option large_cache_mb;    /* HAKMEM_LARGE_CACHE_MB */
  hk_option large_cache_max;   /* HAKMEM_LARGE_CACHE_ENTRIES */
  hk_option verbose;           /* HAKMEM_VERBOSE */
  hk_option purge_thread;      /* HAKMEM_PURGE_THREAD */
  hk_option secure;            /* HAKMEM_SECURE */
  hk_option arena_mb;          /* HAKMEM_ARENA_MB */
  hk_option region_lists;      /* HAKMEM_REGION_LISTS */
  hk_option thread_stats;      /* HAKMEM_THREAD_STATS */
  const char *stats_file; /* HAKMEM_STATS_FILE (NULL: stderr) */
  hk_option profile;           /* HAKMEM_PROFILE */
  hk_option profile_rate;      /* HAKMEM_PROFILE_RATE */
  hk_option profile_signal;    /* HAKMEM_PROFILE_SIGNAL */
  const char *profile_file; /* HAKMEM_PROFILE_FILE */
  hk_option timeline_ms;       /* HAKMEM_TIMELINE_MS */
  hk_option thp;               /* HAKMEM_THP: 0 never, 1 auto, 2 always */
  hk_option memory_limit;      /* HAKMEM_MEMORY_LIMIT (0: none) */
  hk_option memory_soft_limit; /* HAKMEM_MEMORY_SOFT_LIMIT (0: none) */
  const char *cgroup_dir; /* HAKMEM_CGROUP_DIR (NULL: the process's own) */
  const char *timeline_file; /* HAKMEM_TIMELINE_FILE (NULL: no timeline) */
} hk_options;

/* ---- statistics (stats.c) ---- */
typedef struct hk_stats {
  _Atomic uint64_t regions_mapped, regions_unmapped, regions_live, regions_peak;
  _Atomic uint64_t slabs_purged, purge_calls, growth_purges;
  _Atomic uint64_t span_searches, span_search_reads; /* region.c: searches of a region list, regions read */
  _Atomic uint64_t abandoned_released; /* empty pages of exited threads given back */
  _Atomic uint64_t abandoned_trimmed;  /* ... kept, their span's tail given back (abandoned.c, trim_kept) */
  _Atomic uint64_t spares_released;    /* spare spans unused for a purge delay, given back by the purger */
  _Atomic uint64_t pages_reclaimed;    /* full pages emptied by remote frees, given back by the freer */
  _Atomic uint64_t large_allocs, large_frees, large_cache_hits, large_mapped_bytes, large_peak_bytes;
  _Atomic uint64_t large_unmaps, large_remaps, large_tails_trimmed;
  _Atomic uint64_t heaps_created, threads_exited, heaps_reaped;
  _Atomic uint64_t sample_heaps; /* of heaps_created: the heap profiler's (profile.c), no thread's */
  _Atomic uint64_t user_heaps;   /* of heaps_created: the program's (hak_heap_new, hak_label) */
  _Atomic uint64_t limit_refusals, soft_limit_passes; /* limits.c: mappings refused; soft-limit releases */
  _Atomic uint64_t blocks_purged, block_purge_bytes, slabs_lent;
  _Atomic uint64_t spans_deferred;     /* spans given back while their list's lock was taken (region.c) */
} hk_stats_t;

#pragma GCC visibility pop

#endif /* HK_TYPES_H */
