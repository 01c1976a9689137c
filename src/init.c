/* Process initialisation and fork handling.
 *
 * hk_init runs inside the first malloc (or the library constructor,
 * whichever comes first). It must not allocate before malloc can work: it
 * computes the size classes, reads the options and the secret key, and only
 * then (state 2) calls pthread functions that may call malloc themselves. */
#include "internal.h"

#include <sched.h>
#include <string.h>

_Atomic int hk_init_state;
static __thread int initializing __attribute__((tls_model("initial-exec")));

/* The secret from which every key is derived (page keys, heaps' list
 * keys). It is stored nowhere else: what lies in user memory is keyed
 * with values derived from it by SipHash-1-3 (Aumasson and Bernstein), so
 * a key learnt from a freed block says nothing about the secret or about
 * any other key. */
uintptr_t hk_key, hk_key2;

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))
#define SIPROUND                                                                                   \
  do {                                                                                             \
    v0 += v1; v1 = ROTL(v1, 13); v1 ^= v0; v0 = ROTL(v0, 32);                                      \
    v2 += v3; v3 = ROTL(v3, 16); v3 ^= v2;                                                         \
    v0 += v3; v3 = ROTL(v3, 21); v3 ^= v0;                                                         \
    v2 += v1; v1 = ROTL(v1, 17); v1 ^= v2; v2 = ROTL(v2, 32);                                      \
  } while (0)

/* SipHash-1-3 of the 16 bytes (a, b) under the secret; bits 48-63 of the
 * result are at least 0x100 (see hk_looks_free). */
uintptr_t hk_derive_key(uint64_t a, uint64_t b) {
  uint64_t k0 = hk_key, k1 = hk_key2;
  uint64_t v0 = k0 ^ 0x736f6d6570736575ull, v1 = k1 ^ 0x646f72616e646f6dull;
  uint64_t v2 = k0 ^ 0x6c7967656e657261ull, v3 = k1 ^ 0x7465646279746573ull;
  uint64_t m[3] = {a, b, (uint64_t)16 << 56};
  for (int i = 0; i < 3; i++) {
    v3 ^= m[i];
    SIPROUND;
    v0 ^= m[i];
  }
  v2 ^= 0xff;
  SIPROUND;
  SIPROUND;
  SIPROUND;
  uint64_t v = v0 ^ v1 ^ v2 ^ v3;
  if ((v >> 48) < 0x100) v |= (uint64_t)0xa5c3 << 48;
  return (uintptr_t)v;
}

static void check_size_classes(void) {
  for (unsigned c = 1; c < HK_NSIZES; c++) {
    size_t s = hk_class_size[c];
    if (hk_size_class(s) != c || hk_size_class(hk_class_size[c - 1] + 1) != c)
      hk_fatal("internal error: size class table is inconsistent", NULL);
  }
}

void hk_init(void) {
  if (hk_load_acquire(&hk_init_state) == 2 || initializing) return;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&hk_init_state, &expect, 1)) {
    while (hk_load_acquire(&hk_init_state) != 2) sched_yield();
    return;
  }
  initializing = 1;
  hk_sizeclass_init();
  check_size_classes();
  hk_options_init();
  hk_secure = hk_opt.secure >= 1;
  /* hardened mode keeps no cache of remote-freed blocks (remote.c) */
  if (hk_secure) memset(hk_class_cache_max, 0, sizeof hk_class_cache_max);
  hk_secure_zero = hk_opt.secure >= 2;
  hk_key = (uintptr_t)hk_os_random();
  hk_key2 = (uintptr_t)hk_os_random();
  hk_region_init();
  hk_purger_init(hk_pressure_purge_pass, hk_pressure_pending);
  hk_store_release(&hk_init_state, 2);
  /* may allocate: malloc is fully usable from here on */
#if HAKMEM_OVERRIDE
  hk_fork_handlers_check();
#else
  hk_fork_handlers_register(); /* the C library's calloc is not ours: no later check is sure to run in time */
#endif
  initializing = 0;
}

/* The fork handlers are registered once the process may have a second
 * thread, not at start-up. While it has one, no other thread can hold an
 * allocator lock or be inside a reclaim when fork() runs, and the child's
 * heap needs nothing done: the reaper leaves alone the heaps a process
 * did not make (their pid is the parent's, heap.c). And the first
 * pthread_atfork call of a process costs 64 KiB of RSS: it reads a
 * constant in a page of libc's read-only data, which the kernel maps with
 * the 15 pages around it. A program that starts a thread, or whose purger
 * starts, pays them then.
 * They must be in place before a second thread can run allocator code.
 * glibc's pthread_create marks the process multi-threaded and then, before
 * the new thread exists, allocates its DTV with calloc (2.36:
 * allocate_stack -> _dl_allocate_tls -> allocate_dtv), and calloc checks
 * (tests/test_fork_lazy.c fails if the handlers are not there when the new
 * thread starts). A thread's first allocation checks too, in case a C
 * library does not allocate there; a fork racing with that thread would
 * then not be covered. */
_Atomic int hk_fork_handlers;

void hk_fork_handlers_register(void) {
  if (atomic_exchange(&hk_fork_handlers, 1)) return;
  pthread_atfork(hk_fork_prepare, hk_fork_parent, hk_fork_child); /* may allocate */
}

__attribute__((constructor)) static void hk_init_at_load(void) { hk_init(); }

/* Lock order: purger, late heap, heap pool, abandoned pages, large cache,
 * the region lists in order, the region records, the arena, all taken
 * after waiting for the remote frees that are giving pages back
 * (hk_reclaim_fork_prepare). From then until the parent or child handler,
 * this thread holds every lock (hk_fork_holder, sync.h). */

void hk_fork_prepare(void) {
  hk_reclaim_fork_prepare();
  hk_purger_fork_prepare();
  hk_heap_fork_lock();
  hk_lock(&hk_large_lock);
  hk_region_fork_lock();
  hk_fork_holder = true;
}

static void unlock_all(void) {
  hk_region_fork_unlock();
  hk_unlock(&hk_large_lock);
  hk_heap_fork_unlock();
}

void hk_fork_parent(void) {
  hk_fork_holder = false;
  unlock_all();
  hk_purger_fork_parent();
  hk_reclaim_fork_done();
}

void hk_fork_child(void) {
  /* Only the forking thread exists in the child, and it holds every lock. */
  hk_fork_holder = false;
  hk_heap_fork_child(); /* (under hk_heap_lock) */
  unlock_all();
  hk_purger_fork_child();
  hk_reclaim_fork_done();
}
