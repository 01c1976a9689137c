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

/* ln(c) and 1/c for c = 1 + i/32, i = 0..32 */
static const double LN_STEP[33][2] = {
  {0, 1}, /* 32/32 */
  {0x1.f829b0e783300p-6, 0x1.f07c1f07c1f08p-1}, /* 33/32 */
  {0x1.f0a30c01162a6p-5, 0x1.e1e1e1e1e1e1ep-1}, /* 34/32 */
  {0x1.6f0d28ae56b4cp-4, 0x1.d41d41d41d41dp-1}, /* 35/32 */
  {0x1.e27076e2af2e6p-4, 0x1.c71c71c71c71cp-1}, /* 36/32 */
  {0x1.29552f81ff523p-3, 0x1.bacf914c1bad0p-1}, /* 37/32 */
  {0x1.5ff3070a793d4p-3, 0x1.af286bca1af28p-1}, /* 38/32 */
  {0x1.9525a9cf456b4p-3, 0x1.a41a41a41a41ap-1}, /* 39/32 */
  {0x1.c8ff7c79a9a22p-3, 0x1.999999999999ap-1}, /* 40/32 */
  {0x1.fb9186d5e3e2bp-3, 0x1.8f9c18f9c18fap-1}, /* 41/32 */
  {0x1.1675cababa60ep-2, 0x1.8618618618618p-1}, /* 42/32 */
  {0x1.2e8e2bae11d31p-2, 0x1.7d05f417d05f4p-1}, /* 43/32 */
  {0x1.4618bc21c5ec2p-2, 0x1.745d1745d1746p-1}, /* 44/32 */
  {0x1.5d1bdbf5809cap-2, 0x1.6c16c16c16c17p-1}, /* 45/32 */
  {0x1.739d7f6bbd007p-2, 0x1.642c8590b2164p-1}, /* 46/32 */
  {0x1.89a3386c1425bp-2, 0x1.5c9882b931057p-1}, /* 47/32 */
  {0x1.9f323ecbf984cp-2, 0x1.5555555555555p-1}, /* 48/32 */
  {0x1.b44f77bcc8f63p-2, 0x1.4e5e0a72f0539p-1}, /* 49/32 */
  {0x1.c8ff7c79a9a22p-2, 0x1.47ae147ae147bp-1}, /* 50/32 */
  {0x1.dd46a04c1c4a1p-2, 0x1.4141414141414p-1}, /* 51/32 */
  {0x1.f128f5faf06edp-2, 0x1.3b13b13b13b14p-1}, /* 52/32 */
  {0x1.02552a5a5d0ffp-1, 0x1.3521cfb2b78c1p-1}, /* 53/32 */
  {0x1.0be72e4252a83p-1, 0x1.2f684bda12f68p-1}, /* 54/32 */
  {0x1.154c3d2f4d5eap-1, 0x1.29e4129e4129ep-1}, /* 55/32 */
  {0x1.1e85f5e7040d0p-1, 0x1.2492492492492p-1}, /* 56/32 */
  {0x1.2795e1289b11bp-1, 0x1.1f7047dc11f70p-1}, /* 57/32 */
  {0x1.307d7334f10bep-1, 0x1.1a7b9611a7b96p-1}, /* 58/32 */
  {0x1.393e0d3562a1ap-1, 0x1.15b1e5f75270dp-1}, /* 59/32 */
  {0x1.41d8fe84672aep-1, 0x1.1111111111111p-1}, /* 60/32 */
  {0x1.4a4f85db03ebbp-1, 0x1.0c9714fbcda3bp-1}, /* 61/32 */
  {0x1.52a2d265bc5abp-1, 0x1.0842108421084p-1}, /* 62/32 */
  {0x1.5ad404c359f2dp-1, 0x1.0410410410410p-1}, /* 63/32 */
  {0x1.62e42fefa39efp-1, 0x1.0000000000000p-1}, /* 64/32 */
};

/* -ln(u) for u uniform in (0, 1), from the top 53 bits of r, within 1e-9
 * (the library links no libm): u = 2^e x with x in [1, 2), and ln(x) =
 * ln(c) + ln(1 + t), t = x / c - 1, where c is the nearest of the 33 steps
 * 1 + i/32 (so |t| <= 1/64) and ln(1 + t) is its series to t^4. The steps
 * include both ends, so that u near 1 (x near 2) comes out as the small
 * positive number it is. No division and no branch: a sample's draw is on
 * the profiler's path. */
HK_INLINE double neg_log_uniform(uint64_t r) {
  uint64_t m = (r >> 11) | 1; /* u = m / 2^53 */
  int z = __builtin_clzll(m), e = 63 - z - 53; /* m = 2^(e + 53) (1 + frac / 2^52) */
  uint64_t frac = (m << z) << 1 >> 12;
  uint64_t bits = frac | 0x3ffull << 52;
  double x;
  memcpy(&x, &bits, sizeof x);
  const double *step = LN_STEP[(frac + ((uint64_t)1 << 46)) >> 47];
  double t = x * step[1] - 1;
  double ln1t = t * (1 + t * (-0.5 + t * (1.0 / 3 + t * -0.25)));
  return -((double)e * 0x1.62e42fefa39efp-1 + step[0] + ln1t);
}
double hk_neg_log_uniform(uint64_t r) { return neg_log_uniform(r); }

/* A gap drawn from the exponential distribution of mean `mean`, from the
 * thread's own generator: the bytes to the next heap-profile sample. */
uint64_t hk_random_gap(uint64_t mean) {
  static __thread uint64_t rng __attribute__((tls_model("initial-exec")));
  if (rng == 0) rng = hk_derive_key((uint64_t)(uintptr_t)&rng, hk_os_now_ms()) | 1; /* (xorshift: not 0) */
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  /* (signed conversions: one instruction each, where unsigned ones take
   * several; the mean and the gap are below 2^62) */
  double gap = neg_log_uniform(rng * 0x2545F4914F6CDD1Dull) * (double)(int64_t)mean;
  return gap < 1 ? 1 : gap >= 0x1p61 ? (uint64_t)1 << 61 : (uint64_t)(int64_t)gap;
}
