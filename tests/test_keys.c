/* test_keys: the keys that hakmem writes into freed blocks (page keys,
 * heaps' list keys) are derived from the process's 128-bit secret by
 * SipHash-1-3, a page's through its thread's seed (src/keys.c), so that a
 * key read out of a freed block tells nothing about the secret, and
 * nothing evident about any other key.
 *
 * Checked here: the secret is set and is not itself a key; derived keys
 * keep bits 48-63 at 0x100 or more (hk_looks_free relies on it); no two of
 * 200,000 inputs give the same key; flipping one input bit changes about
 * half of the output bits (a weak mixer such as a XOR with the secret would
 * change one); the same of page keys, one thread's successive keys and
 * keys of records one bit apart, and two threads' keys for one record
 * differ; and the keys of live pages and of the thread's heap are neither
 * half of the secret. Also the heap profiler's gaps between samples
 * (hk_random_gap): their mean and tail match the exponential
 * distribution's. */
#include "../src/internal.h"
#include "hakmem.h"
#include "test_util.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;
#define EXPECT(cond, ...)                                                                                         \
  do {                                                                                                             \
    if (!(cond) && failures++ < 10) {                                                                              \
      fprintf(stderr, "test_keys: " __VA_ARGS__);                                                                  \
      fputc('\n', stderr);                                                                                         \
    }                                                                                                              \
  } while (0)

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

enum { N = 200000, SAMPLES = 2000 };

/* SAMPLES page keys of the calling thread for the same page address */
static void *thread_keys(void *out) {
  for (int i = 0; i < SAMPLES; i++) ((uint64_t *)out)[i] = hk_page_key(0x7f0000400000ull);
  return NULL;
}

/* page keys: no two of N alike, top bits kept, the bits of successive keys
 * and of keys for addresses one bit apart about half different, and
 * another thread's keys none of this thread's */
static void check_page_keys(uint64_t *keys) {
  uint64_t rng = 0x2545f4914f6cdd1dull, succ = 0, flip_bits = 0;
  for (int i = 0; i < N; i++) {
    uint64_t page = 0x7f0000000000ull + (hkt_rand(&rng) % (1u << 20)) * 8192;
    keys[i] = hk_page_key(page);
    EXPECT(keys[i] >> 48 >= 0x100, "page key %#lx has its top bits below 0x100", (unsigned long)keys[i]);
    if (i > 0 && i <= SAMPLES) succ += (uint64_t)__builtin_popcountll((keys[i] ^ keys[i - 1]) & (((uint64_t)1 << 48) - 1));
  }
  /* the counter moves on each call: compare a record with its neighbour at
   * the same point by running two calls, address a then a ^ bit, against
   * two calls of the same address */
  for (int i = 0; i < SAMPLES; i++) {
    uint64_t page = 0x7f0000000000ull + (hkt_rand(&rng) % (1u << 20)) * 8192;
    uint64_t k1 = hk_page_key(page), k2 = hk_page_key(page ^ ((uint64_t)1 << (13 + i % 30)));
    flip_bits += (uint64_t)__builtin_popcountll((k1 ^ k2) & (((uint64_t)1 << 48) - 1));
  }
  qsort(keys, N, sizeof *keys, cmp_u64);
  int same = 0;
  for (int i = 1; i < N; i++) same += keys[i] == keys[i - 1];
  EXPECT(same == 0, "%d of %d page keys repeat another", same, N);
  double ms = (double)succ / SAMPLES, mf = (double)flip_bits / SAMPLES;
  EXPECT(ms > 20 && ms < 28, "successive page keys differ in %.1f of 48 low bits on average", ms);
  EXPECT(mf > 20 && mf < 28, "page keys of records one bit apart differ in %.1f of 48 low bits", mf);
  /* two new threads, the same address, the same counter values */
  static uint64_t ta[SAMPLES], tb[SAMPLES];
  pthread_t t1, t2;
  EXPECT(pthread_create(&t1, NULL, thread_keys, ta) == 0 && pthread_join(t1, NULL) == 0 &&
             pthread_create(&t2, NULL, thread_keys, tb) == 0 && pthread_join(t2, NULL) == 0,
         "thread failed");
  qsort(ta, SAMPLES, sizeof *ta, cmp_u64);
  int shared = 0;
  for (int i = 0; i < SAMPLES; i++) shared += bsearch(&tb[i], ta, SAMPLES, sizeof *ta, cmp_u64) != NULL;
  EXPECT(shared == 0, "%d of %d page keys of one thread are another thread's", shared, SAMPLES);
  printf("test_keys: %d page keys distinct, successive ones differ in %.1f bits, neighbours' in %.1f\n", N, ms, mf);
}

/* hk_neg_log_uniform against the C library's log: within 1e-9 at
 * 1,000,000 random inputs, at u's ends (2^-53 and 1 - 2^-53) and at each
 * point where its table switches steps (x = 1 + (2j + 1)/64). */
static void check_neg_log(void) {
  uint64_t rng = 0x243f6a8885a308d3ull;
  double worst = 0;
  for (int i = 0; i < 1000000 + 3 * 32 * 40; i++) {
    uint64_t r;
    if (i < 1000000) {
      r = hkt_rand(&rng);
    } else { /* m = 2^k (1 + (2j + 1)/64) - 1, + 0, + 1, for k in [13, 53) */
      int j = (i - 1000000) / 3 % 32, k = 13 + (i - 1000000) / 96, d = (i - 1000000) % 3 - 1;
      uint64_t m = ((uint64_t)(64 + 2 * j + 1) << k >> 6) + (uint64_t)(int64_t)d;
      if (m == 0 || m >= (uint64_t)1 << 53) continue;
      r = m << 11;
    }
    double u = (double)((r >> 11) | 1) / 9007199254740992.0, err = fabs(hk_neg_log_uniform(r) + log(u));
    if (err > worst) worst = err;
  }
  double ends[2] = {hk_neg_log_uniform(0), hk_neg_log_uniform(~(uint64_t)0)};
  EXPECT(fabs(ends[0] - 53 * log(2.0)) < 1e-9, "-ln(2^-53) computed as %.12f", ends[0]);
  EXPECT(ends[1] > 0 && ends[1] < 1e-15, "-ln(1 - 2^-53) computed as %.3g", ends[1]);
  EXPECT(worst < 1e-9, "-ln(u) off by %.3g", worst);
  printf("test_keys: -ln(u) within %.2g of the C library's\n", worst);
}

/* 2,000,000 gaps of mean 524,288 bytes: the sample mean within 0.5 % (its
 * standard error is 0.07 %), and the share above 0.01, 1 and 3 times the
 * mean within 0.002 of exp(-0.01), exp(-1) and exp(-3). */
static void check_gaps(void) {
  const int n = 2000000;
  const double mean = 524288;
  double sum = 0;
  int above[3] = {0, 0, 0};
  const double at[3] = {0.01, 1, 3}, want[3] = {0.990049834, 0.367879441, 0.049787068};
  for (int i = 0; i < n; i++) {
    double g = (double)hk_random_gap((uint64_t)mean);
    sum += g;
    for (int k = 0; k < 3; k++) above[k] += g > at[k] * mean;
  }
  EXPECT(sum / n > mean * 0.995 && sum / n < mean * 1.005, "sample gaps average %.0f bytes, not %.0f", sum / n, mean);
  for (int k = 0; k < 3; k++) {
    double share = (double)above[k] / n;
    EXPECT(share > want[k] - 0.002 && share < want[k] + 0.002, "%.4f of the gaps exceed %.2f times the mean, not %.4f",
           share, at[k], want[k]);
  }
}

int main(void) {
  void *p = hak_malloc(48), *q = hak_malloc(5000); /* initialises hakmem: the secret, a heap, two pages */
  EXPECT(p != NULL && q != NULL, "malloc failed");
  EXPECT(hk_key != 0 && hk_key2 != 0 && hk_key != hk_key2, "secret not set: %#lx %#lx", (unsigned long)hk_key,
         (unsigned long)hk_key2);

  uint64_t *keys = malloc(N * sizeof *keys); /* (the C library's: this test links hakmem's API only) */
  EXPECT(keys != NULL, "no memory for the test");
  uint64_t rng = 0x9e3779b97f4a7c15ull, bits_changed = 0;
  for (int i = 0; i < N; i++) {
    uint64_t a = hkt_rand(&rng), b = (uint64_t)i;
    keys[i] = hk_derive_key(a, b);
    EXPECT(keys[i] >> 48 >= 0x100, "key %#lx has its top bits below 0x100", (unsigned long)keys[i]);
    EXPECT(keys[i] != hk_key && keys[i] != hk_key2, "a derived key equals the secret");
    EXPECT(hk_derive_key(a, b) == keys[i], "derivation is not a function of its input");
    if (i < 2000) {
      unsigned flip = (unsigned)(hkt_rand(&rng) % 128);
      uint64_t other = flip < 64 ? hk_derive_key(a ^ ((uint64_t)1 << flip), b) : hk_derive_key(a, b ^ ((uint64_t)1 << (flip - 64)));
      bits_changed += (uint64_t)__builtin_popcountll((keys[i] ^ other) & (((uint64_t)1 << 48) - 1));
    }
  }
  qsort(keys, N, sizeof *keys, cmp_u64);
  int same = 0;
  for (int i = 1; i < N; i++) same += keys[i] == keys[i - 1];
  EXPECT(same == 0, "%d of %d inputs gave a key another input gave", same, N);
  check_page_keys(keys);
  /* 48 mixed bits a key (the top 16 may be forced): about 24 change */
  double mean = (double)bits_changed / 2000;
  EXPECT(mean > 20 && mean < 28, "one input bit flipped changes %.1f of the 48 low output bits on average", mean);
  free(keys);

  const void *blocks[2] = {p, q};
  for (int i = 0; i < 2; i++) {
    hk_page *page = hk_page_of(hk_region_of(blocks[i]), blocks[i]);
    EXPECT(page->key != hk_key && page->key != hk_key2, "a page key equals the secret");
    EXPECT(page->key >> 48 >= 0x100, "a page key's top bits are below 0x100");
  }
  hk_page *pp = hk_page_of(hk_region_of(p), p), *pq = hk_page_of(hk_region_of(q), q);
  EXPECT(pp->key != pq->key, "two pages have the same key");
  hk_heap *h = hk_tls_heap;
  EXPECT(h != NULL && h->list_add != hk_key && h->list_add != hk_key2 && h->list_mul != hk_key &&
             h->list_mul != hk_key2 && h->list_add >> 62 == 1,
         "the heap's list keys are the secret, or unset");
  EXPECT(h->list_mul * h->list_inv == 1 && (h->list_mul & 1), "the heap's list multiplier's inverse is wrong");
  uintptr_t two[2] = {0, hk_cache_link(h, (const hk_block *)p)};
  EXPECT(hk_cache_next(h, (const hk_block *)two) == (const hk_block *)p, "a cache link does not decode to its block");
  two[1] = hk_cache_link(h, NULL);
  EXPECT(two[1] != 0 && hk_cache_next(h, (const hk_block *)two) == NULL, "the list's end is a zero link");
  EXPECT(((uintptr_t)0 * h->list_inv - h->list_add) >> HK_VA_BITS != 0, "a zeroed link decodes to an address");
  hak_free(p);
  hak_free(q);
  check_neg_log();
  check_gaps();
  if (failures) {
    fprintf(stderr, "test_keys: %d failures\n", failures);
    return 1;
  }
  printf("test_keys: secret set, %d derived keys distinct, %.1f of 48 bits change per input bit, page and heap keys "
         "are not the secret, sample gaps exponential\n",
         N, mean);
  return 0;
}
