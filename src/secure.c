/* Hardened mode (HAKMEM_SECURE=1, or 2 for zero-on-free): checks that cost
 * too much to run on every allocation by default. All of it runs in slow
 * paths; see the note at hk_secure in internal.h for how the fast paths are
 * bypassed without a test.
 *
 * Block layout in hardened mode (small and medium blocks):
 *   [ user data: size bytes ][ canary: up to 32 bytes ][ unused ][ trailer: size ^ key ^ address ]
 * The class is chosen for size + HK_SECURE_EXTRA, so at least one canary
 * byte follows the data: a one-byte overflow is caught when the block is
 * freed. Large blocks get guard pages instead (large.c). */
#include "internal.h"

#include <string.h>


static uint8_t canary_byte(const hk_page *page, const hk_block *b) {
  return (uint8_t)((((uintptr_t)b ^ page->key) >> 17) | 1);
}

static uintptr_t trailer_code(const hk_page *page, const hk_block *b) { return page->key ^ (uintptr_t)b ^ 0x5bd1e995u; }

void hk_secure_on_alloc(hk_page *page, hk_block *b, size_t size) {
  char *p = (char *)b;
  uint32_t bs = page->block_size;
  if (hk_secure_zero) {
    /* free zeroed everything but the link word, which malloc just cleared */
    for (uint32_t i = 8; i < bs; i++)
      if (p[i] != 0) hk_fatal("write after free detected (a freed block was modified)", p + i);
  }
  hk_secure_set_size(page, b, size);
}

/* Bytes of canary written and checked after the data: enough to catch an
 * overflow by a few bytes; the rest of a block's slack is not checked, so
 * a 72 KiB block holding 64 KiB costs no 8 KiB scan. */
#define CANARY_MAX 32

static size_t canary_len(uint32_t bs, size_t size) {
  size_t room = bs - 8 - size;
  return room < CANARY_MAX ? room : CANARY_MAX;
}

/* Canary after `size` bytes, trailer with the size (also for realloc in place). */
void hk_secure_set_size(hk_page *page, hk_block *b, size_t size) {
  char *p = (char *)b;
  uint32_t bs = page->block_size;
  size_t len = canary_len(bs, size);
  uint64_t word = 0x0101010101010101ull * canary_byte(page, b);
  /* the canary is one byte repeated, so any 8-byte window of it is `word`:
   * whole words, the last one overlapping the one before */
  if (len >= 8) {
    for (size_t i = 0; i + 8 < len; i += 8) memcpy(p + size + i, &word, 8);
    memcpy(p + size + len - 8, &word, 8);
  } else {
    memset(p + size, (int)(word & 0xff), len);
  }
  uintptr_t t = (uintptr_t)size ^ trailer_code(page, b);
  memcpy(p + bs - 8, &t, sizeof t);
}

/* The requested size recorded in the trailer. */
size_t hk_secure_size(hk_page *page, hk_block *b) {
  uintptr_t t;
  uint32_t bs = page->block_size;
  memcpy(&t, (char *)b + bs - 8, sizeof t);
  size_t size = t ^ trailer_code(page, b);
  if (size > bs - HK_SECURE_EXTRA) hk_fatal("heap buffer overflow detected (block trailer overwritten)", b);
  return size;
}

void hk_secure_check_free(hk_page *page, hk_block *b) {
  size_t size = hk_secure_size(page, b);
  const unsigned char *p = (const unsigned char *)b + size;
  size_t len = canary_len(page->block_size, size);
  uint64_t word = 0x0101010101010101ull * canary_byte(page, b), w;
  bool bad = false;
  if (len >= 8) { /* whole words, the last one overlapping (see hk_secure_set_size) */
    for (size_t i = 0; i + 8 < len; i += 8) {
      memcpy(&w, p + i, 8);
      bad |= w != word;
    }
    memcpy(&w, p + len - 8, 8);
    bad |= w != word;
  } else {
    for (size_t i = 0; i < len; i++) bad |= p[i] != (unsigned char)word;
  }
  if (bad) hk_fatal("heap buffer overflow detected (canary after the block overwritten)", p);
  if (hk_secure_zero) memset(b, 0, page->block_size);
}

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
    idx = (uint32_t)(((uint64_t)idx + stride) % n);
    hk_block *cur = (hk_block *)(base + (size_t)idx * bs);
    hk_link_set(prev, cur, page->key);
    prev = cur;
  }
  hk_link_set(prev, page->free, page->key);
  page->free = first;
  page->capacity += n;
  hk_page_set_carved(page);
}
