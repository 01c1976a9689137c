/* test_lifecycle: allocation outside the comfortable middle of a process's
 * life: in constructors before main, from a thread started by a constructor,
 * in atexit handlers and destructors after main returns, in a pthread_key
 * destructor at thread exit.
 *
 * The program re-runs itself as a child (HKTEST_LIFECYCLE_CHILD=1) and checks
 * that the child exited 0 and printed a marker from every stage, so failures
 * in destructors (which exit the child with status 1) and stages that never
 * ran are both caught.
 */
#define _GNU_SOURCE
#include "api.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static void mark(const char *s) {
  /* write(2): stdio may be torn down in late destructors */
  size_t n = strlen(s);
  ssize_t w = write(1, s, n);
  (void)w;
}

/* allocate, fill, check, free a spread of sizes; returns nothing, fails via CHECK */
static void exercise(const char *stage, uint64_t seed) {
  static const size_t sizes[] = {1, 8, 24, 100, 128, 129, 1000, 4096, 20000, 100 * KiB, 600 * KiB, 3 * MiB};
  void *ps[sizeof sizes / sizeof sizes[0]];
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    ps[i] = API(malloc)(sizes[i]);
    CHECK(ps[i] != NULL, "%s: malloc(%zu) failed", stage, sizes[i]);
    hkt_fill(ps[i], sizes[i], seed + i);
  }
  void *c = API(calloc)(100, 10);
  CHECK(c != NULL, "%s: calloc failed", stage);
  for (size_t i = 0; i < 1000; i++) CHECK(((unsigned char *)c)[i] == 0, "%s: calloc memory not zero", stage);
  void *r = API(realloc)(c, 50000);
  CHECK(r != NULL, "%s: realloc failed", stage);
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    size_t bad = hkt_verify(ps[i], sizes[i], seed + i);
    CHECK(bad == HKT_OK, "%s: block of %zu bytes corrupted at byte %zu", stage, sizes[i], bad);
    API(free)(ps[i]);
  }
  API(free)(r);
}

/* ---- before main ---- */

static unsigned char *ctor_block;         /* allocated in a constructor, freed in a destructor */
static unsigned char *ctor_block_for_main; /* allocated in a constructor, freed in main */
static pthread_t ctor_thread;
static atomic_int ctor_thread_done;
static void *ctor_thread_block;

static void *ctor_thread_main(void *arg) {
  (void)arg;
  exercise("thread started in a constructor", 500);
  void *p = API(malloc)(7777);
  CHECK(p != NULL, "constructor thread: malloc failed");
  hkt_fill(p, 7777, 501);
  ctor_thread_block = p; /* freed by main */
  atomic_store(&ctor_thread_done, 1);
  return NULL;
}

__attribute__((constructor(101))) static void early_ctor(void) {
  exercise("constructor", 100);
  ctor_block = (unsigned char *)API(malloc)(5000);
  CHECK(ctor_block != NULL, "constructor: malloc failed");
  hkt_fill(ctor_block, 5000, 101);
  ctor_block_for_main = (unsigned char *)API(malloc)(2 * MiB + 5);
  CHECK(ctor_block_for_main != NULL, "constructor: malloc(2 MiB) failed");
  hkt_fill(ctor_block_for_main, 2 * MiB + 5, 102);
  int rc = pthread_create(&ctor_thread, NULL, ctor_thread_main, NULL);
  CHECK(rc == 0, "constructor: pthread_create: %s", strerror(rc));
  mark("ctor-ok\n");
}

/* ---- thread exit: pthread_key destructor that allocates ---- */

static pthread_key_t key;
static atomic_int key_dtor_runs;
static _Atomic(void *) key_dtor_block; /* allocated in the key destructor, freed by main */

static void key_dtor(void *v) {
  unsigned char *p = (unsigned char *)v;
  size_t bad = hkt_verify(p, 3000, 600);
  CHECK(bad == HKT_OK, "pthread_key destructor: thread-specific block corrupted at byte %zu", bad);
  API(free)(p);
  exercise("pthread_key destructor", 700);
  int run = atomic_fetch_add(&key_dtor_runs, 1);
  if (run == 0) {
    void *q = API(malloc)(4321);
    CHECK(q != NULL, "pthread_key destructor: malloc failed");
    hkt_fill(q, 4321, 701);
    atomic_store(&key_dtor_block, q);
    /* set the key again: the destructor runs a second time */
    void *again = API(malloc)(3000);
    CHECK(again != NULL, "pthread_key destructor: malloc failed");
    hkt_fill(again, 3000, 600);
    pthread_setspecific(key, again);
  }
}

static void *key_thread_main(void *arg) {
  (void)arg;
  void *p = API(malloc)(3000);
  CHECK(p != NULL, "key thread: malloc failed");
  hkt_fill(p, 3000, 600);
  pthread_setspecific(key, p);
  exercise("key thread", 800);
  return NULL;
}

/* ---- thread exit: allocating in the last round of destructors ----
 * glibc calls thread-specific-data destructors in up to
 * PTHREAD_DESTRUCTOR_ITERATIONS rounds; this one sets its key again until
 * the last round, after hakmem's own destructor has given the thread's
 * heap up, and allocates there: the blocks must be usable, and one of them
 * outlives its thread (main frees it). Each such thread makes a heap of its
 * own that its thread never abandons; the reaper does (test_reap). */
static pthread_key_t last_key;
static atomic_int last_round_runs;
static _Atomic(void *) last_round_block; /* one thread's block, freed by main */

static void last_key_dtor(void *v) {
  uintptr_t round = (uintptr_t)v;
  if (round < PTHREAD_DESTRUCTOR_ITERATIONS) {
    pthread_setspecific(last_key, (void *)(round + 1));
    return;
  }
  static const size_t sizes[] = {24, 1000, 20000, 300 * KiB};
  for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    unsigned char *p = (unsigned char *)API(malloc)(sizes[i]);
    CHECK(p != NULL, "last destructor round: malloc(%zu) failed", sizes[i]);
    hkt_fill(p, sizes[i], 900 + i);
    size_t bad = hkt_verify(p, sizes[i], 900 + i);
    CHECK(bad == HKT_OK, "last destructor round: block of %zu bytes corrupted at byte %zu", sizes[i], bad);
    API(free)(p);
  }
  void *a = API(aligned_alloc)(4096, 8192);
  CHECK(a != NULL && ((uintptr_t)a & 4095) == 0, "last destructor round: aligned_alloc(4096, 8192) gave %p", a);
  API(free)(a);
  void *q = API(malloc)(777);
  CHECK(q != NULL, "last destructor round: malloc(777) failed");
  hkt_fill(q, 777, 999);
  void *old = atomic_exchange(&last_round_block, q);
  if (old != NULL) API(free)(old);
  atomic_fetch_add(&last_round_runs, 1);
}

static void *last_key_thread(void *arg) {
  (void)arg;
  void *p = API(malloc)(100);
  CHECK(p != NULL, "thread: malloc failed");
  API(free)(p);
  pthread_setspecific(last_key, (void *)1);
  return NULL;
}

/* ---- after main ---- */

static unsigned char *main_block_for_dtor; /* allocated in main, freed in a destructor */

static void atexit_handler(void) {
  exercise("atexit handler", 900);
  size_t bad = hkt_verify(ctor_block, 5000, 101);
  CHECK(bad == HKT_OK, "atexit: block allocated in a constructor corrupted at byte %zu", bad);
  mark("atexit-ok\n");
}

__attribute__((destructor(101))) static void late_dtor(void) {
  exercise("destructor", 1000);
  size_t bad = hkt_verify(ctor_block, 5000, 101);
  CHECK(bad == HKT_OK, "destructor: block allocated in a constructor corrupted at byte %zu", bad);
  API(free)(ctor_block);
  bad = hkt_verify(main_block_for_dtor, 100000, 1001);
  CHECK(bad == HKT_OK, "destructor: block allocated in main corrupted at byte %zu", bad);
  API(free)(main_block_for_dtor);
  /* a block that lives until the process is gone */
  void *leak = API(malloc)(333);
  CHECK(leak != NULL, "destructor: malloc failed");
  memset(leak, 3, 333);
  mark("dtor-ok\n");
}

__attribute__((destructor)) static void default_dtor(void) {
  exercise("default-priority destructor", 1100);
  mark("dtor2-ok\n");
}

static int run_child(const char *self) {
  int out[2];
  CHECK(pipe(out) == 0, "pipe: %s", strerror(errno));
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    dup2(out[1], 1);
    close(out[0]);
    close(out[1]);
    setenv("HKTEST_LIFECYCLE_CHILD", "1", 1);
    setenv("HAKMEM_STATS", "1", 1); /* stats printing at exit must coexist with late allocations */
    execl(self, self, (char *)NULL);
    _exit(127);
  }
  close(out[1]);
  char buf[4096];
  buf[0] = '\n'; /* every marker is then preceded by a newline */
  size_t len = 1;
  for (;;) {
    ssize_t n = read(out[0], buf + len, sizeof buf - 1 - len);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    len += (size_t)n;
    if (len >= sizeof buf - 1) break;
  }
  buf[len] = 0;
  close(out[0]);
  int st;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid: %s", strerror(errno));
  printf("child output:%s", buf);
  if (WIFSIGNALED(st)) CHECK(0, "child killed by signal %d (%s)", WTERMSIG(st), strsignal(WTERMSIG(st)));
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child exited with status %d", WEXITSTATUS(st));
  fflush(stdout);
  static const char *markers[] = {"\nctor-ok\n", "\nctor-thread-ok\n", "\nkey-dtor-ok\n", "\nlast-round-ok\n", "\nthreads-ok\n",
                                  "\nmain-ok\n", "\natexit-ok\n",      "\ndtor2-ok\n",    "\ndtor-ok\n"};
  for (size_t i = 0; i < sizeof markers / sizeof markers[0]; i++)
    CHECK(strstr(buf, markers[i]) != NULL, "child never printed \"%.*s\": that stage did not complete",
          (int)strlen(markers[i]) - 2, markers[i] + 1);
  /* order: main before atexit before the destructors */
  const char *m = strstr(buf, "\nmain-ok\n"), *a = strstr(buf, "\natexit-ok\n"), *d = strstr(buf, "\ndtor-ok\n");
  CHECK(m < a && a < d, "stages ran in an unexpected order (main, atexit, destructor expected)");
  return 0;
}

static void *plain_thread(void *arg) {
  exercise("thread", 1200 + (uint64_t)(uintptr_t)arg);
  return NULL;
}

int main(int argc, char **argv) {
  (void)argc;
  (void)argv;
  int is_child = getenv("HKTEST_LIFECYCLE_CHILD") != NULL;
  if (!is_child) printf("test_lifecycle [%s]: scenario runs here and in a child process\n", API_MODE);
  CHECK(atexit(atexit_handler) == 0, "atexit failed");

  /* the thread started in the constructor */
  pthread_join(ctor_thread, NULL);
  CHECK(atomic_load(&ctor_thread_done), "constructor thread did not finish");
  size_t bad = hkt_verify(ctor_thread_block, 7777, 501);
  CHECK(bad == HKT_OK, "block from the constructor thread corrupted at byte %zu", bad);
  API(free)(ctor_thread_block);
  bad = hkt_verify(ctor_block_for_main, 2 * MiB + 5, 102);
  CHECK(bad == HKT_OK, "block allocated in a constructor corrupted at byte %zu", bad);
  API(free)(ctor_block_for_main);
  mark("ctor-thread-ok\n");

  /* pthread_key destructor allocating at thread exit */
  CHECK(pthread_key_create(&key, key_dtor) == 0, "pthread_key_create failed");
  for (int round = 0; round < 3; round++) {
    atomic_store(&key_dtor_runs, 0);
    pthread_t t;
    CHECK(pthread_create(&t, NULL, key_thread_main, NULL) == 0, "pthread_create failed");
    pthread_join(t, NULL);
    CHECK(atomic_load(&key_dtor_runs) == 2, "pthread_key destructor ran %d times, expected 2",
          atomic_load(&key_dtor_runs));
    void *q = atomic_exchange(&key_dtor_block, NULL);
    CHECK(q != NULL, "pthread_key destructor did not leave its block");
    bad = hkt_verify(q, 4321, 701);
    CHECK(bad == HKT_OK, "block allocated in a pthread_key destructor corrupted at byte %zu", bad);
    API(free)(q);
  }
  mark("key-dtor-ok\n");

  /* allocating in the last round of destructors: served, and no heap left behind */
  CHECK(pthread_key_create(&last_key, last_key_dtor) == 0, "pthread_key_create failed");
  size_t rss_before = 0;
  for (int i = 0; i < 3000; i += 8) { /* 8 at a time: they share the late heap at once */
    pthread_t t[8];
    for (int k = 0; k < 8; k++)
      CHECK(pthread_create(&t[k], NULL, last_key_thread, NULL) == 0, "pthread_create failed");
    for (int k = 0; k < 8; k++) pthread_join(t[k], NULL);
    if (i == 96) rss_before = hkt_rss_bytes();
  }
  size_t rss_after = hkt_rss_bytes();
  CHECK(atomic_load(&last_round_runs) == 3000, "last-round destructor ran %d times, expected 3000",
        atomic_load(&last_round_runs));
  void *q = atomic_exchange(&last_round_block, NULL);
  bad = hkt_verify(q, 777, 999);
  CHECK(bad == HKT_OK, "block allocated in the last destructor round corrupted at byte %zu", bad);
  API(free)(q);
  CHECK(rss_after < rss_before + 8 * MiB, "2896 threads (8 at a time) allocating in their last destructor round: RSS %zu -> %zu KiB",
        rss_before >> 10, rss_after >> 10);
  mark("last-round-ok\n");

  /* threads started later */
  pthread_t th[8];
  for (int i = 0; i < 8; i++)
    CHECK(pthread_create(&th[i], NULL, plain_thread, (void *)(uintptr_t)i) == 0, "pthread_create failed");
  for (int i = 0; i < 8; i++) pthread_join(th[i], NULL);
  mark("threads-ok\n");

  exercise("main", 1300);
  main_block_for_dtor = (unsigned char *)API(malloc)(100000);
  CHECK(main_block_for_dtor != NULL, "main: malloc failed");
  hkt_fill(main_block_for_dtor, 100000, 1001);
  mark("main-ok\n");

  if (!is_child) {
    run_child("/proc/self/exe");
    printf("test_lifecycle: all passed\n");
    fflush(stdout);
  }
  return 0; /* exit(): atexit handler, then destructors */
}
