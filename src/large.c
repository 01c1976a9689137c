/* Large blocks (> 1 MiB, alignment > 64 KiB, or from HK_TIGHT_LARGE_MIN
 * up while a limit on mapped bytes holds): each is its own 4 MiB-aligned
 * mapping with a 128-byte header (its hk_region record, slot 0) at its
 * start and its data in its first 4 MiB unit. free() misses the arena's
 * page table for it and, in the slow path (hk_region_lookup), finds the
 * unit's bit set in the ownership map (hk_region_is_ours) and the header at
 * the unit's base (hk_region_of), as for a small region mapped outside the
 * arena. Blocks aligned to 4 MiB or more are found through a list instead
 * (see `detached`).
 *
 * Freed mappings are kept in a small cache (the "whale cache") for
 * hk_opt.purge_delay_ms, so a program that allocates and frees large
 * buffers in a loop makes no system call, and no page fault while the
 * cache's resident bytes stay within their budget (see CACHE_RESIDENT_MAX):
 * a request takes the smallest cached mapping that holds it, whatever its
 * size, or grows the largest one with mremap (its pages move, only the
 * growth is new). realloc grows with mremap too: the pages move, they are
 * not copied. */
#include "internal.h"

#include <errno.h>
#include <string.h>

pthread_mutex_t hk_large_lock = PTHREAD_MUTEX_INITIALIZER;

#define LARGE_META sizeof(hk_page) /* the header's bytes: the region record (slot 0) */

#define CACHE_MAX 64
static hk_region *cache[CACHE_MAX]; /* hk_large_lock */
/* What the cache's searches read of each entry, kept beside the array:
 * the headers of 4 MiB-aligned mappings all fall in the same cache sets,
 * and a scan that read them would miss on every entry. (`resident` is also in
 * the header, cached_resident, for the block that takes the entry.) */
typedef struct cache_meta {
  size_t map_size, resident, user_offset;
  uint64_t at_ms;
} cache_meta;
static cache_meta meta[CACHE_MAX];
static unsigned cache_n;
static size_t cache_bytes;
/* Cached mappings keep their pages for quick reuse, but only up to this
 * many bytes, or as many as the large blocks still live if that is more:
 * beyond that, entries cached for CACHE_HOT_MS give their data pages back
 * (they stay mapped, so reusing them costs page faults, not mmap/munmap),
 * oldest first, at the next free or purger pass. A program freeing many
 * large blocks does not hold them resident for long; one that keeps N MiB
 * of large blocks live and replaces them keeps up to N MiB of freed ones
 * resident, for the purge delay at most. The grace of CACHE_HOT_MS is for
 * a thread that frees the large blocks another allocates (a pipeline): few
 * are live at any moment, and purging at once, under the lock, would cost
 * a madvise per free and make the two threads queue on the lock. */
#define CACHE_RESIDENT_MAX ((size_t)8 << 20)
#define CACHE_HOT_MS 10
static size_t cache_resident;

/* Bytes the program asked for in its live large blocks, and their peak
 * over the current and the previous window of the purge delay: the
 * "recently live" that bounds what a reused mapping may hold beyond its
 * block (a mapping is reused for a smaller block whole, so its pages need
 * not be faulted in again when a larger one follows) and how many bytes
 * the cache may hold. */
static _Atomic size_t live_asked;
static size_t peak_cur, peak_prev; /* hk_large_lock */
static uint64_t peak_at;

/* The peak of live_asked (plus `adding`, a block being allocated) over
 * the last one to two purge delays. Under hk_large_lock. */
static size_t recent_live_locked(uint64_t now, size_t adding) {
  size_t live = hk_load_relaxed(&live_asked) + adding;
  uint64_t w = (uint64_t)hk_opt.purge_delay_ms;
  if (now >= peak_at + w) {
    peak_prev = now >= peak_at + 2 * w ? 0 : peak_cur;
    peak_cur = 0;
    peak_at = now;
  }
  if (live > peak_cur) peak_cur = live;
  return peak_cur > peak_prev ? peak_cur : peak_prev;
}

static size_t data_page(const hk_region *r);

/* Purge the oldest resident entries cached for CACHE_HOT_MS while the cache
 * holds more resident bytes than the budget. Under hk_large_lock. */
static void cache_enforce_budget_locked(uint64_t now) {
  size_t live = hk_load_relaxed(&hk_stats.large_mapped_bytes) - cache_bytes;
  size_t budget = live > CACHE_RESIDENT_MAX ? live : CACHE_RESIDENT_MAX;
  while (cache_resident > budget) {
    unsigned oi = CACHE_MAX;
    for (unsigned i = 0; i < cache_n; i++)
      if (meta[i].resident && now >= meta[i].at_ms + CACHE_HOT_MS && (oi == CACHE_MAX || meta[i].at_ms < meta[oi].at_ms))
        oi = i;
    if (oi == CACHE_MAX) break;
    hk_region *old = cache[oi];
    meta[oi].resident = 0;
    hk_os_purge((char *)old + data_page(old), old->cached_resident);
    if (!hk_secure) memset((char *)old + LARGE_META, 0, HK_OS_PAGE - LARGE_META); /* the header's page */
    cache_resident -= old->cached_resident;
    old->cached_resident = 0;
    old->large_zero = 1; /* its data reads back as zeros */
  }
}

/* Blocks aligned to 4 MiB or more (the region size) cannot keep their
 * header in the 4 MiB unit of their data (the data starts on such a boundary). Their header
 * stays at the mapping's start and is found through this list; only free()
 * of a pointer that the ownership map does not know looks here. */
static struct { hk_region *first, *last; } detached; /* hk_large_lock */

hk_region *hk_large_find_detached(const void *p) {
  hk_region *found = NULL;
  hk_lock(&hk_large_lock);
  for (hk_region *r = detached.first; r != NULL; r = r->next)
    if ((char *)p >= (char *)r && (char *)p < (char *)r + r->map_size) {
      found = r;
      break;
    }
  hk_unlock(&hk_large_lock);
  return found;
}

static size_t round_page(size_t n) { return (n + HK_OS_PAGE - 1) & ~(size_t)(HK_OS_PAGE - 1); }

/* Bytes of all large mappings and of those the cache holds, as one
 * snapshot: a mapping leaves both counts under hk_large_lock (victim),
 * so mallinfo2 never sees a cached block about to be unmapped as live,
 * as it would if a purge came between two separate reads. */
void hk_large_usage(size_t *mapped, size_t *cached) {
  hk_lock(&hk_large_lock);
  *mapped = hk_load_relaxed(&hk_stats.large_mapped_bytes);
  *cached = cache_bytes;
  hk_unlock(&hk_large_lock);
}

/* r is to be unmapped once the lock is dropped: it stops counting as
 * mapped now. Under hk_large_lock. */
static void victim(hk_region **out, unsigned *n, hk_region *r) {
  out[(*n)++] = r;
  hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size);
}

/* A victim's mapping (see victim), after the lock is dropped. */
static void unmap_large(hk_region *r) {
  hk_region_unregister(r);
  hk_stat_add(large_unmaps, 1);
  hk_os_unmap(r, r->map_size);
}

static void cache_remove_at(unsigned i) {
  cache_bytes -= meta[i].map_size;
  cache_resident -= meta[i].resident;
  cache_n--;
  cache[i] = cache[cache_n];
  meta[i] = meta[cache_n];
}

/* Take expired (or, with force, all) entries out of the cache; the caller
 * unmaps them after dropping the lock. */
static unsigned cache_expire_locked(hk_region **out, bool force) {
  uint64_t now = hk_os_now_ms();
  unsigned n = 0;
  for (unsigned i = 0; i < cache_n;) {
    if (force || now >= meta[i].at_ms + (uint64_t)hk_opt.purge_delay_ms) {
      victim(out, &n, cache[i]);
      cache_remove_at(i);
    } else {
      i++;
    }
  }
  return n;
}

bool hk_large_pending(void) {
  hk_lock(&hk_large_lock);
  bool any = cache_n > 0;
  hk_unlock(&hk_large_lock);
  return any;
}

bool hk_large_trim(bool force) {
  hk_region *victims[CACHE_MAX];
  hk_lock(&hk_large_lock);
  unsigned n = cache_expire_locked(victims, force);
  cache_enforce_budget_locked(hk_os_now_ms());
  hk_unlock(&hk_large_lock);
  for (unsigned i = 0; i < n; i++) unmap_large(victims[i]);
  return n > 0;
}

/* Hardened mode: a guard page right before the data (after the header) and
 * one at the end of the mapping. Such blocks are not moved by mremap (that
 * would misplace the guards); a cached one is reused only for the same data
 * offset, so its guards are where they belong. */
static size_t guard_tail(void) { return hk_secure ? HK_GUARD : 0; }

static void place_guards(hk_region *r) {
  if (!hk_secure) return;
  hk_os_guard((char *)r + r->user_offset - HK_GUARD, HK_GUARD);
  hk_os_guard((char *)r + r->map_size - HK_GUARD, HK_GUARD);
}

/* A fresh mapping for a large block, its header filled in; NULL when out of
 * memory even after giving back what the caches hold. */
static hk_region *map_large(size_t need, size_t align) {
  hk_space_check();
  hk_region *r = hk_os_map_aligned(need, align);
  if (r != NULL && !hk_region_map_prepare(r)) {
    hk_os_unmap(r, need);
    r = NULL;
  }
  if (r == NULL) return NULL;
  r->magic = HK_MAGIC_REGION;
  r->kind = HK_KIND_LARGE;
  r->map_size = need;
  r->large_zero = 1;
  hk_stat_peak(&hk_stats.large_peak_bytes,
               hk_add_relaxed(&hk_stats.large_mapped_bytes, need) + need);
  return r;
}

/* A reused mapping gives back its tail beyond the block only when that is
 * at least this long and the large tier holds more than twice the bytes
 * recently live (or CACHE_RESIDENT_MAX): a mapping kept whole serves a
 * larger block later without page faults. Under a limit on mapped bytes
 * (hk_space_tight) any tail of a page or more goes. */
#define TRIM_MIN ((size_t)1 << 20)

/* A cached mapping for `need` bytes (a block of `size`), or NULL: the
 * smallest that holds it, a resident one before a purged one (faults);
 * else the largest resident one, grown with mremap (its pages move with
 * it; only the growth is new). Hardened mode: only one with the same data
 * offset, so the guard pages stay in place, and never grown or trimmed. */
static hk_region *cache_take(size_t need, size_t off, size_t size) {
  hk_region *r = NULL;
  bool grow = false, trim = false;
  hk_lock(&hk_large_lock);
  size_t recent = recent_live_locked(hk_os_now_ms(), size);
  unsigned best = CACHE_MAX, largest = CACHE_MAX;
  for (unsigned i = 0; i < cache_n; i++) {
    size_t m = meta[i].map_size;
    bool res = meta[i].resident != 0;
    if (hk_secure && meta[i].user_offset != off) continue;
    if (m >= need) {
      bool bres = best != CACHE_MAX && meta[best].resident != 0;
      if (best == CACHE_MAX || res > bres || (res == bres && m < meta[best].map_size)) best = i;
    } else if (res && !hk_secure && (largest == CACHE_MAX || m > meta[largest].map_size)) {
      largest = i;
    }
  }
  if (best == CACHE_MAX && largest != CACHE_MAX) {
    best = largest;
    grow = true;
  }
  if (best != CACHE_MAX) {
    r = cache[best];
    cache_remove_at(best);
    bool tight = hk_load_relaxed(&hk_space_tight);
    if (!grow && !hk_secure && r->map_size - need >= (tight ? HK_OS_PAGE : TRIM_MIN)) {
      size_t held = hk_load_relaxed(&hk_stats.large_mapped_bytes) - cache_bytes +
                    cache_resident; /* live mappings, this one included, and resident cached ones */
      size_t budget = 2 * recent > CACHE_RESIDENT_MAX ? 2 * recent : CACHE_RESIDENT_MAX;
      trim = held > budget || tight;
    }
  }
  hk_unlock(&hk_large_lock);
  if (r == NULL) return NULL;
  hk_stat_add(large_cache_hits, 1);
  if (r->cached_resident != 0) r->large_zero = 0; /* a purged one reads as zeros */
  size_t old = r->map_size;
  if (grow) {
    /* out of the ownership map while it moves (see hk_large_realloc) */
    hk_region_unregister(r);
    hk_region *n = hk_os_remap(r, old, need, HK_REGION_SIZE);
    size_t gone = old; /* (the bytes to unmap when it fails) */
    if (n != NULL && !hk_region_map_prepare(n)) { /* no leaf for its new place */
      r = n;
      gone = need;
      n = NULL;
    }
    if (n == NULL) { /* give it back, map afresh */
      hk_sub_relaxed(&hk_stats.large_mapped_bytes, old);
      hk_stat_add(large_unmaps, 1);
      hk_os_unmap(r, gone);
      return NULL;
    }
    hk_region_register(n);
    hk_stat_add(large_remaps, 1);
    n->map_size = need;
    hk_stat_peak(&hk_stats.large_peak_bytes,
                 hk_add_relaxed(&hk_stats.large_mapped_bytes, need - old) + need - old);
    return n;
  }
  if (trim && hk_os_shrink(r, old, need)) {
    hk_sub_relaxed(&hk_stats.large_mapped_bytes, old - need);
    r->map_size = need;
  }
  return r;
}

/* Where a block's data starts in its mapping. Every large mapping is 4 MiB
 * aligned, so data at one fixed offset would put the same byte of every
 * block's every page in the same cache sets, and a loop that writes each
 * page of a few large blocks would miss the L2 on every write.
 * Blocks aligned to at most 64 bytes start at one of 62 cache-line offsets
 * after the header (the hk_region record, LARGE_META bytes), in the header's
 * own page: a block of whole pages then spans one page more than its data,
 * not two (as with a header page of its own). Aligned blocks start at
 * their alignment. Hardened mode keeps the data on a page boundary, behind its guard page,
 * and the header on a page of its own. */
static size_t data_offset(size_t align) {
  if (hk_secure) return align <= HK_LARGE_HEADER ? HK_LARGE_HEADER + HK_GUARD : align;
  if (align > 64) return align < LARGE_META ? LARGE_META : align;
  return LARGE_META + hk_color_offset() % (HK_OS_PAGE - LARGE_META);
}

/* Where purging a cached mapping starts: the page after the header's
 * (hardened mode: at its data, the same for every reuse, behind the guard
 * page). The rest of the header's page, which may hold data, is cleared
 * instead when the purge promises zeros (see large_zero). */
static size_t data_page(const hk_region *r) { return hk_secure ? r->user_offset : HK_OS_PAGE; }

void *hk_large_alloc(size_t size, size_t align, bool zero) {
  if (size > HK_MAX_REQUEST || align > ((size_t)1 << 40)) {
    errno = ENOMEM;
    return NULL;
  }
  /* under a limit on mapped bytes (hk_space_tight) the data follows the
   * header without a colour, which could cost a page more */
  bool tight = hk_load_relaxed(&hk_space_tight);
  size_t off = tight && align <= 64 && !hk_secure ? LARGE_META : data_offset(align);
  /* the mapping's size does not depend on the colour: a cached one fits any */
  bool colored = align <= 64 && !hk_secure && !tight;
  size_t span = colored ? HK_OS_PAGE - 64 : off; /* the largest coloured offset */
  size_t need = round_page(span + (size ? size : 1)) + guard_tail(); /* a 0-byte block still owns a byte */
  bool detach = align >= HK_REGION_SIZE;
  hk_region *r = detach ? NULL : cache_take(need, off, size);
  /* a reused mapping keeps its colour: a program that reuses the block
   * writes the same lines, which may still be cached */
  if (r != NULL && colored && r->user_offset >= LARGE_META && r->user_offset <= span) off = r->user_offset;
  if (r == NULL) {
    r = map_large(need, detach ? align : HK_REGION_SIZE);
    if (r == NULL) {
      errno = ENOMEM;
      return NULL;
    }
    r->user_offset = off;
    place_guards(r); /* once per mapping: a cached one keeps them */
    if (detach) {
      r->large_detached = 1;
      hk_lock(&hk_large_lock);
      hk_list_push_front(&detached, r);
      hk_unlock(&hk_large_lock);
    } else {
      hk_region_register(r);
    }
  }
  r->user_offset = off;
  r->user_size = size;
  r->block_end = need - guard_tail();
  r->large_state = HK_LARGE_LIVE;
  hk_add_relaxed(&live_asked, size);
  hk_stat_add(large_allocs, 1);
  char *p = (char *)r + off;
  if (zero && !r->large_zero) memset(p, 0, size);
  return p;
}

void hk_large_free(hk_region *r, void *p) {
  hk_region *victims[CACHE_MAX + 1];
  unsigned nv = 0;
  hk_lock(&hk_large_lock);
  if (r->large_state != HK_LARGE_LIVE) {
    hk_unlock(&hk_large_lock);
    hk_fatal("double free of a large block", p);
  }
  if ((char *)p != (char *)r + r->user_offset) {
    hk_unlock(&hk_large_lock);
    hk_fatal("free() of a pointer into the middle of a large block", p);
  }
  hk_stat_add(large_frees, 1);
  hk_sub_relaxed(&live_asked, r->user_size);
  if (r->large_detached) {
    hk_list_remove(&detached, r);
    hk_unlock(&hk_large_lock);
    hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size);
    hk_stat_add(large_unmaps, 1);
    hk_os_unmap(r, r->map_size);
    return;
  }
  r->large_state = HK_LARGE_CACHED;
  nv = cache_expire_locked(victims, false);
  /* the cache's bytes: the option's, or twice as many as were recently live (a
   * pipeline's blocks in flight, freed in a burst), unless it is off */
  size_t limit = (size_t)hk_opt.large_cache_mb << 20;
  if (limit != 0) {
    size_t recent = recent_live_locked(hk_os_now_ms(), 0);
    if (2 * recent > limit) limit = 2 * recent;
  }
  if (cache_n < (unsigned)hk_opt.large_cache_max && r->map_size <= limit) {
    /* make room by evicting the oldest entries */
    while (cache_bytes + r->map_size > limit && cache_n > 0) {
      unsigned oldest = 0;
      for (unsigned i = 1; i < cache_n; i++)
        if (meta[i].at_ms < meta[oldest].at_ms) oldest = i;
      victim(victims, &nv, cache[oldest]);
      cache_remove_at(oldest);
    }
    uint64_t now = hk_os_now_ms();
    r->cached_resident = r->map_size - guard_tail() - data_page(r);
    meta[cache_n] = (cache_meta){r->map_size, r->cached_resident, r->user_offset, now};
    cache[cache_n++] = r;
    cache_bytes += r->map_size;
    cache_resident += r->cached_resident;
    cache_enforce_budget_locked(now);
  } else {
    victim(victims, &nv, r);
  }
  bool cached = r->large_state == HK_LARGE_CACHED && (nv == 0 || victims[nv - 1] != r);
  hk_unlock(&hk_large_lock);
  for (unsigned i = 0; i < nv; i++) unmap_large(victims[i]);
  if (cached) hk_purger_notify_free(); /* no lock held */
}

size_t hk_large_usable(hk_region *r) { return r->block_end - r->user_offset; }

static void resize_asked(hk_region *r, size_t size) {
  hk_add_relaxed(&live_asked, size - r->user_size); /* modulo 2^64 */
  r->user_size = size;
}

/* Resize in place or move with mremap. NULL: the caller copies. */
void *hk_large_realloc(hk_region *r, void *p, size_t size) {
  if (size > HK_MAX_REQUEST) return NULL;
  size_t need = round_page(r->user_offset + size);
  if (hk_secure) { /* guards stay where they are: in place if it fits, else copy */
    if (need + HK_GUARD > r->map_size) return NULL;
    resize_asked(r, size);
    return p;
  }
  if (need <= r->map_size) {
    /* shrink: give back the tail when at least half the mapping is unused */
    if (need <= r->map_size / 2 && hk_os_shrink(r, r->map_size, need)) {
      hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size - need);
      r->map_size = need;
    }
    r->block_end = need;
    resize_asked(r, size);
    return p;
  }
  if (r->large_detached) return NULL; /* moving would break its alignment: copy */
  size_t old = r->map_size;
  /* Out of the ownership map before the move: once moved, the old address
   * is free, and another thread's new mapping there registers itself;
   * unregistering after the move would clear that mapping's bit, and its
   * block would then read as "not allocated by hakmem". The block is the
   * caller's: no other thread may look it up meanwhile. */
  hk_region_unregister(r);
  hk_region *n = hk_os_remap(r, old, need, HK_REGION_SIZE);
  hk_region_register(n != NULL ? n : r);
  if (n == NULL) return NULL;
  hk_stat_add(large_remaps, 1);
  n->map_size = need;
  n->block_end = need;
  resize_asked(n, size);
  hk_stat_peak(&hk_stats.large_peak_bytes,
               hk_add_relaxed(&hk_stats.large_mapped_bytes, need - old) + need - old);
  return (char *)n + n->user_offset;
}
