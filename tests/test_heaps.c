/* Heaps the program makes (docs/HEAPS.md): hak_heap_new, _malloc, _calloc,
 * _realloc, _destroy and _visit; blocks freed by any thread; what destroy
 * gives back; and each misuse's report. */
#include "api.h"

#include <pthread.h>
#include <stdbool.h>

static const size_t SIZES[] = {0, 1, 8, 16, 24, 100, 1000, 4096, 9000, 70000, 300000, (1 << 20) + 5, 3 << 20};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

/* ---- visiting: a tally of the blocks seen ---- */
typedef struct {
  size_t blocks, bytes;
  void **expect;  /* the live blocks (NULL slots: freed) */
  size_t nexpect;
  size_t stop_after; /* return 7 after this many (0: never) */
} tally;

static int count_block(void *block, size_t size, void *arg) {
  tally *t = arg;
  CHECK(size == API(malloc_usable_size)(block), "visit gives %zu bytes for %p, malloc_usable_size %zu", size, block,
        API(malloc_usable_size)(block));
  if (t->expect != NULL) {
    size_t i = 0;
    while (i < t->nexpect && t->expect[i] != block) i++;
    CHECK(i < t->nexpect, "visit gives %p, not a live block of the heap", block);
  }
  t->blocks++;
  t->bytes += size;
  return t->stop_after != 0 && t->blocks == t->stop_after ? 7 : 0;
}

static size_t live_in(void **b, size_t n) {
  size_t live = 0;
  for (size_t i = 0; i < n; i++) live += b[i] != NULL;
  return live;
}

static void stamp(void *p, size_t size, unsigned char v) {
  if (size > 0) memset(p, v, size);
}

static void check_stamp(const void *p, size_t size, unsigned char v) {
  const unsigned char *c = p;
  for (size_t i = 0; i < size; i++) CHECK(c[i] == v, "byte %zu of %p: %#x, not %#x", i, p, c[i], v);
}

/* malloc, calloc, realloc and visit on one heap, with the default heap's
 * blocks beside them untouched */
static void basics(void) {
  hak_heap_t *h = hak_heap_new();
  CHECK(h != NULL, "hak_heap_new: %s", strerror(errno));
  enum { N = 600 };
  static void *b[N];
  static size_t bs[N];
  void *mine = API(malloc)(100);
  stamp(mine, 100, 0x5a);
  for (size_t i = 0; i < N; i++) {
    bs[i] = SIZES[i % NSIZES];
    b[i] = (i % 3 == 1) ? hak_heap_calloc(h, 1, bs[i]) : hak_heap_malloc(h, bs[i]);
    CHECK(b[i] != NULL, "block %zu of %zu bytes: %s", i, bs[i], strerror(errno));
    CHECK(((uintptr_t)b[i] & 15) == 0 || bs[i] <= 8, "block %zu of %zu bytes at %p: not 16-aligned", i, bs[i], b[i]);
    CHECK(API(malloc_usable_size)(b[i]) >= bs[i], "usable size of block %zu", i);
    if (i % 3 == 1) check_stamp(b[i], bs[i], 0);
    stamp(b[i], bs[i], (unsigned char)i);
  }
  tally t = {.expect = b, .nexpect = N};
  CHECK(hak_heap_visit(h, count_block, &t) == 0, "visit");
  CHECK(t.blocks == N, "visit saw %zu blocks of %d", t.blocks, N);
  /* free a third (by this thread), realloc a third within the heap */
  for (size_t i = 0; i < N; i += 3) {
    API(free)(b[i]);
    b[i] = NULL;
  }
  for (size_t i = 1; i < N; i += 3) {
    size_t to = SIZES[(i * 7) % NSIZES] + 1;
    void *q = (i % 2) ? hak_heap_realloc(h, b[i], to) : API(realloc)(b[i], to);
    CHECK(q != NULL, "realloc of block %zu to %zu", i, to);
    check_stamp(q, to < bs[i] ? to : bs[i], (unsigned char)i);
    b[i] = q;
    bs[i] = to;
    stamp(q, to, (unsigned char)i);
  }
  memset(&t, 0, sizeof t);
  t.expect = b;
  t.nexpect = N;
  CHECK(hak_heap_visit(h, count_block, &t) == 0, "visit after frees and reallocs");
  CHECK(t.blocks == live_in(b, N), "visit saw %zu blocks, %zu live (realloc must keep blocks in their heap)",
        t.blocks, live_in(b, N));
  for (size_t i = 0; i < N; i++)
    if (b[i] != NULL) check_stamp(b[i], bs[i], (unsigned char)i);
  /* the visitor stops the walk */
  memset(&t, 0, sizeof t);
  t.stop_after = 5;
  CHECK(hak_heap_visit(h, count_block, &t) == 7 && t.blocks == 5, "a visitor's non-zero return stops the walk");
  CHECK(hak_heap_realloc(h, NULL, 10) != NULL, "hak_heap_realloc(NULL) allocates");
  CHECK(hak_heap_calloc(h, SIZE_MAX / 2, 3) == NULL && errno == ENOMEM, "calloc overflow: ENOMEM");
  hak_heap_destroy(h);
  check_stamp(mine, 100, 0x5a);
  API(free)(mine);
  hak_heap_destroy(NULL);
  errno = 0;
  hak_heap_t *h2 = hak_heap_new();
  CHECK(hak_heap_visit(h2, NULL, NULL) == -1 && errno == EINVAL, "visit without a visitor: EINVAL");
  hak_heap_destroy(h2);
  printf("test_heaps: %d blocks of 0 B to 3 MiB, visited, freed, reallocated in their heap, destroyed\n", N);
}

static int free_it(void *block, size_t size, void *arg) {
  (void)size;
  (*(size_t *)arg)++;
  API(free)(block);
  return 0;
}

static void visitor_frees(void) {
  hak_heap_t *h = hak_heap_new();
  for (int i = 0; i < 300; i++) CHECK(hak_heap_malloc(h, SIZES[i % NSIZES]) != NULL, "malloc");
  size_t n = 0;
  CHECK(hak_heap_visit(h, free_it, &n) == 0 && n == 300, "a visitor freeing every block: %zu", n);
  tally t = {0};
  CHECK(hak_heap_visit(h, count_block, &t) == 0 && t.blocks == 0, "no block left: %zu", t.blocks);
  hak_heap_destroy(h);
  printf("test_heaps: a visitor freed all 300 blocks it was given\n");
}

/* ---- threads: allocating from one heap, freeing each other's blocks ---- */
enum { THREADS = 4, PER_THREAD = 20000 };
static hak_heap_t *shared;
static void *slots[THREADS][PER_THREAD];
static pthread_barrier_t barrier;

static void *worker(void *arg) {
  size_t id = (size_t)arg;
  uint64_t rng = id * 7919 + 1;
  for (size_t i = 0; i < PER_THREAD; i++) {
    size_t size = 1 + hkt_rand(&rng) % (i % 50 == 0 ? 200000 : 512);
    slots[id][i] = hak_heap_malloc(shared, size);
    CHECK(slots[id][i] != NULL, "thread %zu: malloc(%zu)", id, size);
    memset(slots[id][i], (int)id, size < 64 ? size : 64);
  }
  pthread_barrier_wait(&barrier);
  /* free the next thread's blocks, every other one */
  size_t other = (id + 1) % THREADS;
  for (size_t i = 0; i < PER_THREAD; i += 2) {
    API(free)(slots[other][i]);
    slots[other][i] = NULL;
  }
  return NULL;
}

static void threads(void) {
  shared = hak_heap_new();
  pthread_t t[THREADS];
  pthread_barrier_init(&barrier, NULL, THREADS);
  for (size_t i = 0; i < THREADS; i++) pthread_create(&t[i], NULL, worker, (void *)i);
  for (size_t i = 0; i < THREADS; i++) pthread_join(t[i], NULL);
  tally c = {0};
  CHECK(hak_heap_visit(shared, count_block, &c) == 0, "visit");
  CHECK(c.blocks == (size_t)THREADS * PER_THREAD / 2, "visit after cross-thread frees: %zu blocks, %d live", c.blocks,
        THREADS * PER_THREAD / 2);
  for (size_t k = 0; k < THREADS; k++)
    for (size_t i = 1; i < PER_THREAD; i += 2) {
      const unsigned char *p = slots[k][i];
      CHECK(p[0] == (unsigned char)k, "block of thread %zu overwritten", k);
    }
  hak_heap_destroy(shared);
  printf("test_heaps: %d threads allocated %d blocks from one heap, each freed half of another's\n", THREADS,
         THREADS * PER_THREAD);
}

/* ---- destroy gives the memory back ---- */
static size_t rss_kb(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (f != NULL) {
    if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
    fclose(f);
  }
  return (size_t)res * (size_t)(sysconf(_SC_PAGESIZE) / 1024);
}

static void destroy_gives_back(void) {
  size_t first = 0, last = 0;
  for (int round = 0; round < 20; round++) {
    hak_heap_t *h = hak_heap_new();
    CHECK(h != NULL, "hak_heap_new");
    for (size_t i = 0; i < 200000; i++) {
      size_t size = 16 + (i % 23) * 16;
      char *p = hak_heap_malloc(h, size);
      CHECK(p != NULL, "round %d: malloc", round);
      memset(p, 1, size);
    }
    for (int i = 0; i < 8; i++) memset(hak_heap_malloc(h, 2 << 20), 1, 2 << 20);
    hak_heap_destroy(h);
    API(malloc_trim)(0);
    size_t now = rss_kb();
    if (round == 0) first = now;
    last = now;
  }
  /* each round held ~50 MiB: 20 of them kept would be ~1 GiB */
  CHECK(last < first + 16 * 1024, "RSS %zu KiB after 20 heaps of ~50 MiB, %zu after the first", last, first);
  struct hak_stats s;
  CHECK(hak_stats_get(&s, sizeof s) == 0, "hak_stats_get");
  printf("test_heaps: 20 heaps of ~50 MiB made and destroyed: RSS %zu KiB after the first, %zu after the last\n",
         first, last);
}

/* ---- fork while another thread works in a heap ---- */
static _Atomic int stop;
static void *churn(void *arg) {
  hak_heap_t *h = arg;
  while (!stop) {
    void *p = hak_heap_malloc(h, 64);
    API(free)(p);
  }
  return NULL;
}

static void fork_with_heap(void) {
  hak_heap_t *h = hak_heap_new();
  pthread_t t;
  pthread_create(&t, NULL, churn, h);
  for (int i = 0; i < 20; i++) {
    pid_t pid = fork();
    CHECK(pid >= 0, "fork");
    if (pid == 0) {
      void *p = hak_heap_malloc(h, 100);
      if (p == NULL) _exit(2);
      API(free)(p);
      hak_heap_destroy(h);
      _exit(0);
    }
    int status;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %#x", i, status);
  }
  stop = 1;
  pthread_join(t, NULL);
  hak_heap_destroy(h);
  printf("test_heaps: 20 forks while a thread allocates from a heap: each child used and destroyed it\n");
}

/* ---- labels: a thread's mallocs into a named heap, counted exactly ---- */
enum { LABEL_BLOCKS = 3000 };
static void *labelled[LABEL_BLOCKS];

static void *free_odd(void *arg) {
  (void)arg;
  for (int i = 1; i < LABEL_BLOCKS; i += 2) API(free)(labelled[i]);
  return NULL;
}

static int json_in_visitor(void *block, size_t size, void *arg) {
  (void)block, (void)size;
  hak_stats_json(arg, 4096);
  return 1;
}

static void labels(void) {
  hak_heap_t *a = hak_label("parser");
  CHECK(a != NULL && hak_label("parser") == a, "hak_label: one heap per name");
  CHECK(hak_label("lexer") != a, "hak_label: another name, another heap");
  errno = 0;
  CHECK(hak_label("") == NULL && errno == EINVAL, "hak_label(\"\"): EINVAL");
  errno = 0;
  CHECK(hak_label("a name of more than forty-seven bytes, which is too long") == NULL && errno == EINVAL,
        "a long label: EINVAL");
  struct hak_heap_stats st;
  CHECK(hak_heap_stats(a, &st, sizeof st) == 0 && st.live_blocks == 0 && strcmp(st.name, "parser") == 0,
        "a new label: %llu blocks, name %s", st.live_blocks, st.name);
  CHECK(hak_heap_use(a) == NULL, "hak_heap_use: no heap in use before");
  size_t bytes = 0;
  for (int i = 0; i < LABEL_BLOCKS; i++) {
    size_t size = i % 500 == 7 ? (size_t)(2 << 20) : (size_t)(i % 700) + 1;
    labelled[i] = i % 3 == 0 ? API(calloc)(1, size) : i % 3 == 1 ? API(realloc)(NULL, size) : API(malloc)(size);
    CHECK(labelled[i] != NULL, "malloc(%zu) in the label", size);
    bytes += API(malloc_usable_size)(labelled[i]);
  }
  CHECK(hak_heap_use(NULL) == a, "hak_heap_use(NULL) returns the heap in use");
  void *mine = API(malloc)(100); /* the thread's own heap again */
  CHECK(hak_heap_stats(a, &st, sizeof st) == 0, "hak_heap_stats");
  /* (hardened mode: malloc_usable_size gives the size asked for, the
   * statistics the blocks' classes less the canary) */
  const char *secure = getenv("HAKMEM_SECURE");
  bool hardened = secure != NULL && atoi(secure) > 0;
  CHECK(st.live_blocks == LABEL_BLOCKS && (hardened ? st.live_bytes >= bytes : st.live_bytes == bytes),
        "the label holds %llu blocks, %llu bytes; %d, %zu made", st.live_blocks, st.live_bytes, LABEL_BLOCKS, bytes);
  unsigned long long before = st.live_bytes;
  CHECK(st.large_bytes >= 6u * (2 << 20) && st.page_bytes > 0, "large %llu, pages %llu", st.large_bytes, st.page_bytes);
  /* another thread frees every other block: exact at once */
  size_t odd = 0;
  for (int i = 1; i < LABEL_BLOCKS; i += 2) odd += API(malloc_usable_size)(labelled[i]);
  pthread_t t;
  pthread_create(&t, NULL, free_odd, NULL);
  pthread_join(t, NULL);
  CHECK(hak_heap_stats(a, &st, sizeof st) == 0 && st.live_blocks == LABEL_BLOCKS / 2 &&
            (hardened ? st.live_bytes < before : st.live_bytes == bytes - odd),
        "after another thread's frees: %llu blocks, %llu bytes; %d, %zu live", st.live_blocks, st.live_bytes,
        LABEL_BLOCKS / 2, bytes - odd);

  tally c = {0};
  CHECK(hak_heap_visit(a, count_block, &c) == 0 && c.blocks == LABEL_BLOCKS / 2, "visit: %zu", c.blocks);
  char json[4096];
  /* a report from a visitor of the label: the label is left out, not
   * waited for (its lock is the visitor's thread's) */
  CHECK(hak_heap_visit(a, json_in_visitor, json) == 1, "a visitor writing the statistics' JSON");
  hak_stats_json(json, sizeof json);
  CHECK(strstr(json, "\"labels\":[") != NULL && strstr(json, "\"name\":\"parser\"") != NULL,
        "the statistics' JSON names the label: %s", json);
  for (int i = 0; i < LABEL_BLOCKS; i += 2) API(free)(labelled[i]);
  CHECK(hak_heap_stats(a, &st, sizeof st) == 0 && st.live_blocks == 0 && st.live_bytes == 0, "all freed: %llu",
        st.live_blocks);
  API(free)(mine);
  errno = 0;
  CHECK(hak_heap_stats(a, &st, 8) == -1 && errno == EINVAL, "hak_heap_stats with a short struct: EINVAL");
  printf("test_heaps: %d blocks of up to 2 MiB made in a label, counted exactly before and after another thread "
         "freed half\n", LABEL_BLOCKS);
}

/* The purger's thread, started while the thread uses a heap: the C
 * library's records of it (allocated by pthread_create in this thread)
 * must not land in the heap, which the program may destroy. In a forked
 * child, which has no purger thread until memory is first given back. */
static int tasks(void) {
  int n = 0;
  char path[64];
  for (int i = 0; i < 4096; i++) { /* (no opendir: it allocates) */
    snprintf(path, sizeof path, "/proc/self/task/%d", getpid() + i);
    n += access(path, F_OK) == 0;
  }
  return n;
}

static void purger_started_in_use(void) {
  const char *thread = getenv("HAKMEM_PURGE_THREAD");
  if (thread != NULL && atoi(thread) == 0) { /* (the options matrix: no purger thread to start) */
    printf("test_heaps: HAKMEM_PURGE_THREAD=0: no purger thread, its start inside hak_heap_use not tested\n");
    return;
  }
  fflush(stdout);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    hak_heap_t *h = hak_heap_new();
    int before = tasks();
    hak_heap_use(h);
    static void *b[20000];
    for (int round = 0; round < 3; round++) {
      for (int i = 0; i < 20000; i++) b[i] = API(malloc)(200);
      for (int i = 10; i < 20000; i++) API(free)(b[i]);
    }
    hak_heap_use(NULL);
    int after = tasks();
    struct hak_heap_stats st;
    hak_heap_stats(h, &st, sizeof st);
    CHECK(after > before, "no thread started (%d, %d): the test shows nothing", before, after);
    CHECK(st.live_blocks == 30, "the heap holds %llu blocks, 30 made and kept", st.live_blocks);
    hak_heap_destroy(h);
    _exit(0);
  }
  int status;
  waitpid(pid, &status, 0);
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child: status %#x", status);
  printf("test_heaps: the purger started while a thread used a heap: its records are not in the heap\n");
}

/* ---- misuse: each reported, naming hakmem ---- */
typedef struct {
  void (*fn)(void);
} misuse;
static void call_it(void *m) { ((misuse *)m)->fn(); }

static void expect_report(void (*fn)(void), const char *what, const char *words) {
  char msg[1024];
  misuse m = {fn};
  int status = hkt_run_child(call_it, &m, msg, sizeof msg);
  CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "%s: not reported (status %#x)", what, status);
  CHECK(strstr(msg, "hakmem") != NULL && strstr(msg, words) != NULL, "%s: message %s", what, msg);
  printf("test_heaps: %s: %s", what, msg);
}

static void free_after_destroy(void) {
  hak_heap_t *h = hak_heap_new();
  void *p = hak_heap_malloc(h, 48);
  hak_heap_destroy(h);
  API(free)(hkt_opaque_ptr(p));
}
static void free_large_after_destroy(void) {
  hak_heap_t *h = hak_heap_new();
  void *p = hak_heap_malloc(h, 5 << 20);
  hak_heap_destroy(h);
  API(free)(hkt_opaque_ptr(p));
}
static void malloc_after_destroy(void) {
  hak_heap_t *h = hak_heap_new();
  hak_heap_destroy(h);
  (void)!hak_heap_malloc(hkt_opaque_ptr(h), 10);
}
static void destroy_twice(void) {
  hak_heap_t *h = hak_heap_new();
  hak_heap_destroy(h);
  hak_heap_destroy(hkt_opaque_ptr(h));
}
static hak_heap_t *visited;
static int malloc_in_visitor(void *block, size_t size, void *arg) {
  (void)block, (void)size, (void)arg;
  (void)!hak_heap_malloc(visited, 10);
  return 0;
}
static void visitor_allocates(void) {
  visited = hak_heap_new();
  (void)!hak_heap_malloc(visited, 10);
  hak_heap_visit(visited, malloc_in_visitor, NULL);
}
static void realloc_other_heap(void) {
  hak_heap_t *a = hak_heap_new(), *b = hak_heap_new();
  void *p = hak_heap_malloc(a, 10);
  (void)!hak_heap_realloc(b, p, 20);
}
static void realloc_default_block(void) {
  hak_heap_t *a = hak_heap_new();
  void *p = API(malloc)(10);
  (void)!hak_heap_realloc(a, p, 20);
}
static void use_destroyed(void) {
  hak_heap_t *h = hak_heap_new();
  hak_heap_use(h);
  hak_heap_destroy(h);
  (void)!API(malloc)(hkt_opaque(10));
}
static void not_a_heap(void) {
  static char junk[1 << 16];
  (void)!hak_heap_malloc(hkt_opaque_ptr(junk + 4096), 10);
}

int main(int argc, char **argv) {
  if (argc > 1 && strcmp(argv[1], "threads") == 0) { /* (ThreadSanitizer's run) */
    threads();
    visitor_frees();
    return 0;
  }
  basics();
  visitor_frees();
  threads();
  destroy_gives_back();
  fork_with_heap();
  labels();
  purger_started_in_use();
  expect_report(free_after_destroy, "free() of a block of a destroyed heap", "double free");
  expect_report(free_large_after_destroy, "free() of a large block of a destroyed heap", "free");
  expect_report(malloc_after_destroy, "hak_heap_malloc() on a destroyed heap", "destroyed");
  expect_report(destroy_twice, "hak_heap_destroy() twice", "destroyed");
  expect_report(visitor_allocates, "hak_heap_malloc() from the heap's own visitor", "visitor");
  expect_report(realloc_other_heap, "hak_heap_realloc() of another heap's block", "another heap");
  expect_report(realloc_default_block, "hak_heap_realloc() of a block of no heap", "another heap");
  expect_report(use_destroyed, "malloc() while the thread uses a destroyed heap", "destroyed");
  expect_report(not_a_heap, "hak_heap_malloc() on memory that is no heap", "hak_heap_new");
  printf("test_heaps: ok\n");
  return 0;
}
