/* rlimit_fill: allocate under a limit set while the program runs, as test
 * harnesses, sandboxes and Python's resource.setrlimit do. Built against
 * the C library alone: tests/rlimit_check.sh runs it as it is (glibc) and
 * with hakmem preloaded, and compares how much each serves.
 *
 * usage: rlimit_fill as|data LIMIT_MIB SIZE|mixed THREADS [cold]
 *
 * 1. warms the allocator up, then holds LIMIT + 64 MiB in 1 MiB blocks, so
 *    that the limit is set below the process's current size (cold: neither;
 *    the threads' first allocations come after the limit);
 * 2. sets RLIMIT_AS or RLIMIT_DATA (soft limit) to LIMIT_MIB, frees what it
 *    held;
 * 3. fills: THREADS threads (started before the limit) allocate blocks of SIZE bytes (or of mixed
 *    sizes, small to 2 MiB) until malloc returns NULL, which must come with
 *    errno ENOMEM; each block is written at both ends and checked after;
 * 4. frees everything; then 100 MiB at once must succeed (limits of 256 MiB
 *    and up), and fills again;
 * 5. raises the soft limit back to the hard one: LIMIT + 256 MiB must then
 *    be served without a NULL.
 * Prints the bytes of the two fills and exits 0, or names what failed and
 * exits 1. (The first fill may take more than the limit's room: memory the
 * allocator mapped before the limit, and kept, counts already.) */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "test_util.h"

#define MiB ((size_t)1 << 20)
#define MAX_BLOCKS ((size_t)1 << 23)

static size_t fixed_size; /* 0: mixed */
static int nthreads;

typedef struct {
  void **p;
  size_t n, cap, bytes;
  uint64_t rng;
  int bad_errno;
} filler;

static void fail(const char *what) {
  fprintf(stderr, "rlimit_fill: FAILED: %s\n", what);
  exit(1);
}

static size_t next_size(filler *f) {
  if (fixed_size) return fixed_size;
  uint64_t r = hkt_rand(&f->rng);
  static const size_t big[] = {3000, 70000, 300 << 10, 2 << 20};
  unsigned k = (unsigned)(r % 16);
  return k < 12 ? 16 + (size_t)(r >> 8) % 1000 : big[k - 12];
}

/* Called through a volatile pointer: clang takes malloc for a function
 * that writes no memory the program can see, errno included, and would
 * read errno from before the call. */
static void *(*volatile malloc_fn)(size_t) = malloc;

static void *fill(void *arg) {
  filler *f = arg;
  f->n = f->bytes = 0;
  f->bad_errno = 0;
  while (f->n < f->cap) {
    size_t n = next_size(f);
    errno = 0;
    unsigned char *b = malloc_fn(n);
    if (b == NULL) {
      if (errno != ENOMEM) f->bad_errno = errno ? errno : -1;
      break;
    }
    memcpy(b, &n, sizeof n);
    b[n - 1] = (unsigned char)n;
    f->p[f->n++] = b;
    f->bytes += n;
  }
  return NULL;
}

/* The other threads are started before the limit (their stacks are the C
 * library's mappings) and fill when the main thread does, twice. */
static pthread_barrier_t start, done;
static void *fill_twice(void *arg) {
  for (int round = 0; round < 2; round++) {
    pthread_barrier_wait(&start);
    fill(arg);
    pthread_barrier_wait(&done);
  }
  return NULL;
}

static size_t fill_all(filler *fs) {
  pthread_barrier_wait(&start);
  fill(&fs[0]);
  pthread_barrier_wait(&done);
  size_t bytes = 0;
  for (int i = 0; i < nthreads; i++) {
    if (fs[i].bad_errno) fail("malloc returned NULL without ENOMEM");
    if (fs[i].n == fs[i].cap) fail("the limit was never reached");
    bytes += fs[i].bytes;
  }
  return bytes;
}

static void check_and_free(filler *fs) {
  for (int i = 0; i < nthreads; i++) {
    for (size_t k = 0; k < fs[i].n; k++) {
      unsigned char *b = fs[i].p[k];
      size_t n;
      memcpy(&n, b, sizeof n);
      if (n == 0 || n > 4 * MiB || b[n - 1] != (unsigned char)n) fail("a block's contents changed");
      free(b);
    }
    fs[i].n = 0;
  }
}

int main(int argc, char **argv) {
  if (argc != 5 && argc != 6) {
    fprintf(stderr, "usage: rlimit_fill as|data LIMIT_MIB SIZE|mixed THREADS [cold]\n");
    return 2;
  }
  bool cold = argc == 6 && strcmp(argv[5], "cold") == 0;
  int resource = strcmp(argv[1], "data") == 0 ? RLIMIT_DATA : RLIMIT_AS;
  size_t limit = (size_t)atol(argv[2]) * MiB;
  fixed_size = strcmp(argv[3], "mixed") == 0 ? 0 : (size_t)atol(argv[3]);
  nthreads = atoi(argv[4]);
  if (nthreads < 1 || nthreads > 8) nthreads = 1;

  /* 1. warm up, and hold more than the limit */
  if (!cold)
    for (size_t n = 16; n <= 8 * MiB; n *= 4) free(malloc(n));
  size_t nhold = cold ? 0 : limit / MiB + 64;
  void **hold = cold ? NULL : calloc(nhold, sizeof *hold);
  if (hold == NULL && !cold) fail("calloc");
  for (size_t i = 0; i < nhold; i++) {
    hold[i] = malloc(MiB);
    if (hold[i] == NULL) fail("malloc before the limit");
    memset(hold[i], 1, 64);
  }
  filler fs[8];
  size_t cap = MAX_BLOCKS / (size_t)nthreads;
  for (int i = 0; i < nthreads; i++) {
    /* the pointer arrays are mapped before the limit, by the C library */
    fs[i].p = mmap(NULL, cap * sizeof(void *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (fs[i].p == MAP_FAILED) fail("mmap");
    fs[i].cap = cap;
    fs[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
  }

  pthread_barrier_init(&start, NULL, (unsigned)nthreads);
  pthread_barrier_init(&done, NULL, (unsigned)nthreads);
  pthread_t t[8];
  for (int i = 1; i < nthreads; i++)
    if (pthread_create(&t[i], NULL, fill_twice, &fs[i]) != 0) fail("pthread_create");

  /* 2. the limit, below the current size; then what was held goes */
  struct rlimit rl;
  if (getrlimit(resource, &rl) != 0) fail("getrlimit");
  rlim_t hard = rl.rlim_max;
  rl.rlim_cur = limit;
  if (setrlimit(resource, &rl) != 0) fail("setrlimit");
  for (size_t i = 0; i < nhold; i++) free(hold[i]);
  free(hold);

  /* 3. fill */
  size_t served = fill_all(fs);
  check_and_free(fs);

  /* 4. the memory comes back */
  if (limit >= 256 * MiB) {
    void *big = malloc(100 * MiB);
    if (big == NULL) fail("malloc(100 MiB) after freeing everything");
    memset(big, 2, 100 * MiB);
    free(big);
  }
  for (int i = 0; i < nthreads; i++) fs[i].rng = 0x9E3779B97F4A7C15ull * (uint64_t)(i + 1);
  size_t again = fill_all(fs);
  check_and_free(fs);
  for (int i = 1; i < nthreads; i++) pthread_join(t[i], NULL);

  /* 5. the limit raised again */
  rl.rlim_cur = hard;
  if (setrlimit(resource, &rl) != 0) fail("setrlimit (raise)");
  size_t want = limit + 256 * MiB, got = 0;
  while (got < want && fs[0].n < fs[0].cap) {
    size_t n = next_size(&fs[0]);
    unsigned char *b = malloc(n);
    if (b == NULL) fail("malloc failed after the limit was raised");
    memcpy(b, &n, sizeof n);
    b[n - 1] = (unsigned char)n;
    fs[0].p[fs[0].n++] = b;
    got += n;
  }
  check_and_free(fs);
  printf("%zu %zu\n", served, again);
  return 0;
}
