/* Hardened mode (HAKMEM_SECURE=1, or 2 for zero-on-free): the checks that
 * the default mode does without. Its blocks carry a canary and a size
 * trailer (secure.h); large blocks get guard pages instead (large.c).
 * The default fast paths do not serve hardened mode, without a test of
 * their own: its heaps stay in cache mode (free_owner), which sends malloc
 * to hk_malloc_cached and on to hk_secure_malloc, and its pages' owners are
 * tagged (hk_owner_tag), which sends free to the cache's path and on to
 * secure_free (remote.c). Its classes' direct pages are the empty page
 * and its caches hold nothing, so any other way in ends there too. */
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

/* Hardened malloc: the head of the class's current page's list, checked
 * as hk_heap_alloc checks it; the slow path for everything else (no
 * current page or no heap yet, the list ended, blocks stashed, a large
 * request, zero mode's check). */
void *hk_secure_malloc(size_t size, hk_heap *h) {
  if (HK_UNLIKELY(size > HK_MEDIUM_MAX - HK_SECURE_EXTRA || hk_secure_zero)) return hk_malloc_slow(size, h);
  hk_page *page = h->queues[hk_size_class(size + HK_SECURE_EXTRA)].first;
  if (HK_UNLIKELY(page == NULL || !hk_list_head_ok(page, page->free))) return hk_malloc_slow(size, h);
  hk_block *b = hk_page_pop(page);
  hk_secure_take(page, b);
  hk_secure_mark(page, b, size);
  return b;
}

/* The first word of a block in the quarantine: secret (the page key), and
 * different for every block. */
static uintptr_t quarantine_tag(const hk_page *page, const hk_block *b) {
  return ~hk_secure_mix(page, b);
}

/* A block leaves the quarantine for its page's free list: its first word
 * must be as the quarantine left it (a write after free would be lost
 * under the link written now). */
static void quarantine_out(hk_heap *h, hk_page *page, hk_block *b) {
  if (HK_UNLIKELY(b->link != quarantine_tag(page, b)))
    hk_fatal("write after free detected (a freed block was modified)", b);
  if (hk_page_push(page, b, page->key)) hk_heap_page_emptied(h, page);
}

/* A block the thread freed (checked, and no longer live in the block map)
 * waits in its heap's quarantine, in a random one of its HK_QUARANTINE
 * slots, and the block it displaces goes back to its page: a freed block
 * is not the next one handed out, and when it comes back is random. A
 * double free of a waiting block is found in the block map as any other,
 * and a write into its first word when it leaves. Blocks above
 * HK_QUARANTINE_BLOCK_MAX go back at once: the quarantine holds the
 * blocks, and keeps their pages from emptying. */
void hk_secure_quarantine(hk_heap *h, hk_page *page, hk_block *b) {
  b->link = quarantine_tag(page, b);
  uint64_t x = h->quarantine_rng;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  h->quarantine_rng = x;
  unsigned i = (unsigned)(x >> 32) & (HK_QUARANTINE - 1);
  hk_block *out = h->quarantine[i];
  hk_page *out_page = h->quarantine_page[i];
  h->quarantine[i] = b;
  h->quarantine_page[i] = page;
  if (out != NULL) quarantine_out(h, out_page, out);
}

/* Every waiting block back to its page (thread exit, malloc_trim). */
void hk_secure_quarantine_flush(hk_heap *h) {
  for (unsigned i = 0; i < HK_QUARANTINE; i++) {
    hk_block *b = h->quarantine[i];
    if (b == NULL) continue;
    h->quarantine[i] = NULL;
    quarantine_out(h, h->quarantine_page[i], b);
  }
}

/* A page's span goes back to being unused with every bit of its blocks
 * clear: its blocks all came back through free or hk_secure_collect, which
 * clear them. The one exception is a page given back by the thread that
 * freed its last block (remote.c, try_reclaim), whose remote stack was
 * never collected: its owner clears it here before it sets it up again. */
void hk_secure_clear_span(const hk_page *page) {
  size_t first = (hk_page_span_start(page) & HK_REGION_MASK) >> 10, words = hk_page_span_bytes(page) >> 10;
  _Atomic uint64_t *map = hk_page_region(page)->block_map;
  for (size_t i = first; i < first + words; i++) {
    hk_store_relaxed(&map[i], 0);
    hk_store_relaxed(&map[HK_BLOCK_MAP_WORDS + i], 0);
  }
}

#ifdef HAKMEM_DEBUG
void hk_secure_assert_clear(const hk_page *page) {
  size_t first = (hk_page_span_start(page) & HK_REGION_MASK) >> 10, words = hk_page_span_bytes(page) >> 10;
  _Atomic uint64_t *map = hk_page_region(page)->block_map;
  for (size_t i = first; i < first + words; i++)
    hk_assert(hk_load_relaxed(&map[i]) == 0 && hk_load_relaxed(&map[HK_BLOCK_MAP_WORDS + i]) == 0);
}
#endif

/* The owner took the page's remote stack, `list`, of `count` blocks: each
 * link must lead to a carved block of the page that another thread freed
 * once, and the stack must end after `count` blocks. They are free blocks
 * of the owner's from now on. Returns the stack's last block. */
hk_block *hk_secure_collect(hk_page *page, hk_block *list, uint32_t count) {
  hk_block *b = list, *last = list;
  for (uint32_t i = 0; i < count; i++) {
    if (HK_UNLIKELY(!hk_list_head_ok(page, b)))
      hk_fatal("free list corrupted (a block freed by another thread was written: a use after free, or an overflow)", b);
    hk_block_bit m = hk_block_bit_of(page, b);
    uint64_t live = hk_load_relaxed(m.live);
    if (HK_UNLIKELY((live & hk_load_relaxed(m.remote) & m.bit) == 0))
      hk_fatal("free list corrupted (a block freed by another thread is not in use: a double free)", b);
    hk_store_relaxed(m.live, live & ~m.bit);
    atomic_fetch_and_explicit(m.remote, ~m.bit, memory_order_relaxed);
    last = b;
    b = hk_link_next(b, page->key);
  }
  if (HK_UNLIKELY(!hk_list_end(b)))
    hk_fatal("free list corrupted (a block freed by another thread was written: a use after free, or an overflow)", last);
  return last;
}

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
