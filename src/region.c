/* Regions: 2 MiB-aligned mappings cut into 64 KiB slabs, committed from
 * the arena (a reservation of address space) whose page table free() reads. Any free span of
 * slabs in any region can become a page of any size class. This is the only
 * shared structure on the small-block path; it is taken once per page (tens
 * to thousands of blocks), never per block.
 *
 * Memory goes back to the OS after hk_opt.purge_delay_ms: free slabs are
 * purged with MADV_DONTNEED, and empty regions beyond hk_opt.region_reserve
 * are unmapped. The delay keeps a program that frees and re-allocates in a
 * loop from paying a page fault per block. */
#include "internal.h"

#include <string.h>

pthread_mutex_t hk_region_lock = PTHREAD_MUTEX_INITIALIZER;
_Atomic uint64_t hk_region_map[(1ull << HK_MAP_BITS) / 64];

/* ---- the arena (see internal.h) ----
 * Reserved once, at initialisation: HAKMEM_ARENA_MB (64 GiB) of address
 * space, or a quarter as much, and so on, if the system refuses (RLIMIT_AS). Reserving costs no
 * memory and no commit charge; a region slot is committed when a region
 * needs it and decommitted when the region is given back (one mmap each,
 * as mapping and unmapping a region cost before). Slot 0 stays unused. */
char *hk_arena_base = (char *)&hk_page_empty;
_Atomic uintptr_t hk_page_table[HK_ARENA_SLABS];
#define ARENA_REGIONS (HK_ARENA_SLABS / HK_SLABS)
static size_t arena_regions;                   /* slots reserved, slot 0 included */
static size_t arena_next = 1;                  /* slots below this were used once */
static uint64_t arena_free[ARENA_REGIONS / 64]; /* bit i: slot i (< arena_next) is decommitted */

void hk_arena_init(void) {
  size_t want = (size_t)hk_opt.arena_mb / (HK_REGION_SIZE >> 20);
  for (size_t n = want < ARENA_REGIONS ? want : ARENA_REGIONS; n >= 2; n /= 4) {
    char *base = hk_os_reserve(n * HK_REGION_SIZE, HK_REGION_SIZE);
    if (base == NULL) continue;
    /* slot 0's header reads as zeros: the page of every unused table entry */
    if (!hk_os_commit(base, HK_OS_PAGE)) {
      hk_os_unmap(base, n * HK_REGION_SIZE);
      return;
    }
    hk_arena_base = base;
    arena_regions = n;
    return;
  }
}

static hk_region *arena_take(void) {
  size_t slot = 0;
  for (size_t w = 0; w < (arena_next + 63) / 64; w++)
    if (arena_free[w]) {
      slot = w * 64 + (size_t)__builtin_ctzll(arena_free[w]);
      arena_free[w] &= arena_free[w] - 1;
      break;
    }
  if (slot == 0) {
    if (arena_next >= arena_regions) return NULL;
    slot = arena_next++;
  }
  hk_region *r = (hk_region *)(hk_arena_base + slot * HK_REGION_SIZE);
  if (!hk_os_commit(r, HK_REGION_SIZE)) {
    arena_free[slot / 64] |= (uint64_t)1 << (slot % 64);
    return NULL;
  }
  return r;
}

/* Out of memory: unmap the arena's reserved slots that hold no region (the
 * never used and the given back), whose reservation counts against an
 * address-space limit (RLIMIT_AS) as much as a mapping does. They are not
 * committed again (a mapping of the program's may be there by then):
 * regions mapped there later are found as those beyond the arena are. */
bool hk_arena_shrink(void) {
  pthread_mutex_lock(&hk_region_lock);
  bool shrunk = false;
  for (size_t w = 0; w < (arena_next + 63) / 64; w++) {
    for (uint64_t m = arena_free[w]; m != 0; m &= m - 1) {
      size_t slot = w * 64 + (size_t)__builtin_ctzll(m);
      hk_os_unmap(hk_arena_base + slot * HK_REGION_SIZE, HK_REGION_SIZE);
      shrunk = true;
    }
    arena_free[w] = 0;
  }
  if (arena_regions > arena_next) {
    hk_os_unmap(hk_arena_base + arena_next * HK_REGION_SIZE, (arena_regions - arena_next) * HK_REGION_SIZE);
    arena_regions = arena_next;
    shrunk = true;
  }
  pthread_mutex_unlock(&hk_region_lock);
  return shrunk;
}

static bool in_arena(const hk_region *r) {
  return arena_regions != 0 && (uintptr_t)((const char *)r - hk_arena_base) < arena_regions * HK_REGION_SIZE;
}

/* Point the table entries of slabs first..first+n-1 of r at page (offset
 * from the base), or at nothing (0). Slabs beyond the table have none. */
static void table_set(hk_region *r, unsigned first, unsigned n, const hk_page *page) {
  uintptr_t slab = hk_arena_slab((uintptr_t)r + (uintptr_t)first * HK_SLAB_SIZE);
  if (slab >= HK_ARENA_SLABS || slab + n > HK_ARENA_SLABS) return;
  uintptr_t v = page ? (uintptr_t)((const char *)page - hk_arena_base) : 0;
  for (unsigned k = 0; k < n; k++) atomic_store_explicit(&hk_page_table[slab + k], v, memory_order_relaxed);
}

/* Slabs 1..31 serve pages. In hardened mode slab 31 is left out: its last
 * 4 KiB is the guard page between this region and the next. */
#define ALL_SLABS (hk_secure ? (~(uint32_t)1 & ~((uint32_t)1 << 31)) : ~(uint32_t)1)

/* What the span search reads of each small region, kept apart from the
 * region (hk_region.info) in one array: the headers all sit at 2 MiB
 * alignment, hence in one cache set, and a search that read each region's
 * header missed the cache on every region it visited (64 KiB-1 MiB blocks
 * of random sizes, two threads: 14 % of the time in the search loop, 44 %
 * of that on one load). Under hk_region_lock. */
typedef struct hk_region_info {
  uint32_t free_mask;        /* bit i: slab i is free */
  uint32_t dirty_mask;       /* bit i: slab i is free but may hold committed pages */
  hk_region *r;
  struct hk_region_info *next, *prev;
  uint64_t purge_at_ms;      /* when dirty slabs may be given back (0: none) */
  uint64_t empty_since_ms;   /* all slabs free since (0: not empty) */
  uint8_t last_cls[HK_SLABS]; /* of each free slab: class + 1 of the page that used it last (0: none) */
} hk_region_info;

/* One per region that can exist at once: the arena's, or as many outside
 * it (HAKMEM_ARENA_MB set low). Untouched entries cost no memory. */
static hk_region_info info_pool[ARENA_REGIONS];
static size_t info_used;            /* entries handed out at least once */
static hk_region_info *info_free;   /* given back, linked through next */

static hk_region_info *regions;     /* every small region; full ones (no free slab) at the tail */
static hk_region_info *regions_tail;
static uint64_t next_purge_ms;

/* Free slabs become dirty (may hold committed pages) until purged. */
static void mark_dirty(hk_region_info *r, uint32_t run, uint64_t now) {
  if (r->dirty_mask == 0) r->purge_at_ms = now + (uint64_t)hk_opt.purge_delay_ms;
  r->dirty_mask |= run;
}

void hk_region_register(void *base) {
  uintptr_t idx = (uintptr_t)base >> HK_REGION_SHIFT;
  if (idx >> HK_MAP_BITS) hk_fatal("mapping above the supported address space", base);
  atomic_fetch_or_explicit(&hk_region_map[idx >> 6], (uint64_t)1 << (idx & 63), memory_order_release);
}

void hk_region_unregister(void *base) {
  uintptr_t idx = (uintptr_t)base >> HK_REGION_SHIFT;
  atomic_fetch_and_explicit(&hk_region_map[idx >> 6], ~((uint64_t)1 << (idx & 63)), memory_order_release);
}

static void list_unlink(hk_region_info *r) {
  if (r->prev) r->prev->next = r->next; else regions = r->next;
  if (r->next) r->next->prev = r->prev; else regions_tail = r->prev;
  r->next = r->prev = NULL;
}
static void list_push_front(hk_region_info *r) {
  r->prev = NULL;
  r->next = regions;
  if (regions) regions->prev = r; else regions_tail = r;
  regions = r;
}
static void list_push_back(hk_region_info *r) {
  r->next = NULL;
  r->prev = regions_tail;
  if (regions_tail) regions_tail->next = r; else regions = r;
  regions_tail = r;
}

static void region_forget(hk_region *r) {
  if (in_arena(r)) {
    size_t slot = (size_t)((char *)r - hk_arena_base) / HK_REGION_SIZE;
    hk_os_decommit(r, HK_REGION_SIZE);
    arena_free[slot / 64] |= (uint64_t)1 << (slot % 64);
  } else {
    hk_os_unmap(r, HK_REGION_SIZE);
  }
}

static hk_region_info *region_new(void) {
  hk_region_info *info = info_free;
  if (info == NULL && info_used == ARENA_REGIONS) return NULL; /* 64 GiB of small regions */
  hk_region *r = arena_take();
  if (r == NULL) r = hk_os_map_aligned(HK_REGION_SIZE, HK_REGION_SIZE);
  if (r == NULL) return NULL;
  if (((uintptr_t)r >> HK_REGION_SHIFT) >> HK_MAP_BITS) {
    region_forget(r);
    return NULL;
  }
  if (info != NULL) info_free = info->next;
  else info = &info_pool[info_used++];
  if (hk_secure) hk_os_guard((char *)r + HK_REGION_SIZE - HK_GUARD, HK_GUARD); /* catches overflows into the next region */
  r->magic = HK_MAGIC_REGION;
  r->kind = HK_KIND_SMALL;
  r->info = info;
  memset(info, 0, sizeof *info);
  info->r = r;
  info->free_mask = ALL_SLABS;
  list_push_front(info);
  hk_region_register(r);
  hk_stat_add(regions_mapped, 1);
  hk_stat_peak(&hk_stats.regions_peak, hk_stat_add(regions_live, 1) + 1);
  return info;
}

static void region_delete(hk_region_info *info) {
  hk_region *r = info->r;
  list_unlink(info);
  info->r = NULL;
  info->next = info_free;
  info_free = info;
  hk_region_unregister(r);
  table_set(r, 0, HK_SLABS, NULL);
  region_forget(r);
  hk_stat_add(regions_unmapped, 1);
  atomic_fetch_sub_explicit(&hk_stats.regions_live, 1, memory_order_relaxed);
}

/* Bit i of the result: slabs i .. i+n-1 are all set in mask. */
static uint32_t runs_of(uint32_t mask, unsigned n) {
  uint32_t m = mask;
  for (unsigned k = 1; k < n; k++) m &= mask >> k;
  return m;
}

static void purge_runs(const hk_region *r, uint32_t mask) {
  while (mask) {
    unsigned i = (unsigned)__builtin_ctz(mask);
    unsigned n = 0;
    while (i + n < HK_SLABS && (mask >> (i + n)) & 1) n++;
    hk_os_purge((char *)r + (size_t)i * HK_SLAB_SIZE, (size_t)n * HK_SLAB_SIZE);
    hk_stat_add(slabs_purged, n);
    hk_stat_add(purge_calls, 1);
    mask &= ~(((n == 32) ? ~0u : ((1u << n) - 1)) << i);
  }
}

/* Give back all of r's committed free slabs. Caller holds hk_region_lock. */
static void purge_dirty(hk_region_info *r) {
  purge_runs(r->r, r->dirty_mask);
  r->dirty_mask = 0;
  r->purge_at_ms = 0;
}

/* Caller holds hk_region_lock. */
static bool purge_locked(uint64_t now, bool force) {
  bool released = false;
  long empty_kept = 0;
  hk_region_info *next;
  for (hk_region_info *r = regions; r != NULL && r->free_mask != 0; r = next) {
    next = r->next;
    if (r->dirty_mask && (force || now >= r->purge_at_ms)) {
      purge_dirty(r);
      released = true;
    }
    if (r->free_mask == ALL_SLABS) {
      bool old_enough = force || now >= r->empty_since_ms + (uint64_t)hk_opt.purge_delay_ms;
      if (old_enough && (force || empty_kept >= hk_opt.region_reserve)) {
        region_delete(r);
        released = true;
      } else {
        empty_kept++;
      }
    }
  }
  next_purge_ms = now + (uint64_t)(hk_opt.purge_delay_ms / 2 + 1);
  return released;
}

static void maybe_purge_locked(void) {
  uint64_t now = hk_os_now_ms();
  if (now >= next_purge_ms) purge_locked(now, false);
}

bool hk_region_purge(bool force) {
  pthread_mutex_lock(&hk_region_lock);
  bool released = purge_locked(hk_os_now_ms(), force);
  pthread_mutex_unlock(&hk_region_lock);
  return released;
}

/* ---- purging on growth ----
 * A free slab stays committed for the purge delay, so that a program that
 * frees and allocates again takes it back without page faults. But while
 * the program grows, the committed free slabs that its new spans pass over
 * only add to its RSS until their delay is up. So when a span takes clean
 * slabs (never used, or purged: no committed run suited it) and the slabs
 * in live spans have grown by a quarter, and by HK_GROWTH_PURGE_SLABS, since
 * their lowest point after the last such purge, the committed free slabs of
 * the other regions are purged at once, and hk_growth_epoch tells every
 * heap to give back the inside of its free medium blocks (heap.c).
 *
 * Growth is net: a program whose live spans stay level does not trigger
 * it, however many clean slabs its span search takes. Counting the clean
 * slabs taken instead (every 1 MiB of them, as until 2026-11-25) fired in
 * steady state, where the free runs had the wrong lengths for the next
 * spans: each purge made more slabs clean, whose reuse counted again, and
 * every purge cost page faults and, with two threads, TLB shootdowns
 * (mid_large_mt with 1024 slots: 0.63x tcmalloc's speed, 0.82x with net
 * growth; 4 threads x 512 slots 0.56x -> 0.89x; peak RSS +24 % and +14 %,
 * still below tcmalloc's; 2026-11-25). The fraction matters: a fixed step
 * of 1 MiB fired on the ups and downs of a steady state (1024 slots:
 * 0.39x); a sixteenth: 0.80x base; an eighth: 1.23x base; a quarter: 1.37x
 * base and realloc_growth's peak RSS 16.4 -> 15.6 MiB (5-run A/Bs). So
 * does the floor: with a few live blocks of 64 KiB-1 MiB, a quarter of the
 * live spans is one block, and a floor of 1 MiB purged on nearly every
 * malloc after a free (8 live blocks of 256 KiB-1 MiB: 184k slabs purged
 * in 200k operations); 4 MiB: 32 live blocks of 64-256 KiB 2.4 -> 5.1
 * Mops/s, realloc_growth's peak 15.6 -> 16.1 MiB; 8 MiB: 9.2 Mops/s but
 * realloc_growth 26.5 MiB. A block growing in place does not count either (counting it purged the
 * other growing buffers' room: realloc_growth 0.56x), and the taking region
 * is spared. */
#define HK_GROWTH_PURGE_SLABS 64 /* 4 MiB */
static uint32_t slabs_used; /* in live spans */
static uint32_t growth_low; /* lowest slabs_used since the last growth purge */
_Atomic uint32_t hk_growth_epoch;

static bool span_taken(const hk_region_info *taker, unsigned n, unsigned clean) {
  slabs_used += n;
  uint32_t step = growth_low / 4 > HK_GROWTH_PURGE_SLABS ? growth_low / 4 : HK_GROWTH_PURGE_SLABS;
  if (clean == 0 || slabs_used < growth_low + step) return false;
  growth_low = slabs_used;
  atomic_fetch_add_explicit(&hk_growth_epoch, 1, memory_order_relaxed);
  for (hk_region_info *r = regions; r != NULL && r->free_mask != 0; r = r->next) {
    if (r->dirty_mask != 0 && r != taker) purge_dirty(r);
  }
  return true;
}

static void span_given_back(unsigned n) {
  slabs_used -= n;
  if (slabs_used < growth_low) growth_low = slabs_used;
}

hk_page *hk_region_alloc_span(unsigned n, unsigned cls, uint32_t *dirty, unsigned room) {
  pthread_mutex_lock(&hk_region_lock);
  maybe_purge_locked();
  /* Prefer, in order: a committed run this class used last (see below),
   * committed slabs in a region in use, clean slabs in a region in use,
   * then empty regions (so those can be given back). Without a same-class
   * run the search visits every region with free slabs. With room, above
   * all that: a run followed by `room` more free slabs, for a block that
   * may grow in place (hk_region_grow_span). */
  hk_region_info *best = NULL;
  uint32_t best_runs = 0;
  int best_score = -1, enough = room ? 10 : 4;
  for (hk_region_info *r = regions; r != NULL && r->free_mask != 0 && best_score < enough; r = r->next) {
    uint32_t runs = runs_of(r->free_mask, n);
    if (!runs) continue;
    uint32_t dirty_runs = runs_of(r->free_mask & r->dirty_mask, n);
    uint32_t roomy = room ? runs & runs_of(r->free_mask, n + room) : 0;
    if (roomy) {
      /* best: the room committed too, so growing reuses memory */
      uint32_t all_dirty = runs_of(r->free_mask & r->dirty_mask, n + room);
      uint32_t pick = all_dirty ? all_dirty : (roomy & dirty_runs) ? roomy & dirty_runs : roomy;
      int score = all_dirty ? 10 : 8 + ((roomy & dirty_runs) != 0);
      if (score > best_score) {
        best = r;
        best_score = score;
        best_runs = pick;
      }
      continue;
    }
    /* Best of all: a committed run that a page of this very class used
     * last. Its committed memory is where the new page will carve (blocks
     * at the same offsets), so a slab recycled between threads of a
     * program does not end up committed all over for a few blocks. */
    uint32_t same = 0;
    for (uint32_t m = dirty_runs; m != 0; m &= m - 1)
      if (r->last_cls[__builtin_ctz(m)] == cls + 1) same |= m & -m;
    int score = same ? 4 : (r->free_mask != ALL_SLABS ? 2 : 0) + (dirty_runs ? 1 : 0);
    if (score > best_score) {
      best = r;
      best_score = score;
      best_runs = same ? same : dirty_runs ? dirty_runs : runs;
    }
  }
  if (best == NULL) {
    best = region_new();
    if (best == NULL) {
      purge_locked(hk_os_now_ms(), true);
      best = region_new();
    }
    if (best == NULL) {
      pthread_mutex_unlock(&hk_region_lock);
      return NULL;
    }
    best_runs = runs_of(best->free_mask, n);
  }
  unsigned i = (unsigned)__builtin_ctz(best_runs);
  uint32_t run = (n == 32 ? ~0u : ((1u << n) - 1)) << i;
  *dirty = (best->dirty_mask & run) >> i;
  best->free_mask &= ~run;
  best->dirty_mask &= ~run;
  if (best->dirty_mask == 0) best->purge_at_ms = 0;
  bool grew = span_taken(best, n, n - (unsigned)__builtin_popcount(*dirty));
  best->empty_since_ms = 0;
  if (best->free_mask == 0 && best != regions_tail) { /* full: out of the search's way */
    list_unlink(best);
    list_push_back(best);
  }
  hk_page *page = &best->r->pages[i];
  memset(page, 0, n * sizeof(hk_page));
  page->nslabs = (uint8_t)n;
  for (unsigned k = 1; k < n; k++) page[k].back = (uint16_t)(k * sizeof(hk_page));
  table_set(best->r, i, n, page);
  hk_stat_peak(&hk_stats.slabs_peak, hk_stat_add(slabs_in_use, n) + n);
  pthread_mutex_unlock(&hk_region_lock);
  if (grew) hk_spares_trim(); /* the heaps' spares beyond HK_SPARE_BYTES too */
  return page;
}

/* committed: the span may hold committed pages (else it was purged) */
static void free_span(hk_page *page, bool committed) {
  hk_region *reg = hk_region_of(page);
  hk_region_info *r = reg->info;
  unsigned i = (unsigned)(page - reg->pages), n = page->nslabs;
  uint32_t run = (n == 32 ? ~0u : ((1u << n) - 1)) << i;
  uint8_t last = (uint8_t)(page->cls + 1);
  pthread_mutex_lock(&hk_region_lock);
  memset(page, 0, n * sizeof(hk_page));
  memset(&r->last_cls[i], last, n);
  if (r->free_mask == 0 && r != regions) { /* has free slabs again: back to the front */
    list_unlink(r);
    list_push_front(r);
  }
  r->free_mask |= run;
  uint64_t now = hk_os_now_ms();
  if (committed) mark_dirty(r, run, now);
  if (r->free_mask == ALL_SLABS) r->empty_since_ms = now;
  span_given_back(n);
  atomic_fetch_sub_explicit(&hk_stats.slabs_in_use, n, memory_order_relaxed);
  if (now >= next_purge_ms) purge_locked(now, false);
  pthread_mutex_unlock(&hk_region_lock);
  hk_purge_poke = true; /* the caller wakes the purger once its state is consistent */
}

void hk_region_free_span(hk_page *page) { free_span(page, true); }
void hk_region_free_span_purged(hk_page *page) { free_span(page, false); }

/* Resizing a span in place (a block alone in its span, see hk_realloc). */
static uint32_t slab_bits(unsigned first, unsigned n) { return (n >= 32 ? ~0u : ((1u << n) - 1)) << first; }

bool hk_region_grow_span(hk_page *page, unsigned n) {
  hk_region *reg = hk_region_of(page);
  hk_region_info *r = reg->info;
  unsigned i = (unsigned)(page - reg->pages), old = page->nslabs;
  if (n <= old || i + n > HK_SLABS) return false;
  uint32_t add = slab_bits(i + old, n - old);
  pthread_mutex_lock(&hk_region_lock);
  if ((r->free_mask & add) != add) {
    pthread_mutex_unlock(&hk_region_lock);
    return false;
  }
  r->free_mask &= ~add;
  r->dirty_mask &= ~add;
  if (r->dirty_mask == 0) r->purge_at_ms = 0;
  if (r->free_mask == 0 && r != regions_tail) {
    list_unlink(r);
    list_push_back(r);
  }
  memset(page + old, 0, (n - old) * sizeof(hk_page));
  for (unsigned k = old; k < n; k++) page[k].back = (uint16_t)(k * sizeof(hk_page));
  table_set(reg, i + old, n - old, page);
  page->nslabs = (uint8_t)n;
  slabs_used += n - old;
  growth_low += n - old; /* growth in place is not growth here (see above) */
  hk_stat_peak(&hk_stats.slabs_peak, hk_stat_add(slabs_in_use, n - old) + (n - old));
  pthread_mutex_unlock(&hk_region_lock);
  return true;
}

void hk_region_shrink_span(hk_page *page, unsigned n) {
  hk_region *reg = hk_region_of(page);
  hk_region_info *r = reg->info;
  unsigned i = (unsigned)(page - reg->pages), old = page->nslabs;
  if (n == 0 || n >= old) return;
  uint32_t tail = slab_bits(i + n, old - n);
  uint8_t last = (uint8_t)(page->cls + 1);
  pthread_mutex_lock(&hk_region_lock);
  memset(page + n, 0, (old - n) * sizeof(hk_page));
  memset(&r->last_cls[i + n], last, old - n);
  page->nslabs = (uint8_t)n;
  if (r->free_mask == 0 && r != regions) {
    list_unlink(r);
    list_push_front(r);
  }
  r->free_mask |= tail;
  mark_dirty(r, tail, hk_os_now_ms());
  span_given_back(old - n);
  atomic_fetch_sub_explicit(&hk_stats.slabs_in_use, old - n, memory_order_relaxed);
  pthread_mutex_unlock(&hk_region_lock);
  hk_purge_poke = true;
}

bool hk_region_pending(void) {
  bool any = false;
  long empty = 0;
  pthread_mutex_lock(&hk_region_lock);
  for (hk_region_info *r = regions; r != NULL && r->free_mask != 0 && !any; r = r->next) {
    if (r->dirty_mask) any = true;
    if (r->free_mask == ALL_SLABS && ++empty > hk_opt.region_reserve) any = true;
  }
  pthread_mutex_unlock(&hk_region_lock);
  return any;
}

/* Bytes mapped for small regions and bytes in live pages (for mallinfo2). */
void hk_region_usage(size_t *mapped, size_t *in_use) {
  pthread_mutex_lock(&hk_region_lock);
  size_t m = 0, u = 0;
  for (hk_region_info *r = regions; r != NULL; r = r->next) {
    m += HK_REGION_SIZE;
    u += (size_t)(__builtin_popcount(ALL_SLABS) - __builtin_popcount(r->free_mask)) * HK_SLAB_SIZE;
  }
  pthread_mutex_unlock(&hk_region_lock);
  *mapped = m;
  *in_use = u;
}
