/* large_varied LIVE MIN_MB MAX_MB TOUCH THREADS ITERS SEED
 * Large blocks of varied sizes. LIVE blocks stay live, each of a uniformly
 * random size from MIN_MB to MAX_MB MiB (in bytes); each iteration replaces
 * one of them, chosen at random, and writes the new block: TOUCH "all"
 * writes one byte in each of its 4 KiB pages, "first" only its first bytes
 * (a buffer allocated large and used little). THREADS 1: one thread does
 * all of it; 2: a producer allocates and writes the blocks and passes them
 * through a ring of LIVE slots to a consumer, which checks and frees them
 * (every free is of a block another thread allocated). ITERS is a count of
 * blocks, or seconds with an "s" suffix ("3s"). ops = blocks allocated.
 * Defaults: 2 1 16 all 1 500 42. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#define MAX_LIVE 1024

static size_t min_b, max_b;
static int touch_all;
static long long max_iters;
static double seconds_limit, t_start;
static unsigned live;
static uint64_t seed;

static void write_block(void *p, size_t n) {
  if (touch_all) bu_touch(p, n);
  else {
    uint64_t v = bu_pattern(p, n);
    memcpy(p, &v, 8);
  }
}

static void check_block(const void *p, size_t n) {
  if (touch_all) bu_check(p, n, "large_varied");
  else {
    uint64_t v;
    memcpy(&v, p, 8);
    if (v != bu_pattern(p, n)) bu_fail("large_varied", p, n);
  }
}

static int done(long long i) {
  if (seconds_limit > 0) return (i & 7) == 0 && bu_now() - t_start >= seconds_limit;
  return i >= max_iters;
}

/* ---- one thread ---- */
static long long run_single(void) {
  void *p[MAX_LIVE] = {0};
  size_t n[MAX_LIVE] = {0};
  bu_rng rng;
  bu_seed(&rng, seed);
  long long i = 0;
  for (unsigned k = 0; k < live; k++) {
    n[k] = bu_range(&rng, min_b, max_b);
    p[k] = bu_malloc(n[k]);
    write_block(p[k], n[k]);
  }
  for (; !done(i); i++) {
    unsigned k = (unsigned)bu_range(&rng, 0, live - 1);
    check_block(p[k], n[k]);
    free(p[k]);
    n[k] = bu_range(&rng, min_b, max_b);
    p[k] = bu_malloc(n[k]);
    write_block(p[k], n[k]);
  }
  for (unsigned k = 0; k < live; k++) {
    check_block(p[k], n[k]);
    free(p[k]);
  }
  return i;
}

/* ---- two threads: producer -> ring of LIVE slots -> consumer ---- */
static struct {
  _Alignas(64) _Atomic unsigned long head; /* blocks the producer has pushed */
  _Alignas(64) _Atomic unsigned long tail; /* blocks the consumer has freed */
  _Alignas(64) _Atomic int stop;
  void *p[MAX_LIVE];
  size_t n[MAX_LIVE];
} ring;
static long long produced;

static void *producer(void *arg) {
  (void)arg;
  bu_rng rng;
  bu_seed(&rng, seed);
  long long i = 0;
  for (; !done(i); i++) {
    unsigned long h = atomic_load_explicit(&ring.head, memory_order_relaxed);
    while (h - atomic_load_explicit(&ring.tail, memory_order_acquire) == live) sched_yield();
    size_t n = bu_range(&rng, min_b, max_b);
    void *p = bu_malloc(n);
    write_block(p, n);
    ring.p[h % live] = p;
    ring.n[h % live] = n;
    atomic_store_explicit(&ring.head, h + 1, memory_order_release);
  }
  produced = i;
  atomic_store_explicit(&ring.stop, 1, memory_order_release);
  return NULL;
}

static void *consumer(void *arg) {
  (void)arg;
  for (;;) {
    unsigned long t = atomic_load_explicit(&ring.tail, memory_order_relaxed);
    if (atomic_load_explicit(&ring.head, memory_order_acquire) == t) {
      if (atomic_load_explicit(&ring.stop, memory_order_acquire) &&
          atomic_load_explicit(&ring.head, memory_order_acquire) == t)
        return NULL;
      sched_yield();
      continue;
    }
    check_block(ring.p[t % live], ring.n[t % live]);
    free(ring.p[t % live]);
    atomic_store_explicit(&ring.tail, t + 1, memory_order_release);
  }
}

int main(int argc, char **argv) {
  live = (unsigned)bu_arg(argc, argv, 1, 2);
  long long lo = bu_arg(argc, argv, 2, 1), hi = bu_arg(argc, argv, 3, 16);
  const char *touch = argc > 4 ? argv[4] : "all";
  int threads = (int)bu_arg(argc, argv, 5, 1);
  if (argc > 6 && argv[6][0] && argv[6][strlen(argv[6]) - 1] == 's') seconds_limit = atof(argv[6]);
  else max_iters = bu_arg(argc, argv, 6, 500);
  seed = (uint64_t)bu_arg(argc, argv, 7, 42);
  if (live < 1 || live > MAX_LIVE || lo < 1 || hi < lo || (threads != 1 && threads != 2) ||
      (strcmp(touch, "all") != 0 && strcmp(touch, "first") != 0)) {
    fprintf(stderr, "usage: large_varied LIVE(1-%d) MIN_MB MAX_MB all|first 1|2 ITERS|SECONDSs SEED\n", MAX_LIVE);
    return 64;
  }
  touch_all = strcmp(touch, "all") == 0;
  min_b = (size_t)lo << 20;
  max_b = (size_t)hi << 20;
  char name[96];
  snprintf(name, sizeof name, "large_varied_%u_%lld-%lldm_%s%s", live, lo, hi, touch, threads == 2 ? "_2t" : "");

  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  t_start = bu_now();
  long long ops;
  if (threads == 1) {
    ops = run_single();
  } else {
    pthread_t a, b;
    pthread_create(&b, NULL, consumer, NULL);
    pthread_create(&a, NULL, producer, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    ops = produced;
  }
  double t = bu_now() - t_start;
  getrusage(RUSAGE_SELF, &r1);
  double sys = (double)(r1.ru_stime.tv_sec - r0.ru_stime.tv_sec) + (double)(r1.ru_stime.tv_usec - r0.ru_stime.tv_usec) * 1e-6;
  bu_result(name, (double)ops, t, "minor_faults=%ld sys_seconds=%.3f", r1.ru_minflt - r0.ru_minflt, sys);
  return 0;
}
