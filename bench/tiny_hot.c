/* tiny_hot ITERS
 * The hot loop of small fixed-size blocks: for each size 16, 32, ..., 128 B,
 * allocate a batch of 64 blocks, then free them in reverse (LIFO) order.
 * One iteration = one batch (64 malloc+free pairs); sizes rotate per batch. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */

#define BATCH 64

int main(int argc, char **argv) {
  long long iters = bu_arg(argc, argv, 1, 200000);
  void *p[BATCH];

  double t0 = bu_now();
  for (long long i = 0; i < iters; i++) {
    size_t n = 16 * (size_t)(1 + i % 8); /* 16..128 B */
    for (int j = 0; j < BATCH; j++) {
      p[j] = bu_malloc(n);
      bu_stamp(p[j], n);
    }
    for (int j = BATCH - 1; j >= 0; j--) {
      bu_check(p[j], n, "tiny_hot");
      free(p[j]);
    }
  }
  double t = bu_now() - t0;
  long long pairs = iters * BATCH;
  bu_result("tiny_hot", (double)pairs, t, "mallocs=%lld frees=%lld", pairs, pairs);
  return 0;
}
