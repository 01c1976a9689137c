/* A thread's heap: made at the thread's first allocation, abandoned when
 * the thread exits (a thread-specific-data destructor); and the malloc
 * slow path, which starts from the thread's heap and retries once, after
 * giving back what the caches hold, when memory runs out. */
#include "internal.h"
#include "fastpath.h"
#include "secure.h"

#include <errno.h>

static pthread_key_t thread_key;
static pthread_once_t thread_key_once = PTHREAD_ONCE_INIT;
static bool thread_key_ready;
static __thread bool heap_gone __attribute__((tls_model("initial-exec")));

static void thread_done(void *arg);
static void thread_key_make(void) { thread_key_ready = pthread_key_create(&thread_key, thread_done) == 0; }

/* This thread's heap, made at its first allocation (or, from_free, at
 * its HK_HEAPLESS_FREES-th free of other threads' blocks, remote.c); NULL
 * when out of memory, or once the thread's heap is gone (see
 * hk_heap_alloc_late). */
static void make_for_frees(void);
static hk_heap *heap_make(bool from_free) {
  if (heap_gone) return NULL;
  hk_init_check();
  /* (in case the C library's pthread_create did not call calloc: init.c) */
  hk_fork_handlers_check();
  hk_heap *h = hk_heap_new(true);
  if (h == NULL) {
    hk_pressure_release(sizeof(hk_heap));
    h = hk_heap_new(true);
  }
  if (h == NULL) return NULL;
  hk_tls_heap = h;
  hk_tls_arm();
  hk_store_relaxed(&hk_make_heap_for_frees, make_for_frees); /* (every heap stores the same) */
  /* After hk_tls_heap is set: pthread_setspecific may itself call calloc. */
  pthread_once(&thread_key_once, thread_key_make);
  if (thread_key_ready) pthread_setspecific(thread_key, h);
  /* A second thread allocates: from now on free() cannot start the purger
   * (purger.c), so it starts here, in this thread's first malloc. Not in a
   * free(), for the reason free() cannot: the next slow path does it. */
  static _Atomic uint32_t heaps_made;
  if (hk_add_relaxed(&heaps_made, 1) != 0) {
    if (from_free) hk_store_relaxed(&hk_purger_wanted, 1);
    else hk_purger_start();
  }
  if (!from_free) hk_heap_reap();
  return h;
}

hk_heap *hk_heap_get(void) {
  hk_heap *h = hk_tls_heap;
  return h != &hk_heap_empty ? h : heap_make(false);
}

static void make_for_frees(void) {
  if (hk_tls_heap == &hk_heap_empty) heap_make(true);
}

static void thread_done(void *arg) {
  hk_heap *h = hk_tls_heap;
  (void)arg;
  if (h == &hk_heap_empty) return;
  hk_tls_heap = &hk_heap_empty;
  hk_tls.budget = HK_BUDGET_SHUT;
  heap_gone = true;
  hk_debug_heap(h, true);
  hk_store_relaxed(&h->live, 0);
  hk_heap_abandon(h);
  hk_abandoned_sweep(false, false);
  hk_debug_regions();
  hk_purger_poke();
  hk_purger_start();
}

/* A large block; once more after giving back the caches if none can be
 * mapped (not for a request no mapping can serve). */
void *hk_alloc_large(size_t size, size_t align, bool zero) {
  void *p = hk_large_alloc(size, align, zero);
  if (HK_UNLIKELY(p == NULL) && size <= HK_MAX_REQUEST) {
    hk_pressure_release(size + align);
    p = hk_large_alloc(size, align, zero);
  }
  if (HK_UNLIKELY(hk_load_relaxed(&hk_limit_soft_crossed))) hk_pressure_soft();
  return p;
}

/* A block of class cls from h's pages (NULL: the shared heap of threads
 * past their own, heap.c); once more after giving back the
 * caches (other heaps' spares, abandoned pages, cached large mappings, the
 * regions' free slabs) if no span can be had. */
static void *alloc_from(hk_heap *h, size_t size, unsigned cls) {
  void *p = h != NULL ? hk_heap_alloc(h, size, cls) : hk_heap_alloc_late(size, cls);
  if (HK_UNLIKELY(p == NULL)) {
    hk_pressure_release(HK_REGION_SIZE);
    p = h != NULL ? hk_heap_alloc(h, size, cls) : hk_heap_alloc_late(size, cls);
  }
#ifdef HAKMEM_DEBUG
  static __thread uint32_t checks;
  if (h != NULL) hk_debug_heap(h, (++checks & 255) == 0); /* every page's list every 256th time */
#endif
  hk_purger_poke(); /* (no allocator lock held here) */
  if (HK_UNLIKELY(hk_load_relaxed(&hk_limit_soft_crossed))) hk_pressure_soft();
  return p;
}

/* A malloc the heap profiler samples (profile.c): a block of a size class
 * from the thread's sample heap, a large block marked in its header.
 * (Inline in malloc_gated_rest: a frame less for the sample's stack walk
 * to read.) */
HK_INLINE void *sampled_malloc(size_t size, hk_heap *h) {
  hk_profile_poll();
  if (size > HK_MEDIUM_MAX) {
    void *p = hk_malloc_slow(size, h);
    if (p != NULL && size > HK_MEDIUM_MAX && hk_profile_large(p, size)) hk_large_set_sampled(p);
    return p;
  }
  void *p = hk_profile_malloc(h, size, hk_size_class(size ? size : 1));
  if (p != NULL) return p;
  return h->free_owner != h ? hk_malloc_cached(size, h) : hk_malloc_heap(size, h);
}

/* malloc whose budget ran out: every malloc of a thread that uses a heap
 * of the program's (hak_heap_use) or whose heap is not its own free_owner
 * (cache mode, hardened mode, hk_heap_empty), which keep the budget shut, and with the profiler on the heap's own per-heap count
 * down to the next sample; otherwise a sample is due, or (profiler off)
 * the budget is open again. */
void *(*hk_heap_use_alloc)(size_t size);

/* The rest of hk_malloc_gated: a heap of the program's, the profiler on,
 * or a budget to open again. Out of line, so that the cache mode's malloc
 * saves no register and makes no frame on its way to hk_malloc_cached. */
static HK_NOINLINE void *malloc_gated_rest(size_t size, hk_heap *h) {
  if (HK_UNLIKELY(hk_tls.use != NULL)) return hk_heap_use_alloc(size); /* (set before any use) */
  if (h->free_owner != h) {
    /* (the count ran out, or it is not this thread's to keep) */
    if (h == &hk_heap_empty || hk_secure) return hk_malloc_cached(size, h);
    h->sample_left = hk_random_gap((uint64_t)hk_opt.profile_rate);
  } else if (hk_profile_on) {
    /* (hk_tls_arm, whose first two tests were made above: h is the
     * thread's heap, its own free_owner, and no heap of the program's is
     * in use) */
    hk_tls.budget = hk_random_gap((uint64_t)hk_opt.profile_rate);
  } else {
    hk_tls.budget = HK_BUDGET_OPEN;
    return hk_malloc_heap(size, h);
  }
  return sampled_malloc(size, h);
}

void *hk_malloc_gated(size_t size, hk_heap *h) {
  /* (a shut budget is left as it is: it stays negative for 2^62 bytes of
   * requests, and hk_malloc_slow sets it again after any larger one) */
  if (HK_LIKELY(h->free_owner != h && hk_tls.use == NULL)) {
    if (HK_LIKELY(!hk_profile_on)) return hk_malloc_cached(size, h);
    /* cache mode with the profiler on: the heap's count down to the next
     * sample, here, so that the mallocs between samples make no call more
     * than without it (hk_heap_empty's count, never written, stays 0) */
    uint64_t left = h->sample_left;
    if (HK_LIKELY(left > size)) {
      h->sample_left = left - size;
      return hk_malloc_cached(size, h);
    }
  }
  return malloc_gated_rest(size, h);
}

/* malloc in cache mode (h->free_owner != h, remote.c): the class's cached
 * blocks first, then its current page. */
void *hk_malloc_cached(size_t size, hk_heap *h) {
  /* hardened mode always ends here (its heaps stay in cache mode: its
   * cache is its own, secure.c) */
  if (hk_secure) return hk_secure_malloc(size, h);
  /* (small sizes first: one compare for them) */
  size_t cls;
  if (HK_LIKELY(size <= HK_LUT_MAX)) cls = hk_class_lut[(size + 7) >> 3];
  else if (size <= HK_MEDIUM_MAX) cls = hk_size_class(size);
  else return hk_malloc_slow(size, h);
  hk_block *b = h->cache_first[cls];
  if (b != NULL) {
    /* (the clock in a call of its own: inlined here, its call would make
     * every pop save and restore registers) */
    if (HK_UNLIKELY((h->stats.cache_reused & 63) == 0)) return hk_cache_pop_noting_time(h, cls, b);
    return hk_cache_pop(h, cls, b);
  }
  return hk_malloc_from(h, h->direct[cls], size);
}

/* Hardened malloc: the head of the class's current page's list, checked
 * as hk_heap_alloc checks it; the slow path for everything else (no
 * current page or no heap yet, the list ended, blocks stashed, a large
 * request, zero mode's check). secure.c has the rest of hardened mode. */
void *hk_secure_malloc(size_t size, hk_heap *h) {
  if (HK_HARDENED_BUILD && HK_UNLIKELY(hk_tls.use != NULL)) return hk_heap_use_alloc(size); /* (its fast path) */
  if (HK_UNLIKELY(size > HK_MEDIUM_MAX - HK_SECURE_EXTRA || hk_secure_zero)) return hk_malloc_slow(size, h);
  unsigned cls = hk_size_class(size + HK_SECURE_EXTRA);
  hk_block *cached = h->cache_first[cls];
  if (HK_UNLIKELY(cached != NULL)) return hk_secure_cache_pop(h, cls, cached, size);
  hk_page *page = h->queues[cls].first;
  if (HK_UNLIKELY(page == NULL || !hk_list_head_ok(page, page->free))) return hk_malloc_slow(size, h);
  hk_block *b = hk_page_pop(page);
  hk_secure_take(page, b);
  hk_secure_mark(page, b, size);
  return b;
}


/* Out of line, so that hk_malloc_no_head's other paths are tail calls
 * that save no registers. */
static HK_NOINLINE void *next_page_malloc(size_t size, hk_heap *h, hk_page *page) {
  void *p = hk_heap_next_page_malloc(h, page);
  return p != NULL ? p : hk_malloc_slow(size, h);
}

/* The fast path's page had no carved block at the head of its list: the
 * list ended (the slow path), or a link was corrupted. */
void *hk_malloc_no_head(size_t size, hk_heap *h, hk_page *page) {
  if (HK_LIKELY(hk_list_end(page->free))) {
    /* a stashed block of the class first (queue.c), then the next page's
     * in the queue, without the slow path's calls: they have nothing to do
     * while neither the purger nor the soft limit waits for one */
    if (page != &hk_page_empty && !hk_purge_poke && !hk_load_relaxed(&hk_purger_wanted) &&
        !hk_load_relaxed(&hk_limit_soft_crossed)) {
      if (h->stash[page->cls] != NULL) return hk_heap_stash_malloc(h, page->cls);
      /* (while a class grows, the page after the current one has none) */
      if (page->next != NULL && !hk_list_end(page->next->free)) return next_page_malloc(size, h, page);
    }
    return hk_malloc_slow(size, h);
  }
  hk_fatal("free list corrupted (a freed block was written: a use after free, or an overflow)", page->free);
}

/* From the fast path (the class is computed here: the lookup table is empty
 * before initialisation). */
void *hk_malloc_slow(size_t size, hk_heap *h) {
  if (HK_UNLIKELY(size >= HK_BUDGET_OPEN)) hk_tls_arm(); /* (see hk_tls_state) */
  /* hardened: the class must also hold the canary and the trailer */
  size_t need = hk_secure ? size + HK_SECURE_EXTRA : size;
  unsigned cls = need <= HK_MEDIUM_MAX && need >= size ? hk_size_class(need) : HK_NSIZES;
  if (h == &hk_heap_empty) {
    h = hk_heap_get();
    if (h == NULL && heap_gone) return cls >= HK_NSIZES ? hk_alloc_large(size, 16, false) : alloc_from(NULL, size, cls);
    if (h == NULL) {
      errno = ENOMEM;
      return NULL;
    }
    cls = need <= HK_MEDIUM_MAX && need >= size ? hk_size_class(need) : HK_NSIZES; /* (the table is set now) */
  }
  if (cls >= HK_NSIZES || (HK_UNLIKELY(hk_load_relaxed(&hk_space_tight)) && need >= HK_TIGHT_LARGE_MIN))
    return hk_alloc_large(size, 16, false);
  return alloc_from(h, size, cls);
}

/* Explicit class (aligned allocation): hk_init has run. */
void *hk_alloc_class(size_t size, unsigned cls) {
  hk_heap *h = hk_heap_get();
  if (h == NULL && heap_gone) return alloc_from(NULL, size, cls);
  if (h == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  return alloc_from(h, size, cls);
}
