/* Regions: 4 MiB-aligned mappings cut into 64 KiB slabs, committed from
 * the arena (a reservation of address space) whose page table free() reads.
 * Any free span of slabs in any region can become a page of any size class.
 * This is the only shared structure on the small-block path, in lists of a
 * lock each (one per CPU, see below); a list is taken once per page (tens
 * to thousands of blocks, or one block of 64 KiB-1 MiB), never per block.
 *
 * Memory goes back to the OS after hk_opt.purge_delay_ms: free slabs are
 * purged with MADV_DONTNEED, and empty regions beyond hk_opt.region_reserve (per list)
 * are unmapped. The delay keeps a program that frees and re-allocates in a
 * loop from paying a page fault per block. */
#include "internal.h"

#include <stddef.h>
#include <string.h>

/* Bits first .. first+n-1. */
static hk_slabmask slab_bits(unsigned first, unsigned n) {
  return (n >= 64 ? ~(hk_slabmask)0 : (((hk_slabmask)1 << n) - 1)) << first;
}

/* The length of the run of free slabs that slab i (free) is part of. */
static unsigned run_around(hk_slabmask free, unsigned i) {
  hk_slabmask used = ~free, below = used & (((hk_slabmask)1 << i) - 1), above = used >> i;
  unsigned start = below ? 64u - (unsigned)__builtin_clzll(below) : 0;
  unsigned end = above ? i + (unsigned)__builtin_ctzll(above) : 64;
  return end - start;
}

/* The slabs that serve pages: 1..63, less slab 63 where the region ends
 * with a guard page (end_guard: hardened mode, and pages too large for
 * guards in slab 0), and less slab 1 where it is the guard below the first
 * blocks (pages of 64 KiB, which leave slab 0 to the header). Set by
 * hk_region_init. */
static hk_slabmask all_slabs;
static unsigned first_slab = 1;
static bool end_guard;
#define ALL_SLABS all_slabs

/* What the span search reads of each small region, kept apart from the
 * region (hk_region.info) in one array: the headers sit at 4 MiB
 * alignment (plus one of 6 offsets in the arena: hk_region_of), hence in
 * a few cache sets, and a search that read each region's header would miss
 * the cache on every region it visits. Under its list's lock. */
typedef struct hk_region_info {
  struct region_list *list;  /* the list (and lock) the region belongs to; written and read
                                without that lock atomically (same_at) */
  uint32_t index;            /* its place among the records (info_at), fixed */
  hk_slabmask free_mask;        /* bit i: slab i is free */
  hk_slabmask dirty_mask;       /* bit i: slab i is free but may hold committed pages */
  hk_region *r;
  struct hk_region_info *next, *prev;
  uint64_t purge_at_ms;      /* when dirty slabs may be given back (0: none) */
  uint64_t empty_since_ms;   /* all slabs free since (0: not empty) */
  hk_slabmask fresh;         /* bit i: slab i never used since the region was mapped */
  unsigned max_run;          /* at least the longest run of free slabs: the search skips the
                                region for longer spans (exact after a release, an upper bound
                                after a take, lowered when a search finds no run) */
  hk_slabmask heads;         /* bit i: a page started at free slab i (its class: last_cls[i]) */
  uint8_t last_cls[HK_SLABS]; /* of each free slab: class + 1 of the page that used it last (0: none) */
} __attribute__((aligned(64))) hk_region_info;
/* Cache-line aligned: the records of the regions of different lists (of
 * different threads) lie side by side, and one thread's span search must
 * not read a line that another's releases write. */

/* One per region that exists: the arena's, and those mapped outside it
 * (the arena full, or HAKMEM_ARENA_MB set low), in chunks of INFO_CHUNK
 * mapped as the regions come (a chunk's records stay put: same_at reads
 * one by its index without info_lock). Taken and given back under
 * info_lock, inside a region list's lock. */
#define INFO_CHUNK 4096u   /* records a chunk (768 KiB): 16 GiB of regions */
#define INFO_CHUNKS 4095u  /* 64 TiB of regions: same_at names a record in 24 bits */
static pthread_mutex_t info_lock = PTHREAD_MUTEX_INITIALIZER;
static hk_region_info *info_chunks[INFO_CHUNKS];
static size_t info_used;            /* entries handed out at least once */
static hk_region_info *info_free;   /* given back, linked through next */
static hk_region_info *info_at(size_t i) { return &info_chunks[i / INFO_CHUNK][i % INFO_CHUNK]; }

/* The regions, in lists of their own lock each. A heap
 * takes its spans from its own list's regions when one has a committed run
 * that fits, else from another list's (if its lock is free), else from its
 * own list's clean slabs or a new region there; a span goes back to the
 * list of its region. Under one lock, threads replacing blocks of
 * 64 KiB-1 MiB would mostly wait for each other: each malloc or free of
 * such a block takes or releases a page, with a search over the regions
 * under the lock. Taking another list's committed run before clean memory
 * of its own keeps the lists from growing apart, as separate heaps of
 * regions would. */
typedef struct region_list {
  hk_region_info *first, *last; /* regions with free slabs first, full ones at the tail */
  uint64_t next_purge_ms;
  uint32_t events;              /* span events, for due_purge() */
  uint32_t slabs_used;          /* in live spans of this list's regions */
  uint32_t slabs_peak;          /* highest slabs_used (statistics) */
  uint32_t fresh_taken;         /* never used slabs taken since the last growth purge */
  uint32_t epoch_low;           /* lowest slabs_used since hk_growth_epoch last moved for it */
  /* At least the longest run of committed free slabs in the list's regions:
   * raised when a span is freed, lowered when a search finds no committed
   * run. Other heaps read it without the lock, and skip the list when it
   * is too short, so that they neither take the lock nor search (on its
   * own cache line: the first line changes hands on every span). */
  _Atomic uint32_t committed_run __attribute__((aligned(64)));
  /* Spans given back while another thread held the lock, left for the
   * next holder (free_span); linked through their head records' `next`. */
  _Atomic(hk_page *) deferred;
  /* Per class: the last two places where a page of the class left
   * committed slabs, as (record index + 1) << 8 | slab (0: none),
   * the newer first; tried before the search (same_at()). */
  uint32_t same_at[HK_NCLASSES][2] __attribute__((aligned(64)));
} __attribute__((aligned(64))) region_list;

/* Zero-initialised (in .bss, not 80 KiB of the library's data). */
static region_list lists[HK_REGION_LISTS_MAX];

/* Their locks, set in hk_region_init, lie apart, one to a cache line: in
 * the records, setting them (glibc's adaptive kind is not all zeros)
 * would write a page for every three lists; here one page whatever the
 * count. */
static struct {
  pthread_mutex_t m;
} __attribute__((aligned(64))) list_locks[HK_REGION_LISTS_MAX] __attribute__((aligned(4096))); /* one page */

HK_INLINE pthread_mutex_t *list_lock(const region_list *l) { return &list_locks[l - lists].m; }

static void drain_deferred(region_list *l);
/* Take l's lock; the spans deferred while others held it are freed first. */
static void list_take(region_list *l) {
  hk_lock(list_lock(l));
  drain_deferred(l);
}
static bool list_try(region_list *l) {
  if (!hk_trylock(list_lock(l))) return false;
  drain_deferred(l);
  return true;
}

/* One list per CPU the process may run on, so that threads on different
 * CPUs seldom share a lock, within HK_REGION_LISTS_MIN..MAX. Set once, at
 * initialisation, before any region exists. With fewer lists than CPUs,
 * threads replacing medium blocks wait on the list locks in both span
 * paths. HAKMEM_REGION_LISTS sets the count
 * (1 to HK_REGION_LISTS_MAX): where the CPUs a process may use are not the
 * CPUs it gets (a container's CPU quota), and for the tests. */
static unsigned list_count = HK_REGION_LISTS_MIN;

unsigned hk_header_spots = 1;
uintptr_t hk_header_step;

void hk_region_init(void) {
  /* a header's page, and a page on either side of it in slab 0 */
  uintptr_t step = hk_os_page > sizeof(hk_region) ? hk_os_page : sizeof(hk_region);
  if (HK_SLAB_SIZE / step > 2) {
    hk_header_step = step;
    hk_header_spots = (unsigned)(HK_SLAB_SIZE / step - 2);
  }
  end_guard = hk_secure || hk_header_step == 0;
  first_slab = hk_os_page >= HK_SLAB_SIZE ? 2 : 1;
  all_slabs = slab_bits(first_slab, HK_SLABS - first_slab - end_guard);
  unsigned cpus = hk_os_cpu_count();
  list_count = cpus < HK_REGION_LISTS_MIN ? HK_REGION_LISTS_MIN : cpus > HK_REGION_LISTS_MAX ? HK_REGION_LISTS_MAX : cpus;
  if (hk_opt.region_lists > 0) list_count = (unsigned)hk_opt.region_lists;
  for (unsigned k = 0; k < list_count; k++) {
    list_locks[k].m = (pthread_mutex_t)HK_SPIN_MUTEX_INITIALIZER;
  }
  hk_arena_init();
}

/* A run of committed free slabs of len slabs may exist in l now. */
static void note_committed_run(region_list *l, unsigned len) {
  if (len > hk_load_relaxed(&l->committed_run))
    hk_store_relaxed(&l->committed_run, len);
}

/* Slab i of r has just become free: its run may be r's longest now. */
static void note_run(hk_region_info *r, unsigned i) {
  unsigned len = run_around(r->free_mask, i);
  if (len > r->max_run) r->max_run = len;
}

/* Free slabs become dirty (may hold committed pages) until purged. */
static void mark_dirty(hk_region_info *r, hk_slabmask run) {
  if (r->dirty_mask == 0) r->purge_at_ms = hk_os_now_ms() + (uint64_t)hk_opt.purge_delay_ms;
  r->dirty_mask |= run;
}

static void list_unlink(hk_region_info *r) { hk_list_remove(r->list, r); }
static void list_push_front(hk_region_info *r) { hk_list_push_front(r->list, r); }
static void list_push_back(hk_region_info *r) { hk_list_push_back(r->list, r); }
/* Has free slabs again: back to the front. */
static void list_has_room(hk_region_info *r) {
  if (r->free_mask == 0 && r != r->list->first) {
    list_unlink(r);
    list_push_front(r);
  }
}
/* Full: out of the search's way. */
static void list_if_full(hk_region_info *r) {
  if (r->free_mask == 0 && r != r->list->last) {
    list_unlink(r);
    list_push_back(r);
  }
}

static hk_region_info *info_take(void) {
  hk_lock(&info_lock);
  hk_region_info *info = info_free;
  if (info != NULL) {
    info_free = info->next;
  } else if (info_used < (size_t)INFO_CHUNK * INFO_CHUNKS) {
    hk_region_info **chunk = &info_chunks[info_used / INFO_CHUNK];
    if (*chunk == NULL) *chunk = hk_os_map_aligned(INFO_CHUNK * sizeof(hk_region_info), hk_os_page);
    if (*chunk != NULL) {
      info = info_at(info_used);
      info->index = (uint32_t)info_used++;
    }
  }
  hk_unlock(&info_lock);
  return info; /* (NULL: no memory for a chunk, or 64 TiB of small regions) */
}
static void info_give(hk_region_info *info) {
  hk_lock(&info_lock);
  info->r = NULL;
  __atomic_store_n(&info->list, NULL, __ATOMIC_RELAXED);
  info->next = info_free;
  info_free = info;
  hk_unlock(&info_lock);
}

/* Commit an arena slot for a region: its header's page (hk_region_of) and
 * slabs 1-63. The rest of slab 0, a page at least on either side of the
 * header's (where slab 0 has room: pages of 16 KiB or less), is a guard
 * between the header and the blocks of this region and of the region
 * before. Where the kernel has guards without mappings of their own
 * (hk_os_guard_light), the slot is committed whole and its mapping merges
 * with its neighbours': the regions of a heap of 64 GiB stay within the
 * kernel's limit on mappings (vm.max_map_count, 65,530), and a fork copies
 * a few. Elsewhere the rest of slab 0 stays reserved and inaccessible, and
 * each region takes four mappings; when the limit refuses them, the slot
 * is committed whole, without the guards. */
static bool commit_slot(hk_region *slot) {
  size_t header_pages = hk_page_up(sizeof(hk_region));
  char *r = (char *)slot, *header = r + hk_region_header_offset((uintptr_t)r), *after = header + header_pages;
  /* (a kernel known to refuse them takes the pieces at once: no mapping made and undone) */
  if (hk_os_has_guard_light() && hk_os_commit(r, HK_REGION_SIZE)) {
    if (hk_os_guard_light(r, (size_t)(header - r)) && hk_os_guard_light(after, (size_t)(r + HK_SLAB_SIZE - after)))
      return true;
    hk_os_decommit(r, HK_SLAB_SIZE); /* (slab 0 reserved again, as below) */
  }
  if (hk_os_commit(header, header_pages) && hk_os_commit(r + HK_SLAB_SIZE, HK_REGION_SIZE - HK_SLAB_SIZE))
    return true;
  return hk_os_commit(r, HK_REGION_SIZE);
}

/* Caller holds l's lock. The region is committed (a system call) after the
 * record and the slot are taken, outside their locks: two threads that grow
 * at once do not wait for each other's commit. */
static hk_region_info *region_new(region_list *l) {
  if (!hk_limit_allows(HK_REGION_SIZE)) return NULL; /* (a memory limit: limits.c) */
  hk_region_info *info = info_take();
  if (info == NULL) return NULL;
  hk_region *slot = hk_arena_take();
  hk_space_check(false);
  hk_region *r = slot;
  if (r != NULL && !commit_slot(r)) r = NULL;
  if (r == NULL && (r = hk_os_map_aligned(HK_REGION_SIZE, HK_REGION_SIZE)) != NULL &&
      !hk_os_guard_light((char *)r + hk_page_up(sizeof(hk_region)), HK_SLAB_SIZE - hk_page_up(sizeof(hk_region))))
    hk_os_guard((char *)r + hk_page_up(sizeof(hk_region)), HK_SLAB_SIZE - hk_page_up(sizeof(hk_region))); /* slab 0 after the header */
  if (r != NULL && !hk_region_map_prepare(r)) { /* beyond the ownership map, or no memory for it */
    hk_os_unmap(r, HK_REGION_SIZE);
    r = NULL;
  }
  /* hardened mode's block map (secure.h), apart from the region: no write
   * through a pointer into the region reaches it */
  void *block_map = r != NULL && hk_secure ? hk_os_map_aligned(HK_BLOCK_MAP_BYTES, hk_os_page) : NULL;
  if (r != NULL && hk_secure && block_map == NULL) {
    if (r == slot) hk_os_decommit(r, HK_REGION_SIZE);
    else hk_os_unmap(r, HK_REGION_SIZE);
    r = NULL;
  }
  if (r == NULL || (slot != NULL && r != slot)) { /* the slot, and the record if nothing was mapped, go back */
    if (slot != NULL) hk_arena_give(slot);
    if (r == NULL) {
      info_give(info);
      return NULL;
    }
  }
  /* (catches overflows into the next region, and underflows into this
   * one's header where slab 0 has no room for a guard) */
  if (end_guard && !hk_os_guard_light((char *)r + HK_REGION_SIZE - hk_os_page, hk_os_page))
    hk_os_guard((char *)r + HK_REGION_SIZE - hk_os_page, hk_os_page);
  if (first_slab > 1 && !hk_os_guard_light((char *)r + HK_SLAB_SIZE, HK_SLAB_SIZE))
    hk_os_guard((char *)r + HK_SLAB_SIZE, HK_SLAB_SIZE);
  /* (huge pages: the slabs that serve pages, of which the upper 2 MiB can be one) */
  int thp = hk_thp_advice(HK_REGION_SIZE, true);
  if (thp != 0)
    hk_os_huge((char *)r + first_slab * HK_SLAB_SIZE,
               HK_REGION_SIZE - first_slab * HK_SLAB_SIZE - (end_guard ? hk_os_page : 0), thp > 0);
  r = hk_region_of(r); /* in the arena, the header moves into slab 0 */
  r->magic = HK_MAGIC_REGION;
  r->kind = HK_KIND_SMALL;
  r->info = info;
  r->block_map = block_map;
  /* (all but `list`, which same_at() reads without this list's lock, and
   * the index) */
  memset(&info->free_mask, 0, sizeof *info - offsetof(hk_region_info, free_mask));
  __atomic_store_n(&info->list, l, __ATOMIC_RELAXED);
  info->r = r;
  info->free_mask = ALL_SLABS;
  info->max_run = run_around(ALL_SLABS, first_slab);
  info->fresh = ALL_SLABS;
  list_push_front(info);
  hk_region_register(r);
  hk_stat_add(regions_mapped, 1);
  hk_stat_peak(&hk_stats.regions_peak, hk_stat_add(regions_live, 1) + 1);
  return info;
}

static void region_delete(hk_region_info *info) {
  hk_region *r = info->r;
  list_unlink(info);
  hk_region_unregister(r);
  hk_arena_table_set(r, 0, HK_SLABS, NULL);
  if (r->block_map != NULL) hk_os_unmap((void *)r->block_map, HK_BLOCK_MAP_BYTES);
  r = (hk_region *)hk_region_base(r);
  bool arena = hk_arena_contains(r);
  if (arena) hk_os_decommit(r, HK_REGION_SIZE);
  else hk_os_unmap(r, HK_REGION_SIZE);
  info_give(info);
  if (arena) hk_arena_give(r);
  hk_stat_add(regions_unmapped, 1);
  hk_sub_relaxed(&hk_stats.regions_live, 1);
}

/* Bit i of the result: slabs i .. i+n-1 are all set in mask. Doubling
 * the run length each step (a run of 2L is two overlapping runs of L)
 * takes 5 steps for 17 slabs instead of 16: the search calls this for
 * every region it visits. */
static hk_slabmask runs_of(hk_slabmask mask, unsigned n) {
  unsigned len = 1;
  for (; len * 2 <= n; len *= 2) mask &= mask >> len;
  if (len < n) mask &= mask >> (n - len);
  return mask;
}

static void purge_runs(const hk_region *r, hk_slabmask mask) {
  while (mask) {
    unsigned i = (unsigned)__builtin_ctzll(mask);
    unsigned n = 0;
    while (i + n < HK_SLABS && (mask >> (i + n)) & 1) n++;
    hk_os_purge((char *)hk_region_base(r) + (size_t)i * HK_SLAB_SIZE, (size_t)n * HK_SLAB_SIZE);
    hk_stat_add(slabs_purged, n);
    hk_stat_add(purge_calls, 1);
    mask &= ~slab_bits(i, n);
  }
}

/* Give back all of r's committed free slabs. Caller holds its list's lock. */
static void purge_dirty(hk_region_info *r) {
  purge_runs(r->r, r->dirty_mask);
  r->dirty_mask = 0;
  r->purge_at_ms = 0;
}

/* Caller holds l's lock. */
static bool purge_locked(region_list *l, uint64_t now, bool force) {
  bool released = false;
  long empty_kept = 0;
  hk_region_info *next;
  for (hk_region_info *r = l->first; r != NULL && r->free_mask != 0; r = next) {
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
  l->next_purge_ms = now + (uint64_t)(hk_opt.purge_delay_ms / 2 + 1);
  return released;
}

/* The list's timed purge, if due, looked at on every HK_PURGE_CHECK_EVENTS-th
 * span event of the list (every one with HAKMEM_PURGE_DELAY_MS=0): reading
 * the clock on each, beside the heap's own timed pass, would add several
 * clock reads to each malloc+free of a block of 64 KiB-1 MiB. A busy list
 * makes thousands of events a millisecond;
 * an idle one is the purger thread's. Caller holds l's lock. */
#define HK_PURGE_CHECK_EVENTS 8
static void due_purge(region_list *l) {
  if ((++l->events % HK_PURGE_CHECK_EVENTS) != 0 && hk_opt.purge_delay_ms != 0) return;
  uint64_t now = hk_os_now_ms();
  if (now >= l->next_purge_ms) purge_locked(l, now, false);
}

bool hk_region_purge(bool force) {
  bool released = false;
  for (unsigned k = 0; k < list_count; k++) {
    list_take(&lists[k]);
    released |= purge_locked(&lists[k], hk_os_now_ms(), force);
    hk_unlock(list_lock(&lists[k]));
  }
  return released;
}

/* ---- purging on growth ----
 * A free slab stays committed for the purge delay, so that a program that
 * frees and allocates again takes it back without page faults. But while
 * the program grows, the committed free slabs that its new spans pass over
 * only add to its RSS until their delay is up. Two signals, per list, and
 * only when a span takes clean slabs:
 * - the list's footprint grew: its spans have taken never used ("fresh")
 *   slabs amounting to an eighth of its live spans, and to
 *   HK_GROWTH_PURGE_SLABS, since the last such purge. The committed free
 *   slabs of the list's other regions are purged at once, the heaps'
 *   spares beyond HK_SPARE_BYTES go back to the regions (committed, for
 *   any span to take: hk_spares_trim), and hk_growth_epoch moves;
 * - its live spans grew by a quarter (and by HK_GROWTH_PURGE_SLABS) since
 *   their lowest point after the last signal: hk_growth_epoch moves only,
 *   which tells every heap to give back the inside of the free blocks of
 *   its idle classes below a slab (lend.c, hk_heap_purge_blocks): a program
 *   that frees most of its medium blocks and then allocates other sizes
 *   gives their memory back before its RSS grows far.
 *
 * Only fresh slabs purge. A program replacing blocks of random sizes in a
 * steady state takes clean slabs too, where the free runs have the wrong
 * lengths for the next spans, and each purge makes more slabs clean; but
 * its footprint levels off, and then it takes no fresh ones. Purging on
 * net growth would fire on the ups and downs of the live spans of a thread
 * that replaces a few dozen blocks of 64 KiB-1 MiB, each purge paid for in
 * page faults. An eighth rather than a quarter keeps a growing program's
 * peak lower. A block growing in place does not count (counting it would
 * purge the room of the other growing buffers), and the taking region is
 * spared. The floor: with a few live blocks of 64 KiB-1 MiB a quarter of
 * the live spans is one block, and a lower floor purges on nearly every
 * malloc after a free; a higher one lets a growing buffer's peak rise. */
#define HK_GROWTH_PURGE_SLABS 64 /* 4 MiB */
_Atomic uint32_t hk_growth_epoch;

enum { GREW_NOT, GREW_EPOCH, GREW_PURGED };
/* slabs / div, and HK_GROWTH_PURGE_SLABS at least */
static uint32_t growth_step(uint32_t slabs, uint32_t div) {
  return slabs / div > HK_GROWTH_PURGE_SLABS ? slabs / div : HK_GROWTH_PURGE_SLABS;
}

static int span_taken(region_list *l, const hk_region_info *taker, unsigned n, bool clean, unsigned fresh) {
  l->slabs_used += n;
  if (l->slabs_used > l->slabs_peak) l->slabs_peak = l->slabs_used;
  l->fresh_taken += fresh;
  if (!clean) return GREW_NOT;
  bool purge = l->fresh_taken >= growth_step(l->slabs_used, 8);
  if (!purge && l->slabs_used < l->epoch_low + growth_step(l->epoch_low, 4)) return GREW_NOT;
  l->epoch_low = l->slabs_used;
  hk_add_relaxed(&hk_growth_epoch, 1);
  if (!purge) return GREW_EPOCH;
  l->fresh_taken = 0;
  hk_stat_add(growth_purges, 1);
  for (hk_region_info *r = l->first; r != NULL && r->free_mask != 0; r = r->next) {
    if (r->dirty_mask != 0 && r != taker) purge_dirty(r);
  }
  return GREW_PURGED;
}

/* ---- the span search ----
 * Prefer, in order: a committed run this class used last (see below),
 * committed slabs in a region in use, clean slabs in a region in use, then
 * empty regions (so those can be given back). Without a same-class run the
 * search visits every region of the list with free slabs, up to the first
 * clean run in a region in use where the list has no committed run of the
 * span's length (committed_run). With room, above
 * all that: a run followed by `room` more free slabs, for a block that may
 * grow in place (hk_region_grow_span). */
enum {
  SCORE_EMPTY, SCORE_EMPTY_COMMITTED, SCORE_CLEAN = 3, SCORE_COMMITTED, SCORE_EXACT, SCORE_SAME, /* scores */
  SCORE_ROOMY = 8, SCORE_ROOMY_ALL_COMMITTED = 10 /* with room */
};

typedef struct span_pick {
  hk_region_info *r;
  hk_slabmask runs; /* where the span may start */
  int score;
  bool committed;   /* the run's slabs may hold committed pages */
} span_pick;

/* One of the last two places where a page of class cls ended, if it still
 * starts a committed free run of n slabs there: the search's best pick
 * (SCORE_SAME) without a search. A program replacing medium blocks ends
 * most searches on such a run, and the recent places pack better than the
 * first in list order. */
static span_pick same_at(region_list *l, unsigned n, unsigned cls) {
  for (unsigned k = 0; k < 2; k++) {
    uint32_t at = l->same_at[cls][k];
    if (at == 0) break;
    hk_region_info *r = info_at((at >> 8) - 1);
    unsigned i = at & 255;
    hk_slabmask run = slab_bits(i, n);
    /* (the record may have been given back and be taken for another list
     * right now: its list is read atomically, and nothing else of it unless
     * it is this list's, whose lock the caller holds) */
    if (__atomic_load_n(&r->list, __ATOMIC_RELAXED) == l && i + n <= HK_SLABS && ((r->heads >> i) & 1) &&
        r->last_cls[i] == cls + 1 &&
        (r->free_mask & r->dirty_mask & run) == run)
      return (span_pick){r, (hk_slabmask)1 << i, SCORE_SAME, true};
  }
  return (span_pick){NULL, 0, -1, false};
}

static void note_same(region_list *l, unsigned cls, const hk_region_info *r, unsigned i) {
  uint32_t at = (r->index + 1) << 8 | i;
  if (l->same_at[cls][0] != at) {
    l->same_at[cls][1] = l->same_at[cls][0];
    l->same_at[cls][0] = at;
  }
}

static span_pick search(region_list *l, unsigned n, unsigned cls, unsigned room) {
  span_pick best = room ? (span_pick){NULL, 0, -1, false} : same_at(l, n, cls);
  if (best.score == SCORE_SAME) return best;
  int enough = room ? SCORE_ROOMY_ALL_COMMITTED : SCORE_EXACT;
  /* No committed run of n slabs in the list (committed_run bounds them
   * from above): no region scores above a clean run in a region in use (a
   * roomy one, with room), and the first such is the pick, as the loop
   * keeps the first of equal scores. A heap growing into new regions
   * (pushed to the front) finds its span there, where the search read
   * every region with free slabs for each span. */
  if (hk_load_relaxed(&l->committed_run) < n) enough = room ? SCORE_ROOMY : SCORE_CLEAN;
  bool any_committed = false;
  uint64_t reads = 0;
  for (hk_region_info *r = l->first; r != NULL && r->free_mask != 0 && best.score < enough; r = r->next) {
    reads++;
    if (r->max_run < n) continue;
    hk_slabmask free = r->free_mask, dirty_free = free & r->dirty_mask;
    hk_slabmask dirty_runs = dirty_free ? runs_of(dirty_free, n) : 0;
    any_committed |= dirty_runs != 0;
    if (room) {
      hk_slabmask roomy = runs_of(free, n + room);
      if (roomy) {
        /* best: the room committed too, so growing reuses memory */
        hk_slabmask all_dirty = dirty_runs ? runs_of(dirty_free, n + room) : 0;
        hk_slabmask pick = all_dirty ? all_dirty : (roomy & dirty_runs) ? roomy & dirty_runs : roomy;
        int score = all_dirty ? SCORE_ROOMY_ALL_COMMITTED : SCORE_ROOMY + ((roomy & dirty_runs) != 0);
        if (score > best.score) best = (span_pick){r, pick, score, (pick & dirty_runs) != 0};
        continue;
      }
    }
    bool in_use = free != ALL_SLABS;
    if (!dirty_runs) { /* clean slabs only: the runs are looked for if they would do better */
      int score = in_use ? SCORE_CLEAN : SCORE_EMPTY;
      if (score <= best.score) continue;
      hk_slabmask runs = runs_of(free, n);
      if (runs) best = (span_pick){r, runs, score, false};
      else r->max_run = n - 1;
      continue;
    }
    /* Best of all: a committed run where a page of this very class started
     * last. Its committed memory is where the new page will carve (blocks
     * at the same offsets), so a slab recycled between threads of a
     * program does not end up committed all over for a few blocks. */
    hk_slabmask same = 0;
    for (hk_slabmask m = dirty_runs & r->heads; m != 0; m &= m - 1)
      if (r->last_cls[__builtin_ctzll(m)] == cls + 1) same |= m & -m;
    /* Then a committed run that fills a free run exactly (it leaves no
     * piece too short for the next span), then any committed run. */
    hk_slabmask exact = same || !in_use ? 0 : dirty_runs & ~runs_of(free, n + 1) & ~(free << 1);
    int score = same ? SCORE_SAME : exact ? SCORE_EXACT : in_use ? SCORE_COMMITTED : SCORE_EMPTY_COMMITTED;
    if (score > best.score) best = (span_pick){r, same ? same : exact ? exact : dirty_runs, score, true};
  }
  /* (the loop stops early only on a committed run, or on a clean one
   * where no committed run can be) */
  if (!any_committed && hk_load_relaxed(&l->committed_run) >= n)
    hk_store_relaxed(&l->committed_run, n - 1);
  hk_stat_add(span_searches, 1);
  hk_stat_add(span_search_reads, reads);
  return best;
}

/* Spans of HK_HIGH_SPAN slabs or more start at the highest place the pick
 * allows, shorter ones at the lowest: the two kinds fill a region from its
 * two ends, and the free slabs between them stay one run that either can
 * use, where spans of all lengths placed from one end leave gaps too short
 * for the long ones. A threshold of 2, 3 or 6 slabs leaves more of a
 * region in such gaps. */
#define HK_HIGH_SPAN 4

/* Records from..n-1 of the span whose head is page: each only leads to the
 * head (hk_page_of reads `back` and nothing else of a later slab's record;
 * its bound is cleared, as a stale table entry may name it; the
 * rest is rewritten when the slab heads a span). Clearing all 128 bytes
 * of each would write up to 2 KiB a span. */
static void link_tail(hk_page *page, unsigned from, unsigned n) {
  for (unsigned k = from; k < n; k++) {
    hk_page_clear_carved(&page[k]);
    page[k].back = (uint16_t)(k * sizeof(hk_page));
    page[k].nslabs = 0;
    page[k].cls = 0;
  }
}

/* Take the span the pick found. Caller holds its list's lock. */
static hk_page *take_span(region_list *l, span_pick pick, unsigned n, hk_slabmask *dirty, int *grew) {
  hk_region_info *best = pick.r;
  unsigned i = n >= HK_HIGH_SPAN ? 63u - (unsigned)__builtin_clzll(pick.runs) : (unsigned)__builtin_ctzll(pick.runs);
  hk_slabmask run = slab_bits(i, n);
  hk_assert((best->free_mask & run) == run);
  *dirty = (best->dirty_mask & run) >> i;
  best->free_mask &= ~run;
  best->dirty_mask &= ~run;
  best->heads &= ~run;
  if (best->dirty_mask == 0) best->purge_at_ms = 0;
  hk_slabmask fresh = best->fresh & run; /* (a popcount is a library call without -mpopcnt) */
  *grew = span_taken(l, best, n, *dirty != slab_bits(0, n), fresh ? (unsigned)__builtin_popcountll(fresh) : 0);
  best->fresh &= ~run;
  best->empty_since_ms = 0;
  list_if_full(best);
  return &best->r->pages[i];
}

hk_page *hk_region_alloc_span(unsigned n, unsigned cls, hk_slabmask *dirty, unsigned room, unsigned home,
                              bool *grew_purged) {
  region_list *l = &lists[home % list_count];
  list_take(l);
  due_purge(l);
  span_pick pick = search(l, n, cls, room);
  hk_page *page = NULL;
  int grew = GREW_NOT;
  if (!pick.committed) {
    /* another list's committed run before clean memory here (try only:
     * a list whose lock is taken is busy serving its own heaps) */
    for (unsigned k = 1; k < list_count && page == NULL; k++) {
      region_list *o = &lists[(home + k) % list_count];
      if (hk_load_relaxed(&o->committed_run) < n) continue;
      if (!list_try(o)) continue;
      span_pick p = search(o, n, cls, room);
      if (p.committed) page = take_span(o, p, n, dirty, &grew);
      hk_unlock(list_lock(o));
    }
  }
  if (page == NULL) {
    if (pick.r == NULL) {
      pick.r = region_new(l);
      if (pick.r == NULL) {
        purge_locked(l, hk_os_now_ms(), true);
        pick.r = region_new(l);
      }
      if (pick.r == NULL) {
        hk_unlock(list_lock(l));
        return NULL;
      }
      pick.runs = runs_of(pick.r->free_mask, n);
    }
    page = take_span(l, pick, n, dirty, &grew);
  }
  hk_unlock(list_lock(l));
  /* The span's page records are the caller's now: set up outside the lock. */
  memset(page, 0, sizeof(hk_page));
  page->nslabs = (uint8_t)n;
  link_tail(page, 1, n);
  hk_arena_table_set(hk_page_region(page), hk_page_slab(page), n, page);
  *grew_purged = grew == GREW_PURGED;
  return page;
}

/* Slabs `run` of r (of a page of class last - 1) become free. committed:
 * they may hold committed pages (else they were purged). Caller holds the
 * list's lock. */
static void free_slabs(region_list *l, hk_region_info *r, hk_slabmask run, uint8_t last, bool committed) {
  hk_assert((r->free_mask & run) == 0 && (run & ~ALL_SLABS) == 0); /* a span freed twice, or beyond the region */
  list_has_room(r);
  r->free_mask |= run;
  if (committed) mark_dirty(r, run);
  for (hk_slabmask m = run; m != 0; m &= m - 1) {
    unsigned s = (unsigned)__builtin_ctzll(m);
    r->last_cls[s] = last;
    if (s > 0 && (run >> (s - 1) & 1)) continue; /* not the start of a run */
    r->heads |= (hk_slabmask)1 << s;
    note_run(r, s);
    if (committed) note_committed_run(l, run_around(r->free_mask & r->dirty_mask, s));
  }
  if (r->free_mask == ALL_SLABS) r->empty_since_ms = hk_os_now_ms();
  unsigned n = (unsigned)__builtin_popcountll(run);
  l->slabs_used -= n;
  if (l->slabs_used < l->epoch_low) l->epoch_low = l->slabs_used;
}

/* Slabs i..i+n-1 of r but those lent (a span of class cls) become free.
 * Caller holds the list's lock. */
static void release_locked(region_list *l, hk_region_info *r, unsigned i, unsigned n, unsigned lent, unsigned cls,
                           bool committed) {
  hk_slabmask run = slab_bits(i, n) & ~((hk_slabmask)lent << i);
  if (committed) note_same(l, cls, r, i);
  free_slabs(l, r, run, (uint8_t)(cls + 1), committed);
}

/* The spans other threads gave back while the lock was taken (free_span).
 * Caller holds l's lock. */
static void drain_deferred(region_list *l) {
  if (hk_load_relaxed(&l->deferred) == NULL) return;
  hk_page *p = atomic_exchange_explicit(&l->deferred, NULL, memory_order_acquire);
  while (p != NULL) {
    hk_page *next = p->next;
    uint32_t what = p->capacity, lent = p->used;
    p->capacity = 0; /* the record as free_span left it: all zero */
    p->used = 0;
    p->next = NULL;
    release_locked(l, hk_page_region(p)->info, hk_page_slab(p), what & 0xff, lent, what >> 16 & 0xff, what >> 8 & 1);
    p = next;
  }
}

/* committed: the span may hold committed pages (else it was purged). If
 * another thread holds the list's lock, the span is left on the list's
 * deferred stack for the next holder instead of waiting: a heap that has
 * taken a span from another list's region (hk_region_alloc_span) gives it
 * back there, into the lock of the heap that list serves, and the two
 * would otherwise wait for each other. */
static void free_span(hk_page *page, bool committed) {
  hk_region *reg = hk_page_region(page);
  hk_region_info *r = reg->info;
  region_list *l = r->list;
  unsigned i = hk_page_slab(page), n = page->nslabs, lent = page->lent, cls = page->cls;
  /* The head's record reads "not a live page" from now on (bound 0); the
   * others keep their offsets to it, which lead stale pointers there, and
   * are rewritten by the next span that takes their slabs. Still the
   * caller's until the mask says free. */
  memset(page, 0, sizeof(hk_page));
  hk_purge_poke = true; /* the caller wakes the purger once its state is consistent */
  if (!list_try(l)) {
    /* (in the record's second line, which only an owner reads: a dead
     * record has none) */
    page->capacity = n | (uint32_t)committed << 8 | cls << 16;
    page->used = lent;
    hk_page *top = hk_load_relaxed(&l->deferred);
    do page->next = top;
    while (!atomic_compare_exchange_weak_explicit(&l->deferred, &top, page, memory_order_release, memory_order_relaxed));
    hk_stat_add(spans_deferred, 1);
    return;
  }
  release_locked(l, r, i, n, lent, cls, committed);
  due_purge(l);
  hk_unlock(list_lock(l));
}

/* Slabs `lend` (bit k: the span's slab k, never the head) of a live page
 * go back to the region, committed, for any span to take (lend.c,
 * lend_free_slabs). Their table entries and records stop leading to the
 * page first: until another span owns them, free() of a stale pointer
 * into them finds no live page there (an invalid free) instead of taking
 * a dropped block back. */
void hk_region_lend_slabs(hk_page *page, unsigned lend) {
  hk_region *reg = hk_page_region(page);
  hk_region_info *r = reg->info;
  region_list *l = r->list;
  unsigned i = hk_page_slab(page);
  for (unsigned m = lend; m != 0; m &= m - 1) {
    unsigned s = i + (unsigned)__builtin_ctz(m);
    hk_arena_table_set(reg, s, 1, NULL);
    hk_page_clear_carved(&reg->pages[s]);
    reg->pages[s].back = 0; /* its own record: bound 0, no live page */
  }
  list_take(l);
  free_slabs(l, r, (hk_slabmask)lend << i, (uint8_t)(page->cls + 1), true);
  hk_unlock(list_lock(l));
  hk_purge_poke = true;
}

void hk_region_free_span(hk_page *page) { free_span(page, true); }
void hk_region_free_span_purged(hk_page *page) {
  hk_os_purge((void *)hk_page_span_start(page), hk_page_span_bytes(page));
  free_span(page, false);
}

/* Resizing a span in place (a block alone in its span, see hk_realloc). */
bool hk_region_grow_span(hk_page *page, unsigned n) {
  hk_region *reg = hk_page_region(page);
  hk_region_info *r = reg->info;
  region_list *l = r->list;
  unsigned i = hk_page_slab(page), old = page->nslabs;
  if (n <= old || i + n > HK_SLABS) return false;
  hk_slabmask add = slab_bits(i + old, n - old);
  list_take(l);
  if ((r->free_mask & add) != add) {
    hk_unlock(list_lock(l));
    return false;
  }
  r->free_mask &= ~add;
  r->dirty_mask &= ~add;
  r->heads &= ~add;
  r->fresh &= ~add; /* growth in place is not growth here (see above) */
  if (r->dirty_mask == 0) r->purge_at_ms = 0;
  list_if_full(r);
  l->slabs_used += n - old;
  if (l->slabs_used > l->slabs_peak) l->slabs_peak = l->slabs_used;
  l->epoch_low += n - old;
  hk_unlock(list_lock(l));
  link_tail(page, old, n);
  hk_arena_table_set(reg, i + old, n - old, page);
  page->nslabs = (uint8_t)n;
  return true;
}

void hk_region_shrink_span(hk_page *page, unsigned n) {
  hk_region *reg = hk_page_region(page);
  hk_region_info *r = reg->info;
  region_list *l = r->list;
  unsigned i = hk_page_slab(page), old = page->nslabs;
  if (n == 0 || n >= old) return;
  hk_slabmask tail = slab_bits(i + n, old - n);
  uint8_t last = (uint8_t)(page->cls + 1);
  memset(page + n, 0, (old - n) * sizeof(hk_page));
  page->nslabs = (uint8_t)n;
  list_take(l);
  note_same(l, last - 1u, r, i + n);
  free_slabs(l, r, tail, last, true);
  hk_unlock(list_lock(l));
  hk_purge_poke = true;
}

bool hk_region_pending(void) {
  bool any = false;
  for (unsigned k = 0; k < list_count && !any; k++) {
    long empty = 0;
    list_take(&lists[k]); /* (deferred spans freed: dirty slabs) */
    for (hk_region_info *r = lists[k].first; r != NULL && r->free_mask != 0 && !any; r = r->next) {
      if (r->dirty_mask) any = true;
      if (r->free_mask == ALL_SLABS && ++empty > hk_opt.region_reserve) any = true;
    }
    hk_unlock(list_lock(&lists[k]));
  }
  return any;
}

/* Bytes mapped for small regions, bytes in live pages, and the lists'
 * peaks of those summed (at least the true peak; mallinfo2, statistics). */
void hk_region_usage(size_t *mapped, size_t *in_use, size_t *peak) {
  size_t m = 0, u = 0, p = 0;
  for (unsigned k = 0; k < list_count; k++) {
    list_take(&lists[k]);
    for (hk_region_info *r = lists[k].first; r != NULL; r = r->next) m += HK_REGION_SIZE;
    u += (size_t)lists[k].slabs_used * HK_SLAB_SIZE;
    p += (size_t)lists[k].slabs_peak * HK_SLAB_SIZE;
    hk_unlock(list_lock(&lists[k]));
  }
  *mapped = m;
  *in_use = u;
  *peak = p;
}

/* Calls fn on the record of every live page: the head slab of a span in
 * use, a slab whose bit in free_mask is clear and whose record has a span
 * length (the other slabs of a span have none, and a slab lent out by a
 * page in use is marked free). Each list's regions under its lock, which
 * keeps them mapped; fn must not allocate. */
void hk_region_each_page(void (*fn)(const hk_page *page, void *arg), void *arg) {
  for (unsigned k = 0; k < list_count; k++) {
    list_take(&lists[k]);
    for (hk_region_info *r = lists[k].first; r != NULL; r = r->next)
      for (unsigned s = 1; s < HK_SLABS; s++)
        if ((r->free_mask & ((hk_slabmask)1 << s)) == 0 && __atomic_load_n(&r->r->pages[s].nslabs, __ATOMIC_RELAXED) != 0)
          fn(&r->r->pages[s], arg);
    hk_unlock(list_lock(&lists[k]));
  }
}

/* fork: every list, then the records, then the arena (the order
 * everywhere else too). */
void hk_region_fork_lock(void) {
  for (unsigned k = 0; k < list_count; k++) hk_lock(list_lock(&lists[k]));
  hk_lock(&info_lock);
  hk_arena_fork_lock();
}
void hk_region_fork_unlock(void) {
  hk_arena_fork_unlock();
  hk_unlock(&info_lock);
  for (unsigned k = list_count; k-- > 0;) hk_unlock(list_lock(&lists[k]));
}

#ifdef HAKMEM_DEBUG
/* Every region list, under its lock: the links agree, each record belongs
 * to its list and its region, dirty slabs are free slabs, and the list's
 * count of slabs in live spans matches its records' masks. */
void hk_debug_regions(void) {
  for (unsigned k = 0; k < list_count; k++) {
    region_list *l = &lists[k];
    list_take(l);
    uint32_t n = 0, used = 0;
    hk_region_info *prev = NULL;
    for (hk_region_info *r = l->first; r != NULL; prev = r, r = r->next) {
      hk_assert(r->prev == prev);
      hk_assert(r->list == l && r->r != NULL && r->r->info == r && r->r->kind == HK_KIND_SMALL);
      hk_assert((r->dirty_mask & ~r->free_mask) == 0);
      hk_assert((r->free_mask & ~ALL_SLABS) == 0);
      used += (uint32_t)__builtin_popcountll(ALL_SLABS & ~r->free_mask);
      hk_assert(++n <= INFO_CHUNK * INFO_CHUNKS);
    }
    hk_assert(l->last == prev);
    hk_assert(used == l->slabs_used);
    hk_unlock(list_lock(l));
  }
}
#endif
