/* test_thread_storm: 2,000 threads alive at once, then joined. Joining
 * them overflows glibc's cache of thread stacks, and glibc frees the
 * evicted threads' thread-local storage, through free(), while it holds
 * the lock on that cache. Such a free may be the first to release memory,
 * yet must not start the purger thread from there: pthread_create would
 * wait on that same lock forever (docs/DESIGN.md, "Regions, spans and
 * purging": the purger). A watchdog turns a hang into a failure.
 */
#include "api.h"

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#define THREADS 2000

static pthread_barrier_t all_alive;

static void on_alarm(int sig) {
  (void)sig;
  static const char msg[] = "test_thread_storm: no progress in 60 s: deadlock (creating or joining threads)\n";
  ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

static void *worker(void *arg) {
  size_t id = (size_t)(uintptr_t)arg;
  void *p[16];
  for (int i = 0; i < 16; i++) {
    p[i] = API(malloc)(16 + (id * 97 + (size_t)i * 131) % 3000);
    CHECK(p[i] != NULL, "malloc failed in thread %zu", id);
    memset(p[i], 0x5c, 16);
  }
  pthread_barrier_wait(&all_alive);
  for (int i = 0; i < 16; i++) API(free)(p[i]);
  return NULL;
}

int main(void) {
  signal(SIGALRM, on_alarm);
  alarm(60);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64u << 10); /* small stacks: many of them fit in glibc's 40 MiB cache limit */
  CHECK(pthread_barrier_init(&all_alive, NULL, THREADS) == 0, "pthread_barrier_init");
  static pthread_t t[THREADS];
  for (size_t i = 0; i < THREADS; i++) {
    int rc = pthread_create(&t[i], &attr, worker, (void *)(uintptr_t)i);
    CHECK(rc == 0, "pthread_create %zu: %s", i, strerror(rc));
  }
  for (size_t i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  /* and again, now that the purger may run */
  for (size_t i = 0; i < THREADS; i++) {
    int rc = pthread_create(&t[i], &attr, worker, (void *)(uintptr_t)i);
    CHECK(rc == 0, "pthread_create %zu (second round): %s", i, strerror(rc));
  }
  for (size_t i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  alarm(0);
  printf("test_thread_storm: 2 x %d threads created and joined\n", THREADS);
  return 0;
}
