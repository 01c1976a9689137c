/* Thread heaps: one per thread, holding for each size class a queue of
 * pages whose current (first) page serves the malloc fast path.
 *
 * Lifecycle: a thread starts on hk_heap_empty (whose pages have no free
 * blocks, so its first malloc lands in hk_malloc_slow and creates a real
 * heap). At thread exit the heap's pages, empty or not, are abandoned to a
 * global list per class, from which other threads adopt them; empty ones
 * go back to their regions if no thread adopts them within the purge
 * delay. Heap structures are recycled through a pool and never unmapped,
 * so a remote freer holding a stale owner pointer can still write its hint
 * safely. */
#include "internal.h"

#include <errno.h>
#include <sched.h>
#include <string.h>

hk_page hk_page_empty = {.used = (uint32_t)HK_USED_NORMAL}; /* no blocks, normal state */
hk_heap hk_heap_empty = {.free_owner = HK_NO_OWNER(&hk_heap_empty), /* (not NULL: abandoned pages) */
                         .by_size = {[0 ... HK_LUT_SLOTS - 1] = &hk_page_empty},
                         .direct = {[0 ... HK_NCLASSES - 1] = &hk_page_empty}};
__thread hk_heap *hk_tls_heap __attribute__((tls_model("initial-exec"))) = &hk_heap_empty;

pthread_mutex_t hk_heap_lock = PTHREAD_MUTEX_INITIALIZER;
_Atomic uint32_t hk_abandoned_hint;

static hk_heap *heap_pool;               /* recycled heaps (hk_heap_lock) */
static char *heap_chunk, *heap_chunk_end;  /* bump area for new heaps */
static pthread_key_t thread_key;
static _Atomic int thread_key_ready;

static hk_page_queue abandoned[HK_NCLASSES]; /* abandoned_lock(class) */
static _Atomic uint32_t abandoned_count[HK_NCLASSES];
/* One lock per class: threads that start (adopt) and threads that exit
 * (abandon_page) wait for each other only over pages of one class. With
 * one lock for all, thread_churn (8 threads at a time, 2 CPUs) found it
 * taken in 3-4 % of its 930k acquisitions, and 1.14x the speed with one
 * lock per class (futex calls 375-403 -> 232-306 per 2000 threads). All
 * zero (glibc's PTHREAD_MUTEX_INITIALIZER): in .bss, no page written until
 * a class's lock is used. */
static struct {
  pthread_mutex_t m;
} __attribute__((aligned(64))) abandoned_locks[HK_NCLASSES] = {[0 ... HK_NCLASSES - 1] = {PTHREAD_MUTEX_INITIALIZER}};
HK_INLINE pthread_mutex_t *abandoned_lock(unsigned cls) { return &abandoned_locks[cls].m; }

/* ---- page queues (doubly linked through page->next/prev) ---- */
static void queue_remove(hk_page_queue *q, hk_page *p) {
  if (p->prev) p->prev->next = p->next; else q->first = p->next;
  if (p->next) p->next->prev = p->prev; else q->last = p->prev;
  p->next = p->prev = NULL;
}
static void queue_push_front(hk_page_queue *q, hk_page *p) {
  p->prev = NULL;
  p->next = q->first;
  if (q->first) q->first->prev = p; else q->last = p;
  q->first = p;
}
static void queue_push_back(hk_page_queue *q, hk_page *p) {
  p->next = NULL;
  p->prev = q->last;
  if (q->last) q->last->next = p; else q->first = p;
  q->last = p;
}

static void full_remove(hk_heap *h, hk_page *p) {
  if (p->prev) p->prev->next = p->next; else h->full = p->next;
  if (p->next) p->next->prev = p->prev;
  p->next = p->prev = NULL;
  hk_page_set_state(p, HK_USED_NORMAL);
}

/* The current page is the first of the class queue; direct[] exposes it to
 * the malloc fast path. In hardened mode direct[] stays empty so every
 * malloc takes the slow path, where the checks are. */
static void set_direct(hk_heap *h, unsigned cls, hk_page *page) {
  /* a held page (hk_heap_page_emptied) stops being one; the old page is not
   * read: it may have been released to another thread already */
  if (h->direct[cls] != page) {
    h->held_bytes -= h->held[cls];
    h->held[cls] = 0;
  }
  if (page != &hk_page_empty && page->nslabs == 1) hk_page_set_state(page, HK_USED_CURRENT);
  h->direct[cls] = page;
  /* the lookup table's slots of this class are consecutive */
  for (unsigned i = hk_class_lut_first[cls]; i < HK_LUT_SLOTS && hk_class_lut[i] == cls; i++) h->by_size[i] = page;
}

/* The page stops being current (it stays live and queued): free() may now
 * find it empty. */
static void uncurrent(hk_page *p) {
  if (p != NULL && hk_page_is_current(p)) hk_page_set_state(p, HK_USED_NORMAL);
}

static void set_current(hk_heap *h, unsigned cls) {
  hk_page *first = h->queues[cls].first;
  set_direct(h, cls, first && !hk_secure ? first : &hk_page_empty);
}

/* An empty page left in its class's queue (hk_heap_page_emptied) stops
 * being held: it is taken, or given up. */
static void unhold(hk_heap *h, hk_page *page) {
  if (!page->held) return;
  page->held = 0;
  h->held_bytes -= page->capacity * page->block_size;
}

static void release_page(hk_heap *h, hk_page *page) {
  unhold(h, page);
  h->stats.pages_released++;
  hk_region_free_span(page);
}

static uint32_t span_bytes(const hk_page *page) { return (uint32_t)page->nslabs << HK_SLAB_SHIFT; }

/* An empty page leaves its class. The span of a page of blocks smaller
 * than a slab stays with the heap as a spare, ready to be re-initialised
 * for any class of its length without a span search, up to HK_SPARE_MAX;
 * beyond that, and for every other span, it goes back to its region. A
 * spare keeps its class's memory where the class carves (thread_churn,
 * whose exiting threads pass their spares on as empty pages: 3.7 MiB peak
 * RSS against 4.5 without spares; mid_large_mt with 1024 slots 1.11x).
 * Spans of blocks of a slab or more (one to four blocks a page) and the
 * spans realloc leaves behind go back at once: kept out of the region's
 * free slabs, they served only their exact length and split the free runs
 * that other spans and growing blocks could have used (big_mixed with 16
 * MiB of them a heap: 97 MiB peak RSS against 72; realloc_growth 24.2
 * MiB against 15.1; 2026-11-26). The purger gives back spares unused for a
 * purge delay (hk_spares_expire) beyond HK_SPARE_BYTES; spare_lock is
 * between the owner's slow paths and the purger only. */
static _Atomic uint64_t spares_total; /* spare_bytes of all heaps, for the purger's pending() (up to 16 MiB a heap:
                                          more than 32 bits with 256 threads) */

static void retire_page(hk_heap *h, hk_page *page) {
  unhold(h, page);
  uint32_t bytes = span_bytes(page);
  uint32_t limit = h->moving ? 0 : HK_SPARE_MAX;
  if (page->block_size >= HK_SLAB_SIZE || page->lent) limit = 0; /* (a spare is re-initialised whole) */
  if (limit == 0) {
    release_page(h, page);
    return;
  }
  pthread_mutex_lock(&h->spare_lock);
  if (h->spare_bytes + bytes <= limit) {
    page->next = h->spare[page->nslabs];
    page->prev = NULL;
    page->idle_ms = hk_os_now_ms(); /* (idle_ms serves abandoned pages otherwise) */
    h->spare[page->nslabs] = page;
    h->spare_bytes += bytes;
    pthread_mutex_unlock(&h->spare_lock);
    atomic_fetch_add_explicit(&spares_total, bytes, memory_order_relaxed);
    hk_purge_poke = true;
    return;
  }
  pthread_mutex_unlock(&h->spare_lock);
  release_page(h, page);
}

/* A spare of the same span length, preferably one this class used (its
 * committed memory is where the class carves). Taking a longer one and
 * giving its tail slabs back to the region served more requests with
 * random block sizes but cost realloc_growth 6 % and 2 MiB of peak RSS.
 * The lists are by length: walking one list of all spares, with up to 16
 * MiB of them, took 9 % of the time of a loop of random 64 KiB-1 MiB
 * blocks (a cache miss per spare passed over). */
static hk_page *take_spare(hk_heap *h, unsigned cls, unsigned nslabs) {
  hk_page **found = NULL;
  if (atomic_load_explicit(&spares_total, memory_order_relaxed) == 0) return NULL; /* no heap has spares */
  pthread_mutex_lock(&h->spare_lock);
  for (hk_page **pp = &h->spare[nslabs]; *pp != NULL; pp = &(*pp)->next) {
    if (found == NULL || (*pp)->cls == cls) found = pp;
    if ((*pp)->cls == cls) break;
  }
  hk_page *p = NULL;
  if (found != NULL) {
    p = *found;
    *found = p->next;
    p->next = NULL;
    h->spare_bytes -= span_bytes(p);
    atomic_fetch_sub_explicit(&spares_total, span_bytes(p), memory_order_relaxed);
  }
  pthread_mutex_unlock(&h->spare_lock);
  return p;
}

/* Detach the spares unused since `older_than` (all: UINT64_MAX) while
 * more than `keep` bytes of spares remain, for the caller to give back. */
static hk_page *detach_spares(hk_heap *h, uint64_t older_than, uint32_t keep) {
  hk_page *out = NULL;
  uint32_t bytes = 0;
  for (unsigned n = 1; n < HK_SLABS; n++) {
    for (hk_page **pp = &h->spare[n]; *pp != NULL && h->spare_bytes - bytes > keep;) {
      hk_page *p = *pp;
      if (p->idle_ms < older_than) {
        *pp = p->next;
        p->next = out;
        out = p;
        bytes += span_bytes(p);
      } else {
        pp = &p->next;
      }
    }
  }
  h->spare_bytes -= bytes;
  atomic_fetch_sub_explicit(&spares_total, bytes, memory_order_relaxed);
  return out;
}

static void release_spares(hk_heap *h) {
  pthread_mutex_lock(&h->spare_lock);
  hk_page *p = detach_spares(h, UINT64_MAX, 0);
  pthread_mutex_unlock(&h->spare_lock);
  while (p != NULL) {
    hk_page *next = p->next;
    release_page(h, p);
    p = next;
  }
}

static hk_heap *all_heaps; /* hk_heap_lock */
static uint32_t heaps_carved; /* hk_heap_lock */

bool hk_spares_pending(void) { return atomic_load_explicit(&spares_total, memory_order_relaxed) != 0; }

/* Detach, from every heap, the spares unused since `older_than` beyond
 * `keep` bytes a heap. A heap whose lock is busy (its owner is in a slow
 * path, or was when the process forked) is skipped until next time. */
static hk_page *detach_all_heaps(uint64_t older_than, uint32_t keep) {
  hk_page *out = NULL;
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = all_heaps; h != NULL; h = h->all_next) {
    if (pthread_mutex_trylock(&h->spare_lock) != 0) continue;
    hk_page *p = detach_spares(h, older_than, keep);
    pthread_mutex_unlock(&h->spare_lock);
    while (p != NULL) {
      hk_page *next = p->next;
      p->next = out;
      out = p;
      p = next;
    }
  }
  hk_unlock(&hk_heap_lock);
  return out;
}

/* Purger (and malloc_trim, with force: all of them): give back every
 * heap's spares unused for a purge delay beyond the first HK_SPARE_BYTES
 * (giving those back too cost realloc_growth 5 %: 4.9k more page faults). */
void hk_spares_expire(bool force) {
  if (!hk_spares_pending()) return;
  uint64_t now = hk_os_now_ms();
  uint64_t older_than = force ? UINT64_MAX : (now > (uint64_t)hk_opt.purge_delay_ms ? now - (uint64_t)hk_opt.purge_delay_ms : 0);
  hk_page *out = detach_all_heaps(older_than, force ? 0 : HK_SPARE_BYTES);
  while (out != NULL) {
    hk_page *next = out->next;
    hk_region_free_span(out);
    hk_stat_add(spares_released, 1);
    out = next;
  }
}

/* A span with no live block goes back to its region, its memory to the OS. */
static void give_back_purged(hk_page *page) {
  hk_os_purge((void *)hk_page_span_start(page), span_bytes(page));
  hk_region_free_span_purged(page);
}

/* The program grew (region.c, span_taken): spares beyond HK_SPARE_BYTES, of
 * any age, go back to the OS at once, as the regions' free slabs do; at
 * most once every quarter of a purge delay, because giving them back lowers
 * the live spans that the next growth is measured from: a program replacing
 * a few dozen big blocks (big_mixed) had a growth purge every 2 ms, 341 in
 * 400k operations (with the limit: 0.82 -> 1.37 Mops/s, peak RSS 26 -> 38
 * MiB, the peers' 65-72; fragmentation, realloc_growth unchanged). */
void hk_spares_trim(void) {
  if (atomic_load_explicit(&spares_total, memory_order_relaxed) <= HK_SPARE_BYTES) return;
  static _Atomic uint64_t next_ms;
  uint64_t now = hk_os_now_ms(), next = atomic_load_explicit(&next_ms, memory_order_relaxed);
  if (now < next || !atomic_compare_exchange_strong(&next_ms, &next, now + (uint64_t)hk_opt.purge_delay_ms / 4)) return;
  hk_page *out = detach_all_heaps(UINT64_MAX, HK_SPARE_BYTES);
  while (out != NULL) {
    hk_page *next = out->next;
    give_back_purged(out);
    hk_stat_add(spares_released, 1);
    out = next;
  }
}

/* ---- heap creation and thread exit ---- */
static void thread_done(void *arg);

#define HEAP_CHUNK_BYTES ((size_t)256 << 10)

/* Under hk_heap_lock: a heap from the pool of exited threads' heaps, or a
 * new one carved from the current chunk; NULL if no chunk can be mapped. */
static hk_heap *heap_carve(void) {
  hk_heap *h = heap_pool;
  if (h != NULL) {
    heap_pool = h->pool_next;
    return h;
  }
  if (heap_chunk == NULL || heap_chunk + sizeof(hk_heap) > heap_chunk_end) {
    heap_chunk = hk_os_map_aligned(HEAP_CHUNK_BYTES, HK_OS_PAGE);
    heap_chunk_end = heap_chunk ? heap_chunk + HEAP_CHUNK_BYTES : NULL;
    if (heap_chunk == NULL) return NULL;
  }
  h = (hk_heap *)heap_chunk;
  heap_chunk += (sizeof(hk_heap) + 63) & ~(size_t)63;
  pthread_mutex_init(&h->spare_lock, NULL);
  memset(h->spare, 0, sizeof h->spare);
  h->spare_bytes = 0;
  h->all_next = all_heaps;
  all_heaps = h;
  h->region_list = heaps_carved++;
  return h;
}

static hk_heap *heap_new(void) {
  hk_heap *h;
  for (bool retried = false;; retried = true) {
    hk_lock(&hk_heap_lock);
    h = heap_carve();
    hk_unlock(&hk_heap_lock);
    if (h != NULL || retried) break;
    /* out of memory: the caches (and the arena's reservation) first, as
     * for any mapping; outside hk_heap_lock, which the release takes */
    hk_release_for_retry(HEAP_CHUNK_BYTES);
  }
  if (h == NULL) return NULL;
  memset(h, 0, offsetof(hk_heap, remote_hint));
  h->held_bytes = 0;
  memset(h->held, 0, sizeof h->held);
  for (unsigned c = 0; c < HK_NCLASSES; c++) set_direct(h, c, &hk_page_empty);
  atomic_store_explicit(&h->remote_hint, 0, memory_order_relaxed);
  h->fresh_count = 0;
  h->searches = 0;
  atomic_store_explicit(&h->active_ms, hk_os_now_ms(), memory_order_relaxed);
  memset(h->queues, 0, sizeof h->queues);
  memset(h->cache_first, 0, sizeof h->cache_first);
  for (unsigned c = 0; c < HK_NCLASSES; c++) h->cache_room[c] = hk_class_cache_max[c];
  h->cache_bytes = 0;
  h->free_owner = h;
  h->full = NULL;
  h->block_purge_ms = 0;
  h->purge_passes = 1; /* class_searched[] (0) then matches no pass */
  memset(h->class_searched, 0, sizeof h->class_searched);
  h->growth_epoch = atomic_load_explicit(&hk_growth_epoch, memory_order_relaxed);
  memset(h->grown, 0, sizeof h->grown);
  h->grown_next = 0;
  h->pool_next = NULL;
  memset(&h->stats, 0, sizeof h->stats);
  uint32_t owner = (uint32_t)hk_stat_add(heaps_created, 1) + 1; /* this ownership's own number */
  atomic_store_explicit(&h->pid, hk_os_pid(), memory_order_relaxed);
  atomic_store_explicit(&h->tid, hk_os_tid(), memory_order_relaxed);
  atomic_store_explicit(&h->reap_checked_ms, 0, memory_order_relaxed);
  atomic_store_explicit(&h->live, owner ? owner : 1, memory_order_release); /* after tid: see hk_heap_reap */
  return h;
}

static __thread bool heap_gone __attribute__((tls_model("initial-exec")));

/* This thread's heap, made at its first allocation; NULL when out of
 * memory, or once the thread's heap is gone (see alloc_late). */
hk_heap *hk_heap_get(void) {
  hk_heap *h = hk_tls_heap;
  if (h != &hk_heap_empty) return h;
  if (heap_gone) return NULL;
  if (atomic_load_explicit(&hk_init_state, memory_order_acquire) != 2) hk_init();
  /* (in case the C library's pthread_create did not call calloc: init.c) */
  hk_fork_handlers_check();
  h = heap_new();
  if (h == NULL) return NULL;
  hk_tls_heap = h;
  /* After hk_tls_heap is set: pthread_setspecific may itself call calloc. */
  if (atomic_load_explicit(&thread_key_ready, memory_order_acquire)) pthread_setspecific(thread_key, h);
  /* A second thread allocates: from now on free() cannot start the purger
   * (purger.c), so it starts here, in this thread's first malloc. */
  static _Atomic uint32_t heaps_made;
  if (atomic_fetch_add_explicit(&heaps_made, 1, memory_order_relaxed) != 0) hk_purger_start();
  hk_heap_reap();
  return h;
}

void hk_thread_init_key(void) {
  if (pthread_key_create(&thread_key, thread_done) == 0)
    atomic_store_explicit(&thread_key_ready, 1, memory_order_release);
}

/* A parked page that a remote freer found free and gave back (remote.c,
 * reclaim) starts over as a new page of its class, nothing carved. Busy:
 * that freer is still at it. */
enum { PAGE_KEPT, PAGE_RECLAIMED, PAGE_BUSY };
static int reclaimed(hk_page *page) {
  if (hk_page_state(page) != HK_PAGE_RECLAIMED) return PAGE_KEPT;
  if (atomic_load_explicit(&page->reclaiming, memory_order_acquire)) return PAGE_BUSY;
  hk_page_init(page, page->cls);
  return PAGE_RECLAIMED;
}

static _Atomic uint32_t abandoned_empty; /* empty pages on the abandoned lists */
static _Atomic uint32_t abandoned_empty_in[HK_NCLASSES]; /* the same, per class */
static void purge_free_blocks(hk_page *page);
#define HK_PURGE_BLOCK_MIN (16u << 10)

static void reset_kept(hk_page *p);
static void note_empty(hk_page *page, uint64_t now) {
  reset_kept(page);
  page->idle_ms = now | 1; /* never 0, which means "not empty" */
  atomic_fetch_add_explicit(&abandoned_empty, 1, memory_order_relaxed);
  atomic_fetch_add_explicit(&abandoned_empty_in[page->cls], 1, memory_order_relaxed);
}

static void forget_empty(unsigned cls) {
  atomic_fetch_sub_explicit(&abandoned_empty, 1, memory_order_relaxed);
  atomic_fetch_sub_explicit(&abandoned_empty_in[cls], 1, memory_order_relaxed);
}

/* An empty page of several slabs (blocks above 8 KiB) whose class has an
 * empty page kept already goes back to its region, purged, instead of
 * joining the list: the threads that start next take one page a class
 * each, and when every empty page was kept, they took them in turn, each
 * with the OS pages its earlier owners wrote (a medium page kept 12-24
 * KiB): thread_churn's peak RSS grew with the threads it ran (2.8 MiB
 * after 100, 3.8 after 20,000; glibc 2.6 and 2.9). One kept a class:
 * 3.78 -> 3.51 MiB at 1.00x the CPU time (21 interleaved runs). Applied
 * to the one-slab pages too: 3.26 MiB, but 1.06-1.09x the CPU time: the
 * madvise and the page faults of some 2,600 more pages given back and
 * taken again. A page with lent slabs is kept: they are not its to purge. */
static bool surplus_empty(const hk_page *page) {
  return page->nslabs > 1 && !page->lent && atomic_load_explicit(&abandoned_empty_in[page->cls], memory_order_relaxed) != 0;
}

/* An exiting thread's page joins the abandoned list of its class, even
 * when it is empty: a thread that starts later and uses the class adopts
 * it, blocks carved and memory committed where the class carves. Given
 * back to its region at once, the span went to whichever class took it
 * next, at whatever offset, and under thread churn slabs ended up
 * committed all over for a few blocks each (thread_churn: 9.8 -> 4.5 MiB
 * peak RSS, glibc 3.0). Empty abandoned pages go back after the purge
 * delay (hk_abandoned_sweep). */
static void abandon_page(hk_page *page) {
  for (;;) {
    if (reclaimed(page) == PAGE_BUSY) {
      sched_yield(); /* a freer is purging it: a system call's wait */
      continue;
    }
    if (hk_page_collect(page, HK_PAGE_ABANDONED) != HK_COLLECT_RECLAIMED) break;
  }
  hk_page_set_state(page, HK_USED_NORMAL);
  page->held = 0; /* (the heap's held_bytes goes with the heap) */
  atomic_store_explicit(&page->heap, NULL, memory_order_release);
  page->idle_ms = 0;
  if (hk_page_used(page) == 0) {
    if (surplus_empty(page)) {
      give_back_purged(page);
      hk_stat_add(abandoned_released, 1);
      return;
    }
    note_empty(page, hk_os_now_ms());
  }
  hk_lock(abandoned_lock(page->cls));
  queue_push_back(&abandoned[page->cls], page);
  atomic_fetch_add_explicit(&abandoned_count[page->cls], 1, memory_order_relaxed);
  /* A remote free may have landed between the collect and now. */
  if (atomic_load_explicit(&page->remote, memory_order_acquire) & ~HK_REMOTE_STATE_MASK)
    atomic_store_explicit(&hk_abandoned_hint, 1, memory_order_release);
  hk_unlock(abandoned_lock(page->cls));
}

static void heap_abandon(hk_heap *h) {
  hk_cache_flush_all(h);
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    hk_page *p;
    while ((p = h->queues[c].first) != NULL) {
      queue_remove(&h->queues[c], p);
      abandon_page(p);
    }
    set_direct(h, c, &hk_page_empty);
  }
  hk_page *p;
  while ((p = h->full) != NULL) {
    full_remove(h, p);
    abandon_page(p);
  }
  /* spares too, as empty pages of the class they served last (thread_churn
   * 5.4 -> 4.5 MiB against releasing them) */
  pthread_mutex_lock(&h->spare_lock);
  p = detach_spares(h, UINT64_MAX, 0);
  pthread_mutex_unlock(&h->spare_lock);
  while (p != NULL) {
    hk_page *next = p->next;
    abandon_page(p);
    p = next;
  }
  h->held_bytes = 0;
  memset(h->held, 0, sizeof h->held);
  hk_stats_merge_heap(h);
  hk_stat_add(threads_exited, 1);
  hk_lock(&hk_heap_lock);
  h->pool_next = heap_pool;
  heap_pool = h;
  hk_unlock(&hk_heap_lock);
}

static void thread_done(void *arg) {
  hk_heap *h = hk_tls_heap;
  (void)arg;
  if (h == &hk_heap_empty) return;
  hk_tls_heap = &hk_heap_empty;
  heap_gone = true;
  atomic_store_explicit(&h->live, 0, memory_order_relaxed);
  heap_abandon(h);
  hk_abandoned_sweep(false, false);
  hk_purger_poke();
  hk_purger_start();
}

/* ---- abandoned pages ---- */

/* ---- empty abandoned pages, kept for adoption ----
 * Under thread churn such a page is adopted again within the purge delay,
 * again and again, and never goes back to its region: every block that
 * some thread ever used in it stayed committed (and a new owner, popping
 * whichever block was freed last, used yet another). So an empty page
 * starts over when it is noted empty: its free list is rebuilt as a fresh
 * page's, carving from the start, which writes only memory the page used
 * first; the purger then gives back the rest of the span (trim_kept), and
 * the inside of its free medium blocks (thread_churn: peak RSS 4576 ->
 * 4320 KiB, speed within noise; purging at once, in the exiting thread,
 * cost 11 % of thread_churn's speed). Not in hardened mode, whose pages
 * carve in random order. */
static void reset_kept(hk_page *p) {
  if (hk_secure || p->lent || p->capacity <= hk_extend_blocks(p->block_size)) return; /* as fresh; lent slabs are not its own */
  hk_page_init(p, p->cls);
  hk_page_extend(p);
  atomic_store_explicit(&p->remote, HK_PAGE_ABANDONED, memory_order_relaxed);
  p->untrimmed = 1;
}

/* If p is marked untrimmed, give back its span beyond the blocks carved. */
static bool trim_tail(hk_page *p) {
  if (!p->untrimmed) return false;
  p->untrimmed = 0;
  uintptr_t end = hk_page_span_start(p) + span_bytes(p);
  uintptr_t from = (p->start + hk_page_area(p) + HK_OS_PAGE - 1) & ~(uintptr_t)(HK_OS_PAGE - 1);
  if (end <= from) return false;
  hk_os_purge((void *)from, end - from);
  return true;
}

/* Purger only (it makes system calls), under the class's abandoned_lock. */
static void trim_kept(hk_page *p) {
  if (trim_tail(p)) hk_stat_add(abandoned_trimmed, 1);
  if (p->block_size >= HK_PURGE_BLOCK_MIN && !hk_secure_zero) purge_free_blocks(p);
}

/* Collect the remote frees of abandoned pages (when a hint says some
 * arrived) and note the pages that became empty; with trim, also give back
 * the pages empty for a purge delay (all empty ones with force). Trim runs
 * in the purger and in malloc_trim. */
void hk_abandoned_sweep(bool trim, bool force) {
  bool hinted = atomic_load_explicit(&hk_abandoned_hint, memory_order_relaxed) &&
                atomic_exchange_explicit(&hk_abandoned_hint, 0, memory_order_acq_rel);
  if (!hinted && !(trim && atomic_load_explicit(&abandoned_empty, memory_order_relaxed))) return;
  uint64_t now = hk_os_now_ms(), delay = force ? 0 : (uint64_t)hk_opt.purge_delay_ms;
  hk_page *surplus = NULL;
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    /* (a page pushed after this test with remote frees on it sets the
     * hint again, for the next sweep) */
    if (atomic_load_explicit(&abandoned_count[c], memory_order_relaxed) == 0) continue;
    hk_lock(abandoned_lock(c));
    hk_page *next;
    for (hk_page *p = abandoned[c].first; p != NULL; p = next) {
      next = p->next;
      if (atomic_load_explicit(&p->remote, memory_order_acquire) & ~HK_REMOTE_STATE_MASK) {
        hk_page_collect(p, HK_PAGE_ABANDONED);
        if (hk_page_used(p) == 0 && p->idle_ms == 0) {
          if (surplus_empty(p)) { /* (given back below, out of the lock) */
            queue_remove(&abandoned[c], p);
            atomic_fetch_sub_explicit(&abandoned_count[c], 1, memory_order_relaxed);
            p->next = surplus;
            surplus = p;
            continue;
          }
          note_empty(p, now);
        }
      }
      if (!trim || p->idle_ms == 0) continue;
      /* now | 1: idle_ms is rounded up to odd, and a coarse clock (4 ms
       * ticks) reads even: `now >=` alone never released a page noted
       * empty in the same millisecond, even with force */
      if ((now | 1) >= p->idle_ms + delay) {
        queue_remove(&abandoned[c], p);
        atomic_fetch_sub_explicit(&abandoned_count[c], 1, memory_order_relaxed);
        forget_empty(c);
        hk_stat_add(abandoned_released, 1);
        hk_region_free_span(p);
      } else {
        trim_kept(p);
      }
    }
    hk_unlock(abandoned_lock(c));
  }
  while (surplus != NULL) {
    hk_page *next = surplus->next;
    give_back_purged(surplus);
    hk_stat_add(abandoned_released, 1);
    surplus = next;
  }
}

uint32_t hk_abandoned_empty(void) { return atomic_load_explicit(&abandoned_empty, memory_order_relaxed); }

static hk_page *adopt(hk_heap *h, unsigned cls) {
  if (atomic_load_explicit(&abandoned_count[cls], memory_order_relaxed) == 0) return NULL;
  hk_lock(abandoned_lock(cls));
  hk_page *p = abandoned[cls].first;
  if (p != NULL) {
    queue_remove(&abandoned[cls], p);
    atomic_fetch_sub_explicit(&abandoned_count[cls], 1, memory_order_relaxed);
  }
  hk_unlock(abandoned_lock(cls));
  if (p == NULL) return NULL;
  if (p->idle_ms != 0) {
    p->idle_ms = 0;
    forget_empty(cls);
  }
  atomic_store_explicit(&p->heap, hk_owner_tag(h), memory_order_release);
  hk_page_collect(p, HK_PAGE_NORMAL);
  h->stats.pages_adopted++;
  return p;
}

/* ---- full pages ---- */

/* Put a page on the full list (its state word already says FULL). */
static void full_push(hk_heap *h, hk_page *page) {
  hk_page_set_state(page, HK_USED_FULL);
  page->prev = NULL;
  page->next = h->full;
  if (h->full) h->full->prev = page;
  h->full = page;
}

/* Park a page with no free block on the full list, so the page search does
 * not revisit it. Fails if a remote free arrived meanwhile: the state and the
 * remote stack share one word, so a remote freer either sees FULL (and sets
 * remote_hint) or its block is seen here. */
static bool park_full(hk_heap *h, hk_page *page) {
  uintptr_t expect = HK_PAGE_NORMAL;
  hk_page_park_note(page, hk_page_used(page));
  if (!atomic_compare_exchange_strong_explicit(&page->remote, &expect, HK_PAGE_FULL,
                                               memory_order_acq_rel, memory_order_relaxed))
    return false;
  queue_remove(&h->queues[page->cls], page);
  full_push(h, page);
  return true;
}

static void unpark(hk_heap *h, hk_page *page) {
  full_remove(h, page);
  queue_push_back(&h->queues[page->cls], page);
}

/* Bring back full pages that received remote frees. The hint is cleared
 * before the scan so a free racing with it sets it again. */
static void rescue_full(hk_heap *h) {
  atomic_store_explicit(&h->remote_hint, 0, memory_order_seq_cst);
  hk_page *next;
  for (hk_page *p = h->full; p != NULL; p = next) {
    next = p->next;
    int r = reclaimed(p);
    if (r == PAGE_BUSY) atomic_store_explicit(&h->remote_hint, 1, memory_order_relaxed); /* look again */
    if (r != PAGE_KEPT) {
      if (r == PAGE_RECLAIMED) {
        full_remove(h, p);
        retire_page(h, p);
      }
      continue;
    }
    if (!(atomic_load_explicit(&p->remote, memory_order_acquire) & ~HK_REMOTE_STATE_MASK)) continue;
    if (hk_page_collect(p, HK_PAGE_NORMAL) == HK_COLLECT_RECLAIMED) { /* just now: next scan */
      atomic_store_explicit(&h->remote_hint, 1, memory_order_relaxed);
      continue;
    }
    unpark(h, p);
    if (hk_page_used(p) == 0) {
      queue_remove(&h->queues[p->cls], p);
      retire_page(h, p);
    }
  }
}

/* Called by free() when a page became empty, or when it received a block
 * while parked on the full list. */
#define SWAP_SLABS 4
void hk_heap_page_emptied(hk_heap *h, hk_page *page) {
  unsigned cls = page->cls;
  if (hk_page_parked(page)) {
    /* The state word says FULL: return it to NORMAL, taking any remote
     * blocks along, before the page rejoins the queue. */
    if (hk_page_collect(page, HK_PAGE_NORMAL) == HK_COLLECT_RECLAIMED) return; /* a stray free's doing */
    unpark(h, page);
  }
  /* Each class keeps at most one empty page, as its current page, so a
   * malloc/free loop does not churn pages. An empty single-slab current
   * page stays; an emptied page of up to SWAP_SLABS slabs replaces a
   * current page that has no free block (e.g. 64 or 256 KiB blocks, one per
   * page: fixed_256k +16 % against retiring it; a colour slab, which holds
   * no data, does not count: +14 %). A larger current page that empties
   * stays too, "held", while the carved bytes of the heap's held pages stay
   * within HK_HELD_BYTES: that bounds what an idle thread keeps (without a
   * bound, fragmentation's RSS 1 s after freeing all rose from 7.8 to 12.1
   * MiB; with it, 8.1). Giving such pages up at once cost a thread that
   * keeps a few medium blocks per class live a page search and a new page
   * every few operations, and their spans went back to the regions (with 32
   * blocks of 8-32 KiB live a thread, mid_large_mt with 64 slots: 811k page
   * acquisitions in 12M operations, 0.21x tcmalloc's speed; held: 0.91x,
   * 2026-11-25). Not held: a page emptied by realloc moving its block to
   * another class (the buffer is growing past it: realloc_growth held
   * every class's page, peak RSS 15.7 -> 19.3 MiB), nor in hardened mode,
   * whose direct[] does not track the current page. */
  hk_page *cur = h->queues[cls].first;
  if (hk_page_used(page) == 0 && page != cur) {
    if (page->held) return; /* (cannot happen: nothing was taken from it) */
    unsigned data_slabs = page->nslabs - hk_color_slabs(cls, page->nslabs);
    uint32_t carved = page->capacity * page->block_size;
    if (data_slabs <= SWAP_SLABS && cur != NULL && hk_list_end(cur->free) && cur->capacity == cur->reserved &&
        hk_page_used(cur) != 0) {
      queue_remove(&h->queues[cls], page);
      uncurrent(cur);
      queue_push_front(&h->queues[cls], page);
    } else if (page->nslabs > 1 && !hk_secure && !h->moving && h->held_bytes + carved <= HK_HELD_BYTES) {
      page->held = 1; /* stays queued: find_page takes it before a new span */
      h->held_bytes += carved;
      hk_purger_poke_free();
      return;
    } else {
      queue_remove(&h->queues[cls], page);
      retire_page(h, page);
    }
    set_current(h, cls);
  } else if (hk_page_used(page) == 0 && page->nslabs > 1 && h->held[cls] == 0) {
    /* the current page itself emptied: held (until set_direct replaces it) */
    uint32_t carved = page->capacity * page->block_size;
    if (!hk_secure && !h->moving && h->held_bytes + carved <= HK_HELD_BYTES) {
      h->held[cls] = carved;
      h->held_bytes += carved;
      /* as a single-slab current page: it stays when it empties again
       * (with one or two medium blocks of a class live, nearly every free
       * of one came here; uncurrent() ends it) */
      hk_page_set_state(page, HK_USED_CURRENT);
    } else {
      queue_remove(&h->queues[cls], page);
      retire_page(h, page);
      set_current(h, cls);
    }
  }
  hk_purger_poke_free();
}

/* ---- free medium blocks: their inside goes back to the OS ----
 * A page keeps its span committed until every block is free, so a program
 * that frees most of its large blocks but not all (fragmentation) would keep
 * their memory. Every purge delay, the owner's slow path gives back the
 * whole OS pages inside each free block of HK_PURGE_BLOCK_MIN or more: all
 * but the first page, which holds the free-list link and, in the second
 * word, a mark saying the block is purged (so it is not purged again while
 * it stays free). The mark includes the link: a block handed out and freed
 * again since gets a new link (as a rule) and is purged again. A reused block faults its pages back in, zero-filled.
 * The pass runs when the heap is about to take a new span (and on
 * malloc_trim), not on every slow path: it reads the clock. */

HK_INLINE uintptr_t purged_mark(const hk_page *page, const hk_block *b) {
  return page->key ^ (uintptr_t)b ^ b->link ^ (uintptr_t)0x70757267656421ull;
}

static void purge_free_blocks(hk_page *page) {
  uintptr_t key = page->key, start = page->start;
  uint32_t bs = page->block_size, area = hk_page_area(page), n = 0;
  uint64_t bytes = 0;
  hk_block *b = page->free;
  for (uint32_t i = 0; !hk_list_end(b); i++, b = hk_link_next(b, key)) {
    if (HK_UNLIKELY(i >= page->capacity || (uintptr_t)b - start >= area))
      hk_fatal("free list corrupted (write after free or heap overflow)", b);
    uintptr_t *mark = &b->link + 1;
    /* hardened mode 2 keeps a free block zero but for its link: no mark
     * there, and its only pass, malloc_trim's, purges again every time */
    if (!hk_secure_zero && *mark == purged_mark(page, b)) continue;
    uintptr_t lo = ((uintptr_t)(mark + 1) + HK_OS_PAGE - 1) & ~(uintptr_t)(HK_OS_PAGE - 1);
    uintptr_t hi = ((uintptr_t)b + bs) & ~(uintptr_t)(HK_OS_PAGE - 1);
    if (hi > lo) {
      hk_os_purge((void *)lo, hi - lo);
      bytes += hi - lo;
      n++;
    }
    if (!hk_secure_zero) *mark = purged_mark(page, b);
  }
  if (n) {
    hk_stat_add(blocks_purged, n);
    hk_stat_add(block_purge_bytes, bytes);
  }
}

/* ---- lending free slabs ----
 * Purging the inside of free blocks gives their memory back, but a page
 * whose blocks are mostly free still holds its whole span: no other class
 * can use it. A program that frees most of its blocks of 16-64 KiB and
 * then allocates bigger ones (fragmentation) faulted the new blocks in
 * from fresh memory, page by page: 39k page faults in that phase against
 * tcmalloc's 15k, whose spans of one or two such blocks empty with them.
 * So the same pass lends the region the slabs of a page in which every
 * block that overlaps them is free: they go back committed, as a released
 * span's do, and the next span of any class takes them without a fault
 * (or the region's purge gives them back after the delay). The page lives
 * on around the holes: its free list drops the blocks there, its span is
 * released without them, it is never re-initialised whole (a spare, an
 * abandoned page starting over, a remote reclaim), and a block dropped
 * with them whose start lies outside them carries the foreign tag, so that
 * freeing it is a double free. Not the head slab (its record heads the
 * span), nor slabs past the carved blocks, nor in hardened mode. */
static void lend_free_slabs(hk_page *p) {
  if (hk_secure || p->nslabs < 2 || p->nslabs > 16 || p->held || p->reserved > 64 || hk_page_used(p) == 0) return;
  if (atomic_load_explicit(&p->remote, memory_order_relaxed) & ~HK_REMOTE_STATE_MASK) {
    if (hk_page_collect(p, HK_PAGE_NORMAL) == HK_COLLECT_RECLAIMED) return;
  }
  uintptr_t key = p->key, start = p->start, span = hk_page_span_start(p);
  uint32_t bs = p->block_size, cap = p->capacity;
  uint64_t free_blocks = 0;
  uint32_t n = 0;
  for (hk_block *b = p->free; !hk_list_end(b); b = hk_link_next(b, key), n++) {
    uintptr_t off = (uintptr_t)b - start;
    if (HK_UNLIKELY(n >= cap || off >= (uintptr_t)cap * bs || off % bs != 0))
      hk_fatal("free list corrupted (write after free or heap overflow)", b);
    free_blocks |= (uint64_t)1 << (off / bs);
  }
  uintptr_t carved_end = start + (uintptr_t)cap * bs;
  unsigned lendable = 0;
  uint64_t over[16] = {0};
  for (unsigned k = 1; k < p->nslabs; k++) {
    uintptr_t s0 = span + ((uintptr_t)k << HK_SLAB_SHIFT), s1 = s0 + HK_SLAB_SIZE;
    if (s1 > carved_end) break;
    if (p->lent >> k & 1) continue;
    uint32_t first = (uint32_t)((s0 - start) / bs), last = (uint32_t)((s1 - 1 - start) / bs);
    over[k] = (last - first >= 63 ? ~(uint64_t)0 : (((uint64_t)1 << (last - first + 1)) - 1)) << first;
    if ((free_blocks & over[k]) == over[k]) lendable |= 1u << k;
  }
  /* runs of two slabs or more only: a lone slab serves only a span of one,
   * and kept committed for nothing it raised fragmentation's peak RSS;
   * its free blocks are purged inside instead */
  unsigned lend = lendable & ((lendable << 1) | (lendable >> 1));
  if (lend == 0) return;
  uint64_t dropped = 0;
  for (unsigned m = lend; m != 0; m &= m - 1) dropped |= over[__builtin_ctz(m)];
  /* the free list without the dropped blocks, in its order */
  hk_block *keep[64];
  uint32_t kept = 0;
  for (hk_block *b = p->free, *next; !hk_list_end(b); b = next) {
    next = hk_link_next(b, key);
    uint32_t j = (uint32_t)(((uintptr_t)b - start) / bs);
    if (!(dropped >> j & 1)) {
      keep[kept++] = b;
      continue;
    }
    /* A block reaches into two slabs at most, one of them lent: the part
     * in the other is the page's still, and is given back here as a free
     * block's inside would be (it is on no list now to be purged later). */
    unsigned all = lend | p->lent;
    uintptr_t b0 = (uintptr_t)b, b1 = b0 + bs;
    uintptr_t second = span + ((((b1 - 1) - span) >> HK_SLAB_SHIFT) << HK_SLAB_SHIFT);
    bool lent0 = all >> ((b0 - span) >> HK_SLAB_SHIFT) & 1, lent1 = all >> ((second - span) >> HK_SLAB_SHIFT) & 1;
    uintptr_t lo = b1, hi = b1;
    if (!lent0) {
      b->link = hk_foreign_tag(p);
      lo = b0 + 2 * sizeof(uintptr_t); /* (its first OS page stays: the tag) */
      hi = second;
    } else if (!lent1) {
      lo = second;
    }
    lo = (lo + HK_OS_PAGE - 1) & ~(uintptr_t)(HK_OS_PAGE - 1);
    hi &= ~(uintptr_t)(HK_OS_PAGE - 1);
    if (hi > lo) hk_os_purge((void *)lo, hi - lo);
  }
  hk_block *list = (hk_block *)hk_region_base(p); /* the empty list */
  for (uint32_t k = kept; k-- > 0;) {
    hk_link_set(keep[k], list, key);
    list = keep[k];
  }
  p->free = list;
  __atomic_store_n(&p->lent, (uint16_t)(p->lent | lend), __ATOMIC_RELAXED); /* (try_reclaim reads it) */
  hk_region_lend_slabs(p, lend);
  hk_stat_add(slabs_lent, (unsigned)__builtin_popcount(lend));
}

/* At most once per purge delay, or at once when the program has grown
 * (hk_growth_epoch moved: region.c), or with force. The growth trigger
 * makes a program that frees most of its medium blocks and then allocates
 * other sizes give the free blocks' memory back before its RSS grows far
 * (fragmentation: peak RSS / live was 1.33 or 1.62 depending on where the
 * phases fell against the clock; 1.69 without the trigger); a loop whose
 * live spans stay level does not trigger it. In hardened mode 2, where a
 * free block stays zero but for its link (no purge mark), with force only
 * (malloc_trim). */
static void purge_blocks(hk_heap *h, bool force) {
  uint32_t epoch = atomic_load_explicit(&hk_growth_epoch, memory_order_relaxed);
  uint64_t now = hk_os_now_ms();
  bool timed = force || now >= h->block_purge_ms;
  if (!timed && h->growth_epoch == epoch) return;
  if (timed) h->block_purge_ms = now + (uint64_t)hk_opt.purge_delay_ms;
  h->growth_epoch = epoch;
  uint32_t pass = h->purge_passes++;
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    if (hk_class_slabs[c] < 2) continue; /* (classes below 8 KiB: pages of one slab) */
    /* growth elsewhere: only classes that searched no page since the last
     * pass (a class in use would fault its blocks straight back in), and
     * only blocks smaller than a slab (pages of several blocks) */
    if (!timed && (h->class_searched[c] == pass || hk_class_size[c] >= HK_SLAB_SIZE)) continue;
    /* A class that searched no page since the last pass lends its pages'
     * free slabs first (then the region's purge gives back those that no
     * span takes). On a timed pass, so do the pages of a class in use but
     * its current page, if its blocks are smaller than a slab: purged
     * here, their free blocks were lent by the pass after the class went
     * idle, already given back, and the spans that took them faulted them
     * in again (fragmentation, with a timed pass early in its refill phase:
     * 36.4-37.5k page faults in that phase instead of 27.0-28.9k; realloc_growth,
     * mid_large_mt and thread_churn lend nothing more and kept their
     * speed; 2026-11-26). Blocks of a slab or more are left alone: with
     * random 64 KiB-1 MiB blocks in use (big_mixed), lending their pages'
     * free slabs cost 5 % more page faults. */
    bool small = hk_class_size[c] < HK_SLAB_SIZE;
    bool idle = h->class_searched[c] != pass, purge = hk_class_size[c] >= HK_PURGE_BLOCK_MIN && (force || !hk_secure_zero);
    for (hk_page *p = h->queues[c].first; p != NULL; p = p->next) {
      trim_tail(p);
      if (idle || (timed && small && p != h->queues[c].first)) lend_free_slabs(p);
      if (purge) purge_free_blocks(p);
    }
  }
  if (timed)
    for (hk_page *p = h->full; p != NULL; p = p->next) trim_tail(p); /* a page of one block is full */
}

/* Whether purge_blocks(h, false) may have work: the program grew, or this
 * is every 8th call (the clock is read then only, as region.c's due_purge). */
HK_INLINE bool purge_blocks_due(hk_heap *h) {
  return h->growth_epoch != atomic_load_explicit(&hk_growth_epoch, memory_order_relaxed) ||
         (++h->purge_calls % 8) == 0 || hk_opt.purge_delay_ms == 0;
}

/* ---- the malloc slow path ---- */

/* A new page of class cls: a spare span of the right length, else one from
 * the regions. With room (a span block that may grow, see below), always
 * from the regions, placed with that many free slabs after it: spares have
 * no room after them (tried: realloc_growth peak RSS 23.0 -> 23.6 MiB). */
static hk_page *fresh_page(hk_heap *h, unsigned cls, unsigned nslabs, unsigned room) {
  hk_page *page = room ? NULL : take_spare(h, cls, nslabs);
  /* the colour slab (sizeclass.c) of a span last used otherwise may hold
   * committed memory that the block will not use: the heap's next pass over
   * its medium pages (purge_blocks) gives it back (a spare of the same class
   * has touched one OS page of it at most). At once, here, it cost a
   * madvise per page taken: with random 64-256 KiB blocks, 32 live, a third
   * of hakmem's time (5.5 -> 16.8 Mops/s with the other purges as they were). */
  bool tail_dirty = page != NULL && page->cls != cls;
  if (page == NULL) {
    hk_slabmask dirty = 0;
    page = hk_region_alloc_span(nslabs, cls, &dirty, room, h->region_list);
    if (page == NULL) { /* out of memory: the spares and caches first (not this heap's queued pages: find_page is at them) */
      hk_release_for_retry(HK_REGION_SIZE);
      page = hk_region_alloc_span(nslabs, cls, &dirty, room, h->region_list);
    }
    tail_dirty = (dirty >> (nslabs - 1)) & 1;
  }
  if (page == NULL) return NULL;
  hk_page_init(page, cls);
  page->untrimmed = tail_dirty && hk_color_slabs(cls, nslabs);
  atomic_store_explicit(&page->heap, hk_owner_tag(h), memory_order_release);
  h->stats.pages_acquired++;
  /* Every so often look at all parked pages: a hint can be lost when a page
   * is abandoned and re-adopted while a remote free is in flight. */
  if ((++h->fresh_count & 63) == 0) atomic_store_explicit(&h->remote_hint, 1, memory_order_relaxed);
  return page;
}

static hk_page *make_current(hk_heap *h, unsigned cls, hk_page *p) {
  unhold(h, p);
  hk_page_queue *q = &h->queues[cls];
  if (p != q->first) {
    uncurrent(q->first);
    queue_remove(q, p);
    queue_push_front(q, p);
  }
  set_current(h, cls);
  return p;
}

/* Find a page of class cls with a free block and make it current. Memory
 * already handed out comes first: blocks freed into any page of the queue
 * (locally or remotely), then pages of exited threads; only then are new
 * blocks carved, and a new page taken last. */
static hk_page *find_page(hk_heap *h, unsigned cls) {
  /* the clock every 16th search only: 1.4 % of mid_large_mt's time when
   * read on each; an owner idle for HK_IDLE_OWNER_MS by this measure makes
   * fewer than 1600 page searches a second */
  if ((++h->searches & 15) == 0) hk_heap_note_active(h);
  h->class_searched[cls] = h->purge_passes;
  if (atomic_load_explicit(&h->remote_hint, memory_order_acquire)) rescue_full(h);
  hk_page_queue *q = &h->queues[cls];
  hk_page *carvable = NULL;
  for (int attempt = 0; attempt < 4; attempt++) {
    hk_page *next;
    for (hk_page *p = q->first; p != NULL; p = next) {
      next = p->next;
      if (hk_list_end(p->free) && (atomic_load_explicit(&p->remote, memory_order_relaxed) & ~HK_REMOTE_STATE_MASK))
        hk_page_collect(p, HK_PAGE_NORMAL);
      if (!hk_list_end(p->free)) return make_current(h, cls, p);
      if (p->capacity < p->reserved) {
        if (carvable == NULL) carvable = p;
        continue;
      }
      if (!park_full(h, p)) hk_page_collect(p, HK_PAGE_NORMAL), next = p; /* retry it */
    }
    hk_page *p = adopt(h, cls);
    if (p == NULL) break;
    uncurrent(q->first);
    queue_push_front(q, p);
  }
  if (carvable != NULL && hk_page_extend(carvable)) return make_current(h, cls, carvable);
  /* about to take a new span: first give back the inside of free blocks
   * (both calls made only when due: with one block a page, as for 64 KiB
   * and more, this runs on nearly every malloc) */
  if (purge_blocks_due(h)) purge_blocks(h, false);
  if (atomic_load_explicit(&hk_abandoned_hint, memory_order_relaxed)) hk_abandoned_sweep(false, false);
  hk_page *p = fresh_page(h, cls, hk_class_slabs[cls], 0);
  if (p == NULL) {
    set_current(h, cls);
    hk_purger_poke();
    return NULL;
  }
  uncurrent(q->first);
  queue_push_front(q, p);
  hk_page_extend(p);
  set_current(h, cls);
  return p;
}

/* A block of class cls for a request of `size` bytes, from the pages. */
static void *alloc_from_pages(hk_heap *h, size_t size, unsigned cls) {
  hk_page *page = h->queues[cls].first;
  if (page == NULL || hk_list_end(page->free)) page = find_page(h, cls);
  if (page == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  hk_block *b = page->free;
  page->free = hk_link_next(b, page->free_key);
  b->link = 0;
  page->used++;
  if (hk_secure) hk_secure_on_alloc(page, b, size);
  hk_purger_poke();
  return b;
}

/* ---- threads that allocate after their heap is gone ----
 * A thread-specific-data destructor that runs after hakmem's (glibc calls
 * them in up to PTHREAD_DESTRUCTOR_ITERATIONS rounds, in key order) may
 * still allocate. A heap of its own, made then, was never abandoned when
 * that happened in the last round: 40,000 such threads leaked 468 MiB
 * (glibc: none). Such threads share one heap instead, under a lock; its
 * blocks are freed as any other heap's, remotely when by another thread.
 * A thread whose first allocation is in the last round still gets a heap
 * of its own (nothing tells that round apart), which its thread never
 * abandons: the reaper does (hk_heap_reap). */
static pthread_mutex_t late_lock = PTHREAD_MUTEX_INITIALIZER;
static hk_heap *late_heap; /* late_lock */

static void *alloc_late(size_t size, unsigned cls) {
  hk_lock(&late_lock);
  if (late_heap == NULL && (late_heap = heap_new()) != NULL)
    atomic_store_explicit(&late_heap->tid, 0, memory_order_relaxed); /* no thread of its own: never reaped */
  void *p = late_heap != NULL ? alloc_from_pages(late_heap, size, cls) : NULL;
  hk_unlock(&late_lock);
  if (p == NULL) errno = ENOMEM;
  return p;
}

/* From the fast path (the class is computed here: the lookup table is empty
 * before initialisation). */
void *hk_malloc_slow(size_t size, hk_heap *h) {
  /* hardened: the class must also hold the canary and the trailer */
  size_t need = hk_secure ? size + HK_SECURE_EXTRA : size;
  if (h == &hk_heap_empty) {
    h = hk_heap_get();
    if (h == NULL && heap_gone) {
      unsigned cls = need <= HK_MEDIUM_MAX && need >= size ? hk_size_class(need) : HK_NSIZES;
      return cls >= HK_NSIZES ? hk_large_alloc(size, 16, false) : alloc_late(size, cls);
    }
    if (h == NULL) {
      errno = ENOMEM;
      return NULL;
    }
  }
  unsigned cls = need <= HK_MEDIUM_MAX && need >= size ? hk_size_class(need) : HK_NSIZES;
  if (cls >= HK_NSIZES || (HK_UNLIKELY(atomic_load_explicit(&hk_space_tight, memory_order_relaxed)) &&
                           need >= HK_TIGHT_LARGE_MIN))
    return hk_large_alloc(size, 16, false);
  return alloc_from_pages(h, size, cls);
}

/* Explicit class (aligned allocation): hk_init has run. */
void *hk_alloc_class(size_t size, unsigned cls) {
  hk_heap *h = hk_heap_get();
  if (h == NULL && heap_gone) return alloc_late(size, cls);
  if (h == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  return alloc_from_pages(h, size, cls);
}

/* ---- blocks alone in their span: resizable in place ----
 * The classes whose block size is a whole number of slabs (64, 128, 192 KiB
 * ... 1 MiB) have one block per page, and such a page is a span of n
 * slabs holding one block of n * 64 KiB, plus one slab for its colour
 * (sizeclass.c; not 1 MiB, nor a span block made by realloc, below).
 * realloc can therefore resize it where it is: take the free slabs that
 * follow it in its region, or give back its tail, and the page becomes a
 * page of the class of its new length, coloured if it was. Copying a
 * buffer that grows step by step through the medium sizes was the bulk of
 * realloc's cost (realloc_growth: 1.3 GB copied in 120 rounds, memmove
 * 26 % of the time). */
bool hk_span_block(const hk_page *page) {
  return page->reserved == 1 &&
         page->block_size + (hk_color_slabs(page->cls, page->nslabs) << HK_SLAB_SHIFT) == span_bytes(page);
}

static void span_block_sized(hk_page *page, unsigned color_slabs) {
  uint32_t bs = span_bytes(page) - (color_slabs << HK_SLAB_SHIFT);
  page->cls = (uint8_t)hk_size_class(bs);
  page->block_size = bs;
  page->div_magic = hk_div_magic(bs);
  hk_page_set_carved(page);
}

/* Resize h's span block `page` (its block live) to hold size bytes
 * (HK_SLAB_SIZE / 2 < size <= HK_MEDIUM_MAX); false if the slabs after it
 * are taken. The page must be parked on the full list first: its class,
 * which indexes the queue it would be in, changes. */
bool hk_heap_resize_span_block(hk_heap *h, hk_page *page, size_t size) {
  unsigned color = hk_color_slabs(page->cls, page->nslabs);
  unsigned n = (unsigned)((size + HK_SLAB_SIZE - 1) >> HK_SLAB_SHIFT);
  /* a coloured block stays coloured: its new class must be one */
  if (color && hk_class_colored[hk_size_class((size_t)n << HK_SLAB_SHIFT)] != HK_COLORED_SLAB) return false;
  n += color;
  if (n == page->nslabs) return true;
  if (!hk_page_parked(page)) {
    unsigned cls = page->cls;
    bool was_current = h->queues[cls].first == page;
    if (!hk_list_end(page->free) || !park_full(h, page)) return false;
    if (was_current) set_current(h, cls);
  }
  if (n > page->nslabs) {
    if (!hk_region_grow_span(page, n)) return false;
  } else {
    hk_region_shrink_span(page, n);
  }
  span_block_sized(page, color);
  return true;
}

/* A new span block of at least size bytes, placed where it has as many
 * free slabs after it as it takes (up to the largest span), so that it can
 * grow in place. */
void *hk_heap_alloc_span_block(hk_heap *h, size_t size) {
  unsigned n = (unsigned)((size + HK_SLAB_SIZE - 1) >> HK_SLAB_SHIFT);
  /* n * 64 KiB is a class size that fills n slabs (sizeclass.c; its own
   * pages have a colour slab more, which a span block does without) */
  unsigned cls = hk_size_class((size_t)n << HK_SLAB_SHIFT);
  unsigned room = n < HK_MAX_SPAN_SLABS - n ? n : HK_MAX_SPAN_SLABS - n;
  hk_page *page = fresh_page(h, cls, n, room);
  if (page == NULL) return NULL;
  hk_page_extend(page);
  hk_block *b = page->free;
  page->free = hk_link_next(b, page->free_key);
  b->link = 0;
  page->used++;
  /* no other thread knows the page yet: park it directly */
  hk_page_park_note(page, 1);
  atomic_store_explicit(&page->remote, HK_PAGE_FULL, memory_order_relaxed);
  full_push(h, page);
  return b;
}

/* Collect remote frees and give back empty pages (malloc_trim, thread exit). */
void hk_heap_collect(hk_heap *h, bool release_all) {
  hk_cache_flush_all(h);
  rescue_full(h);
  purge_blocks(h, true);
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    hk_page *next;
    for (hk_page *p = h->queues[c].first; p != NULL; p = next) {
      next = p->next;
      hk_page_collect(p, HK_PAGE_NORMAL);
      if (hk_page_used(p) == 0 && (release_all || p != h->queues[c].first)) {
        queue_remove(&h->queues[c], p);
        release_page(h, p);
      }
    }
    set_current(h, c);
  }
  if (release_all) release_spares(h);
}

/* ---- heaps whose thread is gone ----
 * A heap made by a thread's first allocation in glibc's last round of
 * thread-specific-data destructors (see alloc_late) is never abandoned by
 * its thread: its pages stayed owned by a heap nothing runs (thread_done's
 * work, never done). (In a child after fork() the parent's other threads'
 * heaps have no thread either, but are never reaped: hk_heap_fork_child.)
 * At most every half purge delay, from the purger and when a thread makes
 * its heap, the reaper asks the
 * kernel (tgkill with signal 0: no signal is sent) whether the thread of
 * each live heap idle for a half delay still exists, each heap at most once
 * every ten delays, and abandons the heaps whose thread is gone: no code of
 * that thread can run any more, so nothing else touches them. */
void hk_heap_reap(void) {
  uint64_t now = hk_os_now_ms(), half = (uint64_t)hk_opt.purge_delay_ms / 2 + 1;
  uint64_t every = 10 * (uint64_t)hk_opt.purge_delay_ms + 1;
  static _Atomic uint64_t next_ms;
  uint64_t next = atomic_load_explicit(&next_ms, memory_order_relaxed);
  if (now < next || !atomic_compare_exchange_strong(&next_ms, &next, now + half)) return;
  hk_heap *dead = NULL;
  int pid = hk_os_pid();
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = all_heaps; h != NULL; h = h->all_next) {
    /* live first: its acquire makes the tid of that same ownership visible
     * (heap_new stores tid before live); and the CAS below expects that
     * ownership's number, so a heap given up and taken by another thread
     * meanwhile (live 0, then another number) is left alone */
    uint32_t owner = atomic_load_explicit(&h->live, memory_order_acquire);
    int tid = atomic_load_explicit(&h->tid, memory_order_relaxed);
    /* a heap made before a fork is the forking thread's (its tid is
     * the parent's: without fork handlers, a process forked while it had
     * one thread, init.c) or a thread's that the child does not have */
    if (owner == 0 || tid == 0 || atomic_load_explicit(&h->pid, memory_order_relaxed) != pid ||
        now < atomic_load_explicit(&h->active_ms, memory_order_relaxed) + half ||
        now < atomic_load_explicit(&h->reap_checked_ms, memory_order_relaxed) + every)
      continue;
    atomic_store_explicit(&h->reap_checked_ms, now, memory_order_relaxed);
    if (hk_os_thread_gone(tid, pid) && atomic_compare_exchange_strong(&h->live, &owner, 0)) {
      h->pool_next = dead; /* (not in the pool: a live heap) */
      dead = h;
    }
  }
  hk_unlock(&hk_heap_lock);
  while (dead != NULL) {
    hk_heap *h = dead;
    dead = h->pool_next;
    heap_abandon(h);
    hk_stat_add(heaps_reaped, 1);
  }
}

/* ---- fork: keep every lock consistent in the child ---- */
void hk_heap_fork_lock(void) {
  hk_lock(&late_lock);
  hk_lock(&hk_heap_lock);
  for (unsigned c = 0; c < HK_NCLASSES; c++) hk_lock(abandoned_lock(c));
}
/* In the child (hk_heap_lock held): the forking thread has a new kernel
 * id; the parent's other threads are gone, but their heaps are left as
 * they are, never reaped: such a thread may have been in the middle of a
 * malloc or free, its lists half changed, when the parent forked. */
void hk_heap_fork_child(void) {
  hk_heap *self = hk_tls_heap;
  for (hk_heap *h = all_heaps; h != NULL; h = h->all_next)
    if (h != self) atomic_store_explicit(&h->tid, 0, memory_order_relaxed);
  if (self != &hk_heap_empty) {
    atomic_store_explicit(&self->pid, hk_os_pid(), memory_order_relaxed);
    atomic_store_explicit(&self->tid, hk_os_tid(), memory_order_relaxed);
  }
}

void hk_heap_fork_unlock(void) {
  for (unsigned c = 0; c < HK_NCLASSES; c++) hk_unlock(abandoned_lock(c));
  hk_unlock(&hk_heap_lock);
  hk_unlock(&late_lock);
}
