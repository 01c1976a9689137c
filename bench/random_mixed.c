/* random_mixed ITERS WS SEED
 * A working set of WS slots; each iteration picks a random slot and frees its
 * block if it holds one, else allocates a block of 16-1040 bytes into it. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */

int main(int argc, char **argv) {
  long long iters = bu_arg(argc, argv, 1, 2000000);
  long long ws = bu_arg(argc, argv, 2, 400);
  bu_rng rng;
  bu_seed(&rng, (uint64_t)bu_arg(argc, argv, 3, 42));
  void **slot = calloc((size_t)ws, sizeof *slot);
  size_t *size = calloc((size_t)ws, sizeof *size);
  if (!slot || !size) return 3;
  long long mallocs = 0, frees = 0;

  double t0 = bu_now();
  for (long long i = 0; i < iters; i++) {
    size_t k = bu_next(&rng) % (uint64_t)ws;
    if (slot[k]) {
      bu_check(slot[k], size[k], "random_mixed");
      free(slot[k]);
      slot[k] = NULL;
      frees++;
    } else {
      size[k] = bu_range(&rng, 16, 1040);
      slot[k] = bu_malloc(size[k]);
      bu_stamp(slot[k], size[k]);
      mallocs++;
    }
  }
  double t = bu_now() - t0;

  for (long long k = 0; k < ws; k++)
    if (slot[k]) {
      bu_check(slot[k], size[k], "random_mixed (final)");
      free(slot[k]);
    }
  bu_result("random_mixed", (double)iters, t, "mallocs=%lld frees=%lld", mallocs, frees);
  free(slot);
  free(size);
  return 0;
}
