/* realloc_growth ROUNDS
 * Eight buffers, grown in turn by realloc from 16 B to 1 MiB: each step adds
 * ~10 % or doubles (chosen at random), fills the new bytes and checks a
 * sample of the old ones plus the last old word. At 1 MiB each buffer is
 * checked in full, then halved step by step back to 16 B, checking what
 * remains. ops = realloc calls. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */

#define NBUF 8
#define MAX (1u << 20)

/* the expected 8-byte word at byte offset o of buffer b */
static inline uint64_t word(int b, size_t o) { return ((uint64_t)b << 56) ^ (o * 0x9E3779B97F4A7C15ull); }

static void fill(uint64_t *p, int b, size_t from, size_t to) {
  for (size_t o = from; o < to; o += 8) p[o / 8] = word(b, o);
}
static void check(const uint64_t *p, int b, size_t len, size_t stride) {
  for (size_t o = 0; o < len; o += stride)
    if (p[o / 8] != word(b, o)) bu_fail("realloc_growth", p, len);
  if (len >= 8 && p[len / 8 - 1] != word(b, (len / 8 - 1) * 8)) bu_fail("realloc_growth (last word)", p, len);
}

int main(int argc, char **argv) {
  long long rounds = bu_arg(argc, argv, 1, 20);
  bu_rng rng;
  bu_seed(&rng, 11);
  long long reallocs = 0;

  double t0 = bu_now();
  for (long long round = 0; round < rounds; round++) {
    uint64_t *buf[NBUF] = {0};
    size_t len[NBUF] = {0};
    int growing = NBUF;
    while (growing) { /* grow all buffers in turn so they interleave in memory */
      growing = 0;
      for (int b = 0; b < NBUF; b++) {
        if (len[b] >= MAX) continue;
        size_t n = len[b] == 0 ? 16 : (bu_next(&rng) & 1) ? len[b] * 2 : len[b] + len[b] / 10 + 8;
        n = (n + 7) & ~(size_t)7;
        if (n > MAX) n = MAX;
        uint64_t *p = realloc(buf[b], n);
        if (!p) return 3;
        reallocs++;
        check(p, b, len[b], 256);
        fill(p, b, len[b], n);
        buf[b] = p;
        len[b] = n;
        growing += len[b] < MAX;
      }
    }
    for (int b = 0; b < NBUF; b++) check(buf[b], b, len[b], 8);
    for (int b = 0; b < NBUF; b++) {
      while (len[b] > 16) {
        len[b] /= 2;
        uint64_t *p = realloc(buf[b], len[b]);
        if (!p) return 3;
        reallocs++;
        check(p, b, len[b], 64);
        buf[b] = p;
      }
      free(buf[b]);
    }
  }
  double t = bu_now() - t0;
  bu_result("realloc_growth", (double)reallocs, t, "rounds=%lld", rounds);
  return 0;
}
