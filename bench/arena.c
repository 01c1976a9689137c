/* arena: build a tree as a parser builds its syntax tree, read it, throw it
 * away; again, in each thread.
 *
 *   arena MODE ROUNDS NODES THREADS [SEED]
 *
 * A round allocates NODES nodes of 48 bytes, a name of 8-63 bytes for
 * three nodes in five, and for each parent an array of children that grows
 * by realloc (doubling from 2); each node's parent is one of the 64 nodes
 * made before it. Then it walks the tree (a checksum of every byte it
 * wrote) and throws it away:
 *   free  malloc/realloc/free, freeing block by block (any allocator);
 *   heap  a heap per round (hakmem's hak_heap_*, mimalloc's mi_heap_*, or
 *         a jemalloc arena (mallocx, arena.<i>.destroy), whichever the
 *         preloaded allocator has), thrown away whole.
 * RESULT: ops = nodes made, build_s and drop_s the time building and
 * throwing away (summed over threads), peak RSS. Exit 4: MODE heap and the
 * allocator has no heaps. */
#include "bench_util.h"

#include <dlfcn.h>
#include <pthread.h>

typedef struct node {
  struct node *next;   /* all nodes, newest first */
  struct node **kids;
  uint32_t nkids, cap;
  char *name;
  uint64_t value;
  uint64_t pad;
} node;

/* the heap API found at run time */
static const char *api = "none";
static void *(*h_new)(void);
static void *(*h_malloc)(void *heap, size_t size);
static void *(*h_realloc)(void *heap, void *p, size_t size);
static void (*h_destroy)(void *heap);
/* jemalloc: arenas */
static int (*je_mallctl)(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
static void *(*je_mallocx)(size_t size, int flags);
static void *(*je_rallocx)(void *p, size_t size, int flags);
#define JE_ARENA(a) ((int)(((unsigned)(a) + 1) << 20))
#define JE_TCACHE_NONE ((int)(1 << 8)) /* MALLOCX_TCACHE_NONE: MALLOCX_TCACHE(-1) */

static void *je_new(void) {
  unsigned a;
  size_t len = sizeof a;
  if (je_mallctl("arenas.create", &a, &len, NULL, 0) != 0) return NULL;
  return (void *)(uintptr_t)(a + 1);
}
static void *je_malloc(void *heap, size_t size) {
  return je_mallocx(size, JE_ARENA((uintptr_t)heap - 1) | JE_TCACHE_NONE);
}
static void *je_realloc(void *heap, void *p, size_t size) {
  return p ? je_rallocx(p, size, JE_ARENA((uintptr_t)heap - 1) | JE_TCACHE_NONE) : je_malloc(heap, size);
}
static void je_destroy(void *heap) {
  char name[64];
  snprintf(name, sizeof name, "arena.%u.destroy", (unsigned)((uintptr_t)heap - 1));
  je_mallctl(name, NULL, NULL, NULL, 0);
}

static int find_heap_api(void) {
  if ((h_new = (void *(*)(void))dlsym(RTLD_DEFAULT, "hak_heap_new")) != NULL) {
    api = "hakmem";
    h_malloc = (void *(*)(void *, size_t))dlsym(RTLD_DEFAULT, "hak_heap_malloc");
    h_realloc = (void *(*)(void *, void *, size_t))dlsym(RTLD_DEFAULT, "hak_heap_realloc");
    h_destroy = (void (*)(void *))dlsym(RTLD_DEFAULT, "hak_heap_destroy");
  } else if ((h_new = (void *(*)(void))dlsym(RTLD_DEFAULT, "mi_heap_new")) != NULL) {
    api = "mimalloc";
    h_malloc = (void *(*)(void *, size_t))dlsym(RTLD_DEFAULT, "mi_heap_malloc");
    h_realloc = (void *(*)(void *, void *, size_t))dlsym(RTLD_DEFAULT, "mi_heap_realloc");
    h_destroy = (void (*)(void *))dlsym(RTLD_DEFAULT, "mi_heap_destroy");
  } else if ((je_mallctl = (int (*)(const char *, void *, size_t *, void *, size_t))dlsym(RTLD_DEFAULT, "mallctl")) != NULL) {
    api = "jemalloc";
    je_mallocx = (void *(*)(size_t, int))dlsym(RTLD_DEFAULT, "mallocx");
    je_rallocx = (void *(*)(void *, size_t, int))dlsym(RTLD_DEFAULT, "rallocx");
    if (je_mallocx == NULL || je_rallocx == NULL) return 0;
    h_new = je_new;
    h_malloc = je_malloc;
    h_realloc = je_realloc;
    h_destroy = je_destroy;
  }
  return h_new != NULL && h_malloc != NULL && h_realloc != NULL && h_destroy != NULL;
}

static int use_heap;
static long rounds, nodes;
static uint64_t seed;

typedef struct {
  uint64_t id;
  double build_s, drop_s;
  uint64_t checksum;
} worker_arg;

static void nomem(size_t size) {
  fprintf(stderr, "arena: allocation of %zu bytes failed\n", size);
  exit(3);
}
static void *alloc_in(void *heap, size_t size) {
  void *p = heap ? h_malloc(heap, size) : malloc(size);
  if (p == NULL) nomem(size);
  return p;
}
static void *realloc_in(void *heap, void *q, size_t size) {
  void *p = heap ? h_realloc(heap, q, size) : realloc(q, size);
  if (p == NULL) nomem(size);
  return p;
}

static void *worker(void *argp) {
  worker_arg *a = argp;
  bu_rng rng;
  bu_seed(&rng, seed * 31 + a->id);
  node **recent = malloc(64 * sizeof *recent);
  for (long r = 0; r < rounds; r++) {
    double t0 = bu_now();
    void *heap = use_heap ? h_new() : NULL;
    if (use_heap && heap == NULL) nomem(0);
    node *all = NULL;
    for (long i = 0; i < nodes; i++) {
      uint64_t x = bu_next(&rng);
      node *n = alloc_in(heap, sizeof *n);
      n->next = all;
      n->kids = NULL;
      n->nkids = n->cap = 0;
      n->value = x;
      n->name = NULL;
      if (x % 5 < 3) {
        size_t len = 8 + (x >> 8) % 56;
        n->name = alloc_in(heap, len);
        memset(n->name, (int)(x >> 16) & 0x7f, len - 1);
        n->name[len - 1] = 0;
      }
      if (i > 0) {
        node *p = recent[(x >> 24) % (uint64_t)(i < 64 ? i : 64)];
        if (p->nkids == p->cap) {
          p->cap = p->cap ? 2 * p->cap : 2;
          p->kids = realloc_in(heap, p->kids, p->cap * sizeof *p->kids);
        }
        p->kids[p->nkids++] = n;
      }
      recent[i % 64] = n;
      all = n;
    }
    /* read it all */
    uint64_t sum = 0;
    for (node *n = all; n != NULL; n = n->next) {
      sum += n->value + n->nkids;
      for (uint32_t k = 0; k < n->nkids; k++) sum += n->kids[k]->value & 1;
      if (n->name != NULL) sum += strlen(n->name);
    }
    a->checksum += sum;
    double t1 = bu_now();
    if (heap != NULL) {
      h_destroy(heap);
    } else {
      node *next;
      for (node *n = all; n != NULL; n = next) {
        next = n->next;
        free(n->kids);
        free(n->name);
        free(n);
      }
    }
    double t2 = bu_now();
    a->build_s += t1 - t0;
    a->drop_s += t2 - t1;
  }
  free(recent);
  return NULL;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: arena free|heap ROUNDS NODES THREADS [SEED]\n");
    return 1;
  }
  use_heap = strcmp(argv[1], "heap") == 0;
  rounds = atol(argv[2]);
  nodes = atol(argv[3]);
  int threads = atoi(argv[4]);
  seed = argc > 5 ? strtoull(argv[5], NULL, 10) : 42;
  if (use_heap && !find_heap_api()) {
    fprintf(stderr, "arena: the allocator has no heap API\n");
    return 4;
  }
  pthread_t t[64];
  worker_arg args[64];
  if (threads < 1 || threads > 64) threads = 1;
  double start = bu_now();
  for (int i = 0; i < threads; i++) {
    args[i] = (worker_arg){.id = (uint64_t)i};
    pthread_create(&t[i], NULL, worker, &args[i]);
  }
  double build = 0, drop = 0;
  uint64_t checksum = 0;
  for (int i = 0; i < threads; i++) {
    pthread_join(t[i], NULL);
    build += args[i].build_s;
    drop += args[i].drop_s;
    checksum += args[i].checksum;
  }
  double secs = bu_now() - start;
  char name[32];
  snprintf(name, sizeof name, "arena_%s", use_heap ? "heap" : "free");
  bu_result(name, (double)rounds * (double)nodes * threads, secs, "api=%s build_s=%.4f drop_s=%.4f checksum=%llu",
            use_heap ? api : "malloc", build, drop, (unsigned long long)checksum);
  return 0;
}
