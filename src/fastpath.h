/* The malloc and free fast paths, inlined into every entry point.
 *
 * Same-thread malloc: subtract the request from the thread's budget (out of
 *                     line when it goes negative: hk_tls_state), pop the
 *                     class's current page's free list, whose head must be
 *                     a carved block of the page.
 * Same-thread free:   look the page up in the arena's page table, check the
 *                     pointer is a block start, push (onto the thread
 *                     cache instead in cache mode, remote.c).
 * Neither takes a lock, does an atomic read-modify-write or a system call;
 * everything else (page refill, remote frees, large blocks, errors) is in
 * the out-of-line slow paths.
 */
#ifndef HK_FASTPATH_H
#define HK_FASTPATH_H

#include "internal.h"

/* A build hardened by default (-DHAKMEM_SECURE_DEFAULT=ON) is hardened for
 * good (the environment can only raise it to zero mode), so its fast paths
 * go straight to hardened mode's malloc and free. A default build reaches
 * them through the cache mode's paths instead (secure.c), at no cost to
 * its own fast paths. */
#if defined(HAKMEM_SECURE_DEFAULT) && HAKMEM_SECURE_DEFAULT
#define HK_HARDENED_BUILD 1
#else
#define HK_HARDENED_BUILD 0
#endif

/* Pop the first free block of `page`, the current page of size's class.
 * The one test of the list's head (hk_list_head_ok) finds both the list's
 * end and a corrupted link; hk_malloc_no_head tells them apart. */
HK_INLINE void *hk_malloc_from(hk_heap *heap, hk_page *page, size_t size) {
  if (HK_LIKELY(hk_list_head_ok(page, page->free))) return hk_page_pop(page);
  return hk_malloc_no_head(size, heap, page);
}

/* malloc's fast path past its thread's budget: the class's current page. */
HK_INLINE void *hk_malloc_heap(size_t size, hk_heap *heap) {
  hk_page *page;
  if (HK_LIKELY(size <= HK_LUT_MAX)) {
    page = heap->by_size[(size + 7) >> 3];
  } else if (HK_LIKELY(size <= HK_MEDIUM_MAX)) {
    page = heap->direct[hk_size_class(size)];
  } else {
    return hk_malloc_slow(size, heap);
  }
  return hk_malloc_from(heap, page, size);
}

HK_INLINE void *hk_malloc_fast(size_t size) {
  hk_heap *heap = hk_tls.heap;
  if (HK_HARDENED_BUILD) return hk_secure_malloc(size, heap);
  /* every malloc of a thread without a heap, in cache mode (blocks of
   * other threads freed here come first, remote.c) or in hardened mode,
   * and with the profiler one every sampling period, goes out of line */
  if (HK_UNLIKELY((int64_t)(hk_tls.budget -= size) < 0)) return hk_malloc_gated(size, heap);
  return hk_malloc_heap(size, heap);
}

/* Free p as a block of `page`, or tail-call invalid(p) if it is none. */
HK_INLINE void hk_free_to_page(hk_page *page, void *p, void (*invalid)(void *)) {
  /* the start of a block carved so far (never true of anything that is
   * not a live page) */
  if (HK_LIKELY(hk_is_carved_block(page, (uintptr_t)p))) {
    hk_heap *heap = hk_tls_heap;
    hk_block *b = (hk_block *)p;
    if (HK_HARDENED_BUILD) {
      hk_secure_free(b, page, heap);
      return;
    }
    /* the thread's own block, unless the thread is in cache mode: then
     * every free goes to its cache (remote.c, free_owner) */
    if (HK_LIKELY(hk_load_relaxed(&page->heap) == heap->free_owner)) {
      uintptr_t key = page->key;
      /* every call below is a tail call: no registers to save here */
      if (HK_UNLIKELY(hk_looks_free(page, b))) {
        hk_free_local_checked(heap, page, b);
        return;
      }
      /* empty now, or parked as full (see HK_USED_NORMAL) */
      if (hk_page_push(page, b, key)) hk_heap_page_emptied(heap, page);
      return;
    }
    hk_free_to_cache(b, page, heap);
    return;
  }
  invalid(p);
}

HK_INLINE void hk_free_fast(void *p) {
  uintptr_t slab = hk_arena_slab((uintptr_t)p);
  if (HK_LIKELY(slab < HK_ARENA_SLABS)) {
    hk_free_to_page(hk_arena_page(slab), p, hk_free_slow);
    return;
  }
  hk_free_slow(p);
}

#endif /* HK_FASTPATH_H */
