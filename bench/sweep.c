/* sweep KEY=VALUE ...
 * One workload of the parameter sweep (bench/sweep_configs.py lists the
 * configurations, `run.py --sweep` runs them; docs/BENCHMARKS.md). Sizes
 * take k, m, g suffixes (powers of 1024).
 *
 *   dist=fixed|uniform|loguniform|bimodal   block sizes (default uniform);
 *   lo=B hi=B         from lo to hi bytes (lo >= 8; fixed: lo); bimodal:
 *                     big% of blocks of hi/2..hi, the rest of lo..2*lo
 *   big=P             bimodal's share of big blocks in percent (default 10)
 *   live=N            blocks live at a time, all threads together (default 1000)
 *   ops=N             replacement steps, all threads together (default 100000)
 *   order=lifo|fifo|random   which live blocks a step replaces: the newest
 *                     first (a stack), the oldest first (a queue), random slots
 *   batch=N           blocks freed, then allocated again, per step (default
 *                     min(live, 32)); ops counts blocks, not batches
 *   rebuild=K         K times, evenly spaced over the steps, free every live
 *                     block (in the order's order: newest first, oldest first,
 *                     a random permutation) and allocate the set again
 *   touch=none|first|page|all   what is written into a new block: nothing,
 *                     its first 8 bytes, a byte in each 4 KiB page and the
 *                     stamp, every byte; checked before the block is freed
 *   realloc=none|grow|shrink|mix[:small|:large]   rshare% of the steps
 *                     realloc the chosen block instead of replacing it:
 *                     small steps of up to 1/8 of the size (at least 16 B),
 *                     large ones x2..x4 or /2../4; a size past 2*hi or below
 *                     8 B is drawn afresh from dist
 *   rshare=P          (default 50)
 *   threads=T         worker threads (default 1; the main thread is worker 0);
 *                     each has live/T blocks (at least 1)
 *   remote=P          percent of the frees done by another thread: the block
 *                     goes to the next worker's inbox (short lifetime: to the
 *                     main thread's), which frees it; a worker waits while
 *                     the next one's inbox holds more than its live set
 *                     (at least 64 blocks)
 *   lifetime=long|short   long: the workers run the whole time; short:
 *                     threads of `life` steps each, T at a time, one after
 *                     another (ops/life of them), each with its own live set
 *                     of live/T blocks, which it frees when it ends (the
 *                     remote share goes to the main thread, which frees it
 *                     after the thread has exited)
 *   life=N            steps per short-lived thread (default 100)
 *   pipe=1            producer/consumer pipelines instead: T/2 pairs; the
 *                     producer allocates and writes blocks and passes them
 *                     through a ring of live/(T/2) slots to its consumer,
 *                     which checks and frees them
 *   seed=S            (default 42)
 *
 * ops (in the RESULT line) = blocks allocated plus realloc calls, all
 * threads, live set builds and rebuilds included. A block's contents are
 * checked before it is freed (touch=none: nothing to check); a remote free
 * links the block into the inbox through its first word. */
#include "bench_util.h" /* first: it defines _GNU_SOURCE */
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

enum { D_FIXED, D_UNIFORM, D_LOG, D_BIMODAL };
enum { O_LIFO, O_FIFO, O_RANDOM };
enum { T_NONE, T_FIRST, T_PAGE, T_ALL };
enum { R_NONE, R_GROW, R_SHRINK, R_MIX };

#define OUTBOX_MAX 32 /* remote frees handed over in chains of this many */

static struct {
  int dist, order, touch, realloc_kind, realloc_large, rshare, big, remote, threads, short_life, pipe;
  size_t lo, hi, cap;
  long long live, ops, batch, rebuild, life;
  uint64_t seed;
} cfg = {D_UNIFORM, O_RANDOM, T_FIRST, R_NONE, 0, 50, 10, 0, 1, 0, 0, 16, 1024, 0,
         1000, 100000, 0, 0, 100, 42};

/* a lock-free inbox of blocks to free: pushers prepend chains, the owner
 * takes all. `pending` counts the blocks in it: a long-lived worker whose
 * neighbour's inbox holds more than `limit` waits (draining its own) until
 * the neighbour catches up, so blocks in flight stay about one live set. */
typedef struct {
  _Alignas(64) _Atomic(void *) head;
  _Atomic long pending;
  long limit; /* 0: no limit (the main thread's inbox, drained after joins) */
} inbox_t;

typedef struct {
  bu_rng rng;
  void **p;
  size_t *n;
  long long live, head, steps, ops;
  long long *sel;     /* the batch's emptied slots */
  uint32_t *perm;     /* rebuild order (random) */
  inbox_t *to, *own;  /* remote frees go to `to`; `own` is drained */
  void *out_head, *out_tail;
  int out_count;
} worker_t;

/* ---- sizes and contents ---- */

static size_t draw(bu_rng *r) {
  switch (cfg.dist) {
  case D_FIXED:
    return cfg.lo;
  case D_UNIFORM:
    return bu_range(r, cfg.lo, cfg.hi);
  case D_LOG: {
    double u = (double)(bu_next(r) >> 11) * 0x1p-53;
    size_t s = (size_t)((double)cfg.lo * pow((double)cfg.hi / (double)cfg.lo, u));
    return s < cfg.lo ? cfg.lo : s > cfg.hi ? cfg.hi : s;
  }
  default:
    if ((int)(bu_next(r) % 100) < cfg.big) return bu_range(r, cfg.hi / 2 > cfg.lo ? cfg.hi / 2 : cfg.lo, cfg.hi);
    return bu_range(r, cfg.lo, 2 * cfg.lo < cfg.hi ? 2 * cfg.lo : cfg.hi);
  }
}

static void fill(void *p, size_t n) {
  uint64_t v;
  switch (cfg.touch) {
  case T_FIRST:
    v = bu_pattern(p, n);
    memcpy(p, &v, 8);
    break;
  case T_PAGE:
    bu_touch(p, n);
    break;
  case T_ALL:
    memset(p, 0x5a, n);
    bu_stamp(p, n);
    break;
  }
}

static void check(const void *p, size_t n) {
  uint64_t v;
  switch (cfg.touch) {
  case T_FIRST:
    memcpy(&v, p, 8);
    if (v != bu_pattern(p, n)) bu_fail("sweep", p, n);
    break;
  case T_PAGE:
  case T_ALL:
    bu_check(p, n, "sweep");
    break;
  }
}

/* ---- remote frees ---- */

static void drain(inbox_t *in) {
  if (!atomic_load_explicit(&in->head, memory_order_relaxed)) return;
  void *c = atomic_exchange_explicit(&in->head, NULL, memory_order_acquire);
  long k = 0;
  while (c) {
    void *next = *(void **)c;
    free(c);
    c = next;
    k++;
  }
  atomic_fetch_sub_explicit(&in->pending, k, memory_order_relaxed);
}

static void flush(worker_t *w) {
  if (!w->out_count) return;
  void *old = atomic_load_explicit(&w->to->head, memory_order_relaxed);
  do *(void **)w->out_tail = old;
  while (!atomic_compare_exchange_weak_explicit(&w->to->head, &old, w->out_head, memory_order_release,
                                                memory_order_relaxed));
  atomic_fetch_add_explicit(&w->to->pending, w->out_count, memory_order_relaxed);
  w->out_head = w->out_tail = NULL;
  w->out_count = 0;
  while (w->to->limit && atomic_load_explicit(&w->to->pending, memory_order_relaxed) > w->to->limit) {
    if (w->own) drain(w->own);
    sched_yield();
  }
}

/* free a live block: here, or (remote% of the time) through `to`'s inbox */
static void release(worker_t *w, void *p, size_t n) {
  check(p, n);
  if (w->to && cfg.remote && (int)(bu_next(&w->rng) % 100) < cfg.remote) {
    *(void **)p = w->out_head;
    if (!w->out_head) w->out_tail = p;
    w->out_head = p;
    if (++w->out_count >= OUTBOX_MAX) flush(w);
  } else {
    free(p);
  }
}

/* ---- one worker's live set ---- */

static void alloc_slot(worker_t *w, long long k) {
  size_t n = draw(&w->rng);
  void *p = bu_malloc(n);
  fill(p, n);
  w->p[k] = p;
  w->n[k] = n;
  w->ops++;
}

static void realloc_slot(worker_t *w, long long k) {
  size_t n = w->n[k], m;
  int grow = cfg.realloc_kind == R_GROW || (cfg.realloc_kind == R_MIX && (bu_next(&w->rng) & 1));
  if (cfg.realloc_large) {
    size_t f = bu_range(&w->rng, 2, 4);
    m = grow ? n * f : n / f;
  } else {
    size_t step = bu_range(&w->rng, 1, n / 8 > 16 ? n / 8 : 16);
    m = grow ? n + step : n > step ? n - step : 0;
  }
  if (m > cfg.cap || m < 8) m = draw(&w->rng);
  uint64_t first = 0;
  check(w->p[k], n);
  if (cfg.touch != T_NONE) memcpy(&first, w->p[k], 8);
  void *q = realloc(w->p[k], m);
  if (!q) {
    fprintf(stderr, "realloc(%zu) failed\n", m);
    exit(3);
  }
  if (cfg.touch != T_NONE && memcmp(q, &first, 8) != 0) bu_fail("sweep (realloc lost the contents)", q, m);
  fill(q, m);
  w->p[k] = q;
  w->n[k] = m;
  w->ops++;
}

static void build(worker_t *w) {
  for (long long k = 0; k < w->live; k++) alloc_slot(w, k);
  w->head = 0;
}

/* free every live block in the order's order; `again`: allocate the set again */
static void free_all(worker_t *w, int again) {
  long long L = w->live;
  if (cfg.order == O_RANDOM) {
    for (long long i = 0; i < L; i++) w->perm[i] = (uint32_t)i;
    for (long long i = L - 1; i > 0; i--) {
      long long j = (long long)(bu_next(&w->rng) % (uint64_t)(i + 1));
      uint32_t t = w->perm[i];
      w->perm[i] = w->perm[j];
      w->perm[j] = t;
    }
  }
  for (long long i = 0; i < L; i++) {
    long long k = cfg.order == O_LIFO ? L - 1 - i : cfg.order == O_FIFO ? (w->head + i) % L : w->perm[i];
    release(w, w->p[k], w->n[k]);
    w->p[k] = NULL;
  }
  if (again) build(w);
}

/* `steps` replacement steps in batches, with `rebuilds` free-all phases spread over them */
static void churn(worker_t *w, long long steps, long long rebuilds) {
  long long L = w->live, B = cfg.batch < L ? cfg.batch : L, done = 0, next_rebuild = 1;
  while (done < steps || next_rebuild <= rebuilds) {
    if (next_rebuild <= rebuilds && done >= steps * next_rebuild / (rebuilds + 1)) {
      free_all(w, 1);
      next_rebuild++;
      continue;
    }
    long long b = B < steps - done ? B : steps - done, m = 0;
    for (long long i = 0; i < b; i++) {
      long long k = cfg.order == O_LIFO ? L - 1 - i
                    : cfg.order == O_FIFO ? (w->head + i) % L
                                          : (long long)(bu_next(&w->rng) % (uint64_t)L);
      if (!w->p[k]) continue; /* a random slot drawn twice in the batch */
      if (cfg.realloc_kind != R_NONE && (int)(bu_next(&w->rng) % 100) < cfg.rshare) {
        realloc_slot(w, k);
        continue;
      }
      release(w, w->p[k], w->n[k]);
      w->p[k] = NULL;
      w->sel[m++] = k;
    }
    if (cfg.order == O_FIFO) w->head = (w->head + b) % L;
    for (long long j = 0; j < m; j++) alloc_slot(w, w->sel[cfg.order == O_LIFO ? m - 1 - j : j]);
    done += b;
    if (w->own) drain(w->own);
  }
}

static void worker_init(worker_t *w, long long live, uint64_t seed) {
  memset(w, 0, sizeof *w);
  bu_seed(&w->rng, seed);
  w->live = live;
  w->p = bu_malloc((size_t)live * sizeof *w->p);
  w->n = bu_malloc((size_t)live * sizeof *w->n);
  w->sel = bu_malloc((size_t)(cfg.batch < live ? cfg.batch : live) * sizeof *w->sel);
  w->perm = cfg.order == O_RANDOM ? bu_malloc((size_t)live * sizeof *w->perm) : NULL;
}

static void worker_fini(worker_t *w) {
  free(w->p);
  free(w->n);
  free(w->sel);
  free(w->perm);
}

/* ---- long-lived workers ---- */

static _Atomic int finished; /* long-lived workers done with their steps */
static worker_t *workers;
static inbox_t *inboxes;

static void *long_worker(void *arg) {
  worker_t *w = arg;
  build(w);
  churn(w, w->steps, cfg.rebuild);
  flush(w);
  /* until every worker has finished, keep freeing what the others send */
  atomic_fetch_add(&finished, 1);
  while (atomic_load(&finished) < cfg.threads) {
    drain(w->own);
    sched_yield();
  }
  drain(w->own); /* nobody pushes any more */
  w->to = NULL; /* the final frees are local */
  free_all(w, 0);
  return NULL;
}

static void run_long(void) {
  int T = cfg.threads;
  pthread_t th[16];
  for (int i = 0; i < T; i++) {
    worker_t *w = &workers[i];
    long long live = cfg.live / T + (i < cfg.live % T);
    worker_init(w, live > 0 ? live : 1, cfg.seed * 1000003 + (uint64_t)i);
    inboxes[i].limit = live > 2 * OUTBOX_MAX ? live : 2 * OUTBOX_MAX;
    w->steps = cfg.ops / T + (i < cfg.ops % T);
    w->own = &inboxes[i];
    w->to = T > 1 ? &inboxes[(i + 1) % T] : NULL;
  }
  for (int i = 1; i < T; i++) pthread_create(&th[i], NULL, long_worker, &workers[i]);
  long_worker(&workers[0]);
  for (int i = 1; i < T; i++) pthread_join(th[i], NULL);
}

/* ---- short-lived threads ---- */

static inbox_t main_inbox;

static void *short_worker(void *arg) {
  worker_t *w = arg;
  build(w);
  churn(w, w->steps, cfg.rebuild);
  free_all(w, 0); /* the remote share goes to the main thread */
  flush(w);
  return NULL;
}

static long long run_short(void) {
  int T = cfg.threads;
  long long total = (cfg.ops + cfg.life - 1) / cfg.life, ops = 0;
  if (total < T) total = T;
  pthread_t th[16];
  long long L = cfg.live / T > 0 ? cfg.live / T : 1;
  for (int i = 0; i < T; i++) worker_init(&workers[i], L, 0);
  /* T at a time; the oldest is joined, then its slot starts the next thread */
  for (long long s = 0; s < total + T; s++) {
    int i = (int)(s % T);
    worker_t *w = &workers[i];
    if (s >= T) {
      pthread_join(th[i], NULL);
      ops += w->ops;
      drain(&main_inbox); /* blocks of threads that have exited */
    }
    if (s < total) {
      bu_seed(&w->rng, cfg.seed * 1000003 + (uint64_t)s);
      w->ops = 0;
      w->steps = cfg.life;
      w->to = &main_inbox;
      if (pthread_create(&th[i], NULL, short_worker, w) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        exit(3);
      }
    }
  }
  drain(&main_inbox);
  for (int i = 0; i < T; i++) worker_fini(&workers[i]);
  return ops;
}

/* ---- producer/consumer pipelines ---- */

typedef struct {
  _Alignas(64) _Atomic unsigned long head; /* blocks pushed */
  _Alignas(64) _Atomic unsigned long tail; /* blocks taken */
  void **p;
  size_t *n;
  unsigned long cap, count;
  uint64_t seed;
} ring_t;

static void *producer(void *arg) {
  ring_t *r = arg;
  bu_rng rng;
  bu_seed(&rng, r->seed);
  for (unsigned long h = 0; h < r->count; h++) {
    while (h - atomic_load_explicit(&r->tail, memory_order_acquire) == r->cap) sched_yield();
    size_t n = draw(&rng);
    void *p = bu_malloc(n);
    fill(p, n);
    r->p[h % r->cap] = p;
    r->n[h % r->cap] = n;
    atomic_store_explicit(&r->head, h + 1, memory_order_release);
  }
  return NULL;
}

static void *consumer(void *arg) {
  ring_t *r = arg;
  for (unsigned long t = 0; t < r->count; t++) {
    while (atomic_load_explicit(&r->head, memory_order_acquire) == t) sched_yield();
    check(r->p[t % r->cap], r->n[t % r->cap]);
    free(r->p[t % r->cap]);
    atomic_store_explicit(&r->tail, t + 1, memory_order_release);
  }
  return NULL;
}

static long long run_pipe(void) {
  int pairs = cfg.threads / 2;
  ring_t *rings = aligned_alloc(64, sizeof(ring_t) * (size_t)pairs);
  pthread_t th[16];
  long long ops = 0;
  if (!rings) exit(3);
  for (int i = 0; i < pairs; i++) {
    ring_t *r = &rings[i];
    memset(r, 0, sizeof *r);
    r->cap = (unsigned long)(cfg.live / pairs > 0 ? cfg.live / pairs : 1);
    r->count = (unsigned long)(cfg.ops / pairs);
    r->seed = cfg.seed * 1000003 + (uint64_t)i;
    r->p = bu_malloc(r->cap * sizeof *r->p);
    r->n = bu_malloc(r->cap * sizeof *r->n);
    ops += (long long)r->count;
  }
  for (int i = 0; i < pairs; i++) {
    pthread_create(&th[2 * i], NULL, consumer, &rings[i]);
    pthread_create(&th[2 * i + 1], NULL, producer, &rings[i]);
  }
  for (int i = 0; i < 2 * pairs; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < pairs; i++) {
    free(rings[i].p);
    free(rings[i].n);
  }
  free(rings);
  return ops;
}

/* ---- arguments ---- */

static int pick(const char *v, const char *const *names, int count, const char *key) {
  for (int i = 0; i < count; i++)
    if (strcmp(v, names[i]) == 0) return i;
  fprintf(stderr, "sweep: bad %s=%s\n", key, v);
  exit(64);
}

static long long number(char *v) {
  char *a[1] = {v};
  return bu_arg(1, a, 0, 0);
}

static void parse(int argc, char **argv) {
  static const char *const dists[] = {"fixed", "uniform", "loguniform", "bimodal"};
  static const char *const orders[] = {"lifo", "fifo", "random"};
  static const char *const touches[] = {"none", "first", "page", "all"};
  static const char *const reallocs[] = {"none", "grow", "shrink", "mix"};
  static const char *const lifetimes[] = {"long", "short"};
  int batch_set = 0;
  for (int i = 1; i < argc; i++) {
    char *eq = strchr(argv[i], '=');
    if (!eq) {
      fprintf(stderr, "sweep: arguments are KEY=VALUE (see bench/sweep.c), got %s\n", argv[i]);
      exit(64);
    }
    *eq = 0;
    const char *k = argv[i];
    char *v = eq + 1;
    if (!strcmp(k, "dist")) cfg.dist = pick(v, dists, 4, k);
    else if (!strcmp(k, "lo")) cfg.lo = (size_t)number(v);
    else if (!strcmp(k, "hi")) cfg.hi = (size_t)number(v);
    else if (!strcmp(k, "big")) cfg.big = (int)number(v);
    else if (!strcmp(k, "live")) cfg.live = number(v);
    else if (!strcmp(k, "ops")) cfg.ops = number(v);
    else if (!strcmp(k, "order")) cfg.order = pick(v, orders, 3, k);
    else if (!strcmp(k, "batch")) cfg.batch = number(v), batch_set = 1;
    else if (!strcmp(k, "rebuild")) cfg.rebuild = number(v);
    else if (!strcmp(k, "touch")) cfg.touch = pick(v, touches, 4, k);
    else if (!strcmp(k, "realloc")) {
      char *colon = strchr(v, ':');
      if (colon) {
        *colon = 0;
        static const char *const steps[] = {"small", "large"};
        cfg.realloc_large = pick(colon + 1, steps, 2, "realloc step");
      }
      cfg.realloc_kind = pick(v, reallocs, 4, k);
    } else if (!strcmp(k, "rshare")) cfg.rshare = (int)number(v);
    else if (!strcmp(k, "threads")) cfg.threads = (int)number(v);
    else if (!strcmp(k, "remote")) cfg.remote = (int)number(v);
    else if (!strcmp(k, "lifetime")) cfg.short_life = pick(v, lifetimes, 2, k);
    else if (!strcmp(k, "life")) cfg.life = number(v);
    else if (!strcmp(k, "pipe")) cfg.pipe = (int)number(v);
    else if (!strcmp(k, "seed")) cfg.seed = (uint64_t)number(v);
    else {
      fprintf(stderr, "sweep: unknown key %s (see bench/sweep.c)\n", k);
      exit(64);
    }
  }
  if (cfg.dist == D_FIXED) cfg.hi = cfg.lo;
  if (!batch_set) cfg.batch = cfg.live < 32 ? cfg.live : 32;
  cfg.cap = 2 * cfg.hi > 64 ? 2 * cfg.hi : 64;
  if (cfg.lo < 8 || cfg.hi < cfg.lo || cfg.live < 1 || cfg.live > (1ll << 30) || cfg.ops < 0 ||
      cfg.batch < 1 || cfg.rebuild < 0 || cfg.threads < 1 || cfg.threads > 16 || cfg.remote < 0 ||
      cfg.remote > 100 || cfg.life < 1 || cfg.big < 0 || cfg.big > 100 ||
      (cfg.pipe && (cfg.threads < 2 || cfg.threads % 2))) {
    fprintf(stderr, "sweep: bad combination of arguments (lo >= 8, hi >= lo, live >= 1, threads 1-16, "
                    "remote 0-100, pipe needs an even thread count)\n");
    exit(64);
  }
}

int main(int argc, char **argv) {
  parse(argc, argv);
  workers = aligned_alloc(64, sizeof(worker_t) * 16);
  inboxes = aligned_alloc(64, sizeof(inbox_t) * 16);
  if (!workers || !inboxes) return 3;
  memset(inboxes, 0, sizeof(inbox_t) * 16);

  double t0 = bu_now();
  long long ops = 0;
  if (cfg.pipe) {
    ops = run_pipe();
  } else if (cfg.short_life) {
    ops = run_short();
  } else {
    run_long();
    for (int i = 0; i < cfg.threads; i++) {
      ops += workers[i].ops;
      worker_fini(&workers[i]);
    }
  }
  double t = bu_now() - t0;
  bu_result("sweep", (double)ops, t, "threads=%d", cfg.threads);
  return 0;
}
