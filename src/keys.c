/* Keys: the process's secret, and the keys derived from it.
 *
 * Every key hakmem writes into user memory (a page's key, in its free
 * list's links; a heap's list key, in its thread cache's and stash's links)
 * comes from a 128-bit secret by SipHash-1-3 (Aumasson and Bernstein): a
 * heap's directly, a page's through its thread's page seed (hk_page_key).
 * The secret itself is stored nowhere else, so a key learnt from a freed
 * block says nothing about the secret or about another thread's keys. */
#include "internal.h"

#include <string.h>

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

/* -ln(u) for u uniform in (0, 1), from the top 53 bits of r, within 1e-8
 * (the library links no libm): u = 2^e x with x in [sqrt(1/2), sqrt(2)),
 * x built from u's bits, and ln(x) = t p(t), t = x - 1, where p is a
 * polynomial of degree 8 fitted at Chebyshev nodes of that interval. No
 * division and no branch: a sample's draw is on the profiler's path. */
static double neg_log_uniform(uint64_t r) {
  uint64_t m = (r >> 11) | 1; /* u = m / 2^53 */
  int z = __builtin_clzll(m), e = 63 - z - 53; /* m = 2^(e + 53) (1 + frac / 2^52) */
  uint64_t frac = (m << z) << 1 >> 12;
  uint64_t high = frac >= 0x6a09e667f3bcdull; /* 1 + frac / 2^52 >= sqrt(2): halve it */
  uint64_t bits = frac | (0x3ffull - high) << 52;
  double x;
  memcpy(&x, &bits, sizeof x);
  double t = x - 1;
  double p = 0.08533313081208015;
  p = p * t - 0.14269258205119506;
  p = p * t + 0.1497740128028464;
  p = p * t - 0.16577992896969204;
  p = p * t + 0.19955933358385677;
  p = p * t - 0.25001352185488634;
  p = p * t + 0.333341932861348;
  p = p * t - 0.4999999638212397;
  p = p * t + 0.9999999741310671;
  return -((double)(e + (int)high) * 0.6931471805599453 + t * p);
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
