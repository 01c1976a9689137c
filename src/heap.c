/* Heaps' life cycle: made, abandoned, reaped, and kept consistent across
 * fork(). A thread starts on hk_heap_empty (whose pages have no free
 * blocks, so its first malloc lands in hk_malloc_slow and makes a real
 * heap, thread.c). When the thread exits, the heap's pages, empty or not,
 * are abandoned to a list per class (abandoned.c), from which other threads
 * adopt them. Heap structures are recycled through a pool and never
 * unmapped, so a remote freer holding a stale owner pointer can still write
 * its hint safely. */
#include "internal.h"

#include <errno.h>
#include <string.h>

static hk_heap *heap_pool;                 /* recycled heaps (hk_heap_lock) */
static hk_heap *sample_pool;               /* sample heaps of exited threads (hk_heap_lock, profile.c) */
static char *heap_chunk, *heap_chunk_end;  /* bump area for new heaps (hk_heap_lock) */
static uint32_t heaps_carved;              /* hk_heap_lock */

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
    heap_chunk = hk_os_map_aligned(HEAP_CHUNK_BYTES, hk_os_page);
    heap_chunk_end = heap_chunk ? heap_chunk + HEAP_CHUNK_BYTES : NULL;
    if (heap_chunk == NULL) return NULL;
  }
  h = (hk_heap *)heap_chunk;
  heap_chunk += (sizeof(hk_heap) + 63) & ~(size_t)63;
  pthread_mutex_init(&h->spare_lock, NULL);
  memset(h->spare, 0, sizeof h->spare);
  h->spare_bytes = 0;
  h->all_next = hk_all_heaps;
  hk_all_heaps = h;
  h->region_list = heaps_carved++;
  return h;
}

/* Does a pooled sample heap still hold sampled blocks? (Its frees go
 * straight back to its pages: it stashes and caches none.) */
static bool holds_samples(const hk_heap *h) {
  for (unsigned c = 0; c <= HK_NCLASSES; c++)
    for (const hk_page *p = c < HK_NCLASSES ? h->queues[c].first : h->full.first; p != NULL; p = p->next) {
      uintptr_t remote = hk_load_acquire(&((hk_page *)p)->remote);
      if ((remote & HK_REMOTE_STATE_MASK) != HK_PAGE_RECLAIMED &&
          hk_page_used(p) != (uint32_t)(remote >> HK_REMOTE_COUNT_SHIFT))
        return true;
    }
  return false;
}

/* How many pooled sample heaps a thread looks through for one without
 * samples (HAKMEM_THREAD_STATS) before it takes the first. */
#define SAMPLE_POOL_LOOK 8

/* A sample heap for the calling thread (profile.c): one an exited thread
 * left, or a new one, which no thread owns (tid 0: never reaped). With
 * HAKMEM_THREAD_STATS, one whose samples have all been freed if one of the
 * first few is: a sample heap's live blocks count to the thread that uses
 * it (inspect.c); else the first, marked inherited, so that the pool does
 * not grow with the threads run (see abandoned.c, USED_WAITING_MAX). */
hk_heap *hk_sample_heap_take(void) {
  hk_lock(&hk_heap_lock);
  hk_heap **at = &sample_pool;
  bool inherited = false;
  for (unsigned n = 0; hk_thread_stats && *at != NULL && holds_samples(*at); n++) {
    if (n + 1 == SAMPLE_POOL_LOOK) {
      at = &sample_pool;
      inherited = true;
      break;
    }
    at = &(*at)->pool_next;
  }
  hk_heap *h = *at;
  if (h != NULL) {
    *at = h->pool_next;
    h->inherited = inherited;
  }
  hk_unlock(&hk_heap_lock);
  if (h != NULL) return h;
  h = hk_heap_new(false);
  if (h == NULL) return NULL;
  __atomic_store_n(&h->kind, HK_HEAP_SAMPLES, __ATOMIC_RELAXED); /* (read by freers: hk_owner_kind) */
  hk_stat_add(sample_heaps, 1);
  return h;
}

/* A heap set up empty; for_thread: the calling thread's (false: no
 * thread's, tid 0: never reaped). */
hk_heap *hk_heap_new(bool for_thread) {
  hk_lock(&hk_heap_lock);
  hk_heap *h = heap_carve();
  hk_unlock(&hk_heap_lock);
  if (h == NULL) return NULL;
  /* (the purger may be reading a reused heap's stash: under its lock) */
  bool locked = hk_spin_lock(&h->stash_lock);
  /* (not active_ms, which a freer holding a stale owner may read meanwhile:
   * set below, with the rest of its line) */
  memset(h, 0, offsetof(hk_heap, active_ms));
  if (locked) hk_spin_unlock(&h->stash_lock);
  h->held_bytes = 0;
  memset(h->held, 0, sizeof h->held);
  for (unsigned c = 0; c < HK_NCLASSES; c++) hk_heap_set_direct(h, c, &hk_page_empty);
  hk_store_relaxed(&h->remote_hint, 0);
  __atomic_store_n(&h->kind, HK_HEAP_THREAD, __ATOMIC_RELAXED); /* (read by freers: hk_owner_kind) */
  h->fresh_count = 0;
  h->searches = 0;
  hk_store_relaxed(&h->active_ms, hk_os_now_ms());
  memset(h->queues, 0, sizeof h->queues);
  memset(h->cache_first, 0, sizeof h->cache_first);
  for (unsigned c = 0; c < HK_NCLASSES; c++) h->cache_room[c] = hk_class_cache_max[c];
  h->cache_bytes = 0;
  h->free_owner = hk_secure ? HK_NO_OWNER(h) : h; /* hardened: malloc goes to hk_malloc_cached (hk_tls_arm) */
  h->full.first = h->full.last = NULL;
  h->block_purge_ms = hk_os_now_ms() + (uint64_t)hk_opt.purge_delay_ms; /* its first timed pass (lend.c) */
  h->purge_passes = 1; /* class_searched[] (0) then matches no pass */
  memset(h->class_searched, 0, sizeof h->class_searched);
  h->growth_epoch = hk_load_relaxed(&hk_growth_epoch);
  memset(h->grown, 0, sizeof h->grown);
  h->grown_next = 0;
  h->pool_next = NULL;
  memset(&h->stats, 0, sizeof h->stats);
  uint32_t owner = (uint32_t)hk_stat_add(heaps_created, 1) + 1; /* this ownership's own number */
  hk_derive_list_keys((uint64_t)(uintptr_t)h, owner, &h->list_add, &h->list_mul, &h->list_inv);
  h->quarantine_rng = hk_derive_key((uint64_t)(uintptr_t)h->quarantine, owner);
  hk_store_relaxed(&h->pid, for_thread ? hk_os_pid() : 0);
  hk_store_relaxed(&h->tid, for_thread ? hk_os_tid() : 0);
  hk_store_relaxed(&h->reap_checked_ms, 0);
  hk_store_release(&h->live, owner ? owner : 1); /* after tid: see hk_heap_reap */
  return h;
}
void hk_heap_abandon(hk_heap *h) {
  hk_secure_quarantine_flush(h);
  hk_cache_flush_all(h);
  hk_heap_stash_flush(h);
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    hk_page *p;
    while ((p = h->queues[c].first) != NULL) {
      hk_list_remove(&h->queues[c], p);
      hk_abandon_page(p);
    }
    hk_heap_set_direct(h, c, &hk_page_empty);
  }
  hk_page *p;
  while ((p = h->full.first) != NULL) {
    hk_heap_full_remove(h, p);
    hk_abandon_page(p);
  }
  /* spares too, as empty pages of the class they served last: a thread
   * that starts next adopts them with their memory where its classes carve,
   * instead of spreading new spans */
  pthread_mutex_lock(&h->spare_lock);
  p = hk_spares_detach(h, UINT64_MAX, 0);
  pthread_mutex_unlock(&h->spare_lock);
  while (p != NULL) {
    hk_page *next = p->next;
    hk_abandon_page(p);
    p = next;
  }
  h->held_bytes = 0;
  memset(h->held, 0, sizeof h->held);
  hk_stats_merge_heap(&h->stats);
  hk_stat_add(threads_exited, 1);
  hk_lock(&hk_heap_lock);
  /* the thread's sample heap, whole, with its pages and their live
   * samples, for the next thread that samples */
  if (h->sample_heap != NULL) {
    h->sample_heap->pool_next = sample_pool;
    sample_pool = h->sample_heap;
    h->sample_heap = NULL;
  }
  h->pool_next = heap_pool;
  heap_pool = h;
  hk_unlock(&hk_heap_lock);
}

/* ---- heaps the program makes (user_heap.c) ----
 * Listed while they live, so that fork() takes their locks: a thread may
 * be inside hak_heap_malloc when another forks, and the child must find
 * every heap usable. */
static pthread_mutex_t user_heaps_lock = PTHREAD_MUTEX_INITIALIZER;
static hk_heap *user_heaps; /* user_heaps_lock */

hk_heap *hk_heap_new_user(const char *name) {
  hk_heap *h = hk_heap_new(false);
  if (h == NULL) return NULL;
  size_t n = name != NULL ? strlen(name) : 0;
  memcpy(h->user_name, name != NULL ? name : "", n);
  h->user_name[n] = 0;
  hk_store_relaxed(&h->user_lock, 0);
  h->large_first = NULL;
  hk_store_relaxed(&h->visitor, (pthread_t)0);
  __atomic_store_n(&h->kind, HK_HEAP_USER, __ATOMIC_RELAXED); /* (read by freers: hk_owner_kind) */
  hk_stat_add(user_heaps, 1);
  hk_lock(&user_heaps_lock);
  h->user_prev = NULL;
  h->user_next = user_heaps;
  if (user_heaps != NULL) user_heaps->user_prev = h;
  user_heaps = h;
  hk_unlock(&user_heaps_lock);
  return h;
}

/* The live user heap labelled `name`, or NULL. */
hk_heap *hk_heap_find_user(const char *name) {
  hk_lock(&user_heaps_lock);
  hk_heap *h = user_heaps;
  while (h != NULL && strcmp(h->user_name, name) != 0) h = h->user_next;
  hk_unlock(&user_heaps_lock);
  return h;
}

/* Up to max of the live user heaps that have a label, into out; how many. */
size_t hk_heap_labelled(hk_heap **out, size_t max) {
  size_t n = 0;
  hk_lock(&user_heaps_lock);
  for (hk_heap *h = user_heaps; h != NULL && n < max; h = h->user_next)
    if (h->user_name[0] != 0) out[n++] = h;
  hk_unlock(&user_heaps_lock);
  return n;
}

/* malloc_trim: the empty pages and spans of the program's heaps back to
 * the regions too, from each heap whose lock is free now (another thread
 * may hold one while it waits for a lock that this caller holds). */
void hk_heap_trim_users(void) {
  hk_lock(&user_heaps_lock);
  for (hk_heap *h = user_heaps; h != NULL; h = h->user_next) {
    if (!hk_spin_trylock(&h->user_lock)) continue;
    hk_heap_collect(h, true);
    hk_spin_unlock(&h->user_lock);
  }
  hk_unlock(&user_heaps_lock);
}

/* A heap the program destroyed, its pages given back: its counters kept,
 * the structure back to the pool. */
void hk_heap_recycle_user(hk_heap *h) {
  hk_lock(&user_heaps_lock);
  if (h->user_prev != NULL) h->user_prev->user_next = h->user_next;
  else user_heaps = h->user_next;
  if (h->user_next != NULL) h->user_next->user_prev = h->user_prev;
  hk_unlock(&user_heaps_lock);
  hk_stats_merge_heap(&h->stats);
  hk_lock(&hk_heap_lock);
  h->pool_next = heap_pool;
  heap_pool = h;
  hk_unlock(&hk_heap_lock);
}

/* fork: before every other allocator lock (a heap's lock is held around
 * calls that take the others), released after them */
void hk_heap_fork_lock_users(void) {
  hk_lock(&user_heaps_lock);
  for (hk_heap *h = user_heaps; h != NULL; h = h->user_next) hk_spin_lock(&h->user_lock);
}

void hk_heap_fork_unlock_users(void) {
  for (hk_heap *h = user_heaps; h != NULL; h = h->user_next) hk_spin_unlock(&h->user_lock);
  hk_unlock(&user_heaps_lock);
}

/* ---- threads that allocate after their heap is gone ----
 * A thread-specific-data destructor that runs after hakmem's (glibc calls
 * them in up to PTHREAD_DESTRUCTOR_ITERATIONS rounds, in key order) may
 * still allocate. A heap of its own, made then, would never be abandoned
 * if that happens in the last round, and every such thread would leak its
 * pages. Such threads share one heap instead, under a lock; its
 * blocks are freed as any other heap's, remotely when by another thread.
 * A thread whose first allocation is in the last round still gets a heap
 * of its own (nothing tells that round apart), which its thread never
 * abandons: the reaper does (hk_heap_reap). */
static pthread_mutex_t late_lock = PTHREAD_MUTEX_INITIALIZER;
static hk_heap *late_heap; /* late_lock */

void *hk_heap_alloc_late(size_t size, unsigned cls) {
  hk_lock(&late_lock);
  if (late_heap == NULL) late_heap = hk_heap_new(false);
  void *p = late_heap != NULL ? hk_heap_alloc(late_heap, size, cls) : NULL;
  hk_unlock(&late_lock);
  hk_purger_poke(); /* after the lock: starting the purger may call malloc */
  if (p == NULL) errno = ENOMEM;
  return p;
}

/* Collect remote frees and give back empty pages (malloc_trim). */
void hk_heap_collect(hk_heap *h, bool release_all) {
  hk_secure_quarantine_flush(h);
  hk_cache_flush_all(h);
  hk_heap_stash_flush(h);
  hk_heap_rescue_full(h);
  hk_heap_purge_blocks(h, true);
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    hk_page *next;
    for (hk_page *p = h->queues[c].first; p != NULL; p = next) {
      next = p->next;
      hk_page_collect(p, HK_PAGE_NORMAL);
      if (hk_page_used(p) == 0 && (release_all || p != h->queues[c].first)) {
        hk_list_remove(&h->queues[c], p);
        hk_heap_release_page(h, p);
      }
    }
    hk_heap_set_current(h, c);
  }
  if (release_all) {
    pthread_mutex_lock(&h->spare_lock);
    hk_page *p = hk_spares_detach(h, UINT64_MAX, 0);
    pthread_mutex_unlock(&h->spare_lock);
    while (p != NULL) {
      hk_page *next = p->next;
      hk_heap_release_page(h, p);
      p = next;
    }
  }
}

/* ---- heaps whose thread is gone ----
 * A heap made by a thread's first allocation in glibc's last round of
 * thread-specific-data destructors (see hk_heap_alloc_late) is never abandoned by
 * its thread: its pages stay owned by a heap nothing runs (thread.c's
 * thread_done never runs for it). (In a child after fork() the parent's other threads'
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
  uint64_t next = hk_load_relaxed(&next_ms);
  if (now < next || !atomic_compare_exchange_strong(&next_ms, &next, now + half)) return;
  hk_heap *dead = NULL;
  int pid = hk_os_pid();
  hk_lock(&hk_heap_lock);
  for (hk_heap *h = hk_all_heaps; h != NULL; h = h->all_next) {
    /* live first: its acquire makes the tid of that same ownership visible
     * (hk_heap_new stores tid before live); and the CAS below expects that
     * ownership's number, so a heap given up and taken by another thread
     * meanwhile (live 0, then another number) is left alone */
    uint32_t owner = hk_load_acquire(&h->live);
    int tid = hk_load_relaxed(&h->tid);
    /* a heap made before a fork is the forking thread's (its tid is
     * the parent's: without fork handlers, a process forked while it had
     * one thread, init.c) or a thread's that the child does not have */
    if (owner == 0 || tid == 0 || hk_load_relaxed(&h->pid) != pid ||
        now < hk_load_relaxed(&h->active_ms) + half ||
        now < hk_load_relaxed(&h->reap_checked_ms) + every)
      continue;
    hk_store_relaxed(&h->reap_checked_ms, now);
    if (hk_os_thread_gone(tid, pid) && atomic_compare_exchange_strong(&h->live, &owner, 0)) {
      h->pool_next = dead; /* (not in the pool: a live heap) */
      dead = h;
    }
  }
  hk_unlock(&hk_heap_lock);
  while (dead != NULL) {
    hk_heap *h = dead;
    dead = h->pool_next;
    hk_heap_abandon(h);
    hk_stat_add(heaps_reaped, 1);
  }
}

/* ---- fork: keep every lock consistent in the child ---- */
void hk_heap_fork_lock(void) {
  hk_lock(&late_lock);
  hk_lock(&hk_heap_lock);
  hk_abandoned_fork_lock();
}
/* In the child (hk_heap_lock held): the forking thread has a new kernel
 * id; the parent's other threads are gone, but their heaps are left as
 * they are, never reaped: such a thread may have been in the middle of a
 * malloc or free, its lists half changed, when the parent forked. */
void hk_heap_fork_child(void) {
  hk_heap *self = hk_tls_heap;
  for (hk_heap *h = hk_all_heaps; h != NULL; h = h->all_next)
    if (h != self) hk_store_relaxed(&h->tid, 0);
  if (self != &hk_heap_empty) {
    hk_store_relaxed(&self->pid, hk_os_pid());
    hk_store_relaxed(&self->tid, hk_os_tid());
  }
}

void hk_heap_fork_unlock(void) {
  hk_abandoned_fork_unlock();
  hk_unlock(&hk_heap_lock);
  hk_unlock(&late_lock);
}
