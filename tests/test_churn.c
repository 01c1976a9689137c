/* test_churn: 5000 short-lived threads, a few at a time. Each allocates ~50
 * blocks, frees half, hands the other half to the main thread (which frees
 * them after the next batch, i.e. after the allocating thread has exited),
 * and frees blocks the main thread allocated for it. Memory of exited
 * threads must be reused: RSS stays bounded.
 */
#define _GNU_SOURCE
#include "api.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
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

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* A thread that allocates 48 MiB of small and medium blocks, frees all
 * but every eighth and exits; the main thread frees the rest, so the
 * thread's pages outlive it and empty afterwards. They are kept for threads
 * that start later (which adopt them), but only for a while: */
#define BIG_SMALL 12288 /* x 2000 B */
#define BIG_MEDIUM 1536 /* x 16 KiB */
static size_t big_rss_peak;
static unsigned char *big_blocks[BIG_SMALL + BIG_MEDIUM];
static void *big_thread(void *arg) {
  (void)arg;
  for (int i = 0; i < BIG_SMALL + BIG_MEDIUM; i++) {
    size_t n = i < BIG_SMALL ? 2000 : 16 * KiB;
    big_blocks[i] = (unsigned char *)API(malloc)(n);
    CHECK(big_blocks[i] != NULL, "big thread: malloc(%zu) failed", n);
    memset(big_blocks[i], 0x5a, n);
  }
  big_rss_peak = hkt_rss_bytes();
  for (int i = 0; i < BIG_SMALL + BIG_MEDIUM; i++)
    if (i % 8 != 0) API(free)(big_blocks[i]);
  return NULL;
}

static void run_big_thread(void) {
  pthread_t t;
  int rc = pthread_create(&t, NULL, big_thread, NULL);
  CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  pthread_join(t, NULL);
  for (int i = 0; i < BIG_SMALL + BIG_MEDIUM; i += 8) API(free)(big_blocks[i]);
}

/* ...the memory of an exited thread goes back to the OS within a second
 * with no call from the program, and at once on malloc_trim(0). */
static void test_exited_memory_returns(void) {
  size_t base = hkt_rss_bytes();
  run_big_thread();
  double t0 = now_s(), waited = 0;
  size_t rss = hkt_rss_bytes();
  while (hkt_timed_purges() && rss > base + 8 * MiB && (waited = now_s() - t0) < 3.0) {
    struct timespec d = {0, 10 * 1000 * 1000};
    nanosleep(&d, NULL);
    rss = hkt_rss_bytes();
  }
  printf("exited thread, 48 MiB freed: RSS %.1f -> %.1f MiB (start %.1f) after %.2f s with no call\n",
         (double)big_rss_peak / (double)MiB, (double)rss / (double)MiB, (double)base / (double)MiB, waited);
  CHECK(big_rss_peak > base + 40 * MiB, "the big thread's RSS %.1f MiB is not 40 MiB above the start (%.1f MiB)",
        (double)big_rss_peak / (double)MiB, (double)base / (double)MiB);
  CHECK(!hkt_timed_purges() || (rss <= base + 8 * MiB && waited <= 1.0),
        "an exited thread's freed memory stays resident: RSS %.1f MiB, %.1f MiB at the start, after %.2f s",
        (double)rss / (double)MiB, (double)base / (double)MiB, waited);

  base = hkt_rss_bytes();
  run_big_thread();
  API(malloc_trim)(0);
  rss = hkt_rss_bytes();
  printf("exited thread, 48 MiB freed: RSS %.1f -> %.1f MiB (start %.1f) at once after malloc_trim(0)\n",
         (double)big_rss_peak / (double)MiB, (double)rss / (double)MiB, (double)base / (double)MiB);
  CHECK(rss <= base + 8 * MiB, "malloc_trim(0) left an exited thread's freed memory resident: RSS %.1f MiB, %.1f at the start",
        (double)rss / (double)MiB, (double)base / (double)MiB);
}

/* A thread that filled pages and then waits (here: in pthread_join) never
 * comes back for them; when another thread frees all their blocks, their
 * memory must go back to the OS anyway, and the pages must work again when
 * their owner does come back. */
#define IDLE_BLOCKS 32768 /* x 1000 B */
static unsigned char *idle_blocks[IDLE_BLOCKS];
static size_t idle_rss_before, idle_rss_after;
static void *free_idle_blocks(void *arg) {
  (void)arg;
  struct timespec d = {0, 30 * 1000 * 1000}; /* the owner has been idle a while */
  nanosleep(&d, NULL);
  idle_rss_before = hkt_rss_bytes();
  for (int i = 0; i < IDLE_BLOCKS; i++) {
    check(idle_blocks[i], 1000, (uint64_t)i, "freer (idle owner's block)");
    API(free)(idle_blocks[i]);
  }
  return NULL;
}

static void fill_idle_blocks(uint64_t salt) {
  for (int i = 0; i < IDLE_BLOCKS; i++) {
    idle_blocks[i] = (unsigned char *)API(malloc)(1000);
    CHECK(idle_blocks[i] != NULL, "malloc(1000) failed");
    fill(idle_blocks[i], 1000, (uint64_t)i + salt);
  }
}

static void test_idle_owner_pages_return(void) {
  fill_idle_blocks(0);
  pthread_t t;
  int rc = pthread_create(&t, NULL, free_idle_blocks, NULL);
  CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  pthread_join(t, NULL); /* the freer has exited: its cached blocks went back to their pages */
  idle_rss_after = hkt_rss_bytes();
  printf("31 MiB freed by another thread while their owner waited: RSS %.1f -> %.1f MiB\n",
         (double)idle_rss_before / (double)MiB, (double)idle_rss_after / (double)MiB);
  CHECK(idle_rss_after + 24 * MiB < idle_rss_before,
        "pages emptied by another thread's frees stay resident while their owner waits: RSS %.1f -> %.1f MiB",
        (double)idle_rss_before / (double)MiB, (double)idle_rss_after / (double)MiB);
  /* the owner allocates again: the pages it gets back hold intact new blocks */
  fill_idle_blocks(7);
  for (int i = 0; i < IDLE_BLOCKS; i++) check(idle_blocks[i], 1000, (uint64_t)i + 7, "owner (block after reclaim)");
  for (int i = 0; i < IDLE_BLOCKS; i++) API(free)(idle_blocks[i]);
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
  test_exited_memory_returns();
  test_idle_owner_pages_return();
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
      rss_first = hkt_rss_bytes();
      printf("RSS after %d threads: %.1f MiB\n", base + BATCH, (double)rss_first / (double)MiB);
      fflush(stdout);
    }
  }
  freed += free_list(pending);
  size_t expect = (size_t)NTHREADS * (PER_THREAD / 2);
  CHECK(freed == expect, "main freed %zu handed-off blocks, expected %zu", freed, expect);
  size_t rss_end = hkt_rss_bytes();
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
