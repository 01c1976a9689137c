/* fixed SIZE ITERS
 * Fixed-size blocks (e.g. 64k, 256k, 2m) with a working set of 4: each
 * iteration frees the oldest block, allocates a new one and writes one byte
 * in each of its 4 KiB pages (so page faults and returning memory to the
 * system are part of the cost). */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */

#define WS 4

int main(int argc, char **argv) {
  size_t size = (size_t)bu_arg(argc, argv, 1, 65536);
  long long iters = bu_arg(argc, argv, 2, 100000);
  void *p[WS] = {0};
  char name[64];
  if (size < 8) return 64;
  if (size % (1 << 20) == 0) snprintf(name, sizeof name, "fixed_%zum", size >> 20);
  else if (size % 1024 == 0) snprintf(name, sizeof name, "fixed_%zuk", size >> 10);
  else snprintf(name, sizeof name, "fixed_%zu", size);

  double t0 = bu_now();
  for (long long i = 0; i < iters; i++) {
    int k = (int)(i % WS);
    if (p[k]) {
      bu_check(p[k], size, name);
      free(p[k]);
    }
    p[k] = bu_malloc(size);
    bu_touch(p[k], size);
  }
  double t = bu_now() - t0;
  for (int k = 0; k < WS; k++)
    if (p[k]) {
      bu_check(p[k], size, name);
      free(p[k]);
    }
  bu_result(name, (double)iters, t, "size=%zu", size);
  return 0;
}
