/* test_fork: fork() while other threads are inside malloc/free.
 *
 * 4 worker threads allocate and free continuously (exchanging blocks through
 * shared slots) while the main thread forks 200 times. Each child frees the
 * blocks it inherited in the slots, allocates and frees a few thousand blocks
 * of various sizes (incl. large ones), starts a thread that allocates, and
 * exits 0. A child that deadlocks (allocator lock held across fork) is killed
 * after a timeout and reported as a failure.
 */
#define _GNU_SOURCE
#include "api.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NWORKERS 4
#define NFORKS 200
#define NSLOTS 512
#define CHILD_TIMEOUT_S 20
#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static _Atomic(uintptr_t) slots[NSLOTS];
static atomic_int stop;
static atomic_long worker_ops;

/* word 0: size; then 64-bit words derived from (origin address, index);
 * tail bytes derived likewise. `origin` is the address the block was stamped
 * at (differs from p after realloc moved it). */
static inline uint64_t sw(uintptr_t origin, size_t i) {
  return ((uint64_t)origin * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)i * 0xC2B2AE3D27D4EB4Full);
}
static void stamp_block(unsigned char *p, size_t size) {
  memcpy(p, &size, sizeof size);
  uint64_t *w = (uint64_t *)(void *)p;
  for (size_t i = 1; i < size / 8; i++) w[i] = sw((uintptr_t)p, i);
  for (size_t i = size / 8 * 8; i < size; i++) p[i] = (unsigned char)sw((uintptr_t)p, i);
}
/* checks bytes [8, upto) of a block stamped at `origin` */
static void check_range(const unsigned char *p, uintptr_t origin, size_t size, size_t upto, const char *who) {
  const uint64_t *w = (const uint64_t *)(const void *)p;
  for (size_t i = 1; i < upto / 8 && i < size / 8; i++)
    CHECK(w[i] == sw(origin, i), "%s: block %p (size %zu): word %zu corrupted", who, (const void *)p, size, i);
  for (size_t i = size / 8 * 8; i < upto; i++)
    CHECK(p[i] == (unsigned char)sw(origin, i), "%s: block %p (size %zu): byte %zu corrupted", who, (const void *)p,
          size, i);
}
static void check_block(const unsigned char *p, const char *who) {
  size_t size;
  memcpy(&size, p, sizeof size);
  CHECK(size >= 8 && size <= 8 * MiB, "%s: block %p has a corrupted size word %zu", who, (const void *)p, size);
  check_range(p, (uintptr_t)p, size, size, who);
}

static size_t pick_size(uint64_t *rng) {
  uint64_t r = hkt_rand(rng);
  unsigned k = (unsigned)(r % 10000);
  r >>= 14;
  if (k < 3) return MiB + 1 + (size_t)(r % (2 * MiB)); /* large */
  if (k < 100) return 32 * KiB + (size_t)(r % (200 * KiB));
  return 8 + (size_t)(r % 2000);
}

static void *worker(void *arg) {
  uint64_t rng = 0x9876543ull + (uintptr_t)arg * 7919;
  long ops = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    size_t s = (size_t)(hkt_rand(&rng) % NSLOTS);
    unsigned char *p = (unsigned char *)atomic_exchange(&slots[s], (uintptr_t)0);
    if (p) {
      check_block(p, "worker");
      API(free)(p);
    } else {
      size_t n = pick_size(&rng);
      p = (unsigned char *)API(malloc)(n);
      CHECK(p != NULL, "worker: malloc(%zu) failed", n);
      stamp_block(p, n);
      unsigned char *old = (unsigned char *)atomic_exchange(&slots[s], (uintptr_t)p);
      if (old) {
        check_block(old, "worker");
        API(free)(old);
      }
    }
    /* a little realloc and calloc as well */
    if ((ops & 63) == 0) {
      void *q = API(calloc)(3, 100);
      CHECK(q != NULL, "worker: calloc failed");
      void *r = API(realloc)(q, 5000);
      CHECK(r != NULL, "worker: realloc failed");
      API(free)(r);
    }
    ops++;
    /* leave the CPUs some room for the forking thread and its children
     * (2-core CI machines); the workers are still mid-malloc most of the time */
    if ((ops & 63) == 0) {
      struct timespec d = {0, 100000};
      nanosleep(&d, NULL);
    }
  }
  atomic_fetch_add(&worker_ops, ops);
  return NULL;
}

static void *child_thread(void *arg) {
  (void)arg;
  uint64_t rng = 42;
  void *ps[300];
  for (int i = 0; i < 300; i++) {
    size_t n = pick_size(&rng);
    ps[i] = API(malloc)(n);
    CHECK(ps[i] != NULL, "child thread: malloc(%zu) failed", n);
    stamp_block((unsigned char *)ps[i], n);
  }
  for (int i = 0; i < 300; i++) {
    check_block((unsigned char *)ps[i], "child thread");
    API(free)(ps[i]);
  }
  return NULL;
}

static void child_main(int iter) {
  alarm(CHILD_TIMEOUT_S); /* a deadlock kills the child with SIGALRM */
  /* blocks the parent's workers left in the slots: check and free them
   * (remote frees to heaps whose threads do not exist in the child) */
  for (size_t s = 0; s < NSLOTS; s++) {
    unsigned char *p = (unsigned char *)atomic_exchange(&slots[s], (uintptr_t)0);
    if (p) {
      check_block(p, "child (inherited block)");
      API(free)(p);
    }
  }
  uint64_t rng = 0xabcdefull + (uint64_t)iter * 31;
  enum { N = 2000 };
  static unsigned char *ps[N];
  for (int i = 0; i < N; i++) {
    uint64_t r = hkt_rand(&rng);
    size_t n = (i == 0)         ? 3 * MiB + 8                       /* large */
               : (r % 50 == 0) ? 2 * KiB + (size_t)((r >> 8) % (60 * KiB))
                               : 8 + (size_t)((r >> 8) % 1500);
    ps[i] = (unsigned char *)API(malloc)(n);
    CHECK(ps[i] != NULL, "child: malloc(%zu) failed", n);
    stamp_block(ps[i], n);
  }
  for (int i = 0; i < N; i += 2) {
    check_block(ps[i], "child");
    API(free)(ps[i]);
    ps[i] = NULL;
  }
  for (int i = 1; i < N; i += 4) {
    check_block(ps[i], "child (before realloc)");
    size_t n;
    memcpy(&n, ps[i], sizeof n);
    size_t nn = n * 2 + 8;
    unsigned char *q = (unsigned char *)API(realloc)(ps[i], nn);
    CHECK(q != NULL, "child: realloc(%zu -> %zu) failed", n, nn);
    check_range(q, (uintptr_t)ps[i], n, n, "child (after realloc)");
    stamp_block(q, nn);
    ps[i] = q;
  }
  pthread_t t;
  int rc = pthread_create(&t, NULL, child_thread, NULL);
  CHECK(rc == 0, "child: pthread_create: %s", strerror(rc));
  pthread_join(t, NULL);
  for (int i = 0; i < N; i++) {
    if (!ps[i]) continue;
    check_block(ps[i], "child (end)");
    API(free)(ps[i]);
  }
  /* every 25th child forks again (fork from a process that was forked) */
  if (iter % 25 == 0) {
    pid_t g = fork();
    CHECK(g >= 0, "child: fork failed: %s", strerror(errno));
    if (g == 0) {
      alarm(CHILD_TIMEOUT_S);
      void *p = API(malloc)(12345);
      CHECK(p != NULL, "grandchild: malloc failed");
      memset(p, 1, 12345);
      API(free)(p);
      void *l = API(malloc)(5 * MiB);
      CHECK(l != NULL, "grandchild: malloc(5 MiB) failed");
      memset(l, 2, 5 * MiB);
      API(free)(l);
      _exit(0);
    }
    int st;
    CHECK(waitpid(g, &st, 0) == g, "child: waitpid failed");
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "grandchild failed (status 0x%x)", st);
  }
  _exit(0);
}

/* Waits for a child for at most `secs` seconds; kills it after that. */
static int wait_child(pid_t pid, int secs, int *status) {
  struct timespec start, now;
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) return 1;
    CHECK(r == 0 || errno == EINTR, "waitpid: %s", strerror(errno));
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec - start.tv_sec > secs) {
      kill(pid, SIGKILL);
      waitpid(pid, status, 0);
      return 0;
    }
    struct timespec d = {0, 200000};
    nanosleep(&d, NULL);
  }
}

int main(void) {
  printf("test_fork [%s]: %d workers, %d forks\n", API_MODE, NWORKERS, NFORKS);
  fflush(stdout);
  pthread_t th[NWORKERS];
  for (int i = 0; i < NWORKERS; i++) {
    int rc = pthread_create(&th[i], NULL, worker, (void *)(uintptr_t)i);
    CHECK(rc == 0, "pthread_create: %s", strerror(rc));
  }
  int failures = 0;
  for (int i = 0; i < NFORKS; i++) {
    /* the main thread allocates around the fork too */
    void *mine = API(malloc)(1000 + (size_t)i);
    CHECK(mine != NULL, "parent: malloc failed");
    memset(mine, 0x11, 1000 + (size_t)i);
    fflush(stdout);
    pid_t pid = fork();
    CHECK(pid >= 0, "fork failed: %s", strerror(errno));
    if (pid == 0) {
      API(free)(mine);
      child_main(i);
    }
    int st = 0;
    if (!wait_child(pid, CHILD_TIMEOUT_S + 5, &st)) {
      fprintf(stderr, "FAIL: child %d (pid %d) did not exit within %d s: deadlocked after fork\n", i, (int)pid,
              CHILD_TIMEOUT_S + 5);
      failures++;
    } else if (WIFSIGNALED(st)) {
      fprintf(stderr, "FAIL: child %d killed by signal %d (%s)%s\n", i, WTERMSIG(st), strsignal(WTERMSIG(st)),
              WTERMSIG(st) == SIGALRM ? ": deadlocked after fork" : "");
      failures++;
    } else if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "FAIL: child %d exited with status %d\n", i, WEXITSTATUS(st));
      failures++;
    }
    API(free)(mine);
    if (failures >= 5) break;
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < NWORKERS; i++) pthread_join(th[i], NULL);
  for (size_t s = 0; s < NSLOTS; s++) {
    unsigned char *p = (unsigned char *)atomic_exchange(&slots[s], (uintptr_t)0);
    if (p) {
      check_block(p, "parent (end)");
      API(free)(p);
    }
  }
  CHECK(failures == 0, "%d of the children failed", failures);
  CHECK(atomic_load(&worker_ops) > 0, "workers did nothing");
  printf("test_fork: all %d children exited 0 (worker ops %ld)\n", NFORKS, atomic_load(&worker_ops));
  return 0;
}
