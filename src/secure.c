/* Hardened mode (HAKMEM_SECURE=1, or 2 for zero-on-free): the checks that
 * the default mode does without, at the level of a page (its malloc is
 * in thread.c, its free and quarantine in remote.c). Its blocks carry a
 * canary and a size trailer (secure.h); large blocks get guard pages
 * instead (large.c).
 * The default fast paths do not serve hardened mode, without a test of
 * their own: its heaps stay in cache mode (free_owner, and the thread's
 * budget shut), which sends malloc through hk_malloc_cached to
 * hk_secure_malloc, and its pages' owners are
 * tagged (hk_owner_tag), which sends free to the cache's path and on to
 * hk_secure_free (remote.c); a build hardened by default calls both from
 * its fast paths (fastpath.h). Its stash holds nothing, and its thread
 * cache only blocks that hk_secure_malloc alone takes (remote.c), so no
 * other way hands out a block unmarked. */
#include "internal.h"
#include "secure.h"

#include <string.h>

/* Zero mode: free zeroed the block but its link word, which malloc just
 * cleared; anything else written since is a write after free. */
static HK_NOINLINE void check_zeroed(hk_page *page, hk_block *b) {
  const char *p = (const char *)b;
  for (uint32_t i = 8; i < page->block_size; i++)
    if (p[i] != 0) hk_fatal("write after free detected (a freed block was modified)", p + i);
}

void hk_secure_on_alloc(hk_page *page, hk_block *b, size_t size) {
  hk_secure_take(page, b);
  if (hk_secure_zero) check_zeroed(page, b);
  hk_secure_mark(page, b, size);
}

/* Every bit of the page's span cleared: the pages of a destroyed heap,
 * whose blocks may still be live, go back to being unused (secure.h). */
void hk_secure_clear_span(const hk_page *page) {
  size_t first = (hk_page_span_start(page) & HK_REGION_MASK) >> 10, words = hk_page_span_bytes(page) >> 10;
  _Atomic uint64_t *map = hk_page_region(page)->block_map;
  for (size_t i = first; i < first + words; i++) {
    hk_store_relaxed(&map[2 * i], 0); /* (live and remote alternate: secure.h) */
    hk_store_relaxed(&map[2 * i + 1], 0);
  }
}

#ifdef HAKMEM_DEBUG
void hk_secure_assert_clear(const hk_page *page) {
  size_t first = (hk_page_span_start(page) & HK_REGION_MASK) >> 10, words = hk_page_span_bytes(page) >> 10;
  _Atomic uint64_t *map = hk_page_region(page)->block_map;
  for (size_t i = first; i < first + words; i++)
    hk_assert(hk_load_relaxed(&map[2 * i]) == hk_load_relaxed(&map[2 * i + 1]));
}
#endif

void hk_secure_set_size(hk_page *page, hk_block *b, size_t size) { hk_secure_mark(page, b, size); }

size_t hk_secure_size(hk_page *page, hk_block *b) { return hk_secure_size_of(page, b); }

/* Carve n blocks in a random order: a random start and a random stride
 * coprime with n visit every block once. In zero mode the blocks are zeroed
 * first (the span may have served another class). */
void hk_secure_shuffle_extend(hk_page *page, uint32_t n) {
  static __thread uint64_t rng __attribute__((tls_model("initial-exec")));
  uint32_t bs = page->block_size;
  char *base = (char *)page->start + (size_t)page->capacity * bs;
  if (hk_secure_zero) memset(base, 0, (size_t)n * bs);
  static __thread uint64_t seeds __attribute__((tls_model("initial-exec")));
  if (rng == 0) rng = hk_derive_key((uint64_t)(uintptr_t)&rng, ++seeds) | 1; /* (the thread's own variable) */
  rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
  uint32_t start = (uint32_t)(rng % n), stride = n > 1 ? 1 + (uint32_t)((rng >> 32) % (n - 1)) : 1;
  for (;;) { /* gcd(stride, n) == 1 */
    uint32_t a = stride, m = n;
    while (m) { uint32_t t = a % m; a = m; m = t; }
    if (a == 1) break;
    stride = stride + 1 < n ? stride + 1 : 1;
  }
  hk_block *first = (hk_block *)(base + (size_t)start * bs), *prev = first;
  uint32_t idx = start;
  for (uint32_t i = 1; i < n; i++) {
    idx += stride; /* (mod n: both are below n) */
    if (idx >= n) idx -= n;
    hk_block *cur = (hk_block *)(base + (size_t)idx * bs);
    hk_link_set(prev, cur, page->key);
    prev = cur;
  }
  hk_link_set(prev, page->free, page->key);
  page->free = first;
  page->capacity += n;
  hk_page_set_carved(page);
}
