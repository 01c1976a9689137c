/* Pages: a span of slabs carved into blocks of one size class.
 *
 * The owner thread pops and pushes `page->free` with plain loads and stores.
 * Other threads push freed blocks onto `page->remote` with one CAS (remote.c); the
 * owner takes the whole remote stack with another CAS when it runs dry
 * (hk_page_collect). Blocks are carved lazily, 4 KiB (an OS page, or part
 * of one) at a time, or one block where blocks are larger, so a page only commits the
 * memory it has handed out. */
#include "internal.h"
#include "secure.h"

#include <string.h>

/* Cache colouring. A block alone in its span (page of a coloured class, or
 * large block) would otherwise start on a 64 KiB boundary like every other
 * such block, so the same offset into each, and the same offset into each
 * of their 4 KiB pages, falls in the same L1 cache set, which holds eight
 * lines at most: a loop that writes the same offset of every page of a few
 * such blocks evicts its own lines. The offsets go round all HK_COLORS
 * lines of a 4 KiB page, 37 lines apart, per thread. */
size_t hk_color_offset(void) {
  static __thread unsigned counter __attribute__((tls_model("initial-exec")));
  return (size_t)64 * ((++counter * 37u) % HK_COLORS);
}

/* The heap profiler's (profile.c sets it when it starts, before any block
 * is sampled): a sampled block is freed (internal.h's hk_page_sample_freed,
 * and remote.c for a sample heap's blocks). */
void (*hk_sample_freed)(void *block, const hk_heap *heap);

int hk_page_reclaimed(hk_page *page) {
  if (hk_page_state(page) != HK_PAGE_RECLAIMED) return HK_PAGE_KEPT;
  if (hk_load_acquire(&page->reclaiming)) return HK_PAGE_BUSY;
  hk_page_init(page, page->cls);
  return HK_PAGE_WAS_RECLAIMED;
}

void hk_page_init(hk_page *page, unsigned cls) {
  uint32_t bs = hk_class_block[cls];
  uint32_t span = (uint32_t)page->nslabs * (uint32_t)HK_SLAB_SIZE;
  uintptr_t old_color = page->start - hk_page_span_start(page); /* a reused span's */
  bool same_class = page->cls == cls && page->block_size == bs;
  page->start = hk_page_span_start(page);
  page->block_size = bs;
  page->reserved = span / bs;
  /* Aligned allocation avoids coloured classes (alloc.c). A span that
   * served this class keeps its colour: a program that reuses the block
   * writes the same lines, which may still be cached. */
  if (hk_colored_page(cls, page->nslabs)) {
    page->reserved = 1;
    page->start += same_class && old_color < HK_COLORS * 64 ? old_color : hk_color_offset();
  }
  page->div_magic = hk_div_magic(bs);
  page->key = page->free_key = hk_page_key((uint64_t)(uintptr_t)page); /* new at each (re)initialisation */
  page->free_check = page->key ^ hk_region_base(page);
  page->cls = (uint8_t)cls;
  page->free = (hk_block *)hk_region_base(page); /* empty list: ends at the region base */
  page->used = (uint32_t)HK_USED_NORMAL;
  page->capacity = 0;
  hk_store_relaxed(&page->remote, HK_PAGE_NORMAL);
#ifdef HAKMEM_DEBUG
  if (hk_secure) hk_secure_assert_clear(page);
#endif
  /* the bound grows as blocks are carved (hk_page_extend): free() of a
   * block that was never handed out fails the fast path's test */
  hk_page_clear_carved(page);
}

/* Carve the next HK_EXTEND_BYTES of untouched blocks (or one block) onto
 * the free list, in address order so that consecutive mallocs return
 * neighbouring blocks. Carving writes each block's first word, which
 * commits an OS page per block of 4 KiB or more, so such blocks are carved
 * one at a time: carving several would commit OS pages for nothing in
 * every page that serves only a block or two, and one at a time costs only
 * a call here per block in pages that are used in full. */
bool hk_page_extend(hk_page *page) {
  uintptr_t key = page->key;
  if (page->capacity >= page->reserved) return false;
  uint32_t bs = page->block_size;
  uint32_t n = hk_extend_blocks(bs);
  /* hardened: enough blocks at a time that big ones come in a random order too */
  if (hk_secure && n < HK_SECURE_CARVE) n = HK_SECURE_CARVE;
  if (n > page->reserved - page->capacity) n = page->reserved - page->capacity;
  if (hk_secure) {
    hk_secure_shuffle_extend(page, n);
    return true;
  }
  char *first = (char *)page->start + (size_t)page->capacity * bs;
  char *b = first;
  for (uint32_t i = 1; i < n; i++, b += bs) hk_link_set((hk_block *)b, (hk_block *)(b + bs), key);
  hk_link_set((hk_block *)b, page->free, key);
  page->free = (hk_block *)first;
  page->capacity += n;
  hk_page_set_carved(page);
  return true;
}

static bool list_contains(hk_block *list, hk_block *b, uint32_t limit, uintptr_t key) {
  for (uint32_t i = 0; !hk_list_end(list) && i <= limit; i++) {
    if (list == b) return true;
    list = hk_link_next(list, key);
  }
  return false;
}

/* Is b already free in this page: on the owner's list or on the remote
 * stack? Owner only. Walks are bounded: a double free can make a list
 * cyclic. */
bool hk_page_contains_free(hk_page *page, hk_block *b) {
  uintptr_t key = page->key;
  uint32_t limit = page->reserved;
  if (list_contains(page->free, b, limit, key)) return true;
  hk_block *remote = (hk_block *)(hk_load_acquire(&page->remote) & HK_REMOTE_PTR_MASK);
  return list_contains(remote, b, limit, key);
}

/* Take the remote stack, set the page state to new_state, move the blocks
 * onto the owner's list. Returns how many blocks came back, or
 * HK_COLLECT_RECLAIMED (nothing changed) if the page was reclaimed. The remote stack
 * is linked exactly like the owner's list (same key, same end), so when the
 * owner's list is empty it becomes the list as it is: no walk over the
 * blocks, whose cache lines are likely in another core's cache. */
uint32_t hk_page_collect(hk_page *page, unsigned new_state) {
  uintptr_t key = page->key;
  uintptr_t old = hk_load_relaxed(&page->remote);
  do {
    /* a remote freer gave the page back (remote.c): the owner re-initialises it */
    if ((old & HK_REMOTE_STATE_MASK) == HK_PAGE_RECLAIMED) return HK_COLLECT_RECLAIMED;
  } while (!atomic_compare_exchange_weak_explicit(&page->remote, &old, (uintptr_t)new_state,
                                                  memory_order_acq_rel, memory_order_relaxed));
  hk_block *list = (hk_block *)(old & HK_REMOTE_PTR_MASK);
  uint32_t count = (uint32_t)(old >> HK_REMOTE_COUNT_SHIFT);
  if (list == NULL) return 0;
  if (HK_UNLIKELY(count > hk_page_used(page) || count == 0)) hk_fatal("free list corrupted (double free or heap overflow)", list);
  if (!hk_list_end(page->free)) {
    /* append the owner's list after the stack's last block (each link
     * checked before it is followed: the stack ends after `count` blocks) */
    hk_block *tail = list;
    for (uint32_t i = 1; i < count; i++) {
      tail = hk_link_next(tail, key);
      if (HK_UNLIKELY(!hk_list_head_ok(page, tail)))
        hk_fatal("free list corrupted (a block freed by another thread was written: a use after free, or an overflow)", tail);
    }
    hk_link_set(tail, page->free, key);
  }
  page->free = list;
  page->used -= count;
  return count;
}
