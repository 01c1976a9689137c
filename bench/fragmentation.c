/* fragmentation TOTAL_MB SEED
 * 1. allocate blocks of 16 B-64 KiB (log-uniform sizes) until TOTAL_MB are live;
 * 2. free a random 90 % of them;
 * 3. allocate blocks of 64-256 KiB until TOTAL_MB are live again;
 * 4. free everything, sleep 1 s (no malloc_trim) and read the RSS.
 * Every block is written in all its pages, so RSS counts live data.
 * Reports peak RSS / peak live bytes and the RSS left after everything is freed. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <math.h>

typedef struct { void *p; size_t n; } blk;

static blk *b;
static size_t cap = 1 << 16, nb = 0;

/* allocate and touch an n-byte block, append it to b[] */
static void add_block(size_t n) {
  if (nb == cap) b = realloc(b, (cap *= 2) * sizeof *b);
  if (!b) exit(3);
  b[nb].p = bu_malloc(n);
  b[nb].n = n;
  bu_touch(b[nb].p, n);
  nb++;
}

int main(int argc, char **argv) {
  double total = (double)bu_arg(argc, argv, 1, 200) * 1048576.0;
  bu_rng rng;
  bu_seed(&rng, (uint64_t)bu_arg(argc, argv, 2, 5));
  b = bu_malloc(cap * sizeof *b);
  double live = 0, peak_live = 0;
  long before_kb = bu_rss_kb();
  long long ops = 0;

  double t0 = bu_now();
  while (live < total) { /* phase 1 */
    size_t n = (size_t)exp2(4.0 + 12.0 * (double)(bu_next(&rng) >> 11) / 9007199254740992.0);
    add_block(n);
    live += (double)n;
    ops++;
  }
  peak_live = live;
  size_t kept = 0;
  for (size_t i = 0; i < nb; i++) { /* phase 2 */
    if (bu_next(&rng) % 10 != 0) {
      bu_check(b[i].p, b[i].n, "fragmentation");
      free(b[i].p);
      live -= (double)b[i].n;
      ops++;
    } else {
      b[kept++] = b[i];
    }
  }
  nb = kept;
  while (live < total) { /* phase 3 */
    size_t n = bu_range(&rng, 64 << 10, 256 << 10);
    add_block(n);
    live += (double)n;
    ops++;
  }
  if (live > peak_live) peak_live = live;
  long peak_kb = bu_peak_rss_kb();
  for (size_t i = 0; i < nb; i++) { /* phase 4 */
    bu_check(b[i].p, b[i].n, "fragmentation (final)");
    free(b[i].p);
    ops++;
  }
  double t = bu_now() - t0;
  free(b);
  sleep(1);
  long after_kb = bu_rss_kb();
  bu_result("fragmentation", (double)ops, t,
            "frag_ratio=%.3f peak_live_kb=%.0f rss_before_kb=%ld rss_after_free_kb=%ld",
            (double)(peak_kb - before_kb) * 1024.0 / peak_live, peak_live / 1024, before_kb, after_kb);
  return 0;
}
