/* fuzz_api: a libFuzzer target that runs random programs of hak_ API calls
 * against a shadow model (docs/SAFETY.md, "Fuzzing").
 *
 * The input is a program: each operation is an opcode byte followed by its
 * arguments (a missing byte reads as 0, so every input is a valid program).
 * Opcode bit 7 runs the operation on a helper thread instead of the main
 * one, so blocks are allocated, reallocated and freed by a thread that does
 * not own them; the handoff waits for the helper. Opcodes 0x70-0x7f are the
 * operations on many blocks and two threads at once (the bulk pool, racing
 * frees, the helper exiting while the main thread frees) and misuse, which
 * runs in a forked child whose end is checked against what the mode
 * (HAKMEM_SECURE) promises; those runs are not deterministic.
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
 * Built three ways:
 *  - HAKMEM_SANITIZE=fuzzer (clang): with -fsanitize=fuzzer,address,undefined,
 *    run by `make test-fuzz`;
 *  - every build: linked with fuzz_replay.c (a main() that replays files),
 *    and ctest replays every input in tests/fuzz_corpus/;
 *  - HAKMEM_SANITIZE=coverage: fuzz_replay with source-based coverage, for
 *    tools/fuzz_coverage.sh.
 * Regression rule: every input that ever crashed this target is added to
 * tests/fuzz_corpus/ (named after what it found), so it is replayed forever.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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
  int heap;         /* a block of the heap (heap_op) */
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
  sl->heap = 0;
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


/* ---- the bulk pool ---- */

/* Many blocks of one size at a time fill and empty whole pages, regions and
 * caches, which the 32 slots cannot. A bulk block is checked at its two
 * ends (BULK_STAMP bytes each) rather than painted whole. */
#define NBULK 4096
#define BULK_BYTES ((size_t)96 << 20) /* the pool's total request, at most */
#define BULK_STAMP 16

typedef struct {
  unsigned char *p; /* NULL: freed (the pool is compacted by the main thread) */
  size_t size;
  uint64_t seed;
} bulk_blk;

static bulk_blk bulk[NBULK];
static size_t nbulk, bulk_bytes;

static void bulk_stamp(const bulk_blk *b) {
  size_t head = b->size < BULK_STAMP ? b->size : BULK_STAMP;
  fill_range(b->p, 0, head, b->seed);
  fill_range(b->p, b->size - head, b->size, b->seed);
}

static void bulk_check(const bulk_blk *b, const char *what) {
  size_t head = b->size < BULK_STAMP ? b->size : BULK_STAMP;
  size_t bad = check_range(b->p, 0, head, b->seed, 0);
  if (bad == SIZE_MAX) bad = check_range(b->p, b->size - head, b->size, b->seed, 0);
  if (bad != SIZE_MAX)
    fail("%s: bulk block %p (%zu bytes): byte %zu is 0x%02x, expected 0x%02x", what, (void *)b->p,
         b->size, bad, b->p[bad], pat_byte(bad, b->seed));
}

/* Every live block (slots and pool) as [start, end), sorted: no two may
 * overlap. */
typedef struct {
  uintptr_t start, end;
} span;
static span spans[NBULK + NSLOTS];

static int span_cmp(const void *x, const void *y) {
  const span *a = x, *b = y;
  return a->start < b->start ? -1 : a->start > b->start;
}

static void check_overlaps(const char *what) {
  size_t n = 0;
  for (int i = 0; i < NSLOTS; i++)
    if (slots[i].p != NULL)
      spans[n++] = (span){(uintptr_t)slots[i].p, (uintptr_t)slots[i].p + (slots[i].usable ? slots[i].usable : 1)};
  for (size_t i = 0; i < nbulk; i++)
    if (bulk[i].p != NULL)
      spans[n++] = (span){(uintptr_t)bulk[i].p, (uintptr_t)bulk[i].p + (bulk[i].size ? bulk[i].size : 1)};
  qsort(spans, n, sizeof spans[0], span_cmp);
  for (size_t i = 1; i < n; i++)
    if (spans[i].start < spans[i - 1].end)
      fail("%s: live blocks [%#lx, %#lx) and [%#lx, %#lx) overlap", what, (unsigned long)spans[i - 1].start,
           (unsigned long)spans[i - 1].end, (unsigned long)spans[i].start, (unsigned long)spans[i].end);
}

/* n blocks of `size` bytes: variant 0-1 malloc, 2 calloc, 3 aligned_alloc
 * (64 B .. 4 KiB), on the calling thread. */
static void bulk_alloc(size_t n, size_t size, unsigned variant) {
  if (size == 0) size = 1;
  if (n > NBULK - nbulk) n = NBULK - nbulk;
  if (n > (BULK_BYTES - bulk_bytes) / size) n = (BULK_BYTES - bulk_bytes) / size;
  size_t al = (size_t)64 << (variant >> 2) % 7;
  for (size_t i = 0; i < n; i++) {
    bulk_blk *b = &bulk[nbulk];
    switch (variant & 3) {
    case 2: b->p = hak_calloc(1, size); break;
    case 3: b->p = hak_aligned_alloc(al, size); break;
    default: b->p = hak_malloc(size); break;
    }
    if (b->p == NULL) fail("bulk: allocation %zu of %zu (%zu bytes) returned NULL", i, n, size);
    if ((variant & 3) == 3 && (uintptr_t)b->p % al != 0) fail("bulk: aligned_alloc(%zu) gave %p", al, (void *)b->p);
    if ((uintptr_t)b->p % natural_align(size) != 0) fail("bulk: %zu bytes at %p misaligned", size, (void *)b->p);
    if ((variant & 3) == 2) verify(b->p, size, size, 0, 1, "bulk calloc");
    b->size = size;
    b->seed = ++seed_counter;
    bulk_stamp(b);
    nbulk++;
    bulk_bytes += size;
  }
  check_overlaps("bulk allocation");
}

/* Frees the pool's blocks j with j % stride == phase (reverse: from the
 * end), of those only the ones with j % 2 == half when half >= 0. Called
 * by two threads at once with half 0 and 1: they touch disjoint entries. */
static void bulk_free(size_t stride, size_t phase, int reverse, int half) {
  if (stride == 0) stride = 1;
  for (size_t k = 0; k < nbulk; k++) {
    size_t j = reverse ? nbulk - 1 - k : k;
    if (j % stride != phase % stride || (half >= 0 && (int)(j % 2) != half)) continue;
    bulk_blk *b = &bulk[j];
    if (b->p == NULL) continue;
    bulk_check(b, "before bulk free");
    if (j % 3 == 1)
      hak_free_sized(b->p, b->size);
    else
      hak_free(b->p);
    b->p = NULL;
  }
}

/* Drops freed entries (main thread, nobody else using the pool). */
static void bulk_compact(void) {
  size_t n = 0;
  bulk_bytes = 0;
  for (size_t i = 0; i < nbulk; i++)
    if (bulk[i].p != NULL) {
      bulk[n++] = bulk[i];
      bulk_bytes += bulk[i].size;
    }
  nbulk = n;
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
  NOPS_BASIC, /* opcodes 0x00-0x6f: (x % NOPS_BASIC); 0x70-0x7f: the ops below */
  OP_BULK_ALLOC = NOPS_BASIC,
  OP_BULK_FREE,
  OP_RACE_FREE,
  OP_HELPER_EXIT_RACE,
  OP_MISUSE,
  OP_STATS,
  OP_HEAP,
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
  int heap = old != NULL && sl->heap; /* (realloc keeps a block in its heap) */
  sl->p = NULL; /* the old block is gone: no overlap check against it */
  install(a->s, q, total, 8, 0, who);
  sl->heap = heap;
}

/* ---- a heap the program makes (hak_heap_new) ----
 * Slots may hold blocks of one heap (slot.heap): allocated, reallocated in
 * it, visited (every such slot exactly once, nothing else), freed as any
 * block, or dropped all at once when the heap is destroyed. */
static hak_heap_t *fheap;
static int secure_mode; /* (defined below) */

typedef struct {
  int count, freeing;
} visit_state;

static int visit_block(void *block, size_t size, void *arg) {
  visit_state *v = arg;
  int s = 0;
  while (s < NSLOTS && !(slots[s].p == block && slots[s].heap)) s++;
  if (s == NSLOTS) fail("hak_heap_visit gave %p, no live block of the heap", block);
  if (size != slots[s].usable) fail("hak_heap_visit gave %zu bytes for slot %d, usable %zu", size, s, slots[s].usable);
  v->count++;
  if (v->freeing && (v->count & 1)) free_slot(s, (unsigned)s); /* the visitor may free what it is given */
  return 0;
}

static void heap_misuse(unsigned which, size_t size);

static void heap_op(const opargs *a) {
  slot *sl = &slots[a->s];
  unsigned v = (unsigned)(a->n % 8);
  if (a->n & 128) { /* a misuse of a heap, in a child (see misuse_op) */
    heap_misuse((unsigned)(a->n >> 3), a->size);
    return;
  }
  if (fheap == NULL && v != 4) {
    fheap = (a->n & 64) ? hak_label("fuzz") : hak_heap_new(); /* (a label: destroyed as any heap) */
    if (fheap == NULL) fail("hak_heap_new returned NULL");
  }
  switch (v) {
  case 0:
  case 1: {
    free_slot(a->s, 0);
    size_t count = 1 + (a->n >> 3) % 4, size = a->size / count;
    void *p = v == 0 ? hak_heap_malloc(fheap, a->size) : hak_heap_calloc(fheap, count, size);
    install(a->s, p, v == 0 ? a->size : count * size, 1, v == 1, v == 0 ? "hak_heap_malloc" : "hak_heap_calloc");
    sl->heap = 1;
    break;
  }
  case 2: { /* hak_heap_realloc of the slot's block, if it is the heap's */
    if (sl->p != NULL && !sl->heap) break;
    if (sl->p != NULL) check_slot(a->s, "before hak_heap_realloc");
    void *old = sl->p;
    void *q = hak_heap_realloc(fheap, old, a->size);
    if (old != NULL && a->size == 0) {
      if (q != NULL) fail("hak_heap_realloc(%p, 0) returned %p", old, q);
      sl->p = NULL;
      break;
    }
    if (q == NULL) fail("hak_heap_realloc(%p, %zu) returned NULL", old, a->size);
    if (old != NULL) verify(q, sl->usable, sl->size < a->size ? sl->size : a->size, sl->seed, 0, "after hak_heap_realloc");
    sl->p = NULL;
    install(a->s, q, a->size, 8, 0, "realloc");
    sl->heap = 1;
    break;
  }
  case 3:
  case 5: { /* every block visited once; (5) the visitor frees every other one */
    int live = 0;
    for (int i = 0; i < NSLOTS; i++) live += slots[i].p != NULL && slots[i].heap;
    visit_state st = {0, v == 5};
    int r = hak_heap_visit(fheap, visit_block, &st);
    if (r != 0 || st.count != live) fail("hak_heap_visit returned %d after %d blocks, %d live", r, st.count, live);
    break;
  }
  case 6: { /* the thread's malloc, calloc or realloc(NULL) into the heap (hak_heap_use) */
    free_slot(a->s, 0);
    if (hak_heap_use(fheap) != NULL) fail("hak_heap_use: a heap was in use");
    int how = (int)(a->n >> 3) % 3;
    void *p = how == 0 ? hak_malloc(a->size) : how == 1 ? hak_calloc(1, a->size) : hak_realloc(NULL, a->size);
    if (hak_heap_use(NULL) != fheap) fail("hak_heap_use(NULL) did not return the heap in use");
    install(a->s, p, a->size, 1, how == 1, "malloc in hak_heap_use");
    sl->heap = 1;
    break;
  }
  case 7: { /* what the heap holds: its slots exactly */
    struct hak_heap_stats st;
    unsigned long long live = 0, bytes = 0;
    for (int i = 0; i < NSLOTS; i++)
      if (slots[i].p != NULL && slots[i].heap) live++, bytes += slots[i].usable;
    if (hak_heap_stats(fheap, &st, sizeof st) != 0) fail("hak_heap_stats failed");
    if (st.live_blocks != live || (secure_mode == 0 && st.live_bytes != bytes) || st.live_bytes < bytes)
      fail("hak_heap_stats: %llu blocks, %llu bytes; the slots hold %llu, %llu", st.live_blocks, st.live_bytes, live,
           bytes);
    break;
  }
  default: /* destroyed: its blocks are gone, unfreed */
    if (fheap == NULL) break;
    for (int i = 0; i < NSLOTS; i++)
      if (slots[i].p != NULL && slots[i].heap) {
        check_slot(i, "before hak_heap_destroy");
        slots[i].p = NULL;
      }
    hak_heap_destroy(fheap);
    fheap = NULL;
    break;
  }
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
  case OP_BULK_ALLOC:
    bulk_alloc(a->n, a->size, (unsigned)a->align);
    break;
  case OP_BULK_FREE: /* a->n: stride and phase; a->align: reverse, half + 1; a->size: slots too */
    bulk_free(1 + a->n % 8, a->n >> 3, a->align & 1, (int)(a->align >> 1) - 1);
    if (a->size) /* the slots of this half (all: half -1) */
      for (int i = 0; i < NSLOTS; i++)
        if ((a->align >> 1) == 0 || i % 2 == (int)(a->align >> 1) - 1) free_slot(i, (unsigned)i);
    break;
  case OP_HEAP:
    heap_op(a);
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
static void helper_tell_exit(void) {
  pthread_mutex_lock(&h_mu);
  h_exit = 1;
  pthread_cond_broadcast(&h_cv);
  pthread_mutex_unlock(&h_mu);
}

static void helper_join(void) {
  pthread_join(h_thread, NULL);
  h_running = 0;
}

static void helper_stop(void) {
  if (!h_running) return;
  helper_tell_exit();
  helper_join();
}

/* Hands the helper an operation; helper_wait() waits for it to finish. In
 * between, the main thread may run operations of its own at the same time. */
static void helper_post(const opargs *a) {
  if (!h_running) helper_start();
  pthread_mutex_lock(&h_mu);
  h_job = a;
  h_pending = 1;
  pthread_cond_broadcast(&h_cv);
  pthread_mutex_unlock(&h_mu);
}

static void helper_wait(void) {
  pthread_mutex_lock(&h_mu);
  while (h_pending) pthread_cond_wait(&h_cv, &h_mu);
  pthread_mutex_unlock(&h_mu);
}

static void run_on_helper(const opargs *a) {
  helper_post(a);
  helper_wait();
}


/* ---- operations on two threads at once ---- */

/* The helper and the main thread free disjoint halves of the pool (and of
 * the slots) at the same moment: frees of each other's blocks race with
 * frees of their own on the same pages. */
static void race_free(const opargs *a) {
  opargs h = *a, m = *a;
  h.op = m.op = OP_BULK_FREE;
  h.align = 4 | (a->align & 1); /* half 1 */
  m.align = 2 | (a->align & 1); /* half 0 */
  helper_post(&h);
  run_op(&m);
  helper_wait();
}

/* The helper exits (its heap is abandoned, blocks still live in it) while
 * the main thread frees blocks, many of them the helper's. */
static void helper_exit_race(const opargs *a) {
  if (!h_running) return;
  helper_tell_exit();
  opargs m = *a;
  m.op = OP_BULK_FREE;
  m.align &= 1;
  run_op(&m);
  helper_join();
}

/* Counters and the calls that only report: must not crash or change any
 * block. hak_malloc_stats writes to stderr: sent to /dev/null here. */
static void stats_op(const opargs *a) {
#if defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
  struct mallinfo2 mi = hak_mallinfo2();
  /* in use = region pages in use + live large mappings; free = the rest
   * of the regions + cached large mappings; blocks above 1 MiB are large */
  size_t large = 0;
  for (int i = 0; i < NSLOTS; i++)
    if (slots[i].p != NULL && slots[i].size > ((size_t)1 << 20)) large += slots[i].size;
  for (size_t i = 0; i < nbulk; i++)
    if (bulk[i].p != NULL && bulk[i].size > ((size_t)1 << 20)) large += bulk[i].size;
  if (mi.hblkhd < large || mi.uordblks < mi.hblkhd || mi.uordblks + mi.fordblks < mi.arena + mi.hblkhd)
    fail("mallinfo2: arena %zu, in use %zu, free %zu, large %zu: inconsistent, or below the %zu bytes of live "
         "large blocks", mi.arena, mi.uordblks, mi.fordblks, mi.hblkhd, large);
#endif
  if (hak_mallopt((int)(a->n % 16) - 8, (int)a->size) < 0) fail("mallopt returned a negative value");
  if (a->n & 1) {
    int fd = open("/dev/null", O_WRONLY), saved = dup(2);
    if (fd >= 0 && saved >= 0) {
      dup2(fd, 2);
      hak_malloc_stats();
      dup2(saved, 2);
    }
    if (fd >= 0) close(fd);
    if (saved >= 0) close(saved);
  }
  struct hak_stats st;
  if (hak_stats_get(&st, (a->n & 4) ? HAK_STATS_MIN_SIZE : sizeof st) != 0) fail("hak_stats_get failed");
  if (!(a->n & 4) && (st.live_bytes != st.small_live_bytes + st.large_live_bytes || st.nclasses == 0))
    fail("hak_stats_get: live %llu != %llu + %llu", st.live_bytes, st.small_live_bytes, st.large_live_bytes);
  struct hak_thread_stats ts;
  if (hak_thread_stats(0, &ts, sizeof ts) != 0 || ts.large_live_blocks > ts.live_blocks ||
      ts.large_live_bytes > ts.live_bytes || (ts.exact && !(a->n & 4) && ts.live_bytes > st.live_bytes))
    fail("hak_thread_stats: %llu B live (%llu large), the process %llu", ts.live_bytes, ts.large_live_bytes,
         st.live_bytes);
  char json[256];
  size_t jn = hak_stats_json(json, a->size % sizeof json);
  if (jn < 100 || (a->size % sizeof json != 0 && strlen(json) >= a->size % sizeof json))
    fail("hak_stats_json returned %zu", jn);
  if (a->n & 8) {
    FILE *f = fopen("/dev/null", "w");
    if (f != NULL && hak_malloc_info(0, f) != 0) fail("malloc_info failed");
    if (f != NULL) fclose(f);
  }
  if (a->n & 16) { /* (with HAKMEM_PROFILE=1: tools/fuzz_coverage.sh) */
    char path[64], json_path[80];
    snprintf(path, sizeof path, "/tmp/hakmem-fuzz-%d.heap", (int)getpid());
    snprintf(json_path, sizeof json_path, "%s.json", path);
    if (hak_profile_dump(path) == 0) {
      unlink(path);
      unlink(json_path);
    }
  }
  for (int i = 0; i < NSLOTS; i++) check_slot(i, "after the statistics calls");
}


/* ---- misuse and corruption, in a forked child ---- */

/* A misuse ends the process (a hakmem report, then abort), so each one runs
 * in a child forked from the fuzzer, with all the live blocks of the input
 * so far. The child's end is classified and must be one the mode allows
 * (docs/SAFETY.md's tables): */
enum { END_REPORT = 1, END_RAN_ON = 2, END_FAULT_AT_WRITE = 4 };
#define END_ANY (END_REPORT | END_RAN_ON | END_FAULT_AT_WRITE)

enum {
  MU_DOUBLE_FREE,        /* free, free */
  MU_DOUBLE_FREE_THREAD, /* free, then free by another thread */
  MU_DOUBLE_FREE_RACE,   /* two threads free the block at the same moment */
  MU_INTERIOR,           /* free of a pointer inside the block */
  MU_REALLOC_FREED,      /* free, realloc */
  MU_STACK,              /* free of a stack address */
  MU_WRITE_FREED_MALLOC, /* free, a write into the freed block's first word, mallocs */
  MU_WRITE_FREED_FREE,   /* free, a write into the freed block, free again */
  MU_OVERFLOW,           /* a byte written just past the request, free */
  NMISUSE_OP,            /* the kinds OP_MISUSE picks from; the heap operation's below */
  MU_HEAP_FREE_DESTROYED = NMISUSE_OP, /* a block of a heap freed after its heap was destroyed */
  MU_HEAP_MALLOC_DESTROYED, /* hak_heap_malloc on a destroyed heap */
  MU_HEAP_REALLOC_OTHER, /* hak_heap_realloc of another heap's block */
  MU_HEAP_VISITOR_MALLOC, /* hak_heap_malloc on the heap from its visitor */
  NMISUSE
};

static const char *const misuse_name[NMISUSE] = {
    "double free", "double free by another thread", "two frees at once", "free of an interior pointer",
    "realloc of a freed block", "free of a stack address", "write into a freed block, then malloc",
    "write into a freed block, then free", "overflow past the request, then free",
    "free of a destroyed heap's block", "hak_heap_malloc on a destroyed heap", "hak_heap_realloc of another heap's block",
    "hak_heap_malloc from the heap's visitor"};

/* The ends each misuse may have at HAKMEM_SECURE=0, 1, 2. Writes into
 * freed memory may fault at the write (a freed large block or page can be
 * unmapped); default mode's known gaps (docs/SAFETY.md) may run on. */
static const unsigned misuse_want[NMISUSE][3] = {
    {END_REPORT, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
    {END_REPORT | END_RAN_ON, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
    {END_ANY, END_ANY, END_ANY},
    {END_ANY, END_REPORT | END_FAULT_AT_WRITE, END_REPORT | END_FAULT_AT_WRITE},
    {END_RAN_ON, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
    {END_REPORT, END_REPORT, END_REPORT},
};

static int secure_mode; /* HAKMEM_SECURE, 0..2 */
static volatile sig_atomic_t in_user_write;

/* In a coverage build (tools/fuzz_coverage.sh) the child writes its
 * profile before it dies, so the error paths it reached count. */
extern int __llvm_profile_dump(void) __attribute__((weak));

static void child_flush(void) {
  if (__llvm_profile_dump) __llvm_profile_dump();
}

static void child_on_abort(int sig) {
  (void)sig;
  child_flush(); /* abort() then ends the process with SIGABRT */
}

static void child_on_fault(int sig) {
  static const char msg[] = "fuzz_api child: fault outside the program's write\n";
  if (!in_user_write) {
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
  }
  child_flush();
  _exit(in_user_write ? 70 : 71 + 0 * sig);
}

typedef struct {
  void *p;
  _Atomic int go;
} race_arg;

static void *free_thread(void *arg) {
  race_arg *r = arg;
  while (!r->go) {
  }
  hak_free(r->p);
  return NULL;
}

/* A write the program makes into memory it does not own: the only place
 * where a fault is the right end (a guard page, an unmapped freed block). */
static void user_write(void *dst, const void *src, size_t n) {
  in_user_write = 1;
  memcpy(hkt_opaque_ptr(dst), src, n);
  in_user_write = 0;
}

static hak_heap_t *visited_heap;
static int visitor_mallocs(void *block, size_t size, void *arg) {
  (void)block, (void)size, (void)arg;
  (void)!hak_heap_malloc(visited_heap, 16);
  return 0;
}

/* The heap misuses (the child). */
static void heap_misuse_child(unsigned kind, size_t size) {
  hak_heap_t *h = hak_heap_new(), *other = hak_heap_new();
  if (h == NULL || other == NULL) fail("misuse: hak_heap_new returned NULL");
  void *p = hak_heap_malloc(h, size);
  if (p == NULL) fail("misuse: hak_heap_malloc(%zu) returned NULL", size);
  switch (kind) {
  case MU_HEAP_FREE_DESTROYED:
    hak_heap_destroy(h);
    hak_free(hkt_opaque_ptr(p));
    break;
  case MU_HEAP_MALLOC_DESTROYED:
    hak_heap_destroy(h);
    (void)!hak_heap_malloc(hkt_opaque_ptr(h), size);
    break;
  case MU_HEAP_REALLOC_OTHER:
    (void)!hak_heap_realloc(other, p, size + 1);
    break;
  default:
    visited_heap = h;
    hak_heap_visit(h, visitor_mallocs, NULL);
    break;
  }
}

/* Runs in the child; returning means it ran on. */
static void misuse_child(unsigned kind, size_t size, uint64_t val) {
  if (kind >= NMISUSE_OP) {
    heap_misuse_child(kind, size);
    return;
  }
  unsigned char *p = hak_malloc(size);
  unsigned char *keep = hak_malloc(size); /* the page stays in use */
  if (p == NULL || keep == NULL) fail("misuse: malloc(%zu) returned NULL", size);
  size_t usable = hak_malloc_usable_size(p);
  pthread_t t[2];
  race_arg ra = {p, 0};
  switch (kind) {
  case MU_DOUBLE_FREE:
    hak_free(p);
    hak_free(hkt_opaque_ptr(p));
    break;
  case MU_DOUBLE_FREE_THREAD:
    hak_free(p);
    ra.go = 1;
    if (pthread_create(&t[0], NULL, free_thread, &ra) != 0) fail("pthread_create failed");
    pthread_join(t[0], NULL);
    break;
  case MU_DOUBLE_FREE_RACE:
    for (int i = 0; i < 2; i++)
      if (pthread_create(&t[i], NULL, free_thread, &ra) != 0) fail("pthread_create failed");
    ra.go = 1;
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    break;
  case MU_INTERIOR:
    hak_free(hkt_opaque_ptr(p + 1 + val % (usable > 1 ? usable - 1 : 1)));
    break;
  case MU_REALLOC_FREED:
    hak_free(p);
    p = hak_realloc(hkt_opaque_ptr(p), (size_t)val % (2 * size + 1));
    break;
  case MU_STACK: {
    uint64_t local[4] = {val, 0, 0, 0};
    hak_free(hkt_opaque_ptr((char *)local + 16 * (val & 1)));
    break;
  }
  case MU_WRITE_FREED_MALLOC:
  case MU_WRITE_FREED_FREE: {
    hak_free(p);
    /* val's low bits choose the write: zero, the low two bytes changed
     * (a link redirected nearby), or a whole word of the input */
    if ((val & 3) == 1) {
      unsigned char b2[2];
      in_user_write = 1; /* the read too may fault */
      b2[0] = p[0] ^ (unsigned char)(val >> 8 | 1);
      b2[1] = p[1] ^ (unsigned char)(val >> 16);
      in_user_write = 0;
      user_write(p, b2, 2);
    } else {
      uint64_t w = (val & 3) == 0 ? 0 : val;
      user_write(p, &w, sizeof w);
    }
    if (kind == MU_WRITE_FREED_FREE) {
      hak_free(hkt_opaque_ptr(p));
      break;
    }
    hak_malloc_trim(0); /* hardened mode: the block leaves the quarantine */
    for (int i = 0; i < NSLOTS; i++) { /* reuse: the slots take new blocks of this size */
      if (slots[i].p != NULL) continue;
      slots[i] = (slot){hak_malloc(size), size, size, 0, 0};
      if (slots[i].p == NULL) fail("misuse: malloc(%zu) after the write returned NULL", size);
      slots[i].usable = hak_malloc_usable_size(slots[i].p);
    }
    if (secure_mode > 0 || (val & 3) != 1) check_overlaps("after a write into a freed block");
    break;
  }
  case MU_OVERFLOW:
    if (secure_mode == 0 && size >= usable) break; /* nothing past the request to write */
    {
      unsigned char c = (unsigned char)(val | 1); /* the canary's first byte is zero */
      user_write(p + size, &c, 1);
      hak_free(p);
    }
    break;
  default:
    break;
  }
  hak_free(keep);
}

static void misuse_run(unsigned kind, size_t size, uint64_t val);

static void misuse_op(const opargs *a) {
  unsigned kind = (unsigned)(a->n % NMISUSE_OP);
  size_t size = a->size;
  /* the writes stay within the size-class tiers: large blocks' memory is
   * checked by guard pages (tests/test_misuse.c), and a stray write past a
   * large request lands in its page's slack, unchecked */
  if (kind >= MU_WRITE_FREED_MALLOC && size > ((size_t)1 << 20) - 64) size %= ((size_t)1 << 20) - 64;
  if (kind >= MU_WRITE_FREED_MALLOC && size < 8) size = 8;
  misuse_run(kind, size, (uint64_t)a->align * 0x9E3779B97F4A7C15ull ^ a->size);
}

/* Runs misuse_child(kind, size, val) in a forked child, and checks how the
 * child ended against what the mode promises. */
static void misuse_run(unsigned kind, size_t size, uint64_t val) {
  int fds[2];
  if (pipe(fds) != 0) fail("pipe failed");
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid < 0) fail("fork failed");
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], 2);
    signal(SIGABRT, child_on_abort);
    signal(SIGSEGV, child_on_fault);
    signal(SIGBUS, child_on_fault);
    misuse_child(kind, size, val);
    child_flush();
    _exit(0);
  }
  close(fds[1]);
  char msg[1024] = {0};
  ssize_t n = 0, r;
  /* the first 1 KiB (the report), until the child's end; libFuzzer's
   * timer signal interrupts the read */
  char rest[256];
  for (;;) {
    int full = n == (ssize_t)sizeof msg - 1;
    r = full ? read(fds[0], rest, sizeof rest) : read(fds[0], msg + n, sizeof msg - 1 - (size_t)n);
    if (r == 0) break;
    if (r < 0) {
      if (errno == EINTR) continue;
      fail("reading the child's stderr: %s", strerror(errno));
    }
    if (!full) n += r;
  }
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) != pid)
    if (errno != EINTR) fail("waitpid failed: %s", strerror(errno));
  unsigned end = 0;
  /* (a debug build, HAKMEM_DEBUG, may find the corrupted state first, in
   * its own checks: "hakmem: internal check failed") */
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT &&
      (strstr(msg, "hakmem: error") != NULL || strstr(msg, "hakmem: internal check failed") != NULL))
    end = END_REPORT;
  else if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
    end = END_RAN_ON;
  else if (WIFEXITED(st) && WEXITSTATUS(st) == 70)
    end = END_FAULT_AT_WRITE;
  if (!(end & misuse_want[kind][secure_mode]))
    fail("misuse \"%s\" (%zu bytes, HAKMEM_SECURE=%d): the child ended with %s %d; its stderr: %s",
         misuse_name[kind], size, secure_mode, WIFSIGNALED(st) ? "signal" : "status",
         WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st), msg);
}

static void heap_misuse(unsigned which, size_t size) {
  misuse_run(NMISUSE_OP + which % (NMISUSE - NMISUSE_OP), size, 0);
}

/* ---- the entry point ---- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  reader r = {data, size, 0};
  seed_counter = 0;
  if (inputs_run == 0) {
    const char *env = getenv("HAKMEM_SECURE");
    secure_mode = env ? atoi(env) : 0;
    if (secure_mode < 0 || secure_mode > 2) secure_mode = secure_mode < 0 ? 0 : 2;
  }
  while (r.i < r.n) {
    unsigned b = rd8(&r);
    opargs a;
    memset(&a, 0, sizeof a);
    unsigned x = b & 0x7f;
    a.op = x < 0x70 ? x % NOPS_BASIC : NOPS_BASIC + (x - 0x70) % (NOPS - NOPS_BASIC);
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
    case OP_STATS:
      a.n = rd8(&r);
      a.size = rd8(&r);
      break;
    case OP_BULK_ALLOC: /* count, size (the slot byte is a third of the size choice), variant */
      a.n = 1 + rd16(&r) % 1024;
      a.size = (size_t)a.s & 1 ? rd_size(&r) : rd8(&r) * (size_t)(1 + a.s);
      a.align = rd8(&r);
      break;
    case OP_BULK_FREE:
    case OP_RACE_FREE:
    case OP_HELPER_EXIT_RACE:
      a.n = rd8(&r);
      a.align = rd8(&r) & 1;
      a.size = (size_t)a.s & 1; /* the slots too */
      break;
    case OP_MISUSE:
      a.n = rd8(&r);
      a.size = rd_size(&r);
      a.align = rd16(&r);
      break;
    case OP_HEAP:
      a.n = rd8(&r);
      a.size = rd_size(&r);
      break;
    default:
      break;
    }
    switch (a.op) {
    case OP_RESTART_HELPER:
      helper_stop();
      continue;
    case OP_RACE_FREE:
      race_free(&a);
      break;
    case OP_HELPER_EXIT_RACE:
      helper_exit_race(&a);
      break;
    case OP_MISUSE:
      misuse_op(&a);
      continue;
    case OP_STATS:
      stats_op(&a);
      continue;
    default:
      if (b & 0x80)
        run_on_helper(&a);
      else
        run_op(&a);
      break;
    }
    if (a.op == OP_BULK_FREE || a.op == OP_RACE_FREE || a.op == OP_HELPER_EXIT_RACE) bulk_compact();
  }
  /* inputs are independent: free everything (alternating threads) */
  if (nbulk != 0) {
    opargs a = {OP_BULK_FREE, 0, 0, 0, 0};
    if (h_running)
      race_free(&a); /* half here, half on the helper */
    else
      run_op(&a);
    bulk_compact();
  }
  for (int s = 0; s < NSLOTS; s++) {
    if (slots[s].p == NULL) continue;
    opargs a = {OP_FREE, s, 0, 0, 0};
    if (h_running && (s & 1))
      run_on_helper(&a);
    else
      run_op(&a);
  }
  if (fheap != NULL) {
    opargs a = {OP_HEAP, 0, 0, 4, 0};
    run_op(&a); /* destroyed: empty, or with blocks of other slots' tiers kept since freed */
  }
  if (++inputs_run % 64 == 0) hak_malloc_trim(0);
  return 0;
}
