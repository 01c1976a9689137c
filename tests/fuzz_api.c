/* fuzz_api: a libFuzzer target that runs random programs of hak_ API calls
 * against a shadow model (docs/SAFETY.md, "Fuzzing").
 *
 * The input is a program: each operation is an opcode byte followed by its
 * arguments (a missing byte reads as 0, so every input is a valid program).
 * Opcode bit 7 runs the operation on a helper thread instead of the main
 * one, so blocks are allocated, reallocated and freed by a thread that does
 * not own them; the handoff waits for the helper, so a run is deterministic.
 *
 * The shadow model is a table of slots, each holding a live block: pointer,
 * requested size, usable size and a pattern seed. Every block is painted
 * with its seed's pattern over its whole usable size (above 256 KiB: 4 KiB
 * every 64 KiB, and the tail), and checked before it is freed or reallocated
 * and at the end of the input; realloc must preserve min(old, new) bytes,
 * calloc must give zeros, no two live blocks may overlap, alignment and
 * usable sizes are checked, and impossible requests must fail with the
 * documented errno. Any mismatch prints "fuzz_api: ..." and aborts.
 *
 * Built two ways:
 *  - HAKMEM_SANITIZE=fuzzer (clang): with -fsanitize=fuzzer,address,undefined,
 *    run by `make test-fuzz`;
 *  - every build: linked with fuzz_replay.c (a main() that replays files),
 *    and ctest replays every input in tests/fuzz_corpus/.
 * Regression rule: every input that ever crashed this target is added to
 * tests/fuzz_corpus/ (named after what it found), so it is replayed forever.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h" /* hkt_vreport */
#include "hakmem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NSLOTS 32
#define LARGE_CAP ((size_t)8 << 20)   /* largest block a program may ask for */
#define PAINT_FULL ((size_t)256 << 10) /* blocks up to this are painted entirely */
#define PAINT_STRIDE ((size_t)64 << 10)
#define PAINT_WIN ((size_t)4 << 10)
#define ABSURD_ALIGN ((size_t)1 << 40) /* larger alignments: ENOMEM */

/* The pattern loops give the fuzzer no useful feedback, and ASan knows
 * nothing of hakmem's memory: without coverage tracing and ASan checks in
 * them the fuzzer runs about twice as fast. */
#if defined(__clang__) && __clang_major__ >= 13
#define NO_COVERAGE __attribute__((no_sanitize("coverage", "address"), noinline))
#else
#define NO_COVERAGE
#endif

/* ---- failure report ---- */

static HKT_NORETURN HKT_PRINTF(1, 2) void fail(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  hkt_vreport("fuzz_api: shadow model mismatch: ", fmt, ap);
  va_end(ap);
  abort(); /* libFuzzer records a crash */
}

/* ---- patterns ---- */

static inline uint64_t pat_word(size_t k, uint64_t seed) {
  uint64_t x = (seed + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)k * 0xD6E8FEB86659FD93ull;
  x ^= x >> 29;
  return x * 0xBF58476D1CE4E5B9ull;
}
static inline unsigned char pat_byte(size_t i, uint64_t seed) {
  return (unsigned char)(pat_word(i >> 3, seed) >> ((i & 7) * 8));
}

/* Byte i of a painted block is pat_byte(i, seed): word-wise where aligned. */
NO_COVERAGE static void fill_range(unsigned char *p, size_t off, size_t end, uint64_t seed) {
  size_t i = off;
  for (; i < end && (i & 7) != 0; i++) p[i] = pat_byte(i, seed);
  for (; i + 8 <= end; i += 8) {
    uint64_t w = pat_word(i >> 3, seed);
    memcpy(p + i, &w, 8);
  }
  for (; i < end; i++) p[i] = pat_byte(i, seed);
}

/* First mismatching offset in [off, end), or SIZE_MAX. zero: expect zeros. */
NO_COVERAGE static size_t check_range(const unsigned char *p, size_t off, size_t end, uint64_t seed, int zero) {
  size_t i = off;
  for (; i < end && (i & 7) != 0; i++)
    if (p[i] != (zero ? 0 : pat_byte(i, seed))) return i;
  for (; i + 8 <= end; i += 8) {
    uint64_t w;
    memcpy(&w, p + i, 8);
    if (w != (zero ? 0 : pat_word(i >> 3, seed))) break; /* find the byte below */
  }
  for (; i < end; i++)
    if (p[i] != (zero ? 0 : pat_byte(i, seed))) return i;
  return SIZE_MAX;
}

/* The painted part of an n-byte block: all of it, or for large blocks a
 * window at every stride and the tail. Range k is [*off, *end); returns 0
 * past the last range. */
static int paint_range(size_t n, size_t k, size_t *off, size_t *end) {
  if (n <= PAINT_FULL) {
    *off = 0;
    *end = n;
    return k == 0;
  }
  size_t nwin = (n + PAINT_STRIDE - 1) / PAINT_STRIDE;
  if (k < nwin) {
    *off = k * PAINT_STRIDE;
    *end = *off + PAINT_WIN < n ? *off + PAINT_WIN : n;
    return 1;
  }
  if (k == nwin) {
    *off = n - PAINT_WIN;
    *end = n;
    return 1;
  }
  return 0;
}

static void paint(unsigned char *p, size_t n, uint64_t seed) {
  size_t off, end;
  for (size_t k = 0; paint_range(n, k, &off, &end); k++) fill_range(p, off, end, seed);
}

/* Checks the painted part of an n-byte block below `limit`. */
static void verify(const unsigned char *p, size_t n, size_t limit, uint64_t seed, int zero,
                   const char *what) {
  size_t off, end;
  for (size_t k = 0; paint_range(n, k, &off, &end); k++) {
    if (end > limit) end = limit;
    if (off >= end) continue;
    size_t bad = check_range(p, off, end, seed, zero);
    if (bad != SIZE_MAX)
      fail("%s: block %p (%zu bytes): byte %zu is 0x%02x, expected 0x%02x", what, (const void *)p,
           n, bad, p[bad], zero ? 0 : pat_byte(bad, seed));
  }
}

/* ---- the shadow model ---- */

typedef struct {
  unsigned char *p; /* NULL: empty */
  size_t size;      /* requested */
  size_t usable;    /* hak_malloc_usable_size at allocation; painted */
  uint64_t seed;
} slot;

static slot slots[NSLOTS];
static uint64_t seed_counter;
static unsigned long inputs_run;

/* ---- input reader ---- */

typedef struct {
  const uint8_t *d;
  size_t n, i;
} reader;

static unsigned rd8(reader *r) { return r->i < r->n ? r->d[r->i++] : 0; }
static size_t rd16(reader *r) { return rd8(r) | (size_t)rd8(r) << 8; }
static size_t rd24(reader *r) { return rd16(r) | (size_t)rd8(r) << 16; }

/* Sizes of every tier, and their edges. */
static const size_t edge_sizes[] = {
    0,      1,      7,      8,       9,       15,       16,       17,      24,      127,
    128,    129,    144,    1023,    1024,    1025,     4096,     8191,    8192,    8193,
    40960,  65535,  65536,  65537,   262144,  524288,   1048575,  1048576, 1048577,
    2097152, 2097153, 4190208, 4194304, 8388607, 8388608};

static size_t rd_size(reader *r) {
  unsigned t = rd8(r);
  switch (t & 7) {
  case 0: case 1: case 2: return rd8(r) % 129;                 /* 0..128 */
  case 3: case 4: return 129 + rd16(r) % (8192 - 128);         /* 129..8 KiB */
  case 5: return 8193 + rd24(r) % ((1u << 20) - 8192);         /* ..1 MiB */
  case 6: return ((size_t)1 << 20) + 1 + rd24(r) % (LARGE_CAP - ((size_t)1 << 20)); /* ..8 MiB */
  default: return edge_sizes[rd8(r) % (sizeof edge_sizes / sizeof edge_sizes[0])];
  }
}

/* Valid alignments 1 B .. 4 MiB, or (bit 7) invalid and absurd ones. */
static size_t rd_align(reader *r) {
  unsigned a = rd8(r);
  if (a & 0x80) {
    static const size_t odd[] = {0,  3,  5,  12, 24, 48, 96, 100, 4097, (size_t)3 << 20, SIZE_MAX,
                                 (size_t)1 << 41, (size_t)1 << 63, SIZE_MAX / 2 + 2};
    return odd[(a & 0x7f) % (sizeof odd / sizeof odd[0])];
  }
  return (size_t)1 << (a % 23);
}

static int is_pow2(size_t x) { return x != 0 && (x & (x - 1)) == 0; }

/* ---- checks on a new block ---- */

/* The alignment every allocation result must have: glibc's 16 for sizes
 * above 8 (C++ compilers assume it of operator new; hk_alloc_aligned in
 * src/alloc.c relies on it for alignment 16), 8 below. */
static size_t natural_align(size_t size) {
  return size > 8 ? 16 : 8;
}

/* Records a fresh block (of `size` bytes, aligned to `align`) in slot s:
 * checks alignment, usable size and overlap, then paints it. */
static void install(int s, void *vp, size_t size, size_t align, int zeroed, const char *who) {
  /* realloc may keep a block up to twice the new size; aligned requests
   * and large blocks round up further */
  int tight = align <= 16 && size + 64 <= ((size_t)1 << 20) && strncmp(who, "realloc", 7) != 0;
  unsigned char *p = vp;
  if (p == NULL) fail("%s(%zu) returned NULL", who, size);
  if ((uintptr_t)p % align != 0) fail("%s(%zu): %p is not aligned to %zu", who, size, vp, align);
  if ((uintptr_t)p % natural_align(size) != 0)
    fail("%s(%zu): %p is not aligned to %zu", who, size, vp, natural_align(size));
  size_t usable = hak_malloc_usable_size(p);
  if (usable < size) fail("%s(%zu): usable size %zu is smaller", who, size, usable);
  if (tight && usable > size + (size >> 2) + 64)
    fail("%s(%zu): usable size %zu is more than 25%% larger", who, size, usable);
  if (zeroed) verify(p, size, size, 0, 1, who);
  for (int i = 0; i < NSLOTS; i++) {
    const slot *o = &slots[i];
    if (i == s || o->p == NULL) continue;
    if (p < o->p + o->usable && o->p < p + (usable ? usable : 1))
      fail("%s(%zu): [%p, +%zu) overlaps live block [%p, +%zu) in slot %d", who, size, vp, usable,
           (void *)o->p, o->usable, i);
  }
  slot *sl = &slots[s];
  sl->p = p;
  sl->size = size;
  sl->usable = usable;
  sl->seed = ++seed_counter;
  paint(p, usable, sl->seed);
}

/* Checks slot s's contents and usable size (before it is freed). */
static void check_slot(int s, const char *what) {
  slot *sl = &slots[s];
  if (sl->p == NULL) return;
  size_t u = hak_malloc_usable_size(sl->p);
  if (u != sl->usable)
    fail("%s: usable size of %p changed from %zu to %zu", what, (void *)sl->p, sl->usable, u);
  verify(sl->p, sl->usable, sl->usable, sl->seed, 0, what);
}

static void free_slot(int s, int how) {
  slot *sl = &slots[s];
  if (sl->p == NULL) return;
  check_slot(s, "before free");
  switch (how % 3) {
  case 0: hak_free(sl->p); break;
  case 1: hak_free_sized(sl->p, sl->size); break;
  default: hak_free_aligned_sized(sl->p, 8, sl->size); break;
  }
  sl->p = NULL;
}

/* ---- operations ---- */

enum {
  OP_MALLOC,
  OP_CALLOC,
  OP_REALLOC,
  OP_REALLOCARRAY,
  OP_POSIX_MEMALIGN,
  OP_ALIGNED_ALLOC,
  OP_MEMALIGN,
  OP_VALLOC,
  OP_FREE,
  OP_FREE_SIZED,
  OP_USABLE,
  OP_REPAINT,
  OP_IMPOSSIBLE,
  OP_TRIM,
  OP_RESTART_HELPER,
  OP_NULLS,
  NOPS
};

typedef struct {
  unsigned op;
  int s;          /* slot */
  size_t size, n; /* size; count for calloc/reallocarray; variant */
  size_t align;
} opargs;

static void expect_errno(void *p, int err, int e, const char *what) {
  if (p != NULL) fail("%s returned %p, expected NULL", what, p);
  if (err != e) fail("%s: errno %d, expected %d", what, err, e);
}

static void aligned_op(const opargs *a) {
  size_t al = a->align, size = a->size;
  free_slot(a->s, 0);
  if (a->op == OP_POSIX_MEMALIGN) {
    void *out = (void *)&out; /* must stay untouched on failure */
    int rc = hak_posix_memalign(&out, al, size);
    if (!is_pow2(al) || al % sizeof(void *) != 0) {
      if (rc != EINVAL) fail("posix_memalign(%zu, %zu) = %d, expected EINVAL", al, size, rc);
      if (out != (void *)&out) fail("posix_memalign(%zu): *out changed on failure", al);
      return;
    }
    if (al > ABSURD_ALIGN) {
      if (rc != ENOMEM) fail("posix_memalign(%zu, %zu) = %d, expected ENOMEM", al, size, rc);
      return;
    }
    if (rc != 0) fail("posix_memalign(%zu, %zu) = %d", al, size, rc);
    install(a->s, out, size, al, 0, "posix_memalign");
    return;
  }
  errno = 0;
  void *p = a->op == OP_ALIGNED_ALLOC ? hak_aligned_alloc(al, size) : hak_memalign(al, size);
  int e = errno;
  const char *who = a->op == OP_ALIGNED_ALLOC ? "aligned_alloc" : "memalign";
  if (!is_pow2(al)) {
    /* glibc's memalign rounds the alignment up to a power of two (0: none)
     * and fails only above 2^63; EINVAL, as aligned_alloc, is also fine */
    if (a->op == OP_ALIGNED_ALLOC || al > SIZE_MAX / 2 + 1) return expect_errno(p, e, EINVAL, who);
    if (p == NULL && e == EINVAL) return;
    size_t up = 1;
    while (up < al) up <<= 1;
    al = up;
  }
  if (al > ABSURD_ALIGN) return expect_errno(p, e, ENOMEM, who);
  install(a->s, p, size, al, 0, who);
}

static void realloc_op(const opargs *a) {
  slot *sl = &slots[a->s];
  size_t size = a->size;
  const char *who = a->op == OP_REALLOC ? "realloc" : "reallocarray";
  size_t count = 1;
  if (a->op == OP_REALLOCARRAY) {
    count = a->n;
    if (count != 0 && size > LARGE_CAP / count) size = LARGE_CAP / count;
  }
  size_t total = size * count;
  if (sl->p != NULL) check_slot(a->s, "before realloc");
  void *old = sl->p;
  void *q = a->op == OP_REALLOC ? hak_realloc(old, size) : hak_reallocarray(old, count, size);
  if (old != NULL && total == 0) { /* frees, returns NULL (as glibc) */
    if (q != NULL) fail("%s(%p, 0) returned %p, expected NULL", who, old, q);
    sl->p = NULL;
    return;
  }
  if (q == NULL) fail("%s(%p, %zu) returned NULL", who, old, total);
  if (old != NULL) {
    size_t keep = sl->size < total ? sl->size : total;
    verify(q, sl->usable, keep, sl->seed, 0, "after realloc (preserved prefix)");
  }
  sl->p = NULL; /* the old block is gone: no overlap check against it */
  install(a->s, q, total, 8, 0, who);
}

/* Requests that must fail without touching anything. */
static void impossible_op(const opargs *a) {
  void *p;
  int e;
  switch (a->n % 6) {
  case 0:
    errno = 0; p = hak_malloc(SIZE_MAX - a->size); e = errno;
    return expect_errno(p, e, ENOMEM, "malloc(huge)");
  case 1:
    errno = 0; p = hak_calloc(SIZE_MAX / 2 + 1 + a->size, 2); e = errno;
    return expect_errno(p, e, ENOMEM, "calloc(overflow)");
  case 2:
    errno = 0; p = hak_calloc(1, SIZE_MAX - a->size); e = errno;
    return expect_errno(p, e, ENOMEM, "calloc(1, huge)");
  case 3: {
    slot *sl = &slots[a->s];
    errno = 0; p = hak_realloc(sl->p, SIZE_MAX - a->size); e = errno;
    expect_errno(p, e, ENOMEM, "realloc(p, huge)");
    check_slot(a->s, "after failed realloc"); /* p untouched */
    return;
  }
  case 4: {
    slot *sl = &slots[a->s];
    errno = 0; p = hak_reallocarray(sl->p, SIZE_MAX / 4, 8 + a->size); e = errno;
    expect_errno(p, e, ENOMEM, "reallocarray(overflow)");
    check_slot(a->s, "after failed reallocarray");
    return;
  }
  default:
    errno = 0; p = hak_aligned_alloc(64, SIZE_MAX - a->size); e = errno;
    return expect_errno(p, e, ENOMEM, "aligned_alloc(64, huge)");
  }
}

static void run_op(void *arg) {
  const opargs *a = arg;
  slot *sl = &slots[a->s];
  switch (a->op) {
  case OP_MALLOC:
    free_slot(a->s, 0);
    install(a->s, hak_malloc(a->size), a->size, 1, 0, "malloc");
    break;
  case OP_CALLOC: {
    size_t count = a->n, size = a->size;
    if (count != 0 && size > LARGE_CAP / count) size = LARGE_CAP / count;
    free_slot(a->s, 0);
    /* dirty the memory first, so calloc has something to clear */
    void *d = hak_malloc(count * size);
    if (d == NULL) fail("malloc(%zu) returned NULL", count * size);
    memset(d, 0xa5, count * size < 4096 ? count * size : 4096);
    hak_free(d);
    install(a->s, hak_calloc(count, size), count * size, 1, 1, "calloc");
    break;
  }
  case OP_REALLOC:
  case OP_REALLOCARRAY:
    realloc_op(a);
    break;
  case OP_POSIX_MEMALIGN:
  case OP_ALIGNED_ALLOC:
  case OP_MEMALIGN:
    aligned_op(a);
    break;
  case OP_VALLOC:
    free_slot(a->s, 0);
    if (a->n & 1) {
      install(a->s, hak_valloc(a->size), a->size, 4096, 0, "valloc");
    } else {
      install(a->s, hak_pvalloc(a->size), a->size, 4096, 0, "pvalloc");
      if (sl->usable < ((a->size + 4095) & ~(size_t)4095))
        fail("pvalloc(%zu): usable size %zu is not rounded to pages", a->size, sl->usable);
    }
    break;
  case OP_FREE:
    free_slot(a->s, 0);
    break;
  case OP_FREE_SIZED:
    free_slot(a->s, 1 + (a->n & 1));
    break;
  case OP_USABLE:
    check_slot(a->s, "usable size check");
    break;
  case OP_REPAINT: /* the owner writes its block again: a new pattern */
    if (sl->p != NULL) {
      check_slot(a->s, "before repaint");
      sl->seed = ++seed_counter;
      paint(sl->p, sl->usable, sl->seed);
    }
    break;
  case OP_IMPOSSIBLE:
    impossible_op(a);
    break;
  case OP_TRIM:
    hak_malloc_trim(0);
    break;
  case OP_NULLS:
    hak_free(NULL);
    hak_free_sized(NULL, a->size);
    if (hak_malloc_usable_size(NULL) != 0) fail("malloc_usable_size(NULL) != 0");
    break;
  default:
    break;
  }
}

/* ---- the helper thread ---- */

static pthread_mutex_t h_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t h_cv = PTHREAD_COND_INITIALIZER;
static const opargs *h_job; /* guarded by h_mu */
static int h_pending, h_exit;
static pthread_t h_thread;
static int h_running;

static void *helper_main(void *unused) {
  (void)unused;
  pthread_mutex_lock(&h_mu);
  for (;;) {
    while (!h_pending && !h_exit) pthread_cond_wait(&h_cv, &h_mu);
    if (h_exit) break;
    const opargs *a = h_job;
    pthread_mutex_unlock(&h_mu);
    run_op((void *)a);
    pthread_mutex_lock(&h_mu);
    h_pending = 0;
    pthread_cond_broadcast(&h_cv);
  }
  pthread_mutex_unlock(&h_mu);
  return NULL;
}

static void helper_start(void) {
  h_exit = 0;
  if (pthread_create(&h_thread, NULL, helper_main, NULL) != 0) fail("pthread_create failed");
  h_running = 1;
}

/* The helper exits: its heap is abandoned with blocks still live in it. */
static void helper_stop(void) {
  if (!h_running) return;
  pthread_mutex_lock(&h_mu);
  h_exit = 1;
  pthread_cond_broadcast(&h_cv);
  pthread_mutex_unlock(&h_mu);
  pthread_join(h_thread, NULL);
  h_running = 0;
}

static void run_on_helper(const opargs *a) {
  if (!h_running) helper_start();
  pthread_mutex_lock(&h_mu);
  h_job = a;
  h_pending = 1;
  pthread_cond_broadcast(&h_cv);
  while (h_pending) pthread_cond_wait(&h_cv, &h_mu);
  pthread_mutex_unlock(&h_mu);
}

/* ---- the entry point ---- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size, 0};
  seed_counter = 0;
  while (r.i < r.n) {
    unsigned b = rd8(&r);
    opargs a;
    memset(&a, 0, sizeof a);
    a.op = (b & 0x7f) % NOPS;
    a.s = (int)(rd8(&r) % NSLOTS);
    switch (a.op) {
    case OP_MALLOC:
    case OP_REALLOC:
    case OP_VALLOC:
      a.size = rd_size(&r);
      a.n = rd8(&r);
      break;
    case OP_CALLOC:
    case OP_REALLOCARRAY:
      a.n = rd8(&r) % 17;
      a.size = rd_size(&r);
      break;
    case OP_POSIX_MEMALIGN:
    case OP_ALIGNED_ALLOC:
    case OP_MEMALIGN:
      a.align = rd_align(&r);
      a.size = rd_size(&r);
      break;
    case OP_FREE_SIZED:
    case OP_IMPOSSIBLE:
    case OP_NULLS:
      a.n = rd8(&r);
      a.size = rd8(&r);
      break;
    default:
      break;
    }
    if (a.op == OP_RESTART_HELPER) {
      helper_stop();
      continue;
    }
    if (b & 0x80)
      run_on_helper(&a);
    else
      run_op(&a);
  }
  /* inputs are independent: free everything (alternating threads) */
  for (int s = 0; s < NSLOTS; s++) {
    if (slots[s].p == NULL) continue;
    opargs a = {OP_FREE, s, 0, 0, 0};
    if (h_running && (s & 1))
      run_on_helper(&a);
    else
      run_op(&a);
  }
  if (++inputs_run % 64 == 0) hak_malloc_trim(0);
  return 0;
}
