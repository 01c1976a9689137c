/* Hardened mode's block layout (HAKMEM_SECURE >= 1), inline for its malloc
 * and free paths (secure.c, remote.c).
 *
 * A small or medium block in hardened mode:
 *   [ user data: size bytes ][ canary: 8 bytes ][ unused ][ trailer: size ^ code ]
 * The class is chosen for size + HK_SECURE_EXTRA, so the whole canary and
 * the trailer always fit. The canary is a per-block secret (the page key
 * and the block's address, mixed) whose first byte is zero: a string
 * function reading past the data stops at it, so it neither leaks the
 * secret nor copies it, and an overflow that writes anything but that one
 * zero byte changes it. free and realloc check it; malloc writes it. */
#ifndef HK_SECURE_H
#define HK_SECURE_H

#include "internal.h"

#include <string.h>

/* A block's secret: its address and the page key in a 64 x 64 -> 128-bit
 * product, the halves folded. Not invertible as a multiply by a constant
 * would be: a canary read back does not hand over the page key, which also
 * encodes the page's free list. */
HK_INLINE uintptr_t hk_secure_mix(const hk_page *page, const hk_block *b) {
  unsigned __int128 m = (unsigned __int128)((uintptr_t)b ^ page->key) * (page->key | 1);
  return (uintptr_t)m ^ (uintptr_t)(m >> 64);
}

/* The canary's 8 bytes as one word, the byte at the lowest address zero
 * (mix: the block's hk_secure_mix) */
HK_INLINE uint64_t hk_secure_canary_of(uintptr_t mix) {
  uint64_t w = (uint64_t)mix & ~(uint64_t)0xff; /* (little-endian: the first byte) */
#if __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  w = __builtin_bswap64(w);
#endif
  return w;
}
HK_INLINE uint64_t hk_secure_canary(const hk_page *page, const hk_block *b) {
  return hk_secure_canary_of(hk_secure_mix(page, b));
}

/* The trailer's code: the size is stored XOR-ed with it, so a trailer
 * overwritten with anything the program could pick decodes to an
 * impossible size with odds of about 1 - bs / 2^64. A function of the
 * block's secret alone: the program can read its block's canary and
 * trailer, and a code with the page key in it would give the key away
 * (test_hardened_canary_key). */
HK_INLINE uintptr_t hk_secure_trailer_code_of(uintptr_t mix) { return mix ^ 0x5bd1e995u; }
HK_INLINE uintptr_t hk_secure_trailer_code(const hk_page *page, const hk_block *b) {
  return hk_secure_trailer_code_of(hk_secure_mix(page, b));
}

/* Canary after `size` bytes and the trailer (on malloc, and on a realloc
 * in place before the data grows or shrinks across the old canary); mix:
 * the block's hk_secure_mix. */
HK_INLINE void hk_secure_mark_mixed(hk_page *page, hk_block *b, size_t size, uintptr_t mix) {
  uint64_t canary = hk_secure_canary_of(mix);
  uintptr_t trailer = (uintptr_t)size ^ hk_secure_trailer_code_of(mix);
  memcpy((char *)b + size, &canary, sizeof canary);
  memcpy((char *)b + page->block_size - sizeof trailer, &trailer, sizeof trailer);
}
HK_INLINE void hk_secure_mark(hk_page *page, hk_block *b, size_t size) {
  hk_secure_mark_mixed(page, b, size, hk_secure_mix(page, b));
}

/* The requested size a live block's trailer records; aborts if the trailer
 * was overwritten. */
HK_INLINE size_t hk_secure_size_of(const hk_page *page, const hk_block *b) {
  uintptr_t t;
  memcpy(&t, (const char *)b + page->block_size - sizeof t, sizeof t);
  size_t size = t ^ hk_secure_trailer_code(page, b);
  if (HK_UNLIKELY(size > page->block_size - HK_SECURE_EXTRA))
    hk_fatal("heap buffer overflow detected (block trailer overwritten)", b);
  return size;
}

/* The trailer and the canary of a block about to be freed are intact.
 * Returns the block's secret (hk_secure_mix), which the checks computed. */
HK_INLINE uintptr_t hk_secure_check(const hk_page *page, const hk_block *b) {
  size_t size = hk_secure_size_of(page, b);
  uint64_t w;
  memcpy(&w, (const char *)b + size, sizeof w);
  if (HK_UNLIKELY(w != hk_secure_canary(page, b)))
    hk_fatal("heap buffer overflow detected (canary after the block overwritten)", (const char *)b + size);
  return hk_secure_mix(page, b);
}

/* ---- the block map ----
 * Two bitmaps per small region, mapped apart from it (region.c), with a
 * bit per 16 bytes: a block's bit is that of its first 16 bytes. Their
 * words alternate (live, remote, live, ...), so that malloc's and free's
 * test of both reads one cache line. What a program writes through a
 * pointer into the region never reaches them, so a double free is found
 * whatever was written into the freed block.
 *   live:    flipped by the page's owner as it hands a block out and as it
 *            frees it, plainly; read by any thread.
 *   remote:  flipped by another thread as it frees a block (and as it
 *            takes one it freed back from its cache: hk_secure_cache_pop),
 *            with an atomic XOR, so that of two threads freeing one block
 *            at once, one sees the other's flip.
 * A block is live while its two bits differ, free while they are equal: a
 * free by another thread makes a block free at once, and its owner takes
 * it back from the remote stack without touching its bits (page.c,
 * hk_page_collect). Every bit of a span no page uses has its two bits
 * equal (its blocks were all freed; hk_secure_clear_span for the pages of
 * a destroyed heap), so a page set up there, whatever its class, starts
 * with none of its blocks live. */
/* Flip `bit` (a single bit) of *w atomically; returns its value before.
 * (Written so that GCC makes it one `lock btc` on x86-64, where a fetch_xor
 * whose whole result is used is a compare-and-swap loop: a contended line
 * then moves twice, to be read and to be written.) */
HK_INLINE bool hk_flip_bit(_Atomic uint64_t *w, uint64_t bit, memory_order order) {
  return (atomic_fetch_xor_explicit(w, bit, order) & bit) != 0;
}

typedef struct hk_block_bit {
  _Atomic uint64_t *live, *remote; /* the block's words in the two maps */
  uint64_t bit;
} hk_block_bit;

HK_INLINE hk_block_bit hk_block_bit_of(const hk_page *page, const hk_block *b) {
  /* (the pair's byte offset, b's region offset / 1024 * 16, in a shift and a mask) */
  uintptr_t off = ((uintptr_t)b >> 6) & ((HK_BLOCK_MAP_WORDS - 1) * 16);
  char *map = (char *)hk_page_region(page)->block_map + off;
  return (hk_block_bit){(_Atomic uint64_t *)map, (_Atomic uint64_t *)(map + 8), (uint64_t)1 << (((uintptr_t)b >> 4) & 63)};
}

/* Handed out and not freed since (by its owner or by another thread). */
HK_INLINE bool hk_secure_live(const hk_page *page, const hk_block *b) {
  hk_block_bit m = hk_block_bit_of(page, b);
  return ((hk_load_relaxed(m.live) ^ hk_load_relaxed(m.remote)) & m.bit) != 0;
}

/* The owner hands b out: it must be free (else a list led to it wrongly:
 * a link was overwritten, or the block was freed twice). */
HK_INLINE void hk_secure_take(const hk_page *page, const hk_block *b) {
  hk_block_bit m = hk_block_bit_of(page, b);
  uint64_t live = hk_load_relaxed(m.live);
  if (HK_UNLIKELY(((live ^ hk_load_relaxed(m.remote)) & m.bit) != 0))
    hk_fatal("free list corrupted (it leads to a block in use: a double free, or a write after free)", b);
  hk_store_relaxed(m.live, live ^ m.bit);
}

/* The owner frees b: it must be live. */
HK_INLINE void hk_secure_give(const hk_page *page, const hk_block *b) {
  hk_block_bit m = hk_block_bit_of(page, b);
  uint64_t live = hk_load_relaxed(m.live);
  if (HK_UNLIKELY(((live ^ hk_load_relaxed(m.remote)) & m.bit) == 0)) hk_fatal("double free detected", b);
  hk_store_relaxed(m.live, live ^ m.bit);
}

/* Another thread frees b (any thread but the owner: the page may have
 * none). */
HK_INLINE void hk_secure_give_remote(const hk_page *page, const hk_block *b) {
  hk_block_bit m = hk_block_bit_of(page, b);
  bool remote = hk_flip_bit(m.remote, m.bit, memory_order_acq_rel);
  if (HK_UNLIKELY(remote == ((hk_load_acquire(m.live) & m.bit) != 0)))
    hk_fatal("double free detected (block freed again by another thread)", b);
}

#endif /* HK_SECURE_H */
