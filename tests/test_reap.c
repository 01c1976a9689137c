/* test_reap: every heap is within the purger's reach (src/heap.c), and
 * heaps whose thread is gone without abandoning them are reaped
 * (hk_heap_reap).
 *
 * 0. Four threads that filled their spare spans and then idle: the purger
 *    gives back what each keeps beyond 2 MiB. It reaches them through the
 *    list of all heaps, so every heap, a reused one too, must stay linked
 *    there: RSS comes back within 6 MiB of where it started.
 * 1. Threads whose first allocation happens in glibc's last round of
 *    thread-specific-data destructors, after hakmem's own destructor's
 *    turn: each makes a heap that its thread never abandons, and the
 *    reaper must abandon every one of them (else each keeps its pages).
 * 2. A child forked while other threads of the parent own heaps: those
 *    threads do not exist in the child, but their heaps may have been
 *    caught mid-call by the fork, so the child leaves them alone (and
 *    allocates as usual); the parent, whose threads live, reaps nothing.
 *
 * The count comes from malloc_stats() ("heaps of exited threads reaped"),
 * read through a pipe; the reaper runs at most every half purge delay, so
 * the test waits, making a thread now and then (making a heap runs it). */
#include "api.h"

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/wait.h>

#define THREADS 400

static long reaped_count(void) { return hkt_stat("heaps of exited threads reaped"); }

static void *allocating_thread(void *arg) {
  (void)arg;
  void *p = malloc(100);
  CHECK(p != NULL, "malloc failed");
  free(p);
  return NULL;
}

/* wait (up to 5 s) until at least `want` heaps have been reaped in all */
static long wait_reaped(long want) {
  long got = reaped_count();
  for (int i = 0; i < 100 && got < want; i++) {
    usleep(50 * 1000);
    pthread_t t; /* its heap's making runs the reaper */
    CHECK(pthread_create(&t, NULL, allocating_thread, NULL) == 0, "pthread_create failed");
    pthread_join(t, NULL);
    got = reaped_count();
  }
  return got;
}

static pthread_key_t key;
static atomic_int last_round_runs;

static void key_dtor(void *v) {
  uintptr_t round = (uintptr_t)v;
  if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {
    pthread_setspecific(key, (void *)(round + 1));
    return;
  }
  unsigned char *p = (unsigned char *)malloc(3000); /* the thread's first allocation */
  CHECK(p != NULL, "malloc in the last destructor round failed");
  hkt_fill(p, 3000, 5);
  CHECK(hkt_verify(p, 3000, 5) == HKT_OK, "block allocated in the last destructor round corrupted");
  free(p);
  atomic_fetch_add(&last_round_runs, 1);
}

static void *no_alloc_thread(void *arg) {
  (void)arg;
  pthread_setspecific(key, (void *)1); /* no allocation before the destructors */
  return NULL;
}

static atomic_int hold = 1, holding;
static void *holding_thread(void *arg) {
  void *p = malloc((size_t)(uintptr_t)arg);
  CHECK(p != NULL, "malloc failed");
  atomic_fetch_add(&holding, 1);
  while (atomic_load(&hold)) usleep(1000);
  free(p);
  return NULL;
}

static pthread_barrier_t filled, done;
static void *spare_filler(void *arg) {
  (void)arg;
  enum { N = 64 };
  void *p[N];
  for (int r = 0; r < 4; r++) { /* spans of 2-16 slabs, freed: the heap keeps them as spares */
    for (int i = 0; i < N; i++) {
      p[i] = malloc(65536 * (size_t)(1 + i % 15) + 1000);
      CHECK(p[i] != NULL, "malloc failed");
      memset(p[i], 1, 65536);
    }
    for (int i = 0; i < N; i++) free(p[i]);
  }
  pthread_barrier_wait(&filled);
  pthread_barrier_wait(&done);
  return NULL;
}

int main(void) {
  /* 0: idle threads' spares given back by the purger */
  size_t base = hkt_rss_bytes();
  pthread_barrier_init(&filled, NULL, 5);
  pthread_barrier_init(&done, NULL, 5);
  pthread_t f[4];
  for (int i = 0; i < 4; i++) CHECK(pthread_create(&f[i], NULL, spare_filler, NULL) == 0, "pthread_create failed");
  pthread_barrier_wait(&filled);
  size_t full = hkt_rss_bytes(), idle = full;
  /* (each kept spare's blocks keep their first page, which holds the free
   * link and the purge mark: 64 KiB of the 64 KiB written with such pages) */
  size_t kept = (hkt_page() >= 64 * 1024 ? 12 : 6) * ((size_t)1 << 20);
  for (int i = 0; hkt_timed_purges() && i < 60 && idle > base + kept; i++) {
    usleep(50 * 1000);
    idle = hkt_rss_bytes();
  }
  CHECK(!hkt_timed_purges() || idle <= base + kept, "4 idle threads' spares: RSS %zu -> %zu KiB after 3 s (%zu KiB at start)",
        full >> 10, idle >> 10, base >> 10);
  printf("test_reap: 4 idle threads' spares %s: RSS %zu -> %zu KiB (%zu at start)\n",
         hkt_timed_purges() ? "given back" : "not waited for (no timed purges)", full >> 10, idle >> 10, base >> 10);
  pthread_barrier_wait(&done);
  for (int i = 0; i < 4; i++) pthread_join(f[i], NULL);

  /* 1: first allocations in the last destructor round */
  CHECK(pthread_key_create(&key, key_dtor) == 0, "pthread_key_create failed");
  long before = reaped_count();
  for (int i = 0; i < THREADS; i += 8) {
    pthread_t t[8];
    for (int k = 0; k < 8; k++) CHECK(pthread_create(&t[k], NULL, no_alloc_thread, NULL) == 0, "pthread_create failed");
    for (int k = 0; k < 8; k++) pthread_join(t[k], NULL);
  }
  CHECK(atomic_load(&last_round_runs) == THREADS, "last-round destructor ran %d times, expected %d",
        atomic_load(&last_round_runs), THREADS);
  /* (reaping is paced by the purge delay: HAKMEM_PURGE_DELAY_MS) */
  long after = hkt_short_purge_delay() ? wait_reaped(before + THREADS) : reaped_count();
  CHECK(!hkt_short_purge_delay() || after - before >= THREADS, "%ld of %d heaps made in the last destructor round were reaped",
        after - before, THREADS);
  printf("test_reap: %ld heaps made in threads' last destructor round reaped%s\n", after - before,
         hkt_short_purge_delay() ? "" : " (not waited for: long purge delay)");

  /* 2: the parent's other threads' heaps, in a forked child */
  pthread_t h[6];
  for (int i = 0; i < 6; i++)
    CHECK(pthread_create(&h[i], NULL, holding_thread, (void *)(uintptr_t)(100 + 20000 * i)) == 0,
          "pthread_create failed");
  while (atomic_load(&holding) < 6) usleep(1000);
  long parent_count = reaped_count();
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    usleep(200 * 1000); /* past the reaper's idle time */
    for (int i = 0; i < 3; i++) {
      pthread_t t; /* making its heap runs the reaper */
      CHECK(pthread_create(&t, NULL, allocating_thread, NULL) == 0, "child: pthread_create failed");
      pthread_join(t, NULL);
      usleep(60 * 1000);
    }
    long got = reaped_count();
    CHECK(got == parent_count, "child: reaped %ld of the parent's other threads' heaps, expected none",
          got - parent_count);
    void *p = malloc(1000); /* the child's own heap works */
    CHECK(p != NULL, "child: malloc failed");
    free(p);
    printf("test_reap: child left the parent's other threads' heaps alone\n");
    fflush(stdout);
    _exit(0);
  }
  int st;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child failed (status %d)", st);
  /* the parent's threads are alive: their heaps are not reaped */
  usleep(200 * 1000);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, allocating_thread, NULL) == 0, "pthread_create failed");
  pthread_join(t, NULL);
  CHECK(reaped_count() == parent_count, "the parent reaped a live thread's heap (%ld -> %ld)", parent_count,
        reaped_count());
  atomic_store(&hold, 0);
  for (int i = 0; i < 6; i++) pthread_join(h[i], NULL);
  printf("test_reap: passed\n");
  return 0;
}
