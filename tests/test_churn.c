/* test_churn: 5000 short-lived threads, a few at a time. Each allocates ~50
 * blocks, frees half, hands the other half to the main thread (which frees
 * them after the next batch, i.e. after the allocating thread has exited),
 * and frees blocks the main thread allocated for it. Memory of exited
 * threads must be reused: RSS stays bounded.
 */
#define _GNU_SOURCE
#include "api.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NTHREADS 5000
#define BATCH 8
#define PER_THREAD 50
#define FROM_MAIN 8
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

typedef struct handoff {
  struct handoff *next; /* lives inside the block itself */
  size_t size;
  uint64_t seed;
} handoff;

static pthread_mutex_t list_lock = PTHREAD_MUTEX_INITIALIZER;
static handoff *list_head;
static size_t list_len;

typedef struct targ {
  int id;
  unsigned char *from_main[FROM_MAIN];
  size_t from_main_size[FROM_MAIN];
} targ;

/* the stamp covers everything after the handoff header */
static void fill(unsigned char *p, size_t n, uint64_t seed) { hkt_fill(p + sizeof(handoff), n - sizeof(handoff), seed); }
static void check(const unsigned char *p, size_t n, uint64_t seed, const char *who) {
  size_t bad = hkt_verify(p + sizeof(handoff), n - sizeof(handoff), seed);
  CHECK(bad == HKT_OK, "%s: block %p (size %zu): byte %zu corrupted", who, (const void *)p, n,
        bad + sizeof(handoff));
}

static size_t pick_size(uint64_t *rng, int id) {
  uint64_t r = hkt_rand(rng);
  unsigned k = (unsigned)(r % 100);
  r >>= 8;
  if (k == 0 && id % 16 == 0) return MiB + 1 + (size_t)(r % MiB); /* a large block now and then */
  if (k < 6) return 8 * KiB + (size_t)(r % (120 * KiB));
  return sizeof(handoff) + (size_t)(r % 2000);
}

static void *thread_main(void *arg) {
  targ *a = (targ *)arg;
  uint64_t rng = 0x5bd1e995ull * (uint64_t)(a->id + 1);
  unsigned char *ps[PER_THREAD];
  size_t sz[PER_THREAD];
  uint64_t seeds[PER_THREAD];
  for (int i = 0; i < PER_THREAD; i++) {
    sz[i] = pick_size(&rng, a->id);
    ps[i] = (unsigned char *)API(malloc)(sz[i]);
    CHECK(ps[i] != NULL, "thread %d: malloc(%zu) failed", a->id, sz[i]);
    seeds[i] = (uint64_t)a->id * 1000 + (uint64_t)i;
    fill(ps[i], sz[i], seeds[i]);
  }
  /* blocks the main thread allocated: check and free (remote frees) */
  for (int i = 0; i < FROM_MAIN; i++) {
    check(a->from_main[i], a->from_main_size[i], (uint64_t)a->id + 0x10000000ull * (uint64_t)(i + 1),
          "thread (block from main)");
    API(free)(a->from_main[i]);
  }
  for (int i = 0; i < PER_THREAD; i += 2) {
    check(ps[i], sz[i], seeds[i], "thread (own block)");
    API(free)(ps[i]);
  }
  pthread_mutex_lock(&list_lock);
  for (int i = 1; i < PER_THREAD; i += 2) {
    handoff *h = (handoff *)(void *)ps[i];
    h->size = sz[i];
    h->seed = seeds[i];
    h->next = list_head;
    list_head = h;
    list_len++;
  }
  pthread_mutex_unlock(&list_lock);
  return NULL;
}

static size_t rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  CHECK(f != NULL, "cannot open /proc/self/statm: %s", strerror(errno));
  unsigned long size = 0, resident = 0;
  int n = fscanf(f, "%lu %lu", &size, &resident);
  fclose(f);
  CHECK(n == 2, "cannot parse /proc/self/statm");
  return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

/* Frees the handed-off blocks of exited threads; every third one is first
 * reallocated (grown), which must keep its contents. */
static size_t free_list(handoff *h) {
  size_t n = 0;
  while (h) {
    handoff *next = h->next;
    check((const unsigned char *)h, h->size, h->seed, "main (handed-off block)");
    if (n % 3 == 0) {
      size_t old = h->size, nn = old * 2 + 1;
      uint64_t seed = h->seed;
      unsigned char *q = (unsigned char *)API(realloc)(h, nn);
      CHECK(q != NULL, "main: realloc of a handed-off block (%zu -> %zu) failed", old, nn);
      check(q, old, seed, "main (handed-off block after realloc)");
      API(free)(q);
    } else {
      API(free)(h);
    }
    h = next;
    n++;
  }
  return n;
}

int main(void) {
  printf("test_churn [%s]: %d threads in batches of %d\n", API_MODE, NTHREADS, BATCH);
  fflush(stdout);
  static targ args[BATCH];
  handoff *pending = NULL; /* blocks of the previous batch, freed one batch later */
  size_t rss_first = 0, freed = 0;
  uint64_t rng = 77;
  for (int base = 0; base < NTHREADS; base += BATCH) {
    pthread_t th[BATCH];
    for (int j = 0; j < BATCH; j++) {
      args[j].id = base + j;
      for (int k = 0; k < FROM_MAIN; k++) {
        size_t n = sizeof(handoff) + (size_t)(hkt_rand(&rng) % 3000);
        args[j].from_main[k] = (unsigned char *)API(malloc)(n);
        CHECK(args[j].from_main[k] != NULL, "main: malloc(%zu) failed", n);
        args[j].from_main_size[k] = n;
        fill(args[j].from_main[k], n, (uint64_t)args[j].id + 0x10000000ull * (uint64_t)(k + 1));
      }
      int rc = pthread_create(&th[j], NULL, thread_main, &args[j]);
      CHECK(rc == 0, "pthread_create (thread %d): %s", base + j, strerror(rc));
    }
    for (int j = 0; j < BATCH; j++) pthread_join(th[j], NULL);
    freed += free_list(pending);
    pthread_mutex_lock(&list_lock);
    pending = list_head;
    list_head = NULL;
    list_len = 0;
    pthread_mutex_unlock(&list_lock);
    if (base + BATCH == 504) { /* after the first ~500 threads */
      rss_first = rss_bytes();
      printf("RSS after %d threads: %.1f MiB\n", base + BATCH, (double)rss_first / (double)MiB);
      fflush(stdout);
    }
  }
  freed += free_list(pending);
  size_t expect = (size_t)NTHREADS * (PER_THREAD / 2);
  CHECK(freed == expect, "main freed %zu handed-off blocks, expected %zu", freed, expect);
  size_t rss_end = rss_bytes();
  printf("RSS at the end: %.1f MiB (first measurement %.1f MiB)\n", (double)rss_end / (double)MiB,
         (double)rss_first / (double)MiB);
  CHECK(rss_first > 0, "RSS was not measured");
  CHECK(rss_end < rss_first + 32 * MiB,
        "RSS grew from %.1f MiB (after 504 threads) to %.1f MiB (after %d): memory of exited threads is not reused",
        (double)rss_first / (double)MiB, (double)rss_end / (double)MiB, NTHREADS);
  CHECK(rss_end < 256 * MiB, "RSS %.1f MiB >= 256 MiB", (double)rss_end / (double)MiB);
  printf("test_churn: all passed\n");
  return 0;
}
