/* Keys: the process's secret, and the keys derived from it.
 *
 * Every key hakmem writes into user memory (a page's key, in its free
 * list's links; a heap's list key, in its thread cache's and stash's links)
 * comes from a 128-bit secret by SipHash-1-3 (Aumasson and Bernstein): a
 * heap's directly, a page's through its thread's page seed (hk_page_key).
 * The secret itself is stored nowhere else, so a key learnt from a freed
 * block says nothing about the secret or about another thread's keys. */
#include "internal.h"

uintptr_t hk_key, hk_key2;

/* Read once, at initialisation. Never made from a clock: with no random
 * source, the keys would be guessable, so hakmem says so and stops. */
void hk_keys_init(void) {
  uint64_t a, b;
  if (!hk_os_random(&a) || !hk_os_random(&b))
    hk_fatal("no random source for its keys (getrandom and /dev/urandom both failed)", NULL);
  hk_key = (uintptr_t)a;
  hk_key2 = (uintptr_t)b;
}

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
  do {                                                                                             \
    v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                      \
    v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                         \
    v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                         \
    v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                      \
  } while (0)

/* SipHash-1-3 of the 16 bytes (a, b) under the secret; bits 48-63 of the
 * result are at least 0x100 (see hk_looks_free). */
uintptr_t hk_derive_key(uint64_t a, uint64_t b) {
  uint64_t k0 = hk_key, k1 = hk_key2;
  uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
  uint64_t m[3] = {a, b, (uint64_t)16 << 56};
  for (int i = 0; i < 3; i++) {
    v3 ^= m[i];
    SIPROUND;
    v0 ^= m[i];
  }
  v2 ^= 0xff;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  uint64_t v = v0 ^ v1 ^ v2 ^ v3;
  if ((v >> 48) < 0x100) v |= (uint64_t)0xa5c3 << 48;
  return (uintptr_t)v;
}


/* The keys of a heap's cache and stash links (hk_cache_link): list_add in
 * [2^62, 2^63), list_mul odd, list_inv its inverse mod 2^64 (Newton's
 * iteration doubles the correct low bits from the 3 every odd number has:
 * five steps reach 96). */
void hk_derive_list_keys(uint64_t a, uint64_t b, uintptr_t *add, uintptr_t *mul, uintptr_t *inv) {
  *add = (hk_derive_key(a, b) & ~((uint64_t)1 << 63)) | (uint64_t)1 << 62;
  uint64_t m = hk_derive_key(~a, b) | 1, x = m;
  for (int i = 0; i < 5; i++) x *= 2 - m * x;
  *mul = m;
  *inv = x;
}

/* The high and low halves of a * b, XOR-ed: neither invertible nor linear. */
static inline uint64_t fold(uint64_t a, uint64_t b) {
  unsigned __int128 r = (unsigned __int128)a * b;
  return (uint64_t)r ^ (uint64_t)(r >> 64);
}

/* A page's key: two multiply-folds of the page record's address and a
 * per-thread counter under the thread's 128-bit page seed, which is
 * SipHash-1-3 of the secret and a process-wide thread number. A span
 * starts serving a class at every hk_page_init, so a key is made often
 * (every large-block malloc that misses the caches): a dozen instructions
 * instead of SipHash's hundred. Keys of different threads are independent;
 * one thread's keys share its seed, which the folds hide from a reader of
 * a few keys, though without a proof. Bits 48-63 are at least 0x100, as
 * hk_derive_key's. */
uintptr_t hk_page_key(uint64_t page) {
  static __thread uint64_t seed0 __attribute__((tls_model("initial-exec")));
  static __thread uint64_t seed1 __attribute__((tls_model("initial-exec")));
  static __thread uint64_t counter __attribute__((tls_model("initial-exec")));
  static _Atomic uint64_t threads;
  if (HK_UNLIKELY(seed0 == 0)) {
    uint64_t t = hk_add_relaxed(&threads, 1);
    seed1 = hk_derive_key(t, 0x7061676573656564ull);  /* "pageseed" */
    seed0 = hk_derive_key(t, ~0x7061676573656564ull); /* never 0: its top bits are set */
  }
  uint64_t c = ++counter;
  uint64_t v = fold(page ^ seed0, c ^ seed1);
  v = fold(v ^ seed1, c ^ seed0 ^ 0x9e3779b97f4a7c15ull);
  if ((v >> 48) < 0x100) v |= (uint64_t)0xa5c3 << 48;
  return (uintptr_t)v;
}

/* -ln(u) for u uniform in (0, 1], from the top 53 bits of r, within 1e-4:
 * the exponent from the bit length, ln(1 + f) of the rest by a short
 * series (the library links no libm). */
static double neg_log_uniform(uint64_t r) {
  uint64_t m = (r >> 11) | 1; /* in (0, 2^53) */
  int e = 63 - __builtin_clzll(m); /* m = 2^e (1 + f) */
  double f = (double)(m - ((uint64_t)1 << e)) / (double)((uint64_t)1 << e);
  double t = f / (2 + f), t2 = t * t; /* ln(1 + f) = 2 atanh(t) */
  double ln1f = 2 * t * (1 + t2 * (1.0 / 3 + t2 * (1.0 / 5 + t2 * (1.0 / 7 + t2 / 9))));
  return -((e - 53) * 0.6931471805599453 + ln1f);
}

/* A gap drawn from the exponential distribution of mean `mean`, from the
 * thread's own generator: the bytes to the next heap-profile sample. */
uint64_t hk_random_gap(uint64_t mean) {
  static __thread uint64_t rng __attribute__((tls_model("initial-exec")));
  if (rng == 0) rng = hk_derive_key((uint64_t)(uintptr_t)&rng, hk_os_now_ms()) | 1; /* (xorshift: not 0) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  double gap = neg_log_uniform(rng * 0x2545F4914F6CDD1Dull) * (double)mean;
  return gap < 1 ? 1 : gap >= (double)((uint64_t)1 << 61) ? (uint64_t)1 << 61 : (uint64_t)gap;
}
