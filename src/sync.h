/* hakmem's locks and atomics.
 *
 * Atomics go through the wrappers below, named for the ordering they give;
 * a use that needs more (a compare-and-swap, an exchange, a fence) spells
 * it out with its reason beside it.
 *   relaxed: only the value matters and no other memory is read on its
 *            account: statistics, hints that a later locked or acquiring
 *            step revalidates, fields whose readers tolerate a stale value.
 *   release/acquire: a writer publishes what it wrote before (a page's
 *            records before its owner, a heap's tid before `live`, the
 *            size-class tables before the initialisation state) to a reader
 *            that acquires the same word.
 */
#ifndef HK_SYNC_H
#define HK_SYNC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <pthread.h>

#pragma GCC visibility push(hidden)

#define hk_load_relaxed(p) atomic_load_explicit((p), memory_order_relaxed)
/* A plain load of a 64-bit atomic field by a thread that no other thread
 * writes it against (its only writer, or one ordered after every other
 * write): the value hk_load_relaxed would give, in a form the compiler may
 * fold into the instruction that uses it. */
#define hk_load_owned(p) (*(const uint64_t *)(const void *)(p))
#define hk_store_relaxed(p, v) atomic_store_explicit((p), (v), memory_order_relaxed)
#define hk_add_relaxed(p, n) atomic_fetch_add_explicit((p), (n), memory_order_relaxed)
#define hk_sub_relaxed(p, n) atomic_fetch_sub_explicit((p), (n), memory_order_relaxed)
#define hk_load_acquire(p) atomic_load_explicit((p), memory_order_acquire)
#define hk_store_release(p, v) atomic_store_explicit((p), (v), memory_order_release)

/* ---- the allocator's locks and fork() ----
 * Every lock that hk_fork_prepare takes (init.c) is taken through these.
 * Between hakmem's prepare handler and its parent or child handler, the
 * forking thread holds them all, and the program's own fork handlers that
 * run in that window (those registered before hakmem's: pthread_atfork
 * runs prepare handlers last-registered first, the others first-registered
 * first) may allocate and free. No other thread can be inside a part of the
 * allocator these locks guard then, so the forking thread goes on as if it
 * took each lock, instead of waiting for itself. (A heap's spare_lock is
 * not among them: fork does not take it.) */
extern __thread bool hk_fork_holder __attribute__((tls_model("initial-exec")));
static inline __attribute__((always_inline)) void hk_lock(pthread_mutex_t *m) {
  if (__builtin_expect(!hk_fork_holder, 1)) pthread_mutex_lock(m);
}
static inline __attribute__((always_inline)) void hk_unlock(pthread_mutex_t *m) {
  if (__builtin_expect(!hk_fork_holder, 1)) pthread_mutex_unlock(m);
}
static inline __attribute__((always_inline)) bool hk_trylock(pthread_mutex_t *m) {
  return hk_fork_holder || pthread_mutex_trylock(m) == 0;
}

/* A spin lock: one atomic exchange to take, a store to release, for
 * critical sections of a few dozen instructions (a heap the program made:
 * user_heap.c), where a mutex's release costs another read-modify-write.
 * A waiter spins a while, then yields. hk_spin_lock returns false, taking
 * nothing, to the thread that forks while it holds every lock (as
 * hk_lock does), and the caller then releases nothing. */
void hk_spin_wait(_Atomic uint32_t *l);
static inline __attribute__((always_inline)) bool hk_spin_lock(_Atomic uint32_t *l) {
  if (__builtin_expect(!atomic_exchange_explicit(l, 1, memory_order_acquire), 1)) return true;
  if (hk_fork_holder) return false;
  hk_spin_wait(l);
  return true;
}
static inline __attribute__((always_inline)) bool hk_spin_trylock(_Atomic uint32_t *l) {
  return !atomic_exchange_explicit(l, 1, memory_order_acquire);
}
static inline __attribute__((always_inline)) void hk_spin_unlock(_Atomic uint32_t *l) {
  atomic_store_explicit(l, 0, memory_order_release);
}

/* The initialiser of the locks that many threads take for short critical
 * sections (the region lists, the large cache): glibc's adaptive mutex
 * spins a while before it sleeps, where a plain one makes a futex call for
 * nearly every contended acquisition. */
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
#define HK_SPIN_MUTEX_INITIALIZER PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
#else
#define HK_SPIN_MUTEX_INITIALIZER PTHREAD_MUTEX_INITIALIZER
#endif

#pragma GCC visibility pop

#endif /* HK_SYNC_H */
