/* Large blocks (> 1 MiB, alignment > 64 KiB, or from HK_TIGHT_LARGE_MIN
 * up while a limit on mapped bytes holds): each is its own 4 MiB-aligned
 * mapping with a 128-byte header (its hk_region record, slot 0) in its
 * first page, a guard page after it (PROT_NONE: no underflow from the data
 * reaches the header) and its data from there on, starting in its first
 * 4 MiB unit. Under a limit on mapped bytes (hk_space_tight), where the two
 * pages would cost many blocks of HK_TIGHT_LARGE_MIN up a tenth of their
 * address space, the data follows the header in its page, unguarded. free() misses the arena's
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
#include "secure.h"

#include <errno.h>
#include <string.h>

pthread_mutex_t hk_large_lock = HK_SPIN_MUTEX_INITIALIZER;

#define LARGE_HEAD (hk_os_page + hk_os_page) /* the header's page and the guard page */
#define LARGE_META sizeof(hk_page) /* the header's bytes (the region record, slot 0): where unguarded data may start */

/* The cache: up to CACHE_MAX entries (see cache_entries_limit), each a
 * freed mapping, indexed by size in bins of eight per power of two (the
 * size classes' spacing), so that a request finds a mapping of its own size
 * without a search. A new mapping's size is rounded up to a bin's lower
 * bound (not under a limit on mapped bytes): freed,
 * it serves every request of its bin whole, neither grown nor trimmed, at
 * the cost of at most an eighth more address space (pages the block does
 * not touch are never faulted in). A bin lists resident entries before
 * purged ones, newest first; two age lists (resident, purged), oldest
 * first, serve expiry, the resident budget and eviction. The entries live
 * in one array beside the bins: the headers of 4 MiB-aligned mappings all
 * fall in the same cache sets, and walks that read them would miss on
 * every entry. Everything here is under hk_large_lock. */
#define CACHE_MAX 4096
#define NIL 0 /* entries are numbered from 1: zeroed lists are empty */
#define BIN_MIN_SHIFT 16 /* bin 0: below 64 KiB */
#define NBINS 256
typedef struct cache_entry {
  hk_region *r;
  size_t map_size, resident; /* resident: data bytes committed */
  size_t data_base;          /* hardened mode: its data's first page (data_base) */
  uint64_t at_ms;                         /* when it was cached */
  uint16_t bin;
  uint16_t link[2][2]; /* [BY_BIN or BY_AGE][NEXT or PREV] */
} __attribute__((aligned(64))) cache_entry; /* one cache line */
enum { BY_BIN, BY_AGE };
enum { NEXT, PREV };
typedef struct { uint16_t first, last; } index_list;
static cache_entry ent[CACHE_MAX + 1];
static index_list bins[NBINS];
/* the rest, together: the lock's holders pass these lines between cores */
static struct {
  unsigned n;              /* entries */
  size_t bytes, resident;  /* their map_size and resident bytes, summed */
  index_list age_resident, age_purged;
  uint64_t bin_bits[NBINS / 64]; /* bit k: bins[k] is not empty */
  unsigned used;           /* entries handed out at least once (from 1) */
  unsigned free_n;         /* entries given back, in free[] */
  uint16_t free[CACHE_MAX];
} cache __attribute__((aligned(64))) = {.used = 1};
/* Cached mappings keep their pages for quick reuse, but only up to this
 * many bytes, or twice as many as the large blocks still live if that is
 * more: beyond that, entries cached for CACHE_HOT_MS give their data pages
 * back (they stay mapped, so reusing them costs page faults, not
 * mmap/munmap), oldest first, at the next free or purger pass. A program
 * freeing many large blocks does not hold them resident for long; one that
 * keeps N MiB of large blocks live and replaces them keeps up to 2N MiB of
 * freed ones resident, for the purge delay at most: blocks of random sizes
 * replaced at random leave the cache holding about as many bytes as are
 * live, in mappings of all sizes, and a bound of N would purge nearly
 * every entry before its reuse. The grace of CACHE_HOT_MS is for
 * a thread that frees the large blocks another allocates (a pipeline): few
 * are live at any moment, and purging at once, under the lock, would cost
 * a madvise per free and make the two threads queue on the lock. */
#define CACHE_RESIDENT_MAX ((size_t)8 << 20)
#define CACHE_HOT_MS 10

/* Bytes the program asked for in its live large blocks and how many blocks
 * those are, and their peaks over the current and the previous window of
 * the purge delay: the "recently live" that bounds what a reused mapping
 * may hold beyond its block (a mapping is reused for a smaller block whole,
 * so its pages need not be faulted in again when a larger one follows) and
 * how many bytes and entries the cache may hold. */
static _Atomic size_t live_asked, live_blocks;
typedef struct { size_t bytes, blocks; } live_sum;
static live_sum peak_cur, peak_prev; /* hk_large_lock */
static uint64_t peak_at;

/* The peaks of live_asked and live_blocks (plus `adding` bytes in one
 * block, when a block is being allocated) over the last one to two purge
 * delays. Under hk_large_lock. */
static live_sum recent_live_locked(uint64_t now, bool allocating, size_t adding) {
  live_sum live = {hk_load_relaxed(&live_asked) + adding, hk_load_relaxed(&live_blocks) + allocating};
  uint64_t w = (uint64_t)hk_opt.purge_delay_ms;
  if (now >= peak_at + w) {
    peak_prev = now >= peak_at + 2 * w ? (live_sum){0, 0} : peak_cur;
    peak_cur = (live_sum){0, 0};
    peak_at = now;
  }
  if (live.bytes > peak_cur.bytes) peak_cur.bytes = live.bytes;
  if (live.blocks > peak_cur.blocks) peak_cur.blocks = live.blocks;
  return (live_sum){peak_cur.bytes > peak_prev.bytes ? peak_cur.bytes : peak_prev.bytes,
                    peak_cur.blocks > peak_prev.blocks ? peak_cur.blocks : peak_prev.blocks};
}

/* How many entries the cache may hold: the option's, or twice as many as
 * large blocks were recently live if that is more (a program that frees a
 * thousand blocks in a burst and allocates as many again finds them all
 * cached), at most CACHE_MAX; 0 when the option is 0. The entries cost
 * address space and a header page each: the resident budget
 * (cache_enforce_budget_locked) and the purge delay bound the rest. */
static unsigned cache_entries_limit(live_sum recent) {
  size_t n = (size_t)hk_opt.large_cache_max;
  if (n != 0 && 2 * recent.blocks > n) n = 2 * recent.blocks;
  return n < CACHE_MAX ? (unsigned)n : CACHE_MAX;
}

static size_t data_page(const hk_region *r);
static size_t data_base(const hk_region *r);

/* ---- the cache's lists ---- */
static void list_unlink(index_list *l, unsigned i, int by) {
  uint16_t nx = ent[i].link[by][NEXT], pv = ent[i].link[by][PREV];
  if (pv != NIL) ent[pv].link[by][NEXT] = nx;
  else l->first = nx;
  if (nx != NIL) ent[nx].link[by][PREV] = pv;
  else l->last = pv;
}
static void list_link(index_list *l, unsigned i, int by, bool front) {
  uint16_t other = front ? l->first : l->last;
  ent[i].link[by][NEXT] = front ? other : NIL;
  ent[i].link[by][PREV] = front ? NIL : other;
  if (other == NIL) l->last = l->first = (uint16_t)i;
  else if (front) ent[other].link[by][PREV] = l->first = (uint16_t)i;
  else ent[other].link[by][NEXT] = l->last = (uint16_t)i;
}

/* The bin of a mapping of `size` bytes: the highest whose lower bound
 * (bin_size) it reaches. */
static unsigned bin_of(size_t size) {
  if (size < ((size_t)1 << BIN_MIN_SHIFT)) return 0;
  unsigned b = 63u - (unsigned)__builtin_clzl(size);
  unsigned k = (b - BIN_MIN_SHIFT) * 8u + (unsigned)((size >> (b - 3)) & 7u) + 1u;
  return k < NBINS ? k : NBINS - 1;
}
static size_t bin_size(unsigned k) {
  if (k == 0) return 0;
  unsigned b = (k - 1) / 8 + BIN_MIN_SHIFT;
  return (size_t)(8 + (k - 1) % 8) << (b - 3);
}
/* need rounded up to a bin's lower bound (a multiple of the page size) */
static size_t bin_round(size_t need) {
  unsigned k = bin_of(need);
  return bin_size(k) == need || k == NBINS - 1 ? need : bin_size(k + 1);
}

static void cache_insert(hk_region *r, size_t resident, uint64_t now) {
  unsigned i = cache.free_n ? cache.free[--cache.free_n] : cache.used++;
  unsigned k = bin_of(r->map_size);
  ent[i] = (cache_entry){r, r->map_size, resident, data_base(r), now, (uint16_t)k, {{NIL, NIL}, {NIL, NIL}}};
  list_link(&bins[k], i, BY_BIN, true);
  cache.bin_bits[k / 64] |= (uint64_t)1 << (k % 64);
  list_link(&cache.age_resident, i, BY_AGE, false);
  cache.n++;
  cache.bytes += r->map_size;
  cache.resident += resident;
}

static hk_region *cache_remove(unsigned i) {
  unsigned k = ent[i].bin;
  list_unlink(&bins[k], i, BY_BIN);
  if (bins[k].first == NIL) cache.bin_bits[k / 64] &= ~((uint64_t)1 << (k % 64));
  list_unlink(ent[i].resident ? &cache.age_resident : &cache.age_purged, i, BY_AGE);
  cache.n--;
  cache.bytes -= ent[i].map_size;
  cache.resident -= ent[i].resident;
  cache.free[cache.free_n++] = (uint16_t)i;
  return ent[i].r;
}

/* Purge the oldest resident entries cached for CACHE_HOT_MS while the cache
 * holds more resident bytes than the budget; each moves to the back of its
 * bin and to the purged age list. */
static void cache_enforce_budget_locked(uint64_t now) {
  size_t live = hk_load_relaxed(&hk_stats.large_mapped_bytes) - cache.bytes;
  size_t budget = 2 * live > CACHE_RESIDENT_MAX ? 2 * live : CACHE_RESIDENT_MAX;
  while (cache.resident > budget && cache.age_resident.first != NIL) {
    unsigned i = cache.age_resident.first;
    if (now < ent[i].at_ms + CACHE_HOT_MS) break;
    hk_region *old = ent[i].r;
    hk_os_purge((char *)old + data_page(old), old->cached_resident);
    if (!hk_secure && !old->large_guarded) memset((char *)old + LARGE_META, 0, hk_os_page - LARGE_META); /* the header's page */
    cache.resident -= ent[i].resident;
    ent[i].resident = 0;
    old->cached_resident = 0;
    old->large_zero = 1; /* its data reads back as zeros */
    list_unlink(&cache.age_resident, i, BY_AGE);
    list_link(&cache.age_purged, i, BY_AGE, false);
    list_unlink(&bins[ent[i].bin], i, BY_BIN);
    list_link(&bins[ent[i].bin], i, BY_BIN, false);
  }
}

/* The oldest entry (NIL: none). */
static unsigned cache_oldest(void) {
  unsigned a = cache.age_resident.first, b = cache.age_purged.first;
  if (a == NIL) return b;
  if (b == NIL) return a;
  return ent[b].at_ms < ent[a].at_ms ? b : a;
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

static size_t round_page(size_t n) { return (n + hk_os_page - 1) & ~(size_t)(hk_os_page - 1); }

/* ---- tails of live blocks ----
 * A live block's mapping may hold resident pages past the block: a cached
 * mapping reused whole for a smaller block (cache_take), or one whose block
 * realloc shrank, while the tier held within its budget
 * (held_over_budget_locked). The tail serves the mapping's next, larger
 * block without page faults, but a block that stays live would keep it for
 * good: such a block is listed here, oldest first, and a tail still there a
 * purge delay later is unmapped (tails_expire_locked). A listed block's
 * map_size and block_end change only under hk_large_lock (realloc takes the
 * block off the list first). Detached blocks and hardened mode's (whose
 * tails lie past a guard page) are not listed. */
#define TAIL_MIN HK_SLAB_SIZE /* a shorter tail is left alone */
static struct { hk_region *first, *last; } tails; /* hk_large_lock */

static void tail_forget_locked(hk_region *r) {
  if (!r->large_tail) return;
  hk_list_remove(&tails, r);
  r->large_tail = 0;
}

/* r's tail listed (again, as of now), unless it is too short to matter */
static void tail_note_locked(hk_region *r, uint64_t now) {
  tail_forget_locked(r);
  if (r->large_detached || hk_secure || r->map_size - round_page(r->block_end) < TAIL_MIN) return;
  r->large_tail = 1;
  r->tail_since_ms = now;
  hk_list_push_back(&tails, r);
}

/* Unmap the tails listed for a purge delay (with force, all of them);
 * were there any? */
static bool tails_expire_locked(bool force, uint64_t now) {
  bool any = false;
  for (hk_region *r; (r = tails.first) != NULL; any = true) {
    if (!force && now < r->tail_since_ms + (uint64_t)hk_opt.purge_delay_ms) break;
    tail_forget_locked(r);
    size_t end = round_page(r->block_end);
    if (hk_os_shrink(r, r->map_size, end)) {
      hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size - end);
      r->map_size = end;
      hk_stat_add(large_tails_trimmed, 1);
    }
  }
  return any;
}

/* ---- large blocks of heaps the program made (user_heap.c) ----
 * Such a heap lists its live large blocks through their headers
 * (large_heap, heap_next, heap_prev), under hk_large_lock: free() takes
 * a block off its heap's list, hak_heap_destroy frees those left, and
 * hak_heap_visit finds them. A block that moves (mremap) leaves the list
 * for the move. */
static void heap_link_locked(hk_region *r, hk_heap *h) {
  r->large_heap = h;
  r->heap_prev = NULL;
  r->heap_next = h->large_first;
  if (h->large_first != NULL) h->large_first->heap_prev = r;
  h->large_first = r;
}

static void heap_unlink_locked(hk_region *r) {
  hk_heap *h = r->large_heap;
  if (h == NULL) return;
  if (r->heap_prev != NULL) r->heap_prev->heap_next = r->heap_next;
  else h->large_first = r->heap_next;
  if (r->heap_next != NULL) r->heap_next->heap_prev = r->heap_prev;
  r->large_heap = NULL;
}

/* ---- a thread's live large blocks (hak_thread_stats, inspect.c) ----
 * A large block counts to the thread whose heap allocated it for as long
 * as that thread owns the heap: its header names the heap and the heap's
 * ownership number then (`live`), and the heap counts the blocks and the
 * bytes asked for, for the owner its thread_large_owner names. The
 * allocating thread raises the counts; a free, from any thread, checks the
 * number and lowers them in one step under hk_large_lock, under which a
 * new owner's first large block also clears the counts and names it, so
 * that no free lands on a later owner's counts. */
static void thread_count(hk_region *r, size_t size) {
  hk_heap *h = hk_tls_heap;
  uint32_t live = hk_load_relaxed(&h->live);
  r->large_thread = NULL;
  /* (hk_heap_empty: live 0; a heap no thread owns: tid 0) */
  if (h->kind != HK_HEAP_THREAD || live == 0 || hk_load_relaxed(&h->tid) == 0) return;
  if (hk_load_relaxed(&h->thread_large_owner) != live) {
    hk_lock(&hk_large_lock);
    hk_store_relaxed(&h->thread_large_bytes, 0);
    hk_store_relaxed(&h->thread_large_blocks, 0);
    hk_store_relaxed(&h->thread_large_owner, live);
    hk_unlock(&hk_large_lock);
  }
  r->large_thread = h;
  r->large_owner = live;
  hk_add_relaxed(&h->thread_large_bytes, size);
  hk_add_relaxed(&h->thread_large_blocks, 1);
}

/* r's bytes change from `from` to `to`, or (freed) it is freed; under
 * hk_large_lock. */
static void thread_recount_locked(hk_region *r, size_t from, size_t to, bool freed) {
  hk_heap *h = r->large_thread;
  if (h == NULL) return;
  if (hk_load_relaxed(&h->live) == r->large_owner) {
    hk_add_relaxed(&h->thread_large_bytes, (freed ? 0 : to) - from); /* (modulo 2^64) */
    if (freed) hk_sub_relaxed(&h->thread_large_blocks, 1);
  }
  if (freed) r->large_thread = NULL;
}

void hk_large_thread_sum(hk_heap *h, uint64_t *blocks, uint64_t *bytes) {
  bool counted = hk_load_relaxed(&h->thread_large_owner) == hk_load_relaxed(&h->live);
  *blocks = counted ? hk_load_relaxed(&h->thread_large_blocks) : 0;
  *bytes = counted ? hk_load_relaxed(&h->thread_large_bytes) : 0;
}

/* p, a large block of 16-byte alignment (its header is its 4 MiB
 * unit's) that hk_large_alloc just returned, becomes heap h's (and no
 * thread's). */
void hk_large_join_heap(void *p, hk_heap *h) {
  hk_region *r = hk_region_of(p);
  hk_lock(&hk_large_lock);
  thread_recount_locked(r, r->user_size, 0, true);
  heap_link_locked(r, h);
  hk_unlock(&hk_large_lock);
}

/* The heap the large block of header r belongs to, NULL: none (the
 * block is the caller's: no other thread changes it meanwhile). */
hk_heap *hk_large_heap_of(const hk_region *r) { return r->large_heap; }

/* Free every live large block of heap h (hak_heap_destroy). */
void hk_large_free_heap(hk_heap *h) {
  for (;;) {
    hk_lock(&hk_large_lock);
    hk_region *r = h->large_first;
    hk_unlock(&hk_large_lock);
    if (r == NULL) return;
    hk_large_free(r, (char *)r + r->user_offset);
  }
}

/* Heap h's live large blocks, up to max of them into out; how many it has. */
size_t hk_large_heap_blocks(hk_heap *h, void **out, size_t max) {
  size_t n = 0;
  hk_lock(&hk_large_lock);
  for (hk_region *r = h->large_first; r != NULL; r = r->heap_next, n++)
    if (n < max) out[n] = (char *)r + r->user_offset;
  hk_unlock(&hk_large_lock);
  return n;
}

/* Heap h's live large blocks added to *blocks, their usable bytes to
 * *bytes, their mappings' to *mapped. */
void hk_large_heap_sum(hk_heap *h, unsigned long long *blocks, unsigned long long *bytes, unsigned long long *mapped) {
  hk_lock(&hk_large_lock);
  for (hk_region *r = h->large_first; r != NULL; r = r->heap_next) {
    (*blocks)++;
    *bytes += hk_large_usable(r);
    *mapped += r->map_size;
  }
  hk_unlock(&hk_large_lock);
}

/* A block about to move (mremap) leaves its heap's list: its header moves
 * with it. NULL: it has no heap. */
static hk_heap *heap_leave(hk_region *r) {
  hk_heap *h = r->large_heap;
  if (h == NULL) return NULL;
  hk_lock(&hk_large_lock);
  heap_unlink_locked(r);
  hk_unlock(&hk_large_lock);
  return h;
}

static void heap_rejoin(hk_region *r, hk_heap *h) {
  if (h == NULL) return;
  hk_lock(&hk_large_lock);
  heap_link_locked(r, h);
  hk_unlock(&hk_large_lock);
}

/* Bytes of all large mappings and of those the cache holds, as one
 * snapshot: a mapping leaves both counts under hk_large_lock (victim),
 * so mallinfo2 never sees a cached block about to be unmapped as live,
 * as it would if a purge came between two separate reads. */
void hk_large_usage(size_t *mapped, size_t *cached) {
  hk_lock(&hk_large_lock);
  *mapped = hk_load_relaxed(&hk_stats.large_mapped_bytes);
  *cached = cache.bytes;
  hk_unlock(&hk_large_lock);
}

size_t hk_large_live_bytes(void) { return hk_load_relaxed(&live_asked); }

/* A large block malloc just returned: 16-byte aligned, so its header is
 * its 4 MiB unit's (only the largest alignments are detached). */
void hk_large_set_sampled(void *p) {
  hk_region *r = hk_region_of(p);
  hk_assert(r->magic == HK_MAGIC_REGION && r->kind == HK_KIND_LARGE && !r->large_detached);
  r->large_sampled = 1;
}

/* Victims taken out of the cache and not yet unmapped, by any thread: a
 * forced trim (a mapping failed, hk_pressure_release) waits for them, or
 * its caller's retry could fail while another thread still unmaps what it
 * took from the cache. */
static _Atomic unsigned victims_pending;

/* r is to be unmapped once the lock is dropped: it stops counting as
 * mapped now and joins the chain of victims, linked through `next` (their
 * headers: nothing else refers to them). Under hk_large_lock. */
static void victim(hk_region **chain, hk_region *r) {
  r->next = *chain;
  *chain = r;
  hk_add_relaxed(&victims_pending, 1);
  hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size);
}

/* A victim's mapping (see victim), after the lock is dropped. */
static void unmap_large(hk_region *r) {
  hk_region_unregister(r);
  hk_stat_add(large_unmaps, 1);
  hk_os_unmap(r, r->map_size);
}

/* fork: in the child (hk_large_lock held) no thread is left to unmap what
 * the parent's other threads had taken (those mappings stay, unused), and a
 * forced trim must not wait for them */
void hk_large_fork_child(void) { atomic_store(&victims_pending, 0); }

static void unmap_victims(hk_region *chain) {
  while (chain != NULL) {
    hk_region *next = chain->next;
    unmap_large(chain);
    atomic_fetch_sub_explicit(&victims_pending, 1, memory_order_release);
    chain = next;
  }
}

/* Take expired (or, with force, all) entries out of the cache; the caller
 * unmaps them after dropping the lock. */
static void cache_expire_locked(hk_region **chain, bool force, uint64_t now) {
  for (unsigned i; (i = cache_oldest()) != NIL;) {
    if (!force && now < ent[i].at_ms + (uint64_t)hk_opt.purge_delay_ms) break;
    victim(chain, cache_remove(i));
  }
}

bool hk_large_pending(void) {
  hk_lock(&hk_large_lock);
  bool any = cache.n > 0 || tails.first != NULL;
  hk_unlock(&hk_large_lock);
  return any;
}

bool hk_large_trim(bool force) {
  hk_region *victims = NULL;
  hk_lock(&hk_large_lock);
  uint64_t now = hk_os_now_ms();
  cache_expire_locked(&victims, force, now);
  cache_enforce_budget_locked(now);
  bool released = tails_expire_locked(force, now);
  hk_unlock(&hk_large_lock);
  unmap_victims(victims);
  if (force)
    while (hk_load_acquire(&victims_pending) != 0) sched_yield();
  return victims != NULL || released;
}

/* The guard page after the header's page, in every mode; hardened mode
 * puts it right before the data instead (the same place unless the block
 * is aligned to more than a page) and adds one at the end of the mapping,
 * and, when a fresh mapping is longer than its block, one right after the
 * block (at block_end: move_tail_guard). A reused hardened mapping keeps
 * its guards where they are (secure_place): a block that fits below the
 * guard at block_end ends right at it where its data still starts in the
 * header's 4 MiB unit (free finds the header there: hk_region_of), else
 * starts right after the guard before it; a larger one has the guard at
 * block_end lifted, leaving the mapping's end guard. Moving a guard to the
 * block instead would cost two mprotect calls a reuse, each a TLB
 * shootdown where the process has other threads. A canary in the 8 bytes
 * on each side of the data that does not touch a guard page (canaries_mark)
 * reports at free and realloc a linear overflow or underflow into the
 * unused pages there. A block aligned to more than a page is reused only
 * for the same data base, the guard before it where it belongs. Blocks
 * move with hk_os_remap_headed, which keeps header, guard and data in place
 * relative to each other. */
static size_t guard_tail(void) { return hk_secure ? hk_os_page : 0; }

/* Hardened mode: the first page a mapping's data may use, right after the
 * guard before it (cache entries are matched on it). */
static size_t data_base(const hk_region *r) { return r->large_floating ? LARGE_HEAD : r->user_offset; }

/* Hardened mode: a canary's 8 bytes at `where` (a keyed hash of the
 * address, its first byte zero, as the small blocks' canaries: secure.h). */
static uint64_t canary_for(uintptr_t where) {
  return hk_secure_canary_of(hk_derive_key(where, 0x6c61726765636e79ull /* "largecny" */));
}
/* Where a live block's canaries are: 0 for a side whose data touches a
 * guard page (or whose last 8 bytes before it are the data's). */
static uintptr_t canary_before(const hk_region *r) {
  return r->user_offset > data_base(r) ? (uintptr_t)r + r->user_offset - 8 : 0;
}
static uintptr_t canary_after(const hk_region *r) {
  return r->user_offset + r->user_size + 8 <= r->block_end ? (uintptr_t)r + r->user_offset + r->user_size : 0;
}
static void canaries_mark(hk_region *r) {
  uintptr_t at[2] = {canary_before(r), canary_after(r)};
  for (int k = 0; k < 2; k++) {
    if (at[k] == 0) continue;
    uint64_t c = canary_for(at[k]);
    memcpy((void *)at[k], &c, sizeof c);
  }
}
/* The report for a broken canary of a live block, or NULL. */
static const char *canaries_broken(const hk_region *r) {
  uintptr_t at[2] = {canary_before(r), canary_after(r)};
  static const char *const what[2] = {"heap buffer underflow detected (the 8 bytes before a large block overwritten)",
                                      "heap buffer overflow detected (the 8 bytes after a large block overwritten)"};
  for (int k = 0; k < 2; k++) {
    uint64_t found;
    if (at[k] == 0) continue;
    memcpy(&found, (const void *)at[k], sizeof found);
    if (found != canary_for(at[k])) return what[k];
  }
  return NULL;
}

static void place_guards(hk_region *r) {
  if (!hk_secure) return;
  hk_os_guard((char *)r + data_base(r) - hk_os_page, hk_os_page);
  hk_os_guard((char *)r + r->map_size - hk_os_page, hk_os_page);
  r->block_end = r->map_size - hk_os_page;
}

/* Hardened mode, before a mapping grows: its data to its end made one
 * mapping again, as mremap needs (false if a guard could not be lifted). */
static bool lift_tail_guards(hk_region *r) {
  if (!hk_os_unguard((char *)r + r->block_end, r->map_size - r->block_end)) return false;
  r->block_end = r->map_size - hk_os_page;
  return true;
}

/* Hardened mode: a guard page at `end` (page-aligned), right after the
 * block that r serves now, and every page below it accessible. Below
 * block_end they are; above it, pages may still be guards that blocks
 * before placed there (guards moved down stay, which spares a system
 * call), and are lifted in the one call that lifts the guard at block_end.
 * The guard at the mapping's end stays. The pages keep their contents (no
 * page faults on reuse). False if a guard could not be lifted. */
static bool move_tail_guard(hk_region *r, size_t end) {
  size_t old = r->block_end, last = r->map_size - hk_os_page;
  if (old == end) return true;
  if (end > old && !hk_os_unguard((char *)r + old, end - old)) return false;
  if (end < last) hk_os_guard((char *)r + end, hk_os_page);
  r->block_end = end;
  return true;
}

/* Hardened mode, a cached mapping reused for a block that needs `need`
 * bytes from its data base (*off: the page its data starts in): where the
 * block is not aligned beyond a cache line (colored), the last
 * block ended at the guard at block_end (its pages, likely still resident)
 * and the new one fits below it, the new one ends there too, unless its
 * data would then start past the header's 4 MiB unit (free finds the
 * header there: hk_region_of); else it starts at its base, on the pages
 * the last one started on, the guard at block_end lifted if it does not
 * fit below it. False if the guard could not be lifted. */
static bool secure_place(hk_region *r, size_t need, bool colored, size_t *off) {
  size_t base = data_base(r), data = need - hk_os_page - base; /* the data's pages, its colour's room among them */
  /* (the last block's fields: its end in its last page, or its colour's) */
  bool last_at_guard = r->block_end - (r->user_offset + r->user_size) < 2 * hk_os_page;
  *off = base;
  if (r->block_end - base < data) return move_tail_guard(r, r->map_size - hk_os_page);
  if (colored && r->large_floating && last_at_guard && r->block_end - data < HK_REGION_SIZE) *off = r->block_end - data;
  return true;
}

/* Default mode: the guard page after the header's, or none (under a limit
 * on mapped bytes), for a fresh or reused mapping. */
static void set_head_guard(hk_region *r, bool on) {
  if (hk_secure || r->large_guarded == on) return;
  if (on) hk_os_guard((char *)r + hk_os_page, hk_os_page);
  else if (!hk_os_commit((char *)r + hk_os_page, hk_os_page)) return; /* (stays guarded) */
  r->large_guarded = on;
}

/* A mapping grown or moved, its header (and guard) with it. */
static hk_region *remap_large(hk_region *r, size_t old, size_t want) {
  if (!r->large_guarded && !hk_secure) return hk_os_remap(r, old, want, HK_REGION_SIZE);
  return hk_os_remap_headed(r, old, want, HK_REGION_SIZE, LARGE_HEAD, hk_os_page);
}

/* A fresh mapping for a large block, its header filled in; NULL when out of
 * memory even after giving back what the caches hold. */
static hk_region *map_large(size_t need, size_t align) {
  if (!hk_limit_allows(need)) return NULL; /* (a memory limit: limits.c) */
  hk_space_check(false);
  hk_region *r = hk_os_map_aligned(need, align);
  if (r != NULL && !hk_region_map_prepare(r)) {
    hk_os_unmap(r, need);
    r = NULL;
  }
  if (r == NULL) return NULL;
  /* Huge pages past the 2 MiB that hold the header: the header's write
   * would otherwise fault a whole huge page into every block, touched by
   * the program or not (a block it writes only the start of, or never,
   * would take 2 MiB of RSS). */
  int thp = hk_thp_advice(need, false);
  uintptr_t huge = ((uintptr_t)r + HK_HUGE_PAGE) & ~(HK_HUGE_PAGE - 1);
  if (thp < 0) hk_os_huge(r, need, false);
  else if (thp > 0 && huge < (uintptr_t)r + need) hk_os_huge((void *)huge, (uintptr_t)r + need - huge, true);
  r->magic = HK_MAGIC_REGION;
  r->kind = HK_KIND_LARGE;
  r->map_size = need;
  r->large_zero = 1;
  hk_stat_peak(&hk_stats.large_peak_bytes,
               hk_add_relaxed(&hk_stats.large_mapped_bytes, need) + need);
  return r;
}

/* Does the large tier hold more than `times` the bytes recently live (or
 * CACHE_RESIDENT_MAX): its live mappings, whole, and the cache's resident
 * bytes? Then a mapping reused for a smaller block (times 2, as the
 * cache's resident budget), or a block realloc shrinks (times 1), gives
 * back its tail; else the tail stays for a larger block later, which then
 * needs no page faults. A shrunk block's tail is held to once the live
 * bytes: a program that resizes large buffers at random shrinks nearly
 * every one, and at twice held a third more at its peak. Under
 * hk_large_lock. */
static bool held_over_budget_locked(size_t recent, size_t times) {
  size_t held = hk_load_relaxed(&hk_stats.large_mapped_bytes) - cache.bytes + cache.resident;
  size_t budget = times * recent > CACHE_RESIDENT_MAX ? times * recent : CACHE_RESIDENT_MAX;
  return held > budget;
}

/* A reused mapping gives back its tail beyond the block only when that is
 * at least this long and the large tier holds more than its budget
 * (held_over_budget_locked). Under a limit on mapped bytes (hk_space_tight)
 * any tail of a page or more goes. */
#define TRIM_MIN ((size_t)1 << 20)

/* How many bins above a request's own a cached mapping is taken from whole
 * before the search looks further (then trims what it takes). */
#define NEAR_BINS 2

/* The first entry of bin k usable for a block at data offset `off` that
 * needs `need` bytes (hardened mode: only one whose data base is `off`, so
 * that the guard before the data stays in place, and at least `need`
 * long), resident ones first; NIL if none. */
static unsigned bin_first(unsigned k, size_t off, size_t need) {
  unsigned i = bins[k].first;
  if (hk_secure)
    while (i != NIL && (ent[i].data_base != off || ent[i].map_size < need)) i = ent[i].link[BY_BIN][NEXT];
  return i;
}
/* The lowest non-empty bin from k up (NBINS: none). */
static unsigned bin_next(unsigned k) {
  for (unsigned w = k / 64; w < NBINS / 64; w++) {
    uint64_t bits = cache.bin_bits[w] & (w == k / 64 ? ~(uint64_t)0 << (k % 64) : ~(uint64_t)0);
    if (bits) return w * 64 + (unsigned)__builtin_ctzll(bits);
  }
  return NBINS;
}

/* A cached mapping for `need` bytes (a block of `size`), or NULL: one of
 * the request's bin or up to NEAR_BINS above, a resident one first; else
 * the smallest that holds it; else the largest resident one, grown with
 * mremap (its pages move with it; only the growth is new). Hardened mode:
 * only one with the same data base (under a limit on mapped bytes, of the
 * near bins); its guards are lifted for a growth, and put back at the new
 * end. `want` is need rounded to its bin (bin_round), what a trim or growth
 * leaves. A mapping kept whole with resident pages past the block is
 * listed as a tail right here, under the lock (its block_end set first):
 * *listed says so. */
static hk_region *cache_take(size_t need, size_t want, size_t off, size_t size, bool *listed) {
  hk_region *r = NULL;
  bool grow = false, trim = false;
  hk_lock(&hk_large_lock);
  uint64_t now = hk_os_now_ms();
  size_t recent = recent_live_locked(now, true, size).bytes;
  unsigned k = bin_of(need), best = NIL;
  /* entries of bin k may be smaller than need */
  if (bin_size(k) < need) k++;
  for (unsigned b = k; b <= k + NEAR_BINS && b < NBINS; b++) {
    unsigned i = bin_first(b, off, need);
    if (i != NIL && (best == NIL || (ent[i].resident && !ent[best].resident))) best = i;
    if (best != NIL && ent[best].resident) break;
  }
  /* (hardened mode under a limit on mapped bytes: a mapping never trimmed
   * would hold a small block's address space many times over) */
  bool far = !hk_secure || !hk_load_relaxed(&hk_space_tight);
  for (unsigned b = k + NEAR_BINS + 1; best == NIL && far && (b = bin_next(b)) < NBINS; b++) best = bin_first(b, off, need);
  /* (hardened: only blocks at the usual offset, whose guard before the
   * data is the one hk_os_remap_headed keeps) */
  if (best == NIL && (!hk_secure || off == LARGE_HEAD)) {
    /* the largest resident one below: bins from k down, heads only */
    for (unsigned b = k < NBINS ? k : NBINS - 1; b-- > 0 && best == NIL;) {
      unsigned i = bins[b].first;
      if (i != NIL && ent[i].resident && ent[i].map_size < need && (!hk_secure || ent[i].data_base == off)) best = i;
    }
    grow = best != NIL;
  }
  bool resident = false;
  size_t old = 0; /* (read here: a listed tail's mapping is the purger's to trim) */
  if (best != NIL) {
    r = cache_remove(best);
    resident = r->cached_resident != 0;
    old = r->map_size;
    bool tight = hk_load_relaxed(&hk_space_tight);
    if (!grow && r->map_size - want >= (tight ? hk_os_page : TRIM_MIN) && r->map_size > want)
      trim = tight || held_over_budget_locked(recent, 2);
    if (!grow && !trim && resident && !hk_secure && r->map_size - need >= TAIL_MIN) {
      r->block_end = need;
      tail_note_locked(r, now);
      *listed = true;
    }
  }
  hk_unlock(&hk_large_lock);
  if (r == NULL) return NULL;
  hk_stat_add(large_cache_hits, 1);
  if (resident) r->large_zero = 0; /* a purged one reads as zeros */
  if (grow) {
    /* out of the ownership map while it moves (see hk_large_realloc) */
    hk_region_unregister(r);
    /* (a memory limit refusing the growth: given back, the caller maps afresh) */
    hk_region *n = hk_limit_allows(want - old) && (!hk_secure || lift_tail_guards(r)) ? remap_large(r, old, want) : NULL;
    size_t gone = old; /* (the bytes to unmap when it fails) */
    if (n != NULL && !hk_region_map_prepare(n)) { /* no leaf for its new place */
      r = n;
      gone = want;
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
    n->map_size = want;
    if (hk_secure) { /* the guard at the new end */
      hk_os_guard((char *)n + want - hk_os_page, hk_os_page);
      n->block_end = want - hk_os_page;
    }
    hk_stat_peak(&hk_stats.large_peak_bytes,
                 hk_add_relaxed(&hk_stats.large_mapped_bytes, want - old) + want - old);
    return n;
  }
  if (trim && hk_os_shrink(r, old, want)) {
    hk_sub_relaxed(&hk_stats.large_mapped_bytes, old - want);
    r->map_size = want;
    if (hk_secure) { /* the guard at the new end (the one after the last block may stay) */
      hk_os_guard((char *)r + want - hk_os_page, hk_os_page);
      if (r->block_end > want - hk_os_page) r->block_end = want - hk_os_page;
    }
  }
  return r;
}

/* Where a block's data starts in its mapping: after the header's page and
 * the guard page (LARGE_HEAD). Every large mapping is 4 MiB aligned, so
 * data at one fixed offset would put the same byte of every block's every
 * page in the same cache sets, and a loop that writes each page of a few
 * large blocks would miss the L2 on every write: blocks aligned to at most
 * 64 bytes start at one of 64 cache-line offsets into the page after the
 * guard. Aligned blocks start at their alignment, or at LARGE_HEAD (a
 * multiple of every smaller one). So does hardened mode, whose canary
 * before the data covers the colour's bytes. */
static size_t data_offset(size_t align) {
  if (align > 64) return align > LARGE_HEAD ? align : LARGE_HEAD;
  return LARGE_HEAD + hk_color_offset();
}

/* Where purging a cached mapping starts: its data's first page (hardened
 * mode: its data, the same for every reuse), or, unguarded, the page after
 * the header's, the rest of which is cleared instead when the purge
 * promises zeros (see large_zero). */
static size_t data_page(const hk_region *r) {
  return hk_secure ? data_base(r) : r->large_guarded ? LARGE_HEAD : hk_os_page;
}

void *hk_large_alloc(size_t size, size_t align, bool zero) {
  if (size > HK_MAX_REQUEST || align > ((size_t)1 << 40)) {
    errno = ENOMEM;
    return NULL;
  }
  /* under a limit on mapped bytes (hk_space_tight) the data follows the
   * header without a colour, which could cost a page more */
  bool tight = hk_load_relaxed(&hk_space_tight), guarded = !tight && !hk_secure;
  size_t off = guarded || hk_secure ? data_offset(align) : align > LARGE_META ? align : LARGE_META;
  /* the mapping's size does not depend on the colour: a cached one fits any */
  bool colored = align <= 64 && (guarded || hk_secure);
  size_t span = colored ? LARGE_HEAD + (HK_COLORS - 1) * 64 : off; /* the largest coloured offset (hk_color_offset) */
  size_t base = colored ? LARGE_HEAD : off; /* (hardened mode: the data's first page) */
  size_t need = round_page(span + (size ? size : 1)) + guard_tail(); /* a 0-byte block still owns a byte */
  bool detach = align >= HK_REGION_SIZE;
  /* the mapping's size: rounded to its cache bin (not under a limit), so
   * that a cached mapping serves the sizes of its bin whole; hardened mode
   * guards the page right after the block (move_tail_guard) */
  size_t want = tight || detach ? need : bin_round(need);
  bool listed = false; /* (then its block_end is set: the purger may read it) */
  hk_region *r = detach ? NULL : cache_take(need, want, base, size, &listed);
  /* a reused mapping keeps its colour: a program that reuses the block
   * writes the same lines, which may still be cached (hardened mode: the
   * colour in the page its data starts in) */
  size_t color = off - base;
  if (r != NULL && colored && r->user_offset >= LARGE_HEAD && r->user_offset <= span) off = r->user_offset;
  if (r != NULL && colored && hk_secure) color = r->user_offset & (hk_os_page - 1);
  if (r != NULL) set_head_guard(r, guarded);
  if (r != NULL && hk_secure) {
    size_t start;
    if (secure_place(r, need, colored, &start)) {
      off = start + color;
    } else { /* (mapped afresh instead) */
      hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size);
      unmap_large(r);
      r = NULL;
    }
  }
  if (r == NULL) {
    r = map_large(want, detach ? align : HK_REGION_SIZE);
    if (r == NULL) {
      errno = ENOMEM;
      return NULL;
    }
    r->user_offset = off;
    r->large_floating = hk_secure && base == LARGE_HEAD;
    place_guards(r); /* once per mapping: a cached one keeps them */
    if (hk_secure) move_tail_guard(r, need - hk_os_page); /* (nothing to lift: cannot fail) */
    set_head_guard(r, guarded);
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
  if (hk_secure) canaries_mark(r);
  else if (!listed) r->block_end = need; /* (hardened mode: where the guard is, set above) */
  r->large_state = HK_LARGE_LIVE;
  r->large_sampled = 0;
  r->large_heap = NULL;
  thread_count(r, size);
  hk_add_relaxed(&live_asked, size);
  hk_add_relaxed(&live_blocks, 1);
  hk_stat_add(large_allocs, 1);
  char *p = (char *)r + off;
  if (zero && !r->large_zero) memset(p, 0, size);
  return p;
}

void hk_large_free(hk_region *r, void *p) {
  hk_region *victims = NULL;
  if (r->large_sampled && (char *)p == (char *)r + r->user_offset) { /* (before the lock: profile.c's is first) */
    r->large_sampled = 0;
    hk_profile_forget(p, NULL);
  }
  hk_lock(&hk_large_lock);
  if (r->large_state != HK_LARGE_LIVE) {
    hk_unlock(&hk_large_lock);
    hk_fatal("double free of a large block", p);
  }
  if ((char *)p != (char *)r + r->user_offset) {
    hk_unlock(&hk_large_lock);
    hk_fatal("free() of a pointer into the middle of a large block", p);
  }
  const char *broken = hk_secure ? canaries_broken(r) : NULL;
  if (broken != NULL) {
    hk_unlock(&hk_large_lock);
    hk_fatal(broken, p);
  }
  hk_stat_add(large_frees, 1);
  tail_forget_locked(r);
  hk_sub_relaxed(&live_asked, r->user_size);
  hk_sub_relaxed(&live_blocks, 1);
  heap_unlink_locked(r);
  thread_recount_locked(r, r->user_size, 0, true);
  if (r->large_detached) {
    hk_list_remove(&detached, r);
    hk_unlock(&hk_large_lock);
    hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size);
    hk_stat_add(large_unmaps, 1);
    hk_os_unmap(r, r->map_size);
    return;
  }
  r->large_state = HK_LARGE_CACHED;
  uint64_t now = hk_os_now_ms();
  cache_expire_locked(&victims, false, now);
  tails_expire_locked(false, now);
  /* the cache's bytes: the option's, or twice as many as were recently live (a
   * pipeline's blocks in flight, freed in a burst), unless it is off */
  live_sum recent = recent_live_locked(now, false, 0);
  size_t limit = (size_t)hk_opt.large_cache_mb << 20;
  if (limit != 0 && 2 * recent.bytes > limit) limit = 2 * recent.bytes;
  unsigned entries = cache_entries_limit(recent);
  /* (zero mode caches none: a freed block's memory goes back to the kernel,
   * so the next block is zero, and a write after free faults while the
   * range stays unmapped) */
  bool cached = entries != 0 && r->map_size <= limit && !hk_secure_zero;
  if (cached) {
    /* make room by evicting the oldest entries */
    while ((cache.n >= entries || cache.bytes + r->map_size > limit) && cache.n > 0)
      victim(&victims, cache_remove(cache_oldest()));
    r->cached_resident = r->map_size - guard_tail() - data_page(r);
    cache_insert(r, r->cached_resident, now);
    cache_enforce_budget_locked(now);
  } else {
    victim(&victims, r);
  }
  hk_unlock(&hk_large_lock);
  unmap_victims(victims);
  if (cached) hk_purger_notify_free(); /* no lock held */
}

/* Hardened mode reports the request, as for the smaller blocks
 * (docs/SAFETY.md); a reused cached mapping may be bigger. */
size_t hk_large_usable(hk_region *r) { return hk_secure ? r->user_size : r->block_end - r->user_offset; }

/* The block's size becomes `size`. lock: take hk_large_lock for the
 * thread's count (not when the caller holds it, nor when the thread it
 * counts to is the caller's or none: hk_large_resize_in_pages). */
HK_INLINE void resize_asked(hk_region *r, size_t size, bool lock) {
  hk_add_relaxed(&live_asked, size - r->user_size); /* modulo 2^64 */
  if (r->large_thread != NULL) {
    if (lock) hk_lock(&hk_large_lock);
    thread_recount_locked(r, r->user_size, size, false);
    if (lock) hk_unlock(&hk_large_lock);
  }
  r->user_size = size;
}

/* Hardened mode's hk_large_realloc: in place while the mapping holds the
 * block and a guard after it, the guard moved to the block's new end when
 * it grows past it (a shrink leaves it: no system call); else grown with
 * mremap to just that, the guards lifted and the end guard put back, as
 * cache_take grows a mapping. The canaries are checked first, and written
 * again for the new size or place. */
static void *secure_realloc(hk_region *r, void *p, size_t size, size_t need) {
  const char *broken = canaries_broken(r);
  if (broken != NULL) hk_fatal(broken, p);
  size_t old = r->map_size;
  if (need + hk_os_page <= old) {
    if (need > r->block_end && !move_tail_guard(r, need)) return NULL;
    resize_asked(r, size, true);
    canaries_mark(r);
    return p;
  }
  if (!r->large_floating) return NULL; /* (see cache_take) */
  size_t want = need + hk_os_page;
  if (!hk_limit_allows(want - old)) return NULL; /* (a memory limit: the caller's copy fails too) */
  hk_region_unregister(r); /* (see hk_large_realloc) */
  hk_heap *heap = heap_leave(r);
  size_t end = r->block_end;
  hk_region *n = lift_tail_guards(r) ? remap_large(r, old, want) : NULL;
  hk_region_register(n != NULL ? n : r);
  heap_rejoin(n != NULL ? n : r, heap);
  if (n == NULL) { /* still at r: its guards back (and so where its canary is) */
    if (end < old - hk_os_page) hk_os_guard((char *)r + end, hk_os_page);
    hk_os_guard((char *)r + old - hk_os_page, hk_os_page);
    r->block_end = end;
    return NULL;
  }
  hk_os_guard((char *)n + want - hk_os_page, hk_os_page);
  hk_stat_add(large_remaps, 1);
  n->map_size = want;
  n->block_end = want - hk_os_page;
  resize_asked(n, size, true);
  canaries_mark(n);
  hk_stat_peak(&hk_stats.large_peak_bytes,
               hk_add_relaxed(&hk_stats.large_mapped_bytes, want - old) + want - old);
  return (char *)n + n->user_offset;
}

/* realloc of the live large block p (r's) to a size that ends in the same
 * page as its block does now: only the asked size changes, so there is no
 * tail to list or forget and no lock to take (the block is the caller's;
 * the thread whose live bytes count it is this one, or none, so no thread's
 * exit changes that count meanwhile, as at its allocation, thread_count).
 * The common step of a buffer that grows by small appends. False, having
 * done nothing, for anything else, which hk_large_realloc and the checks
 * before it take. */
bool hk_large_resize_in_pages(hk_region *r, void *p, size_t size) {
  if (hk_secure || r->large_state != HK_LARGE_LIVE || (char *)p != (char *)r + r->user_offset || r->large_sampled)
    return false;
  size_t usable = r->block_end - r->user_offset;
  if (size > usable || size <= usable - hk_os_page || size < usable / 2) return false;
  hk_heap *t = r->large_thread;
  if (t != NULL && t != hk_tls_heap) return false;
  resize_asked(r, size, false);
  return true;
}

/* Resize in place or move with mremap. NULL: the caller copies. */
void *hk_large_realloc(hk_region *r, void *p, size_t size) {
  if (size > HK_MAX_REQUEST) return NULL;
  if (r->large_sampled) { /* (the sample was of the size first asked for: it ends here) */
    r->large_sampled = 0;
    hk_profile_forget(p, NULL);
  }
  size_t need = round_page(r->user_offset + size);
  if (hk_secure) return secure_realloc(r, p, size, need);
  /* Off the list of tails first: from then on only this thread changes
   * the mapping (the purger may have trimmed it until now). */
  uint64_t now = hk_os_now_ms();
  hk_lock(&hk_large_lock);
  tail_forget_locked(r);
  bool in_place = need <= r->map_size, give_back = false, listed = false;
  if (in_place) {
    /* A shrink gives back the tail when at least half the mapping is
     * unused and the tier holds more than its budget (or a limit on mapped
     * bytes holds; a detached block always); else the tail is listed, and
     * goes a purge delay later if the block still lives. */
    give_back = need <= r->map_size / 2 && (r->large_detached || hk_load_relaxed(&hk_space_tight) ||
                                            held_over_budget_locked(recent_live_locked(now, false, 0).bytes, 1));
    r->block_end = need;
    if (!give_back) tail_note_locked(r, now);
    listed = r->large_tail;
    resize_asked(r, size, false);
  }
  hk_unlock(&hk_large_lock);
  if (in_place) {
    if (give_back && hk_os_shrink(r, r->map_size, need)) {
      hk_sub_relaxed(&hk_stats.large_mapped_bytes, r->map_size - need);
      r->map_size = need;
    }
    if (listed) hk_purger_notify(); /* (realloc may start the purger, free() may not) */
    return p;
  }
  if (r->large_detached) return NULL; /* moving would break its alignment: copy */
  size_t old = r->map_size;
  if (!hk_limit_allows(need - old)) return NULL; /* (the caller's copy asks again, and fails) */
  /* Out of the ownership map before the move: once moved, the old address
   * is free, and another thread's new mapping there registers itself;
   * unregistering after the move would clear that mapping's bit, and its
   * block would then read as "not allocated by hakmem". The block is the
   * caller's: no other thread may look it up meanwhile. */
  hk_region_unregister(r);
  hk_heap *heap = heap_leave(r);
  /* rounded to a cache bin, as a new mapping: room to grow further in place */
  size_t want = hk_load_relaxed(&hk_space_tight) ? need : bin_round(need);
  hk_region *n = remap_large(r, old, want);
  hk_region_register(n != NULL ? n : r);
  heap_rejoin(n != NULL ? n : r, heap);
  if (n == NULL) return NULL;
  hk_stat_add(large_remaps, 1);
  n->map_size = want;
  n->block_end = need;
  resize_asked(n, size, true);
  hk_stat_peak(&hk_stats.large_peak_bytes,
               hk_add_relaxed(&hk_stats.large_mapped_bytes, want - old) + want - old);
  return (char *)n + n->user_offset;
}
