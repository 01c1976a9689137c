/* The debug build's validators (cmake -DHAKMEM_DEBUG=ON): they walk a heap
 * or a page and assert the invariants the rest of the code relies on. Only
 * the owner thread may validate its heap (its queues and free lists are
 * unlocked). See docs/DESIGN.md for the invariants themselves. */
#include "internal.h"

#ifdef HAKMEM_DEBUG

#include <stdlib.h>

void hk_assert_fail(const char *cond, const char *file, int line) {
  char buf[256];
  size_t n = 0;
  static const char head[] = "hakmem: internal check failed: ";
  for (const char *s = head; *s && n < sizeof buf - 1; s++) buf[n++] = *s;
  for (const char *s = cond; *s && n < sizeof buf - 40; s++) buf[n++] = *s;
  buf[n++] = ' ';
  buf[n++] = '(';
  for (const char *s = file; *s && n < sizeof buf - 20; s++) buf[n++] = *s;
  buf[n++] = ':';
  n += hk_fmt_dec(buf + n, (uint64_t)line);
  buf[n++] = ')';
  buf[n++] = '\n';
  hk_os_write_stderr(buf, n);
  abort();
}

/* The owner's view of one of its pages: the free list lies in the carved
 * blocks, each a block start, and every carved block is either handed out
 * (`used`, which counts blocks on the remote stack and in thread caches
 * too) or on the free list, except the blocks dropped with lent slabs. */
void hk_debug_page(const hk_page *page) {
  hk_assert(page->nslabs >= 1 && page->nslabs <= HK_MAX_SPAN_SLABS + 1);
  hk_assert(page->cls < HK_NCLASSES);
  hk_assert(page->capacity <= page->reserved);
  hk_assert(page->free_key == page->key);
  hk_assert((page->lent & 1) == 0);
  uint32_t area = hk_page_area(page), n = 0;
  for (const hk_block *b = page->free; !hk_list_end(b); b = hk_link_next(b, page->key)) {
    uintptr_t off = (uintptr_t)b - page->start;
    hk_assert(off < area);
    hk_assert(off % page->block_size == 0);
    hk_assert(++n <= page->capacity);
  }
  uint32_t used = hk_page_used(page);
  if (page->lent == 0) hk_assert(used + n == page->capacity);
  else hk_assert(used + n <= page->capacity);
  /* (a parked page may have been reclaimed by a remote freer meanwhile) */
  hk_assert(hk_load_relaxed(&((hk_page *)page)->carved_bound) != 0 || page->capacity == 0 || hk_page_parked(page));
}

/* Walk a list: its links agree both ways and it ends where `last` says. */
#define CHECK_LIST(list, type, count)                                \
  do {                                                               \
    const type *prev_ = NULL;                                        \
    for (const type *e_ = (list)->first; e_ != NULL; e_ = e_->next) { \
      hk_assert(e_->prev == prev_);                                  \
      prev_ = e_;                                                    \
      (count)++;                                                     \
    }                                                                \
    hk_assert((list)->last == prev_);                                \
  } while (0)

/* A heap's structure: each class's queue holds live pages of the class
 * owned by the heap and not parked, its first page is what direct[] and
 * by_size[] expose, held bytes add up, the full
 * list holds parked pages only, and the thread cache's and the stash's
 * counts agree with their lists. deep: every page's free list too. */
void hk_debug_heap(const hk_heap *h, bool deep) {
  if (h == &hk_heap_empty) return;
  hk_heap *tag = hk_owner_tag((hk_heap *)h);
  uint64_t held = 0; /* held_bytes: the current pages' held[], and each held page's bytes */
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    uint32_t n = 0;
    held += h->held[c];
    CHECK_LIST(&h->queues[c], hk_page, n);
    for (const hk_page *p = h->queues[c].first; p != NULL; p = p->next) {
      hk_assert(p->cls == c || hk_span_block(p));
      hk_assert(hk_load_relaxed(&((hk_page *)p)->heap) == tag);
      hk_assert(!hk_page_parked(p));
      hk_assert(!hk_page_is_current(p) || p == h->queues[c].first);
      if (p->held) held += p->idle_ms;
      if (deep) hk_debug_page(p);
    }
    const hk_page *cur = h->direct[c];
    hk_assert(cur == &hk_page_empty || cur == h->queues[c].first);
    hk_assert(h->cache_room[c] <= hk_class_cache_max[c]);
    uint32_t cached = 0;
    for (const hk_block *b = h->cache_first[c]; b != NULL; b = hk_cache_next(h, b)) hk_assert(++cached <= hk_class_cache_max[c]);
    hk_assert(cached == (uint32_t)(hk_class_cache_max[c] - h->cache_room[c]));
  }
  for (unsigned i = 0; i < HK_LUT_SLOTS; i++) hk_assert(h->by_size[i] == h->direct[hk_class_lut[i]]);
  uint32_t nfull = 0;
  CHECK_LIST(&h->full, hk_page, nfull);
  hk_assert(nfull == h->full_count);
  uint32_t per_class[HK_NCLASSES] = {0};
  for (const hk_page *p = h->full.first; p != NULL; p = p->next) {
    hk_assert(hk_page_parked(p));
    hk_assert(hk_load_relaxed(&((hk_page *)p)->heap) == tag);
    per_class[p->cls]++;
    if (p->held) held += p->idle_ms;
    if (deep) hk_debug_page(p);
  }
  for (unsigned c = 0; c < HK_NCLASSES; c++) hk_assert(per_class[c] == h->full_pages[c]);
  hk_assert(h->free_owner == h || h->free_owner == HK_NO_OWNER(h));
  hk_assert(held == h->held_bytes);
  /* the stash: its lists agree with its counts, and each block, tagged as
   * a cached one, lies in a page of the heap's */
  uint32_t stashed = 0, small = 0, medium = 0;
  uint64_t bytes = 0, small_bytes = 0;
  for (unsigned c = 0; c < HK_NCLASSES; c++) {
    uint32_t n = 0;
    for (const hk_block *b = h->stash[c]; b != NULL; b = hk_cache_next(h, b)) {
      const hk_page *p = hk_block_page(b);
      hk_assert(b->link == hk_foreign_tag(p));
      hk_assert(hk_load_relaxed(&((hk_page *)p)->heap) == tag);
      hk_assert(++n <= h->stash_count[c]);
      bytes += p->block_size;
      if (p->reserved == 1) continue;
      if (hk_stash_medium(p)) {
        medium++;
      } else {
        hk_assert(p->block_size <= HK_STASH_PARKED_SIZE);
        small++;
        small_bytes += p->block_size;
      }
    }
    hk_assert(n == h->stash_count[c]);
    stashed += n;
  }
  hk_assert(stashed == h->stash_blocks && bytes == h->stash_bytes);
  hk_assert(small == h->stash_parked_blocks && small_bytes == h->stash_parked_bytes && medium == h->stash_medium_blocks);
  hk_assert(hk_heap_held_bytes(h) <= HK_HELD_BYTES + h->held_grown && h->held_grown <= HK_HELD_GROWN_MAX &&
            h->spare_grown <= HK_SPARE_GROWN_MAX);
}

#endif /* HAKMEM_DEBUG */
