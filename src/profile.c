/* The sampling heap profiler (HAKMEM_PROFILE=1, docs/PROFILE.md).
 *
 * Sampling: each thread's malloc budget (hk_tls_state) holds the bytes
 * until its next sample, drawn from an exponential distribution of mean
 * HAKMEM_PROFILE_RATE; the allocation that takes it below zero is sampled.
 * Every byte allocated is thus sampled with the same probability, 1/rate,
 * and an allocation of s bytes with probability 1 - exp(-s/rate): a sample
 * stands for 1 / (1 - exp(-s/rate)) allocations like it (the estimate
 * pprof makes from a heap_v2 profile, and the JSON's).
 *
 * A sampled block of a size class of pages of several blocks comes from
 * the thread's sample heap (hk_heap.sample_heap: a heap of its own that
 * holds only samples, made at the thread's first sample and handed to
 * another thread when it exits), so that no fast path needs to know
 * whether a block is sampled: every free of one is a free to another heap,
 * whose slow path (remote.c) drops the sample and sends the block to its
 * page (its local list when the sample heap is the freeing thread's), never
 * to a thread cache. A sampled block of a class whose pages hold one block
 * (64 KiB, and most classes from 112 KiB to 960 KiB: where a block is
 * sampled every few allocations, or at each) comes from
 * the thread's own heap instead, so that its span is reused by the
 * thread's next blocks of the class, as every other such block's is: its
 * page is marked (hk_page.sampled), and every free of it reaches a slow
 * path that drops the sample (the owner's empties the page, which a
 * marked page's state makes it report; another thread's and the cache
 * mode's go through hk_free_to_cache). A sampled large block carries a
 * flag in its header; its free drops the sample too. The table of samples
 * holds exactly the live ones.
 *
 * Stacks come from the unwinder (_Unwind_Backtrace, libgcc_s's, loaded
 * only when the profiler is on: the tables of every
 * binary, frame pointers or not), taken before the lock. The tables live
 * in memory mapped here; nothing in this file calls malloc. */
#include "internal.h"

#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <signal.h>
#include <string.h>
#include <unwind.h>

#define STACK_MAX 48           /* frames kept per sample */
#define STACKS_MAX (1u << 14)  /* distinct stacks (a table of 16,384) */
#define SHARDS 16              /* live-sample tables, each under its own lock */
#define LIFETIMES 3            /* freed within 10 ms, within 1 s, later */
static const uint64_t LIFETIME_MS[LIFETIMES - 1] = {10, 1000};
#define SIZE_BUCKETS 48        /* sampled allocations by size: [2^i, 2^(i+1)) bytes */
#define SHARD_MIN (1u << 7)    /* a table's first size; doubles when 3/4 full */

typedef struct prof_stack {
  uint64_t hash;     /* 0: free slot */
  uint32_t depth;
  uint32_t pad;
  uintptr_t pc[STACK_MAX];
} prof_stack;

/* A stack's counts, in a copy per shard of the live samples (below): a
 * sample's counts go to the copy of the shard that records it, its free's
 * to that of the shard it leaves, each under that shard's lock, so the
 * adds are a plain load and store (no read-modify-write: the lock is the
 * one atomic operation of a sample and of its free), and threads sampling
 * at one site seldom take the counts' cache line from each other; a
 * profile sums the copies (relaxed loads, as a shard's writer stores). */
typedef struct stack_count {
  _Atomic uint64_t alloc_count, alloc_bytes; /* samples taken here, and their bytes (raw) */
  _Atomic uint64_t freed[LIFETIMES];         /* samples freed, by lifetime (LIFETIME_MS) */
  _Atomic uint64_t freed_remote;             /* samples freed by a thread other than their allocator's */
} stack_count;
typedef struct stack_total {
  uint64_t alloc_count, alloc_bytes, freed[LIFETIMES], freed_remote;
} stack_total;

typedef struct prof_sample {
  uintptr_t addr; /* 0: free slot */
  uint64_t size;  /* bytes asked for */
  uint32_t stack; /* index in stacks[] */
  uint32_t thread; /* the allocating thread's number (thread_number) */
  uint64_t when;  /* hk_os_now_ms() at the allocation */
} prof_sample;

/* profile_lock: adding stacks, the tally of a profile
 * (first in the order, then the shards' locks by index) */
static pthread_mutex_t profile_lock = PTHREAD_MUTEX_INITIALIZER;
/* dump_lock: one profile or leak report written at a time (the tally and
 * the objects' table); taken before profile_lock, and the only lock of the
 * profiler held while the writers call into the loader (dladdr,
 * dl_iterate_phdr), whose lock a sampled malloc inside dlopen holds when
 * it takes profile_lock */
static pthread_mutex_t dump_lock = PTHREAD_MUTEX_INITIALIZER;
static prof_stack *stacks;   /* 0..nstacks-1 in order of appearance, and at STACKS_MAX
                                those that found the table full; an entry is written
                                (under profile_lock) before its slot is published */
static uint32_t nstacks;     /* profile_lock */
static _Atomic uint32_t *stack_slots; /* a hash table of stacks' indexes + 1 (0: free), twice
                                 the stacks' room, so that RSS grows with the stacks; read
                                 without a lock, a slot set once */

/* The live samples, in SHARDS tables (open addressing, linear probing, by
 * the address's hash): a sample of a size class in its heap's (the sample
 * heap's, or the thread heap's of a marked page: heap_shard), so that a
 * thread's samples and their frees take a lock and touch a table that
 * other threads seldom do; a large block's by its address. A sample not
 * in the shard its free looks in first (its page changed heaps: taken over
 * from an exited thread) is in another. */
typedef struct sample_shard {
  _Alignas(64) _Atomic uint32_t lock; /* a spin lock (sync.h): held for a probe, an insert or a
                                         removal (and a profile's pass over the table) */
  size_t n;
  /* (a line of its own, which only grow writes: sample_prefetch reads it
   * without the lock, and would otherwise miss on the lock's line, which
   * the threads that sample take from each other) */
  _Alignas(64) prof_sample *table;
  size_t cap;
} sample_shard;
static sample_shard shards[SHARDS];

static _Atomic uint64_t size_samples[SHARDS][SIZE_BUCKETS][2]; /* sampled allocations by size: samples,
                                                                   bytes (raw), a copy per shard as the stacks' counts */
static uint64_t start_ms; /* hk_os_now_ms() when the profiler started */

/* A number for this thread, from 1 (a sample's allocator, compared at its free) */
static uint32_t thread_number(void) {
  static __thread uint32_t number __attribute__((tls_model("initial-exec")));
  static _Atomic uint32_t threads;
  if (number == 0) number = atomic_fetch_add_explicit(&threads, 1, memory_order_relaxed) + 1;
  return number;
}
static stack_count *counts; /* SHARDS x (STACKS_MAX + 1), mapped: pages touched as stacks appear */

/* Shard k's copy of the counts of the stack with index i (its lock held) */
static stack_count *shard_count(unsigned k, uint32_t i) { return &counts[(size_t)k * (STACKS_MAX + 1) + i]; }
/* *c += v by the one writer of *c (a shard's lock holder) */
static void count_add(_Atomic uint64_t *c, uint64_t v) { hk_store_relaxed(c, hk_load_relaxed(c) + v); }
static stack_total total_of(uint32_t i) {
  stack_total t = {0};
  for (unsigned c = 0; c < SHARDS; c++) {
    const stack_count *s = &counts[(size_t)c * (STACKS_MAX + 1) + i];
    t.alloc_count += hk_load_relaxed(&s->alloc_count);
    t.alloc_bytes += hk_load_relaxed(&s->alloc_bytes);
    for (unsigned k = 0; k < LIFETIMES; k++) t.freed[k] += hk_load_relaxed(&s->freed[k]);
    t.freed_remote += hk_load_relaxed(&s->freed_remote);
  }
  return t;
}

static uintptr_t lib_start, lib_end; /* this library's code: frames skipped at a stack's top */
static __thread bool sampling __attribute__((tls_model("initial-exec"))); /* no sample within a sample */

/* ---- stacks ---- */

/* ---- stacks ----
 * The unwinder reads each frame's rules from its binary's .eh_frame, about
 * a thousand instructions a frame. What it finds is kept: a return
 * address's frame size, the distance from the stack pointer at that call
 * to the frame's canonical frame address (CFA), is the same every time the
 * function gets there unless it sized its frame at run time (alloca). So
 * the stack is walked from that table (frame_sizes), the return address of
 * each frame read just below its CFA, and the unwinder runs only for a
 * return address not seen yet, and for a walked stack not seen yet, to
 * check it: a return address found with two sizes is never trusted again.
 * (A walk misled by a frame sized at run time reads a word that is not its
 * return address, and finds no remembered size for it or a stack seen
 * nowhere before: every stack the profile keeps is the unwinder's.)
 * Every read stays within the stack: between this function's frame and
 * the highest CFA the unwinder has shown on this thread. On x86-64 only,
 * where a return address is the word just below its frame's CFA; aarch64
 * takes every stack from the unwinder. */
#define FRAME_SIZES (1u << 14)  /* return addresses remembered */
#define SIZE_END 0              /* the outermost frame (_start, a thread's start) */
#define SIZE_VARIES 0x1ffff     /* found with two sizes */
static _Atomic uint64_t frame_sizes[FRAME_SIZES]; /* return address << 17 | size / 8 (or a code above); 0: free */
static __thread uintptr_t stack_top __attribute__((tls_model("initial-exec"))); /* highest CFA seen */

static size_t frame_slot(uintptr_t ip) { return (size_t)((ip * 0x9e3779b97f4a7c15ull) >> 50) & (FRAME_SIZES - 1); }

#if defined(__x86_64__) /* (read by walk_stack only) */
/* The code remembered for ip, or -1. */
static int64_t frame_size_of(uintptr_t ip) {
  for (size_t i = frame_slot(ip), probes = 0; probes < 8; i = (i + 1) & (FRAME_SIZES - 1), probes++) {
    uint64_t w = atomic_load_explicit(&frame_sizes[i], memory_order_relaxed);
    if (w == 0) return -1;
    if (w >> 17 == ip) return (int64_t)(w & 0x1ffff);
  }
  return -1;
}
#endif

static void remember(uintptr_t ip, uint64_t code) {
  if (ip >> 47) return; /* (not a user-space code address) */
  uint64_t want = (uint64_t)ip << 17 | code;
  for (size_t i = frame_slot(ip), probes = 0; probes < 8; i = (i + 1) & (FRAME_SIZES - 1), probes++) {
    uint64_t w = atomic_load_explicit(&frame_sizes[i], memory_order_relaxed);
    while (w == 0 && !atomic_compare_exchange_weak_explicit(&frame_sizes[i], &w, want, memory_order_relaxed,
                                                            memory_order_relaxed)) {
    }
    if (w == 0 || w == want) return;
    if (w >> 17 == ip) { /* a second size: never trusted again */
      atomic_store_explicit(&frame_sizes[i], (uint64_t)ip << 17 | SIZE_VARIES, memory_order_relaxed);
      return;
    }
  }
}

typedef struct unwind_state {
  uintptr_t *pc;
  uint32_t n, max;
  bool top;          /* still in this library's frames */
  uintptr_t last_ip, last_sp;
  bool first;
  uintptr_t anchor, ra; /* take_stack's local and return address (see take_stack_cfa) */
} unwind_state;

/* take_stack's CFA less the address of its local `anchor`: fixed, as its
 * frame is, and learnt from the unwinder (compilers' __builtin_dwarf_cfa
 * do not agree). 0: not known yet. */
static _Atomic intptr_t take_stack_cfa;

/* libgcc_s's unwinder, loaded by hk_profile_load (a program that does not
 * profile does not map the library) */
static _Unwind_Reason_Code (*unwind_backtrace)(_Unwind_Trace_Fn, void *);
static _Unwind_Ptr (*unwind_ip)(struct _Unwind_Context *);
static _Unwind_Word (*unwind_cfa)(struct _Unwind_Context *);

static _Unwind_Reason_Code unwind_one(struct _Unwind_Context *ctx, void *arg) {
  unwind_state *u = arg;
  /* (libgcc's "CFA" of a frame is its stack pointer at the call it made:
   * the CFA of the frame it called; the previous frame's size is the
   * difference) */
  uintptr_t ip = unwind_ip(ctx), sp = unwind_cfa(ctx);
  if (ip == 0) return _URC_END_OF_STACK;
  if (!u->first) { /* (unwind_stack's own frame: not walked) */
    uintptr_t size = sp - u->last_sp;
    remember(u->last_ip, sp > u->last_sp && size % 8 == 0 && size / 8 < SIZE_VARIES ? size / 8 : SIZE_VARIES);
  }
  if (ip == u->ra && u->anchor != 0) { /* (the frame take_stack returns to: its sp is take_stack's CFA) */
    atomic_store_explicit(&take_stack_cfa, (intptr_t)(sp - u->anchor), memory_order_relaxed);
    u->anchor = 0;
  }
  u->first = false;
  u->last_ip = ip;
  u->last_sp = sp;
  if (sp > stack_top) stack_top = sp;
  if (u->n == u->max) return _URC_END_OF_STACK;
  if (u->top && ip >= lib_start && ip < lib_end) return _URC_NO_REASON;
  u->top = false;
  u->pc[u->n++] = ip;
  return _URC_NO_REASON;
}

/* The stack by the unwinder; the frames' sizes remembered. */
static __attribute__((noinline)) uint32_t unwind_stack(uintptr_t *pc, uintptr_t anchor, uintptr_t ra) {
  unwind_state u = {pc, 0, STACK_MAX, true, 0, 0, true, anchor, ra};
  _Unwind_Reason_Code rc = unwind_backtrace(unwind_one, &u);
  /* the last frame the unwinder found is where it ends, whether the frame
   * says so (_start's) or it found no rules beyond (3, FATAL_PHASE1_ERROR):
   * the walk stops there too */
  if ((rc == _URC_END_OF_STACK || rc == _URC_FATAL_PHASE1_ERROR) && u.n < u.max && u.last_ip != 0)
    remember(u.last_ip, SIZE_END);
  return u.n;
}

#define STACK_NONE UINT32_MAX
#define STACK_PENDING (UINT32_MAX - 1) /* last_walk.stack: the whole walk is kept, its index to come */

#if defined(__x86_64__)
/* The first frames of this thread's last walk: their return addresses and
 * where each was read (its frame's CFA less take_stack's). A frame's size
 * follows from its return address, so a walk that finds the same return
 * addresses at those places has taken the same path that far: it reads
 * them and skips their lookups (a few instructions a frame for about
 * thirty). Where that is the whole walk, it is the same stack, and its
 * index is the last one's (record_sample). */
#define MEMO_FRAMES 16
static __thread struct {
  uint32_t n;                   /* frames kept */
  uint32_t lib;                 /* of them, this library's at the top (not in the stack) */
  uint32_t stack;               /* the last stack's index, when the n frames are all of it; else STACK_NONE */
  uint32_t at[MEMO_FRAMES + 1]; /* at[j]: frame j's CFA less take_stack's; at[n]: the next frame's */
  uintptr_t ip[MEMO_FRAMES];
} last_walk __attribute__((tls_model("initial-exec")));

/* The stack by the remembered frame sizes, from (ip, cfa): the return
 * address into take_stack's caller and take_stack's CFA. 0: a frame not
 * remembered, or a read that would leave the stack. *same: the last walk's
 * stack, whose index last_walk.stack holds. */
static uint32_t walk_stack(uintptr_t *pc, uintptr_t ip, uintptr_t cfa, bool *same) {
  const uintptr_t cfa0 = cfa;
  uint32_t n = 0, j = 0, k = last_walk.n;
  bool top = true;
  *same = false;
  if (k != 0 && ip == last_walk.ip[0] && cfa0 + last_walk.at[k] <= stack_top) {
    for (j = 1; j < k && *(const uintptr_t *)(cfa0 + last_walk.at[j] - 8) == last_walk.ip[j]; j++) {
    }
    if (j == k && last_walk.stack != STACK_NONE) {
      *same = true;
      return k - last_walk.lib;
    }
    /* the first j frames as before: the rest from there */
    for (uint32_t f = last_walk.lib < j ? last_walk.lib : j; f < j; f++) pc[n++] = last_walk.ip[f];
    top = last_walk.lib >= j;
    cfa = cfa0 + last_walk.at[j];
    ip = *(const uintptr_t *)(cfa - 8);
  }
  last_walk.n = j;
  last_walk.stack = STACK_NONE;
  for (uint32_t depth = j; depth < 4 * STACK_MAX; depth++) {
    int64_t code = frame_size_of(ip);
    if (code < 0 || code == SIZE_VARIES) return 0;
    bool lib = top && ip >= lib_start && ip < lib_end;
    if (!lib) {
      top = false;
      pc[n++] = ip;
    }
    if (depth < MEMO_FRAMES) { /* (a frame whose size is known) */
      last_walk.ip[depth] = ip;
      last_walk.at[depth] = (uint32_t)(cfa - cfa0);
      last_walk.lib = depth + 1 - n;
      last_walk.n = depth + 1;
    }
    if (n == STACK_MAX || code == SIZE_END) {
      if (depth < MEMO_FRAMES) last_walk.stack = STACK_PENDING;
      return n;
    }
    cfa += (uintptr_t)code * 8;
    if (cfa > stack_top) return 0;
    ip = *(const uintptr_t *)(cfa - 8);
    if (depth < MEMO_FRAMES) last_walk.at[depth + 1] = (uint32_t)(cfa - cfa0);
  }
  return 0;
}
#endif

static uint64_t stack_hash(const uintptr_t *pc, uint32_t n) {
  uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
  for (uint32_t i = 0; i < n; i++) h = (h ^ pc[i]) * 0xff51afd7ed558ccdull, h ^= h >> 29;
  return h | 1;
}

static bool same_stack(const prof_stack *s, uint64_t h, const uintptr_t *pc, uint32_t n) {
  if (s->hash != h || s->depth != n) return false;
  for (uint32_t f = 0; f < n; f++)
    if (s->pc[f] != pc[f]) return false;
  return true;
}


/* The stack's index, or STACK_NONE when it is not in the table. Without
 * a lock. */
static uint32_t stack_find(const uintptr_t *pc, uint32_t n) {
  uint64_t h = stack_hash(pc, n);
  const uint32_t mask = 2 * STACKS_MAX - 1;
  for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
    uint32_t k = atomic_load_explicit(&stack_slots[i], memory_order_acquire);
    if (k == 0) return STACK_NONE;
    if (same_stack(&stacks[k - 1], h, pc, n)) return k - 1;
  }
}

/* The stack's index, added if new (the last slot collects the stacks that
 * find the table full). Under profile_lock. */
static uint32_t stack_index(const uintptr_t *pc, uint32_t n) {
  uint64_t h = stack_hash(pc, n);
  const uint32_t mask = 2 * STACKS_MAX - 1;
  for (uint32_t i = (uint32_t)h & mask;; i = (i + 1) & mask) {
    uint32_t k = atomic_load_explicit(&stack_slots[i], memory_order_relaxed);
    if (k == 0) {
      if (nstacks == STACKS_MAX) return STACKS_MAX;
      prof_stack *s = &stacks[nstacks];
      s->hash = h;
      s->depth = n;
      memcpy(s->pc, pc, n * sizeof *pc);
      atomic_store_explicit(&stack_slots[i], ++nstacks, memory_order_release);
      return nstacks - 1;
    }
    if (same_stack(&stacks[k - 1], h, pc, n)) return k - 1;
  }
}

/* The stack after i in the tables' order: 0..nstacks-1, then STACKS_MAX
 * (the stacks that found the table full), then past it. */
static uint32_t tally_stacks; /* dump_lock: nstacks when the tally was made */
static uint32_t next_stack(uint32_t i) {
  return i + 1 < tally_stacks ? i + 1 : i < STACKS_MAX ? STACKS_MAX : STACKS_MAX + 1;
}

/* ---- live samples ---- */

static uint64_t addr_hash(uintptr_t addr) { return (addr >> 4) * 0x9e3779b97f4a7c15ull; }
static sample_shard *shard_of(uintptr_t addr) { return &shards[addr_hash(addr) >> 60]; }
static sample_shard *heap_shard(const hk_heap *h) { return &shards[h->region_list % SHARDS]; }
static size_t sample_slot(const sample_shard *sh, uintptr_t addr) {
  return (size_t)(addr_hash(addr) >> 20) & (sh->cap - 1);
}

/* Remove slot i, shifting later entries of its run back (no tombstones). */
static void sample_remove_at(sample_shard *sh, size_t i) {
  prof_sample *t = sh->table;
  size_t mask = sh->cap - 1;
  t[i].addr = 0;
  sh->n--;
  for (size_t j = (i + 1) & mask; t[j].addr != 0; j = (j + 1) & mask) {
    size_t home = sample_slot(sh, t[j].addr);
    /* j's entry may move to i if its home is not in (i, j] cyclically */
    if ((j > i && (home <= i || home > j)) || (j < i && (home <= i && home > j))) {
      t[i] = t[j];
      t[j].addr = 0;
      i = j;
    }
  }
}

/* The slot where addr's sample is, or goes, and the shard's lock, on their
 * way into the cache before the lock is taken (a probe under it would wait for the miss: the
 * program's memory traffic since the sample was taken has evicted it).
 * Read without the lock: a table replaced meanwhile costs a wasted
 * prefetch. */
static void sample_prefetch(sample_shard *sh, uintptr_t addr) {
  __builtin_prefetch(&sh->lock, 1); /* (for the lock's write) */
  prof_sample *t = __atomic_load_n(&sh->table, __ATOMIC_RELAXED);
  size_t cap = __atomic_load_n(&sh->cap, __ATOMIC_RELAXED);
  if (t != NULL) __builtin_prefetch(&t[(size_t)(addr_hash(addr) >> 20) & (cap - 1)], 1);
}

static prof_sample *sample_find(sample_shard *sh, uintptr_t addr) {
  for (size_t i = sample_slot(sh, addr);; i = (i + 1) & (sh->cap - 1)) {
    if (sh->table[i].addr == addr) return &sh->table[i];
    if (sh->table[i].addr == 0) return NULL;
  }
}

static bool grow(sample_shard *sh) {
  size_t old_cap = sh->cap, cap = old_cap * 2;
  prof_sample *t = hk_os_map_aligned(cap * sizeof *t, 4096), *old = sh->table;
  if (t == NULL) return false;
  __atomic_store_n(&sh->table, t, __ATOMIC_RELAXED); /* (read without the lock: sample_prefetch) */
  __atomic_store_n(&sh->cap, cap, __ATOMIC_RELAXED);
  for (size_t i = 0; i < old_cap; i++) {
    if (old[i].addr == 0) continue;
    size_t j = sample_slot(sh, old[i].addr);
    while (t[j].addr != 0) j = (j + 1) & (cap - 1);
    t[j] = old[i];
  }
  hk_os_unmap(old, old_cap * sizeof *old);
  return true;
}

/* The sample of the block at addr, and its counts (size: bytes asked for;
 * stack: its stack's index) */
static void sample_add(sample_shard *sh, uintptr_t addr, size_t size, uint32_t stack, uint64_t now) {
  bool took = hk_spin_lock(&sh->lock);
  unsigned k = (unsigned)(sh - shards);
  stack_count *c = shard_count(k, stack);
  count_add(&c->alloc_count, 1);
  count_add(&c->alloc_bytes, size);
  unsigned b = 63 - (unsigned)__builtin_clzll((uint64_t)size | 1);
  if (b >= SIZE_BUCKETS) b = SIZE_BUCKETS - 1;
  count_add(&size_samples[k][b][0], 1);
  count_add(&size_samples[k][b][1], size);
  /* one probe: the address's entry (sampled before: that block was freed
   * and its place reused), or the free slot that ends its run */
  prof_sample *s = sh->table + sample_slot(sh, addr);
  while (s->addr != addr && s->addr != 0) s = s + 1 < sh->table + sh->cap ? s + 1 : sh->table;
  if (s->addr == 0) {
    if ((sh->n + 1) * 4 > sh->cap * 3) {
      s = NULL;
      if (grow(sh)) {
        for (s = sh->table + sample_slot(sh, addr); s->addr != 0;) s = s + 1 < sh->table + sh->cap ? s + 1 : sh->table;
      }
    }
    if (s != NULL) sh->n++;
  }
  if (s != NULL) *s = (prof_sample){addr, size, stack, thread_number(), now};
  if (took) hk_spin_unlock(&sh->lock);
}

/* ---- the sampled allocation ---- */

/* The stack of the allocation being sampled, this library's frames left
 * out: from the remembered frame sizes (*walked), or by the unwinder (see
 * above). *index: the stack's index where the walk found this thread's
 * last stack (then pc is not filled in), else STACK_NONE. */
static __attribute__((noinline)) uint32_t take_stack(uintptr_t *pc, bool *walked, uint32_t *index) {
  volatile char anchor = 0;
  uintptr_t here = (uintptr_t)&anchor, ip = (uintptr_t)__builtin_return_address(0);
  *walked = false;
  *index = STACK_NONE;
#if defined(__x86_64__) /* (a return address is the word below its frame's CFA there; not on aarch64) */
  intptr_t delta = atomic_load_explicit(&take_stack_cfa, memory_order_relaxed);
  if (stack_top != 0 && delta != 0) {
    bool same;
    uint32_t n = walk_stack(pc, ip, here + (uintptr_t)delta, &same);
    if (same) *index = last_walk.stack;
    *walked = n != 0;
    if (n != 0) return n;
  }
#endif
  return unwind_stack(pc, here, ip);
}

/* Record the sample of the block at addr: its stack taken, and its
 * stack's index (a walked stack not in the table yet is taken again by the
 * unwinder, then added under profile_lock; the index kept for the next
 * walk that finds the same stack), then the sample. */
HK_INLINE void record_sample(sample_shard *sh, uintptr_t addr, size_t size) {
  uintptr_t pc[STACK_MAX];
  bool walked;
  sample_prefetch(sh, addr); /* (the stack's walk meanwhile) */
  uint32_t index, n = take_stack(pc, &walked, &index);
  if (index == STACK_NONE) index = stack_find(pc, n);
  if (index == STACK_NONE) {
    if (walked) n = unwind_stack(pc, 0, 0);
    hk_lock(&profile_lock);
    index = stack_index(pc, n);
    hk_unlock(&profile_lock);
  }
#if defined(__x86_64__)
  if (last_walk.stack == STACK_PENDING) last_walk.stack = index;
#endif
  sample_add(sh, addr, size, index, hk_os_now_ms());
}

static _Atomic bool self_found;     /* lib_start and lib_end are known */
static int find_self(struct dl_phdr_info *info, size_t size, void *arg);

/* This library's code, found at the first sample (not at start:
 * dl_iterate_phdr takes the loader's lock). */
static void find_self_once(void) {
  static pthread_mutex_t self_lock = PTHREAD_MUTEX_INITIALIZER; /* (a leaf: the loader's taken inside) */
  if (atomic_load_explicit(&self_found, memory_order_acquire)) return;
  hk_lock(&self_lock);
  if (!atomic_load_explicit(&self_found, memory_order_relaxed)) {
    dl_iterate_phdr(find_self, (void *)(uintptr_t)&hk_profile_init);
    atomic_store_explicit(&self_found, true, memory_order_release);
  }
  hk_unlock(&self_lock);
}

void *hk_profile_malloc(hk_heap *h, size_t size, unsigned cls) {
  if (sampling) return NULL; /* (the unwinder allocating: the caller allocates as usual) */
  sampling = true;
  find_self_once();
  void *p;
  if (hk_class_colored[cls]) {
    /* (a stashed block first, as the thread's unsampled mallocs of the
     * class take them: the page goes back to the stash at the free) */
    p = h->stash[cls] != NULL ? hk_heap_stash_malloc(h, cls) : hk_heap_alloc(h, size, cls);
    hk_page *page = p != NULL ? hk_block_page(p) : NULL;
    if (page != NULL && page->reserved == 1) { /* (always: the class's pages hold one block) */
      hk_page_mark_sampled(page);
      record_sample(heap_shard(h), (uintptr_t)p, size);
    }
  } else {
    if (h->sample_heap == NULL) h->sample_heap = hk_sample_heap_take();
    p = h->sample_heap != NULL ? hk_heap_alloc(h->sample_heap, size, cls) : NULL;
    if (p != NULL) record_sample(heap_shard(h->sample_heap), (uintptr_t)p, size);
  }
  sampling = false;
  return p;
}

bool hk_profile_large(void *p, size_t size) {
  if (sampling) return false;
  sampling = true;
  find_self_once();
  record_sample(shard_of((uintptr_t)p), (uintptr_t)p, size);
  sampling = false;
  return true;
}

/* p's sample out of shard sh, if it is there: counted as freed, `now`
 * its free's time */
HK_INLINE bool forget_in(sample_shard *sh, uintptr_t p, uint64_t now) {
  bool took = hk_spin_lock(&sh->lock);
  prof_sample *s = sample_find(sh, p);
  if (s != NULL) {
    uint64_t life = now - s->when;
    unsigned k = 0;
    while (k < LIFETIMES - 1 && life >= LIFETIME_MS[k]) k++;
    stack_count *c = shard_count((unsigned)(sh - shards), s->stack);
    count_add(&c->freed[k], 1);
    if (s->thread != thread_number()) count_add(&c->freed_remote, 1);
    sample_remove_at(sh, (size_t)(s - sh->table));
  }
  if (took) hk_spin_unlock(&sh->lock);
  return s != NULL;
}

void hk_profile_forget(void *p, const hk_heap *heap) {
  sample_shard *first = heap != NULL ? heap_shard(heap) : shard_of((uintptr_t)p);
  sample_prefetch(first, (uintptr_t)p);
  uint64_t now = hk_os_now_ms(); /* (the prefetch meanwhile) */
  if (forget_in(first, (uintptr_t)p, now)) return;
  for (unsigned k = 0; k < SHARDS; k++)
    if (&shards[k] != first && forget_in(&shards[k], (uintptr_t)p, now)) return;
}

/* ---- the profile ---- */

typedef struct out {
  int fd;
  char buf[4096];
  size_t n;
} out;

static void out_flush(out *o) {
  hk_os_write(o->fd, o->buf, o->n);
  o->n = 0;
}
static void out_put(out *o, const char *s, size_t n) {
  while (n > 0) {
    if (o->n == sizeof o->buf) out_flush(o);
    size_t k = sizeof o->buf - o->n < n ? sizeof o->buf - o->n : n;
    memcpy(o->buf + o->n, s, k);
    o->n += k;
    s += k;
    n -= k;
  }
}
static void out_str(out *o, const char *s) { out_put(o, s, strlen(s)); }
static void out_dec(out *o, uint64_t v) {
  char d[24];
  out_put(o, d, hk_fmt_dec(d, v));
}
static void out_hex(out *o, uintptr_t v) {
  char d[24];
  out_put(o, d, hk_fmt_hex(d, v));
}
/* a JSON string's content */
static void out_json_str(out *o, const char *s) {
  char e[6];
  for (; *s; s++) out_put(o, e, hk_fmt_json_char(e, (unsigned char)*s));
}

/* The estimate a sample of `size` bytes stands for, in allocations. */
static double scale(uint64_t size) {
  double x = (double)size / (double)hk_opt.profile_rate;
  /* 1 / (1 - exp(-x)), with exp from its series for small x (no libm) */
  double e;
  if (x < 1e-6) return 1 / x;
  if (x > 40) return 1;
  /* exp(-x) = 2^(-x / ln 2): the integer part by halving, the rest by a series */
  double y = x / 0.6931471805599453;
  int k = (int)y;
  double r = (y - k) * 0.6931471805599453, term = 1, sum = 1;
  for (int i = 1; i < 20; i++) {
    term *= -r / i;
    sum += term;
  }
  e = sum;
  for (int i = 0; i < k; i++) e *= 0.5;
  return 1 / (1 - e);
}

/* Per stack: the live samples' count and bytes, raw, for the stacks
 * 0..nstacks-1 at this time (tally_stacks; the stacks before it stay as
 * they are: the writers read them after profile_lock is let go). Under
 * dump_lock; takes profile_lock and the shards' locks. */
typedef struct live_tally { uint64_t count, bytes; double est_count, est_bytes; } live_tally;

static live_tally *live_by_stack(void) {
  static live_tally *t;
  if (t == NULL) t = hk_os_map_aligned((STACKS_MAX + 1) * sizeof *t, 4096);
  if (t == NULL) return NULL;
  hk_lock(&profile_lock);
  tally_stacks = nstacks;
  memset(t, 0, nstacks * sizeof *t);
  memset(&t[STACKS_MAX], 0, sizeof *t);
  for (unsigned k = 0; k < SHARDS; k++) {
    sample_shard *sh = &shards[k];
    bool took = hk_spin_lock(&sh->lock);
    for (size_t i = 0; i < sh->cap; i++) {
      const prof_sample *s = &sh->table[i];
      if (s->addr == 0) continue;
      live_tally *l = &t[s->stack];
      double f = scale(s->size);
      l->count++;
      l->bytes += s->size;
      l->est_count += f;
      l->est_bytes += f * (double)s->size;
    }
    if (took) hk_spin_unlock(&sh->lock);
  }
  hk_unlock(&profile_lock);
  return t;
}

/* The tally at the heap's peak (docs/REPORT.md): the timeline passes the
 * live bytes of each of its lines (hk_profile_peak), and a peak 10 % above
 * the last one kept (and above 1 MiB) keeps the tally of that moment,
 * written at exit beside the profile (".peak"). Under dump_lock. */
static live_tally *peak_tally;
static uint32_t peak_stacks;
static uint64_t peak_ms;
static _Atomic uint64_t peak_live; /* its live bytes (by the timeline's walk); 0: none kept */

/* The heap profile in the text format of gperftools' heap profiler,
 * "heap_v2" (what google-pprof reads; it scales the raw counts itself):
 * a header, one line per stack with its live and allocated samples, and
 * the process's mappings. */
static void write_pprof(int fd, const live_tally *t) {
  out o = {.fd = fd};
  uint64_t lc = 0, lb = 0, ac = 0, ab = 0;
  for (uint32_t i = 0; i <= STACKS_MAX; i = next_stack(i)) {
    lc += t[i].count;
    lb += t[i].bytes;
    stack_total c = total_of(i);
    ac += c.alloc_count, ab += c.alloc_bytes;
  }
  out_str(&o, "heap profile: ");
  out_dec(&o, lc); out_str(&o, ": "); out_dec(&o, lb);
  out_str(&o, " ["); out_dec(&o, ac); out_str(&o, ": "); out_dec(&o, ab);
  out_str(&o, "] @ heap_v2/");
  out_dec(&o, (uint64_t)hk_opt.profile_rate);
  out_str(&o, "\n");
  for (uint32_t i = 0; i <= STACKS_MAX; i = next_stack(i)) {
    const prof_stack *s = &stacks[i];
    stack_total c = total_of(i);
    if (s->depth == 0 || (c.alloc_count == 0 && t[i].count == 0)) continue; /* (google-pprof wants a frame) */
    out_dec(&o, t[i].count); out_str(&o, ": "); out_dec(&o, t[i].bytes);
    out_str(&o, " ["); out_dec(&o, c.alloc_count); out_str(&o, ": "); out_dec(&o, c.alloc_bytes);
    out_str(&o, "] @");
    for (uint32_t k = 0; k < s->depth; k++) {
      out_str(&o, " ");
      out_hex(&o, s->pc[k]);
    }
    out_str(&o, "\n");
  }
  out_str(&o, "\nMAPPED_LIBRARIES:\n");
  out_flush(&o);
  hk_os_copy_file("/proc/self/maps", fd);
}

/* The object holding the code at pc, and the name of the function there
 * when its symbol table has it (NULL: none). A binary stripped down to its
 * dynamic symbols has no entry for its static functions: the nearest symbol
 * below pc names the function only if pc lies within that symbol's size. */
static bool frame_info(uintptr_t pc, Dl_info *info) {
  const ElfW(Sym) *sym = NULL;
  if (dladdr1((void *)(pc - 1), info, (void **)&sym, RTLD_DL_SYMENT) == 0) return false;
  if (info->dli_sname != NULL && (sym == NULL || pc - 1 - (uintptr_t)info->dli_saddr >= sym->st_size))
    info->dli_sname = NULL;
  return true;
}

/* The loaded objects' code, for a profile's frames: found once per
 * profile (dladdr finds a frame's function by a scan of its object's
 * symbols, too slow for every frame of a profile written at each peak).
 * Under dump_lock. */
#define OBJECTS_MAX 512
typedef struct code_range {
  uintptr_t start, end, base;
  const char *name; /* as dladdr names the object */
} code_range;
static code_range objects[OBJECTS_MAX];
static unsigned nobjects;

static int add_object(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size, (void)arg;
  for (int i = 0; i < info->dlpi_phnum && nobjects < OBJECTS_MAX; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t start = info->dlpi_addr + ph->p_vaddr;
    Dl_info d;
    if (dladdr((void *)start, &d) == 0 || d.dli_fname == NULL) continue;
    objects[nobjects++] = (code_range){start, start + ph->p_memsz, info->dlpi_addr, d.dli_fname};
  }
  return 0;
}

static const code_range *object_of(uintptr_t pc) {
  for (unsigned i = 0; i < nobjects; i++)
    if (pc - 1 >= objects[i].start && pc - 1 < objects[i].end) return &objects[i];
  return NULL;
}

/* The functions' names by pc, for one profile's frames: the same frames
 * come back in many stacks (an interpreter's loop in nearly every one),
 * and each dladdr scans its object's symbols. Open addressing, mapped for
 * the profile (NULL: none, each frame looked up); filled to three
 * quarters at most. Under dump_lock. */
#define NAME_SLOTS_SHIFT 15
#define NAME_SLOTS ((size_t)1 << NAME_SLOTS_SHIFT)
typedef struct name_slot {
  uintptr_t pc;     /* 0: free */
  const char *name; /* NULL: the symbols name no function there */
} name_slot;
static name_slot *names_seen;
static size_t names_held;

static const char *frame_name(uintptr_t pc) {
  size_t i = (size_t)(((uint64_t)pc * 0x9e3779b97f4a7c15ull) >> (64 - NAME_SLOTS_SHIFT));
  if (names_seen != NULL)
    for (; names_seen[i].pc != 0; i = (i + 1) & (NAME_SLOTS - 1))
      if (names_seen[i].pc == pc) return names_seen[i].name;
  Dl_info info;
  const char *name = frame_info(pc, &info) ? info.dli_sname : NULL;
  if (names_seen != NULL && names_held < NAME_SLOTS / 4 * 3) {
    names_seen[i] = (name_slot){pc, name};
    names_held++;
  }
  return name;
}

/* A frame: its object and offset, and with `names` the function's name. */
static void write_frame_json(out *o, uintptr_t pc, bool names) {
  out_str(o, "{\"pc\":\"");
  out_hex(o, pc);
  out_str(o, "\"");
  const code_range *r = object_of(pc);
  if (r != NULL) {
    out_str(o, ",\"object\":\"");
    out_json_str(o, r->name);
    out_str(o, "\",\"offset\":");
    out_dec(o, pc - r->base);
  }
  const char *name = names && r != NULL ? frame_name(pc) : NULL;
  if (name != NULL) {
    out_str(o, ",\"function\":\"");
    out_json_str(o, name);
    out_str(o, "\"");
  }
  out_str(o, "}");
}

/* The same as JSON (docs/PROFILE.md): estimates and raw samples per stack,
 * frames with their object, offset and (exported) function name. */
static void write_json(int fd, const live_tally *t, bool names, uint64_t uptime_ms) {
  out o = {.fd = fd};
  names_seen = names ? hk_os_map_aligned(NAME_SLOTS * sizeof(name_slot), hk_os_page) : NULL;
  names_held = 0;
  double lb = 0, lc = 0, ab = 0, ac = 0;
  for (uint32_t i = 0; i <= STACKS_MAX; i = next_stack(i)) lb += t[i].est_bytes, lc += t[i].est_count;
  extern char *program_invocation_short_name; /* (glibc and musl; no allocation) */
  out_str(&o, "{\"hakmem\":\"" HK_VERSION_STRING "\",\"pid\":");
  out_dec(&o, (uint64_t)hk_os_pid());
  out_str(&o, ",\"program\":\"");
  out_json_str(&o, program_invocation_short_name != NULL ? program_invocation_short_name : "");
  out_str(&o, "\",\"uptime_ms\":");
  out_dec(&o, uptime_ms);
  out_str(&o, ",\"rate\":");
  out_dec(&o, (uint64_t)hk_opt.profile_rate);
  out_str(&o, ",\"live_bytes\":");
  out_dec(&o, (uint64_t)(lb + 0.5));
  out_str(&o, ",\"live_count\":");
  out_dec(&o, (uint64_t)(lc + 0.5));
  out_str(&o, ",\"stacks\":[");
  bool first = true;
  for (uint32_t i = 0; i <= STACKS_MAX; i = next_stack(i)) {
    const prof_stack *s = &stacks[i];
    stack_total c = total_of(i);
    if (c.alloc_count == 0 && t[i].count == 0) continue;
    out_str(&o, first ? "{" : ",{");
    first = false;
    out_str(&o, "\"live_bytes\":");
    out_dec(&o, (uint64_t)(t[i].est_bytes + 0.5));
    out_str(&o, ",\"live_count\":");
    out_dec(&o, (uint64_t)(t[i].est_count + 0.5));
    /* allocated: each raw sample scaled by its average size's weight */
    double k = c.alloc_count ? scale(c.alloc_bytes / c.alloc_count) : 0;
    ab += k * (double)c.alloc_bytes;
    ac += k * (double)c.alloc_count;
    out_str(&o, ",\"alloc_bytes\":");
    out_dec(&o, (uint64_t)(k * (double)c.alloc_bytes + 0.5));
    out_str(&o, ",\"alloc_count\":");
    out_dec(&o, (uint64_t)(k * (double)c.alloc_count + 0.5));
    out_str(&o, ",\"samples_live\":");
    out_dec(&o, t[i].count);
    out_str(&o, ",\"samples\":");
    out_dec(&o, c.alloc_count);
    out_str(&o, ",\"samples_freed\":[");
    for (unsigned k = 0; k < LIFETIMES; k++) {
      if (k) out_str(&o, ",");
      out_dec(&o, c.freed[k]);
    }
    out_str(&o, "],\"samples_freed_remote\":");
    out_dec(&o, c.freed_remote);
    out_str(&o, ",\"frames\":[");
    for (uint32_t f = 0; f < s->depth; f++) {
      if (f) out_str(&o, ",");
      write_frame_json(&o, s->pc[f], names);
    }
    out_str(&o, "]}");
  }
  out_str(&o, "],\"alloc_bytes\":");
  out_dec(&o, (uint64_t)(ab + 0.5));
  out_str(&o, ",\"alloc_count\":");
  out_dec(&o, (uint64_t)(ac + 0.5));
  out_str(&o, ",\"lifetime_ms\":[");
  for (unsigned k = 0; k < LIFETIMES - 1; k++) {
    if (k) out_str(&o, ",");
    out_dec(&o, LIFETIME_MS[k]);
  }
  /* sampled allocations by size, each bucket's samples scaled by the
   * weight of their average size */
  out_str(&o, "],\"sizes\":[");
  first = true;
  for (unsigned b = 0; b < SIZE_BUCKETS; b++) {
    uint64_t n = 0, bytes = 0;
    for (unsigned c = 0; c < SHARDS; c++) n += hk_load_relaxed(&size_samples[c][b][0]), bytes += hk_load_relaxed(&size_samples[c][b][1]);
    if (n == 0) continue;
    double k = scale(bytes / n);
    out_str(&o, first ? "{\"min\":" : ",{\"min\":");
    first = false;
    out_dec(&o, (uint64_t)1 << b);
    out_str(&o, ",\"samples\":");
    out_dec(&o, n);
    out_str(&o, ",\"alloc_count\":");
    out_dec(&o, (uint64_t)(k * (double)n + 0.5));
    out_str(&o, ",\"alloc_bytes\":");
    out_dec(&o, (uint64_t)(k * (double)bytes + 0.5));
    out_str(&o, "}");
  }
  out_str(&o, "]}\n");
  out_flush(&o);
  if (names_seen != NULL) hk_os_unmap(names_seen, NAME_SLOTS * sizeof(name_slot));
  names_seen = NULL;
}

/* The profile into path's files (with suffix); `names`: with the frames'
 * function names; `wait`: for another profile being written (else -1,
 * EBUSY); `peak`: the tally kept at the peak rather than the live samples. */
static int dump(const char *path, const char *suffix, bool names, bool wait, bool peak) {
  if (!hk_profile_on) {
    errno = ENOSYS;
    return -1;
  }
  char name[1100];
  if (path == NULL) path = hk_opt.profile_file;
  if (!hk_fmt_path(name, sizeof name, path, suffix)) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (!wait && pthread_mutex_trylock(&dump_lock) != 0) {
    errno = EBUSY;
    return -1;
  }
  if (wait) hk_lock(&dump_lock);
  uint64_t uptime = hk_os_now_ms() - start_ms;
  const live_tally *t = live_by_stack();
  if (peak) { /* (the stacks beyond the peak's appeared since: none of them live then) */
    memset(peak_tally + peak_stacks, 0, (tally_stacks - peak_stacks) * sizeof *t);
    t = peak_tally;
    uptime = peak_ms - start_ms;
  }
  nobjects = 0;
  dl_iterate_phdr(add_object, NULL); /* (no lock of the profiler's held: the loader's may be taken) */
  int rc = -1;
  if (t == NULL) errno = ENOMEM;
  int fd = t != NULL ? hk_os_create(name) : -1;
  if (fd >= 0) {
    write_pprof(fd, t);
    hk_os_close(fd);
    size_t n = strlen(name);
    memcpy(name + n, ".json", 6);
    fd = hk_os_create(name);
    if (fd >= 0) {
      write_json(fd, t, names, uptime);
      hk_os_close(fd);
      rc = 0;
    }
  }
  hk_unlock(&dump_lock);
  return rc;
}

int hk_profile_dump(const char *path) { return dump(path, "", true, true, false); }

void hk_profile_peak(uint64_t live) {
  uint64_t last = hk_load_relaxed(&peak_live);
  if (!hk_profile_on || live < ((uint64_t)1 << 20) || live < last + last / 10) return;
  hk_lock(&dump_lock);
  if (peak_tally == NULL) peak_tally = hk_os_map_aligned((STACKS_MAX + 1) * sizeof *peak_tally, 4096);
  const live_tally *t = peak_tally != NULL ? live_by_stack() : NULL;
  if (t != NULL) {
    memcpy(peak_tally, t, tally_stacks * sizeof *t);
    peak_tally[STACKS_MAX] = t[STACKS_MAX];
    peak_stacks = tally_stacks;
    peak_ms = hk_os_now_ms();
    hk_store_relaxed(&peak_live, live);
  }
  hk_unlock(&dump_lock);
}

/* The leak report at exit: the stacks holding the most live bytes
 * (estimates), to stderr. */
static void leak_report(void) {
  hk_lock(&dump_lock);
  live_tally *t = live_by_stack();
  if (t == NULL) {
    hk_unlock(&dump_lock);
    return;
  }
  double total = 0;
  uint64_t live = 0;
  for (uint32_t i = 0; i <= STACKS_MAX; i = next_stack(i)) total += t[i].est_bytes, live += t[i].count;
  out o = {.fd = 2};
  out_str(&o, "hakmem: profile: ");
  out_dec(&o, (uint64_t)(total + 0.5));
  out_str(&o, " bytes live at exit (estimated from ");
  out_dec(&o, live);
  out_str(&o, " samples, 1 per ");
  out_dec(&o, (uint64_t)hk_opt.profile_rate);
  out_str(&o, live != 0 ? " bytes); the largest by allocation site:\n" : " bytes)\n");
  for (int rank = 0; rank < 10; rank++) {
    uint32_t best = STACKS_MAX + 1;
    for (uint32_t i = 0; i <= STACKS_MAX; i = next_stack(i))
      if (t[i].est_bytes > 0 && (best > STACKS_MAX || t[i].est_bytes > t[best].est_bytes)) best = i;
    if (best > STACKS_MAX) break;
    out_str(&o, "hakmem:   ");
    out_dec(&o, (uint64_t)(t[best].est_bytes + 0.5));
    out_str(&o, " bytes in ");
    out_dec(&o, (uint64_t)(t[best].est_count + 0.5));
    out_str(&o, " blocks at");
    const prof_stack *s = &stacks[best];
    for (uint32_t f = 0; f < s->depth && f < 6; f++) {
      Dl_info info;
      out_str(&o, f ? " < " : " ");
      if (frame_info(s->pc[f], &info) && info.dli_sname != NULL) {
        out_str(&o, info.dli_sname);
      } else {
        out_hex(&o, s->pc[f]);
      }
    }
    out_str(&o, "\n");
    t[best].est_bytes = 0;
  }
  out_flush(&o);
  hk_unlock(&dump_lock);
}

/* ---- start, signal, exit ---- */

/* This library's code segment, unless the library is linked into the
 * program (libhakmem.a): the program's own frames would go too then. */
static int find_self(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  uintptr_t me = (uintptr_t)arg;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
    uintptr_t start = info->dlpi_addr + ph->p_vaddr, end = start + ph->p_memsz;
    if (me < start || me >= end) continue;
    if (info->dlpi_name != NULL && info->dlpi_name[0] != 0) {
      lib_start = start;
      lib_end = end;
    }
    return 1;
  }
  return 0;
}

static volatile sig_atomic_t dump_asked;

static void on_signal(int sig) {
  (void)sig;
  dump_asked = 1;
}

/* The signal's dump, made by the next sampled allocation or by the
 * purger's pass, where no lock of the program's or of hakmem's is held. */
void hk_profile_poll(void) {
  if (dump_asked && hk_profile_on) {
    dump_asked = 0;
    /* (without waiting: this malloc may be the loader's, which holds the
     * lock a profile being written may be waiting for) */
    int saved = errno; /* (malloc's caller sees its own) */
    if (dump(NULL, "", true, false, false) != 0 && errno == EBUSY) dump_asked = 1;
    errno = saved;
  }
}

/* At start-up (hk_init, before malloc works): the tables (the profiler's
 * heap is made at the first sample, the unwinder loaded by
 * hk_profile_load). */
void hk_profile_init(void) {
  if (!hk_opt.profile) return;
  if (hk_secure) {
    static const char msg[] = "hakmem: warning: HAKMEM_PROFILE ignored in hardened mode (HAKMEM_SECURE)\n";
    hk_os_write_stderr(msg, sizeof msg - 1);
    return;
  }
  for (unsigned k = 0; k < SHARDS; k++) {
    shards[k].cap = SHARD_MIN;
    shards[k].table = hk_os_map_aligned(SHARD_MIN * sizeof(prof_sample), 4096);
    if (shards[k].table == NULL) return;
  }
  stacks = hk_os_map_aligned((STACKS_MAX + 1) * sizeof *stacks, 4096);
  counts = hk_os_map_aligned((size_t)SHARDS * (STACKS_MAX + 1) * sizeof *counts, 4096);
  stack_slots = hk_os_map_aligned(2 * STACKS_MAX * sizeof *stack_slots, 4096);
}

/* At the end of initialisation, malloc working (dlopen allocates): the
 * unwinder, and then the profiler samples. */
void hk_profile_load(void) {
  if (shards[SHARDS - 1].table == NULL || stacks == NULL || counts == NULL || stack_slots == NULL) return;
  void *lib = dlopen("libgcc_s.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib != NULL) {
    unwind_backtrace = (_Unwind_Reason_Code(*)(_Unwind_Trace_Fn, void *))dlsym(lib, "_Unwind_Backtrace");
    unwind_ip = (_Unwind_Ptr(*)(struct _Unwind_Context *))dlsym(lib, "_Unwind_GetIP");
    unwind_cfa = (_Unwind_Word(*)(struct _Unwind_Context *))dlsym(lib, "_Unwind_GetCFA");
  }
  if (unwind_backtrace == NULL || unwind_ip == NULL || unwind_cfa == NULL) {
    static const char msg[] = "hakmem: warning: HAKMEM_PROFILE: cannot load the unwinder (libgcc_s.so.1): no profile\n";
    hk_os_write_stderr(msg, sizeof msg - 1);
    return;
  }
  if (hk_opt.profile_signal > 0) hk_os_on_signal((int)hk_opt.profile_signal, on_signal);
  start_ms = hk_os_now_ms();
  hk_sample_freed = hk_profile_forget;
  hk_free_checks = true; /* (sampled pages: hk_free_to_cache) */
  hk_profile_on = true;
  hk_tls_arm(); /* (this thread's budget: now to its first sample) */
}

__attribute__((destructor)) static void profile_at_exit(void) {
  if (!hk_profile_on) return;
  hk_profile_dump(NULL);
  if (hk_load_relaxed(&peak_live) != 0) dump(NULL, ".peak", false, true, true);
  leak_report();
}

void hk_profile_fork_prepare(void) {
  hk_lock(&dump_lock);
  hk_lock(&profile_lock);
  for (unsigned k = 0; k < SHARDS; k++) hk_spin_lock(&shards[k].lock);
}
void hk_profile_fork_parent(void) {
  for (unsigned k = 0; k < SHARDS; k++) hk_spin_unlock(&shards[k].lock);
  hk_unlock(&profile_lock);
  hk_unlock(&dump_lock);
}
void hk_profile_fork_child(void) {
  hk_store_relaxed(&peak_live, 0); /* (the child's own peak, written under its own pid) */
  pthread_mutex_init(&profile_lock, NULL);
  pthread_mutex_init(&dump_lock, NULL);
  for (unsigned k = 0; k < SHARDS; k++) hk_spin_unlock(&shards[k].lock);
}
