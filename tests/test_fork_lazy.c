/* test_fork_lazy: the fork handlers are registered once the process may
 * have a second thread, and before that thread runs (src/init.c); a child
 * forked while the process had one thread keeps a working heap.
 *
 * 1. One thread, after allocating: no handlers yet (what spares a small
 *    program the 64 KiB that the first pthread_atfork call costs).
 * 2. fork() then: the child's heap was made in the parent, whose thread id
 *    it still carries. The reaper, run in the child once that heap has been
 *    idle long enough, must leave it alone (the thread id names no thread
 *    of the child: without the pid check it took the heap for an exited
 *    thread's and abandoned it under the running thread). The child then
 *    allocates, frees and checks its blocks and the parent's.
 * 3. pthread_create: the new thread finds the handlers registered when it
 *    starts (glibc calls calloc for its DTV before it exists); then a fork
 *    while it allocates completes, and the child allocates.
 *
 * Linked with libhakmem.a (malloc replaced, internal names visible).
 * HAKMEM_PURGE_DELAY_MS=0 (set by ctest) makes the reaper's idle test 1 ms. */
#define _GNU_SOURCE
#include "../src/internal.h"
#include "test_util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define NBLOCKS 256

static int failures;
#define CHECK(cond, ...)                                                 \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "test_fork_lazy: FAIL %s:%d: ", __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                      \
      fputc('\n', stderr);                                               \
      failures++;                                                        \
    }                                                                    \
  } while (0)

static void sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static void fill(unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(seed + i * 7);
}
static int intact(const unsigned char *p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != (unsigned char)(seed + i * 7)) return 0;
  return 1;
}

/* allocate, check and free a few thousand blocks of mixed sizes */
static int churn(unsigned seed) {
  void *keep[NBLOCKS];
  size_t len[NBLOCKS];
  uint64_t rng = (uint64_t)seed + 1;
  for (int round = 0; round < 8; round++) {
    for (int i = 0; i < NBLOCKS; i++) {
      len[i] = 16 + (size_t)(hkt_rand(&rng) % 3000);
      keep[i] = malloc(len[i]);
      if (keep[i] == NULL) return 0;
      fill(keep[i], len[i], seed + (unsigned)i);
    }
    for (int i = 0; i < NBLOCKS; i++) {
      if (!intact(keep[i], len[i], seed + (unsigned)i)) return 0;
      free(keep[i]);
    }
    seed += 17;
  }
  return 1;
}

static int wait_child(pid_t pid) {
  int status = 0;
  for (int waited = 0; waited < 20000; waited += 10) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    sleep_ms(10);
  }
  kill(pid, SIGKILL);
  waitpid(pid, &status, 0);
  return -1; /* hung */
}

static _Atomic int seen_at_start = -1;
static _Atomic int stop;

static void *thread_main(void *arg) {
  (void)arg;
  atomic_store(&seen_at_start, atomic_load(&hk_fork_handlers));
  while (!atomic_load(&stop))
    if (!churn(99)) {
      fprintf(stderr, "test_fork_lazy: FAIL: a block changed in the thread\n");
      exit(1);
    }
  return NULL;
}

int main(void) {
  unsigned char *blocks[NBLOCKS];
  for (int i = 0; i < NBLOCKS; i++) {
    blocks[i] = malloc(100 + (size_t)i);
    fill(blocks[i], 100 + (size_t)i, (unsigned)i);
  }

  /* 1 */
  CHECK(atomic_load(&hk_fork_handlers) == 0, "fork handlers registered in a process with one thread");

  /* 2 */
  pid_t pid = fork();
  if (pid == 0) {
    hk_heap *self = hk_tls_heap;
    sleep_ms(20); /* idle far past the reaper's half delay */
    uint64_t reaped = atomic_load(&hk_stats.heaps_reaped);
    hk_heap_reap();
    int ok = atomic_load(&hk_stats.heaps_reaped) == reaped && atomic_load(&self->live) != 0;
    if (!ok) fprintf(stderr, "test_fork_lazy: FAIL: the child's reaper took its running thread's heap\n");
    for (int i = 0; i < NBLOCKS; i++) {
      if (!intact(blocks[i], 100 + (size_t)i, (unsigned)i)) ok = 0;
      free(blocks[i]);
    }
    if (!churn(7)) ok = 0;
    _exit(ok ? 0 : 1);
  }
  CHECK(pid > 0, "fork failed");
  CHECK(wait_child(pid) == 0, "the child forked with one thread failed (or hung)");
  CHECK(atomic_load(&hk_fork_handlers) == 0, "fork handlers registered by fork() alone");

  /* 3 */
  pthread_t t;
  CHECK(pthread_create(&t, NULL, thread_main, NULL) == 0, "pthread_create failed");
  while (atomic_load(&seen_at_start) < 0) sleep_ms(1);
  CHECK(atomic_load(&seen_at_start) == 1, "the second thread started before the fork handlers were registered");
  for (int i = 0; i < 20; i++) {
    pid = fork();
    if (pid == 0) _exit(churn(11) ? 0 : 1);
    CHECK(pid > 0 && wait_child(pid) == 0, "a child forked while a thread allocates failed (or hung)");
  }
  atomic_store(&stop, 1);
  pthread_join(t, NULL);

  for (int i = 0; i < NBLOCKS; i++) {
    CHECK(intact(blocks[i], 100 + (size_t)i, (unsigned)i), "the parent's block %d changed", i);
    free(blocks[i]);
  }
  if (failures) return 1;
  printf("test_fork_lazy: ok\n");
  return 0;
}
