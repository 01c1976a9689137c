/* mem_16b [COUNT]      (built from mem.c)
 * mem_random [COUNT SEED] (built from mem.c with -DMEM_RANDOM)
 * Allocates COUNT (default 1M) blocks of 16 B (mem_random: random 16-128 B),
 * writes them all, then checks and frees them. Reports the allocator's
 * overhead per block:
 *   (peak RSS - requested bytes - pointer array bytes - RSS before) / COUNT */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <sys/mman.h>

#ifdef MEM_RANDOM
#define NAME "mem_random"
#define NEXT_SIZE(r) bu_range(r, 16, 128)
#else
#define NAME "mem_16b"
#define NEXT_SIZE(r) ((void)(r), (size_t)16)
#endif

int main(int argc, char **argv) {
  long long count = bu_arg(argc, argv, 1, 1000000);
  bu_rng rng;
  bu_seed(&rng, (uint64_t)bu_arg(argc, argv, 2, 3));
  /* The pointer array is mapped directly so it costs the same under every
   * allocator (its pages become resident as it fills, after the RSS before
   * is read); the sizes are recomputed from the same seed when checking. */
  size_t array_bytes = (size_t)count * sizeof(void *);
  void **p = mmap(NULL, array_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return 3;
  free(bu_malloc(16)); /* let the allocator initialise itself first */
  (void)bu_now();       /* and the clock's code be faulted in (libc's text) */
  long before_kb = bu_rss_kb();

  double data = 0;
  bu_rng r = rng;
  double t0 = bu_now();
  for (long long i = 0; i < count; i++) {
    size_t n = NEXT_SIZE(&r);
    p[i] = bu_malloc(n);
    bu_stamp(p[i], n);
    data += (double)n;
  }
  long peak_kb = bu_rss_kb();
  r = rng;
  for (long long i = 0; i < count; i++) {
    size_t n = NEXT_SIZE(&r);
    bu_check(p[i], n, NAME);
    free(p[i]);
  }
  double t = bu_now() - t0;
  long hwm_kb = bu_peak_rss_kb();
  if (hwm_kb > peak_kb) peak_kb = hwm_kb;
  double overhead = ((double)peak_kb * 1024 - data - (double)array_bytes - (double)before_kb * 1024) / (double)count;
  bu_result(NAME, 2.0 * (double)count, t, "overhead_bytes_per_alloc=%.2f data_kb=%.0f rss_before_kb=%ld",
            overhead, data / 1024, before_kb);
  munmap(p, array_bytes);
  return 0;
}
