/* Heaps the program makes (hak_heap_new): blocks in pages of their own,
 * given back all at once by hak_heap_destroy.
 *
 * A user heap is an hk_heap of kind HK_HEAP_USER that no thread owns. Its
 * pages, queues and spares work as a thread's do (queue.c), and every call
 * on it but free() holds its user_lock, so any thread may use it. free()
 * takes no lock: a free of its block, from any thread, is a remote free
 * (remote.c), pushed onto the block's page with one compare-and-swap and
 * collected by the heap's next page search. No thread cache keeps its
 * blocks and the heap never adopts other threads' pages (queue.c), so its
 * pages hold only its own blocks, and only its pages hold them: destroy
 * can give them all back. Its blocks above 1 MiB are large blocks on the
 * heap's list (large.c). A label is such a heap with a name, and
 * hak_heap_use sends a thread's mallocs to a heap (below), so that
 * hak_heap_stats counts what a component allocated.
 *
 * After hak_heap_destroy, free() of one of its blocks finds no live block
 * and is reported (a double free), as long as no new page has taken the
 * span; once one has, such a free cannot be told from a free of that
 * page's block, as for any double free in the default mode. */
#include "internal.h"
#include "secure.h"

#include <errno.h>
#include <sched.h>
#include <string.h>

#include "hakmem.h"

/* Lock the heap a call names; false: the lock was not taken, and must not
 * be released (the forking thread, which holds it already: sync.h).
 * Reported: a heap that is none (destroyed, or not made by hak_heap_new),
 * and a call from a visitor of the same heap (its thread holds the lock:
 * it would wait for itself). */
static bool heap_lock(hk_heap *h, const char *who) {
  if (h == NULL) hk_fatal_in(who, "a NULL heap", NULL);
  if (HK_UNLIKELY(hk_load_relaxed(&h->visitor) != 0) && hk_load_relaxed(&h->visitor) == pthread_self())
    hk_fatal_in(who, "a heap, from its own hak_heap_visit() visitor", h);
  bool took = hk_spin_lock(&h->user_lock);
  if (HK_UNLIKELY(h->kind != HK_HEAP_USER)) {
    unsigned kind = h->kind;
    if (took) hk_spin_unlock(&h->user_lock);
    hk_fatal_in(who, kind == HK_HEAP_DESTROYED ? "a heap already destroyed" : "a pointer that is not a hak_heap_new() heap", h);
  }
  return took;
}

static void heap_unlock(hk_heap *h, bool took) {
  if (took) hk_spin_unlock(&h->user_lock);
}

/* The user heap a live block belongs to (r: its mapping's header), or
 * NULL: a thread's block. */
hk_heap *hk_user_heap_of(hk_region *r, const void *p) {
  if (r->kind == HK_KIND_LARGE) return hk_large_heap_of(r);
  hk_heap *h = hk_owner_untag(hk_load_relaxed(&hk_page_of(r, p)->heap));
  return h != NULL && h->kind == HK_HEAP_USER ? h : NULL;
}

/* Wake or start the purger (no allocator lock held: starting it
 * allocates). The C library's records of a thread started here must not
 * land in a heap this thread uses (hak_heap_use), which the program may
 * destroy while the thread runs. */
static void poke_purger(void) {
  hk_heap *use = hk_tls.use;
  if (HK_LIKELY(use == NULL)) {
    hk_purger_poke();
    return;
  }
  hk_tls.use = NULL;
  hk_purger_poke();
  hk_tls.use = use;
  hk_tls_arm(); /* (shut again) */
}

/* A block of size bytes from h, zeroed if asked, all the way: a large
 * block, a page search, hardened mode. who: the caller, for reports. */
static HK_NOINLINE void *alloc_slow(hk_heap *h, size_t size, bool zero, const char *who) {
  size_t need = hk_secure ? size + HK_SECURE_EXTRA : size; /* hardened: the canary and the trailer too */
  if (need > HK_MEDIUM_MAX || need < size) {
    heap_unlock(h, heap_lock(h, who)); /* (checked before mapping) */
    void *p = hk_alloc_large(size, 16, zero);
    if (p == NULL) return NULL;
    /* (locked: hak_heap_destroy may not run meanwhile, or the block would
     * join a heap that is gone) */
    bool took = heap_lock(h, who);
    hk_large_join_heap(p, h);
    heap_unlock(h, took);
    return p;
  }
  unsigned cls = hk_size_class(need);
  bool took = heap_lock(h, who);
  void *p = hk_heap_alloc(h, size, cls);
  heap_unlock(h, took);
  if (HK_UNLIKELY(p == NULL)) { /* give back the caches (without the lock: they take others) and retry */
    hk_pressure_release(HK_REGION_SIZE);
    took = heap_lock(h, who);
    p = hk_heap_alloc(h, size, cls);
    heap_unlock(h, took);
  }
  poke_purger();
  if (HK_UNLIKELY(hk_load_relaxed(&hk_limit_soft_crossed))) hk_pressure_soft();
  if (p == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  if (zero) memset(p, 0, size);
  return p;
}

/* The common case inline: a block of up to 1 KiB from its class's current
 * page, as the malloc fast path takes one (fastpath.h), between the lock's
 * exchange and its release; the rest in alloc_slow, which also waits for
 * the lock (a visitor of the heap holds it: heap_lock's check). */
HK_INLINE void *heap_alloc(hak_heap_t *heap, size_t size, bool zero, const char *who) {
  hk_heap *h = (hk_heap *)heap;
  if (HK_LIKELY(size <= HK_LUT_MAX && !hk_secure && h != NULL) && HK_LIKELY(hk_spin_trylock(&h->user_lock))) {
    if (HK_LIKELY(h->kind == HK_HEAP_USER)) {
      hk_page *page = h->by_size[(size + 7) >> 3];
      if (HK_LIKELY(hk_list_head_ok(page, page->free))) {
        void *p = hk_page_pop(page);
        hk_spin_unlock(&h->user_lock);
        if (zero) memset(p, 0, size);
        return p;
      }
    }
    hk_spin_unlock(&h->user_lock);
  }
  return alloc_slow(h, size, zero, who);
}

/* heap, checked as every call on it is (reported if it is no heap). */
hk_heap *hk_user_heap_check(void *heap, const char *who) {
  hk_heap *h = heap;
  heap_unlock(h, heap_lock(h, who));
  return h;
}

/* The heap a realloc of one of its blocks names (p's heap, or a check
 * hk_realloc makes), checked without its lock: a heap destroyed before
 * the call says so (its kind is written once, before it is reused). */
hk_heap *hk_user_heap_named(void *heap, const char *who) {
  hk_heap *h = heap;
  if (h == NULL || h->kind != HK_HEAP_USER) return hk_user_heap_check(heap, who); /* (reports) */
  return h;
}

void *hk_user_heap_alloc(hk_heap *h, size_t size) { return heap_alloc((hak_heap_t *)h, size, false, "realloc()"); }

/* realloc moved h's live block p (of page) to a new block: p goes back
 * onto its page's own list under the heap's lock, as its owner frees,
 * instead of through the page's remote stack (default mode: hardened mode
 * frees remotely, checked). */
void hk_user_heap_free_own(hk_heap *h, hk_page *page, void *p) {
  bool took = heap_lock(h, "realloc()");
  h->moving = 1; /* (the page it empties is not held: the buffer moved on, queue.c) */
  hk_free_local_push(h, page, p);
  h->moving = 0;
  heap_unlock(h, took);
}

HK_API hak_heap_t *hak_heap_new(void) {
  hk_init();
  hk_heap *h = hk_heap_new_user(NULL);
  if (h == NULL) errno = ENOMEM;
  return (hak_heap_t *)h;
}

HK_API void *hak_heap_malloc(hak_heap_t *heap, size_t size) { return heap_alloc(heap, size, false, "hak_heap_malloc()"); }

HK_API void *hak_heap_calloc(hak_heap_t *heap, size_t n, size_t size) {
  size_t total;
  if (__builtin_mul_overflow(n, size, &total)) {
    hk_user_heap_check(heap, "hak_heap_calloc()");
    errno = ENOMEM;
    return NULL;
  }
  return heap_alloc(heap, total, true, "hak_heap_calloc()");
}

/* Every page of the heap goes back to its region, live blocks and all. */
static void release_page(hk_heap *h, hk_page *p) {
  if (hk_secure) hk_secure_clear_span(p); /* its live blocks' bits: the next page there starts clear */
  hk_heap_release_page(h, p);
}

HK_API void hak_heap_destroy(hak_heap_t *heap) {
  if (heap == NULL) return;
  hk_heap *h = (hk_heap *)heap;
  bool took = heap_lock(h, "hak_heap_destroy()");
  h->kind = HK_HEAP_DESTROYED; /* a later call on it is reported (heap_lock) */
  hk_heap_stash_flush(h);
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    hk_page *p;
    while ((p = h->queues[c].first) != NULL) {
      hk_list_remove(&h->queues[c], p);
      release_page(h, p);
    }
    hk_heap_set_direct(h, c, &hk_page_empty);
  }
  hk_page *p;
  while ((p = h->full.first) != NULL) {
    /* a freer may be giving the page back (remote.c, try_reclaim): wait
     * for it to finish */
    while (hk_page_reclaimed(p) == HK_PAGE_BUSY) sched_yield();
    hk_heap_full_remove(h, p);
    release_page(h, p);
  }
  pthread_mutex_lock(&h->spare_lock);
  p = hk_spares_detach(h, UINT64_MAX, 0);
  pthread_mutex_unlock(&h->spare_lock);
  while (p != NULL) {
    hk_page *next = p->next;
    hk_heap_release_page(h, p);
    p = next;
  }
  h->held_bytes = 0;
  memset(h->held, 0, sizeof h->held);
  hk_large_free_heap(h);
  heap_unlock(h, took);
  hk_heap_recycle_user(h);
  poke_purger();
}

/* ---- hak_heap_visit ---- */

/* Blocks a page can hold at most: pages of several slabs hold blocks of
 * 9 KiB and more (sizeclass.c), so a slab of the smallest blocks. */
#define VISIT_BLOCKS_MAX (HK_SLAB_SIZE / 8)
typedef int (*visitor_fn)(void *block, size_t size, void *arg);

/* Does block i of the page reach into a slab the page lent its region
 * (lend.c: such blocks were free, and left the free list with the slab)? */
static bool in_lent_slab(const hk_page *page, uint32_t i) {
  uintptr_t span = hk_page_span_start(page), b0 = page->start + (uintptr_t)i * page->block_size;
  unsigned k0 = (unsigned)((b0 - span) >> HK_SLAB_SHIFT);
  unsigned k1 = (unsigned)((b0 + page->block_size - 1 - span) >> HK_SLAB_SHIFT); /* (< 16) */
  uint32_t slabs = (((uint32_t)2 << k1) - 1) & ~(((uint32_t)1 << k0) - 1);
  return (page->lent & slabs) != 0;
}

/* The page's live blocks: those carved, but not on its free list (nor
 * dropped with a lent slab). */
static int visit_page(hk_page *page, visitor_fn visitor, void *arg) {
  uint64_t bits[VISIT_BLOCKS_MAX / 64]; /* bit i: block i is free */
  uint32_t cap = page->capacity;
  if (cap == 0 || hk_page_state(page) == HK_PAGE_RECLAIMED) return 0;
  hk_assert(cap <= VISIT_BLOCKS_MAX);
  memset(bits, 0, ((cap + 63) / 64) * sizeof bits[0]);
  uint32_t n = 0;
  for (hk_block *b = page->free; !hk_list_end(b); b = hk_link_next(b, page->key)) {
    if (!hk_list_head_ok(page, b) || ++n > cap)
      hk_fatal("free list corrupted (a freed block was written: a use after free, or an overflow)", b);
    uint32_t i = (uint32_t)(((uintptr_t)b - page->start) / page->block_size);
    bits[i / 64] |= (uint64_t)1 << (i % 64);
  }
  for (uint32_t i = 0; i < cap; i++) {
    if ((bits[i / 64] & ((uint64_t)1 << (i % 64))) || (page->lent != 0 && in_lent_slab(page, i))) continue;
    hk_block *b = (hk_block *)(page->start + (uintptr_t)i * page->block_size);
    int r = visitor(b, hk_secure ? hk_secure_size_of(page, b) : hk_page_usable(page), arg);
    if (r != 0) return r;
  }
  return 0;
}

static int visit_pages(hk_heap *h, visitor_fn visitor, void *arg) {
  /* every block freed so far onto its page's own list: blocks parked full
   * pages received back in their queue first */
  hk_heap_rescue_full(h);
  for (unsigned c = 0; c < HK_NCLASSES; c++)
    for (hk_page *p = h->queues[c].first; p != NULL; p = p->next)
      if (hk_load_relaxed(&p->remote) & ~HK_REMOTE_STATE_MASK) hk_page_collect(p, HK_PAGE_NORMAL);
  for (unsigned c = 0; c < HK_NCLASSES; c++)
    for (hk_page *p = h->queues[c].first; p != NULL; p = p->next) {
      int r = visit_page(p, visitor, arg);
      if (r != 0) return r;
    }
  for (hk_page *p = h->full.first; p != NULL; p = p->next) {
    int r = visit_page(p, visitor, arg);
    if (r != 0) return r;
  }
  return 0;
}

/* The large blocks, from a copy of the heap's list: the visitor may free
 * them (which takes the lock of the list). False: no memory for the copy. */
static bool visit_large(hk_heap *h, visitor_fn visitor, void *arg, int *r) {
  void *few[64], **list = few;
  size_t n = hk_large_heap_blocks(h, NULL, 0), bytes = 0;
  if (n > 64) {
    bytes = (n * sizeof(void *) + hk_os_page - 1) & ~(size_t)(hk_os_page - 1);
    list = hk_os_map_aligned(bytes, hk_os_page);
    if (list == NULL) return false;
  }
  n = hk_large_heap_blocks(h, list, n); /* (no more than before: new ones need the heap's lock) */
  for (size_t i = 0; i < n && *r == 0; i++) *r = visitor(list[i], hk_large_usable(hk_region_of(list[i])), arg);
  if (bytes != 0) hk_os_unmap(list, bytes);
  return true;
}

/* 0: every live block visited; the visitor's value that stopped the walk;
 * -1 and errno: ENOMEM (no memory for the walk), EINVAL (no visitor). */
HK_API int hak_heap_visit(hak_heap_t *heap, int (*visitor)(void *block, size_t size, void *arg), void *arg) {
  hk_heap *h = (hk_heap *)heap;
  bool took = heap_lock(h, "hak_heap_visit()");
  if (visitor == NULL) {
    heap_unlock(h, took);
    errno = EINVAL;
    return -1;
  }
  hk_store_relaxed(&h->visitor, pthread_self());
  hk_heap_stash_flush(h); /* (a stashed block is free, but not on its page's list: queue.c) */
  int r = visit_pages(h, visitor, arg);
  bool mapped = r != 0 || visit_large(h, visitor, arg, &r);
  hk_store_relaxed(&h->visitor, (pthread_t)0);
  heap_unlock(h, took);
  if (!mapped) {
    errno = ENOMEM;
    return -1;
  }
  return r;
}

/* ---- labels: heaps by name, and a thread's mallocs into a heap ----
 * A label is a heap with a name, made at the first hak_label of the name
 * and found by it afterwards (label_lock keeps two threads from making
 * one name twice). hak_heap_use makes the calling thread's malloc, calloc,
 * realloc's new blocks and operator new take their blocks from a heap: the
 * thread's budget stays shut (queue.c, hk_tls_arm), so every such malloc
 * leaves the fast path for hk_malloc_gated, which sends it here. What a
 * component allocated is then its heap's, and hak_heap_stats counts it
 * exactly, whoever frees it. */
static pthread_mutex_t label_lock = PTHREAD_MUTEX_INITIALIZER;

HK_API hak_heap_t *hak_label(const char *name) {
  hk_init();
  if (name == NULL || name[0] == 0 || strlen(name) > HK_LABEL_MAX) {
    errno = EINVAL;
    return NULL;
  }
  hk_lock(&label_lock);
  hk_heap *h = hk_heap_find_user(name);
  if (h == NULL) h = hk_heap_new_user(name);
  hk_unlock(&label_lock);
  if (h == NULL) errno = ENOMEM;
  return (hak_heap_t *)h;
}

static void *use_alloc(size_t size) {
  return heap_alloc((hak_heap_t *)hk_tls.use, size, false, "malloc() in hak_heap_use()");
}

HK_API hak_heap_t *hak_heap_use(hak_heap_t *heap) {
  hk_init();
  if (heap != NULL) hk_user_heap_check(heap, "hak_heap_use()");
  hk_heap *before = hk_tls.use;
  hk_heap_use_alloc = use_alloc;
  hk_tls.use = (hk_heap *)heap;
  hk_tls_arm();
  return (hak_heap_t *)before;
}

/* ---- what a heap holds ---- */

/* h's figures (its lock held). */
static void stats_locked(hk_heap *h, struct hak_heap_stats *st) {
  memset(st, 0, sizeof *st);
  memcpy(st->name, h->user_name, sizeof st->name);
  hk_heap_stash_flush(h); /* (stashed blocks are free, but counted in their page's `used`) */
  for (unsigned c = 0; c <= HK_NCLASSES; c++) {
    hk_page *p = c < HK_NCLASSES ? h->queues[c].first : h->full.first;
    for (; p != NULL; p = p->next) {
      st->page_bytes += hk_page_span_bytes(p);
      uintptr_t remote = hk_load_acquire(&p->remote);
      if ((remote & HK_REMOTE_STATE_MASK) == HK_PAGE_RECLAIMED) continue; /* all free */
      /* handed out, less those freed onto the remote stack (counted in
       * its word by the push that freed them) */
      uint64_t live = hk_page_used(p) - (remote >> HK_REMOTE_COUNT_SHIFT);
      st->live_blocks += live;
      st->live_bytes += live * (hk_page_usable(p) - (hk_secure ? HK_SECURE_EXTRA : 0));
    }
  }
  pthread_mutex_lock(&h->spare_lock);
  st->page_bytes += h->spare_bytes;
  pthread_mutex_unlock(&h->spare_lock);
  hk_large_heap_sum(h, &st->live_blocks, &st->live_bytes, &st->large_bytes);
}

HK_API int hak_heap_stats(hak_heap_t *heap, struct hak_heap_stats *out, size_t size) {
  hk_heap *h = (hk_heap *)heap;
  bool took = heap_lock(h, "hak_heap_stats()");
  if (out == NULL || size < sizeof *out) {
    heap_unlock(h, took);
    errno = EINVAL;
    return -1;
  }
  stats_locked(h, out);
  heap_unlock(h, took);
  return 0;
}

/* The figures of up to max labelled heaps, for the reports (inspect.c;
 * called with no allocator lock held: a heap's lock comes first). */
size_t hk_user_heap_labels(struct hak_heap_stats *out, size_t max) {
  hk_heap *h[64];
  size_t n = hk_heap_labelled(h, max < 64 ? max : 64), k = 0;
  for (size_t i = 0; i < n; i++) {
    if (hk_load_relaxed(&h[i]->visitor) == pthread_self()) continue; /* (a report from its visitor: its lock is ours) */
    bool took = hk_spin_lock(&h[i]->user_lock);
    if (h[i]->kind == HK_HEAP_USER) stats_locked(h[i], &out[k++]); /* (not destroyed since) */
    if (took) hk_spin_unlock(&h[i]->user_lock);
  }
  return k;
}
