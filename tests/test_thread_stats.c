/* hak_thread_stats: a thread's live blocks are those it allocated and no
 * thread has freed, exactly, under HAKMEM_THREAD_STATS=1, whichever thread
 * frees them (another thread's frees of blocks of every tier, in random
 * order, while the owner waits), across an exited thread's pages (a thread
 * that starts after it counts only its own blocks), and across a large
 * block's realloc by another thread and by its own, by small steps; the calling thread (tid 0), a thread
 * that has allocated nothing and bad arguments; a forked child's thread;
 * the JSON report's list; threads that exit one after another leaving
 * live blocks do not make memory grow (their adopters say they are
 * inexact).
 * Run with HAKMEM_THREAD_STATS=1 (and under the profiler and hardened mode
 * too: tests/CMakeLists.txt). Usage: test_thread_stats [inexact]: with
 * `inexact`, run without the option: the figures say they are inexact, and
 * the owner's count includes blocks another thread freed into its cache
 * (what the option is for), until that thread exits. */
#include "api.h"

#include <pthread.h>
#include <stdbool.h>
#include <sys/syscall.h>

static bool hardened, inexact;

static long my_tid(void) { return (long)syscall(SYS_gettid); }

static struct hak_thread_stats thread_of(long tid) {
  struct hak_thread_stats t;
  memset(&t, 0xab, sizeof t);
  CHECK(hak_thread_stats(tid, &t, sizeof t) == 0, "hak_thread_stats(%ld): %s", tid, strerror(errno));
  CHECK(tid == 0 || t.tid == (unsigned long long)tid, "tid %llu, asked %ld", t.tid, tid);
  CHECK(t.exact == !inexact, "exact %d", t.exact);
  CHECK(t.large_live_blocks <= t.live_blocks && t.large_live_bytes <= t.live_bytes, "large above all");
  return t;
}

/* What a block adds to its thread's live bytes: its class's size (what
 * malloc_usable_size says), a large one's the size asked for; hardened mode's
 * usable size is the size asked for, so there only blocks are compared. */
#define LARGE_MIN ((size_t)2 << 20)
static unsigned long long block_bytes(void *p, size_t size) {
  return size >= LARGE_MIN ? size : API(malloc_usable_size)(p);
}

typedef struct {
  unsigned long long blocks, bytes, large_blocks, large_bytes;
} figures;

static void expect(long tid, const struct hak_thread_stats *base, figures want, const char *when) {
  struct hak_thread_stats t = thread_of(tid);
  long long blocks = (long long)(t.live_blocks - base->live_blocks);
  long long large = (long long)(t.large_live_blocks - base->large_live_blocks);
  long long large_bytes = (long long)(t.large_live_bytes - base->large_live_bytes);
  CHECK(blocks == (long long)want.blocks, "%s: %lld live blocks, want %llu", when, blocks, want.blocks);
  CHECK(large == (long long)want.large_blocks && large_bytes == (long long)want.large_bytes,
        "%s: %lld large blocks of %lld B, want %llu of %llu", when, large, large_bytes, want.large_blocks,
        want.large_bytes);
  long long bytes = (long long)(t.live_bytes - base->live_bytes);
  CHECK(hardened || bytes == (long long)want.bytes, "%s: %lld live bytes, want %llu", when, bytes, want.bytes);
}

/* ---- another thread frees an owner's blocks while it waits ---- */
enum { OWNED = 3000 };
static void *owned[OWNED];
static size_t owned_size[OWNED];
static long owner_tid;
static struct hak_thread_stats owner_base;
static pthread_barrier_t barrier;

static size_t owned_size_of(int i, uint64_t *rng) {
  uint64_t r = hkt_rand(rng);
  if (i % 500 == 7) return LARGE_MIN + (r % 4) * 100000; /* a few large ones */
  if (i % 10 == 3) return 1024 + r % (300 << 10);          /* medium */
  return 1 + r % 512;                                        /* small */
}

static void *owner(void *arg) {
  owner_tid = my_tid();
  owner_base = thread_of(0);
  uint64_t rng = 12345;
  for (int i = 0; i < OWNED; i++) {
    owned_size[i] = owned_size_of(i, &rng);
    owned[i] = API(malloc)(owned_size[i]);
    CHECK(owned[i] != NULL, "malloc(%zu)", owned_size[i]);
  }
  pthread_barrier_wait(&barrier); /* allocated */
  pthread_barrier_wait(&barrier); /* counted, half freed by the freer, counted */
  /* the rest freed here: back to 0 */
  for (int i = 0; i < OWNED; i++)
    if (owned[i] != NULL) API(free)(owned[i]);
  figures none = {0, 0, 0, 0};
  expect(0, &owner_base, none, "the owner freed the rest");
  return arg;
}

static figures owned_figures(void) {
  figures f = {0, 0, 0, 0};
  for (int i = 0; i < OWNED; i++) {
    if (owned[i] == NULL) continue;
    f.blocks++;
    f.bytes += block_bytes(owned[i], owned_size[i]);
    if (owned_size[i] >= LARGE_MIN) {
      f.large_blocks++;
      f.large_bytes += owned_size[i];
    }
  }
  return f;
}

static void *freer(void *arg) {
  long self = my_tid();
  struct hak_thread_stats base = thread_of(0);
  /* every other block, in a shuffled order: runs of one page and single
   * blocks; a large block grown by realloc here stays the owner's */
  int order[OWNED];
  for (int i = 0; i < OWNED; i++) order[i] = i;
  uint64_t rng = 777;
  for (int i = OWNED - 1; i > 0; i--) {
    int j = (int)(hkt_rand(&rng) % (uint64_t)(i + 1)), x = order[i];
    order[i] = order[j];
    order[j] = x;
  }
  for (int k = 0; k < OWNED; k++) {
    int i = order[k];
    if (i % 2 == 0) {
      API(free)(owned[i]);
      owned[i] = NULL;
    }
  }
  figures none = {0, 0, 0, 0};
  expect(self, &base, none, "the freer allocated nothing");
  if (inexact) {
    /* this thread's cache holds some of the blocks it freed, and they
     * still count to the owner: what the option is for */
    struct hak_thread_stats t = thread_of(owner_tid);
    unsigned long long want = owned_figures().blocks, blocks = t.live_blocks - owner_base.live_blocks;
    CHECK(blocks > want, "without the option: %llu live blocks, %llu really live", blocks, want);
    return arg;
  }
  expect(owner_tid, &owner_base, owned_figures(), "half the owner's blocks freed by another thread");
  for (int i = 0; i < OWNED; i++) {
    if (owned[i] == NULL || owned_size[i] < LARGE_MIN) continue;
    size_t grown = owned_size[i] + 300000;
    void *q = API(realloc)(owned[i], grown);
    CHECK(q != NULL, "realloc");
    owned[i] = q;
    if (q == NULL) continue;
    owned_size[i] = grown; /* in place or moved by mremap: still the owner's */
  }
  expect(owner_tid, &owner_base, owned_figures(), "the owner's large blocks grown by another thread");
  return arg;
}

static void test_remote_frees(void) {
  pthread_t o, f;
  pthread_barrier_init(&barrier, NULL, 2);
  CHECK(pthread_create(&o, NULL, owner, NULL) == 0, "thread");
  pthread_barrier_wait(&barrier);
  figures all = owned_figures();
  CHECK(all.large_blocks > 0 && all.large_blocks < all.blocks, "the sizes");
  expect(owner_tid, &owner_base, all, "the owner's blocks");
  CHECK(pthread_create(&f, NULL, freer, NULL) == 0 && pthread_join(f, NULL) == 0, "freer");
  pthread_barrier_wait(&barrier);
  pthread_join(o, NULL);
  pthread_barrier_destroy(&barrier);
  errno = 0;
  struct hak_thread_stats t;
  CHECK(hak_thread_stats(owner_tid, &t, sizeof t) == -1 && errno == ESRCH, "an exited thread found");
}

/* ---- a large block grown by small appends and trimmed by a few bytes:
 * each step within the pages the block ends at changes only its asked size
 * (in place, without a lock: large.c), and the figures follow exactly, the
 * thread's and the process's ---- */
static void *appender(void *arg) {
  struct hak_thread_stats base = thread_of(0);
  struct hak_stats before;
  CHECK(hak_stats_get(&before, sizeof before) == 0, "hak_stats_get");
  size_t size = LARGE_MIN + 12345;
  unsigned char *p = API(malloc)(size);
  CHECK(p != NULL, "malloc");
  memset(p, 0x5a, size);
  int stayed = 0, steps = 4000;
  uint64_t rng = 99;
  for (int i = 0; i < steps; i++) {
    size_t next = i % 8 == 7 ? size - 1 - (size_t)(hkt_rand(&rng) % 40) : size + 1 + (size_t)(hkt_rand(&rng) % 64);
    unsigned char *q = API(realloc)(p, next);
    CHECK(q != NULL, "realloc(%zu -> %zu)", size, next);
    stayed += q == p;
    CHECK(q[0] == 0x5a && q[(size < next ? size : next) - 1] == 0x5a, "realloc(%zu -> %zu) lost the contents", size, next);
    if (next > size) memset(q + size, 0x5a, next - size);
    p = q;
    size = next;
    CHECK(API(malloc_usable_size)(p) >= size, "usable size %zu below %zu", API(malloc_usable_size)(p), size);
    if (i % 97 == 0 || i == steps - 1) {
      figures one = {1, size, 1, size};
      expect(0, &base, one, "a large block grown by appends");
      struct hak_stats s;
      CHECK(hak_stats_get(&s, sizeof s) == 0, "hak_stats_get");
      CHECK(s.large_live_bytes - before.large_live_bytes == size, "process: %llu large live bytes, want %zu",
            s.large_live_bytes - before.large_live_bytes, size);
    }
  }
  CHECK(stayed > steps * 9 / 10, "only %d of %d small resizes stayed in place", stayed, steps);
  API(free)(p);
  figures none = {0, 0, 0, 0};
  expect(0, &base, none, "the appended block freed");
  return arg;
}

static void test_appends(void) {
  pthread_t t;
  CHECK(pthread_create(&t, NULL, appender, NULL) == 0 && pthread_join(t, NULL) == 0, "appender");
}

/* ---- an exited thread's pages: the next thread counts its own blocks only ---- */
enum { LEFT = 2000 };
static void *left[LEFT];

static void *leaver(void *arg) {
  for (int i = 0; i < LEFT; i++) {
    left[i] = API(malloc)(48 + (size_t)(i % 4) * 16);
    CHECK(left[i] != NULL, "malloc");
  }
  for (int i = 0; i < LEFT; i += 3) { /* holes in every page */
    API(free)(left[i]);
    left[i] = NULL;
  }
  return arg;
}

static void *successor(void *arg) {
  struct hak_thread_stats base = thread_of(0);
  enum { MINE = 1500 };
  static void *mine[MINE];
  figures want = {0, 0, 0, 0};
  for (int i = 0; i < MINE; i++) {
    mine[i] = API(malloc)(48 + (size_t)(i % 4) * 16);
    CHECK(mine[i] != NULL, "malloc");
    want.blocks++;
    want.bytes += API(malloc_usable_size)(mine[i]);
  }
  expect(0, &base, want, "a thread started after another exited with live blocks");
  for (int i = 0; i < MINE; i++) API(free)(mine[i]);
  figures none = {0, 0, 0, 0};
  expect(0, &base, none, "its blocks freed");
  return arg;
}

static void test_exited(void) {
  pthread_t t;
  CHECK(pthread_create(&t, NULL, leaver, NULL) == 0 && pthread_join(t, NULL) == 0, "leaver");
  CHECK(pthread_create(&t, NULL, successor, NULL) == 0 && pthread_join(t, NULL) == 0, "successor");
  for (int i = 0; i < LEFT; i++) API(free)(left[i]);
}

/* ---- threads that exit one after another, each leaving a few blocks ----
 * Their pages in use wait for the blocks to be freed, but only a few of a
 * class (then they are adopted, and the adopter's figures say they are
 * inexact): memory does not grow with the threads run. */
enum { STRANDERS = 300, STRAND_BLOCKS = 300, STRAND_KEEP = 30 };
static void *stranded[STRANDERS * (STRAND_BLOCKS / STRAND_KEEP)];
static int exact_after[STRANDERS];

static void *strander(void *arg) {
  int k = (int)(intptr_t)arg;
  uint64_t rng = 99 + (uint64_t)k;
  void *p[STRAND_BLOCKS];
  for (int i = 0; i < STRAND_BLOCKS; i++) {
    p[i] = API(malloc)(16 + hkt_rand(&rng) % 2000);
    CHECK(p[i] != NULL, "malloc");
  }
  for (int i = 0; i < STRAND_BLOCKS; i++) {
    if (i % STRAND_KEEP == 0) stranded[k * (STRAND_BLOCKS / STRAND_KEEP) + i / STRAND_KEEP] = p[i];
    else API(free)(p[i]);
  }
  struct hak_thread_stats t;
  CHECK(hak_thread_stats(0, &t, sizeof t) == 0, "hak_thread_stats");
  exact_after[k] = t.exact;
  return arg;
}

static void test_stranding(void) {
  for (int k = 0; k < STRANDERS; k++) {
    pthread_t t;
    CHECK(pthread_create(&t, NULL, strander, (void *)(intptr_t)k) == 0 && pthread_join(t, NULL) == 0, "strander");
  }
  struct hak_stats s;
  CHECK(hak_stats_get(&s, sizeof s) == 0, "hak_stats_get");
  int inexact_threads = 0;
  for (int k = 0; k < STRANDERS; k++) inexact_threads += !exact_after[k];
  /* (waiting for their blocks, the pages of 300 threads of about 30
   * classes each would take 500 MiB; adopted, they hold a few MiB) */
  CHECK(s.page_bytes < ((unsigned long long)64 << 20), "%llu bytes of pages for %llu live bytes", s.page_bytes,
        s.small_live_bytes);
  CHECK(inexact_threads > 0, "no thread adopted a page in use");
  printf("stranding: %d of %d threads adopted pages in use; pages %.1f MiB\n", inexact_threads, STRANDERS,
         (double)s.page_bytes / (1 << 20));
  for (size_t i = 0; i < sizeof stranded / sizeof *stranded; i++) API(free)(stranded[i]);
}

/* ---- the calling thread, a thread without a heap, bad arguments ---- */
static void *idle(void *arg) {
  struct hak_thread_stats t = thread_of(0);
  CHECK(t.live_blocks == 0 && t.live_bytes == 0 && t.tid == (unsigned long long)my_tid(),
        "a thread that allocated nothing: %llu blocks, tid %llu", t.live_blocks, t.tid);
  return arg;
}

static void test_calls(void) {
  struct hak_thread_stats base = thread_of(0), t = thread_of(my_tid());
  CHECK(t.tid == (unsigned long long)my_tid() && base.tid == t.tid, "tid 0 is the caller");
  void *p = API(malloc)(100), *q = API(malloc)(LARGE_MIN);
  figures want = {2, block_bytes(p, 100) + LARGE_MIN, 1, LARGE_MIN};
  expect(0, &base, want, "the caller's two blocks");
  API(free)(p);
  API(free)(q);
  /* blocks taken from a heap of the program's are that heap's */
  hak_heap_t *outer = hak_heap_use(hak_label("thread-stats-test"));
  p = API(malloc)(100);
  q = API(malloc)(LARGE_MIN);
  hak_heap_use(outer);
  figures none = {0, 0, 0, 0};
  expect(0, &base, none, "blocks of a labelled heap");
  API(free)(p);
  API(free)(q);
  pthread_t i;
  CHECK(pthread_create(&i, NULL, idle, NULL) == 0 && pthread_join(i, NULL) == 0, "idle");
  errno = 0;
  CHECK(hak_thread_stats(0, &t, sizeof t - 1) == -1 && errno == EINVAL, "a short struct accepted");
  errno = 0;
  CHECK(hak_thread_stats(0, NULL, sizeof t) == -1 && errno == EINVAL, "NULL accepted");
  errno = 0;
  CHECK(hak_thread_stats(-1, &t, sizeof t) == -1 && errno == EINVAL, "tid -1 accepted");
  errno = 0;
  CHECK(hak_thread_stats(0x7ffffff0, &t, sizeof t) == -1 && errno == ESRCH, "a tid of no thread found");
}

/* ---- a forked child: its thread has its parent's thread's blocks ---- */
static void test_fork(const char *when) {
  struct hak_thread_stats base = thread_of(0);
  void *p = API(malloc)(LARGE_MIN), *q = API(malloc)(1000);
  CHECK(p != NULL && q != NULL, "malloc");
  figures want = {2, LARGE_MIN + block_bytes(q, 1000), 1, LARGE_MIN};
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    struct hak_thread_stats t = thread_of(0);
    CHECK(t.tid == (unsigned long long)getpid(), "%s: the child's tid %llu, its pid %d", when, t.tid, (int)getpid());
    CHECK(thread_of(getpid()).live_blocks == t.live_blocks, "%s: the child by its tid", when);
    expect(0, &base, want, when);
    _exit(0);
  }
  int status;
  CHECK(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0, "%s: the child failed", when);
  API(free)(p);
  API(free)(q);
}

/* ---- the JSON report lists the threads, the most live bytes first ---- */
static void test_json(void) {
  void *p = API(malloc)(3 << 20);
  size_t size = 1 << 16;
  char *buf = API(malloc)(size);
  CHECK(buf != NULL && hak_stats_json(buf, size) < size, "hak_stats_json");
  char want[64];
  snprintf(want, sizeof want, "\"thread_live\":[{\"tid\":%ld,", my_tid());
  CHECK(strstr(buf, want) != NULL, "the caller (3 MiB live) not first in %s", buf);
  CHECK(strstr(buf, inexact ? "\"thread_stats_exact\":false" : "\"thread_stats_exact\":true") != NULL, "exact");
  API(free)(buf);
  API(free)(p);
}

int main(int argc, char **argv) {
  inexact = argc > 1 && strcmp(argv[1], "inexact") == 0;
  const char *secure = getenv("HAKMEM_SECURE");
  hardened = secure != NULL && atoi(secure) > 0;
#ifdef HAKMEM_TEST_SECURE_DEFAULT
  hardened = true;
#endif
  test_fork("a child forked by a process of one thread");
  test_calls();
  test_json();
  test_remote_frees();
  test_appends();
  if (!inexact) test_exited(); /* (without the option, a page in use may or may not be adopted) */
  test_fork("a child forked by a process that has had other threads");
  if (!inexact) test_stranding(); /* (last: from then on this thread's own figures may be inexact too) */
  printf("test_thread_stats: OK (%s%s)\n", API_MODE, inexact ? ", without HAKMEM_THREAD_STATS" : "");
  return 0;
}
