/* Process initialisation and fork handling.
 *
 * hk_init runs inside the first malloc (or the library constructor,
 * whichever comes first). It must not allocate before malloc can work: it
 * computes the size classes, reads the options and the secret keys derive
 * from (keys.c), and only then (state 2) calls pthread functions that may
 * call malloc themselves. */
#include "internal.h"

#include <sched.h>
#include <string.h>

_Atomic int hk_init_state;
static __thread int initializing __attribute__((tls_model("initial-exec")));

static void check_size_classes(void) {
  for (unsigned c = 1; c < HK_NSIZES; c++) {
    size_t s = hk_class_size[c];
    if (hk_size_class(s) != c || hk_size_class(hk_class_size[c - 1] + 1) != c)
      hk_fatal("internal error: size class table is inconsistent", NULL);
  }
  /* (what hk_alloc_aligned's small path relies on) */
  for (size_t align = 32; align <= 64; align *= 2)
    for (size_t s = align; s <= HK_LUT_MAX; s += align)
      if (hk_class_size[hk_size_class(s)] % align != 0 || hk_class_size[hk_size_class(s)] > 2 * s)
        hk_fatal("internal error: size class table is inconsistent", NULL);
}

void hk_init(void) {
  if (hk_load_acquire(&hk_init_state) == 2 || initializing) return;
  int expect = 0;
  if (!atomic_compare_exchange_strong(&hk_init_state, &expect, 1)) {
    while (hk_load_acquire(&hk_init_state) != 2) sched_yield();
    return;
  }
  initializing = 1;
  /* Every range hakmem maps, guards or purges is in whole pages of the
   * kernel's (hk_os_page): read before the first mapping. A slab must hold
   * whole pages (its spans are committed and purged whole). */
  size_t page = hk_os_page_size();
  if (page < HK_OS_PAGE_MIN || page > HK_OS_PAGE_MAX || (page & (page - 1)) != 0)
    hk_fatal("the system's memory page size is not one hakmem supports (a power of two from 4 KiB to 64 KiB)", NULL);
  hk_os_page = page;
  hk_sizeclass_init();
  check_size_classes();
  hk_options_init();
  hk_stats_init();
  hk_secure = hk_opt.secure >= 1;
  hk_secure_zero = hk_opt.secure >= 2;
  hk_free_checks = hk_secure;
  hk_thread_stats = hk_opt.thread_stats != 0;
  /* zero mode keeps no cache of remote-freed blocks (remote.c); nor does
   * the exact per-thread accounting, which counts a freed block out of its
   * allocating thread's figures only once it is back on its page
   * (inspect.c) */
  if (hk_secure_zero || hk_thread_stats) memset(hk_class_cache_max, 0, sizeof hk_class_cache_max);
  hk_keys_init();
  hk_region_init();
  hk_purger_init(hk_pressure_purge_pass, hk_pressure_pending);
  hk_profile_init();
  hk_store_release(&hk_init_state, 2);
  /* may allocate: malloc is fully usable from here on */
#if HAKMEM_OVERRIDE
  hk_fork_handlers_check();
#else
  hk_fork_handlers_register(); /* the C library's calloc is not ours: no later check is sure to run in time */
#endif
  if (hk_opt.profile && !hk_secure) hk_profile_load(); /* (dlopen) */
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
void (*hk_fork_child_done)(void);

void hk_fork_handlers_register(void) {
  if (atomic_exchange(&hk_fork_handlers, 1)) return;
  pthread_atfork(hk_fork_prepare, hk_fork_parent, hk_fork_child); /* may allocate */
}

__attribute__((constructor)) static void hk_init_at_load(void) { hk_init(); }

/* Lock order: the purger's pass (and statistics' readers), purger, late heap, heap pool, abandoned pages, large cache,
 * the region lists in order, the region records, the arena, all taken
 * after waiting for the remote frees that are giving pages back
 * (hk_reclaim_fork_prepare). From then until the parent or child handler,
 * this thread holds every lock (hk_fork_holder, sync.h). */

void hk_fork_prepare(void) {
  hk_heap_fork_lock_users();
  hk_pressure_hold();
  hk_profile_fork_prepare();
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
  hk_profile_fork_parent();
  hk_pressure_unhold();
  hk_heap_fork_unlock_users();
}

void hk_fork_child(void) {
  /* Only the forking thread exists in the child, and it holds every lock. */
  hk_fork_holder = false;
  hk_heap_fork_child(); /* (under hk_heap_lock) */
  hk_large_fork_child();
  unlock_all();
  hk_purger_fork_child();
  hk_reclaim_fork_done();
  hk_profile_fork_child();
  hk_pressure_fork_child();
  hk_limits_fork_child();
  hk_heap_fork_unlock_users();
  if (hk_fork_child_done != NULL) hk_fork_child_done(); /* (every lock usable again) */
}
