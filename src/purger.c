/* The purger: a background thread that gives memory back to the OS after
 * HAKMEM_PURGE_DELAY_MS even when the program makes no further allocator
 * call (a program that frees everything and then sleeps or waits on I/O).
 *
 * It is started on the first release of memory in a program with one
 * thread, and when a second thread first allocates (never at load time, so
 * short programs that never free a page never get it; never from free() in
 * a program with threads: see hk_purger_notify_free), wakes every half
 * delay while there is something to purge, and sleeps on a condition
 * variable when there is nothing. Application threads only read one atomic
 * flag (`idle`) on the page-release slow path; they signal the purger only
 * when it has gone idle. The purger never allocates. */
#include "internal.h"


__thread bool hk_purge_poke __attribute__((tls_model("initial-exec")));

static pthread_mutex_t purger_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t purger_cond = PTHREAD_COND_INITIALIZER;
static _Atomic int started;  /* 0: no thread (also in a fork child), 1: started */
static _Atomic uint64_t retry_ms; /* a start failed: not tried again before then */
static _Atomic int idle;     /* the thread is (about to be) waiting for work */
static int work;             /* purger_lock */

/* The pass and its test (pressure.c), given at initialisation: the purger
 * sits below the tiers it purges and knows none of them. */
static void (*purge_pass)(void);
static bool (*purge_pending)(void);

void hk_purger_init(void (*pass)(void), bool (*pending)(void)) {
  purge_pass = pass;
  purge_pending = pending;
}

static void *purger_main(void *arg) {
  (void)arg;
  for (;;) {
    long period = hk_opt.purge_delay_ms / 2; /* (hak_option_set may change it) */
    hk_os_sleep_ms(period < 10 ? 10 : period);
    purge_pass();
    /* Go idle only if nothing is left; a release racing with this either
     * shows up in pending() or sees idle == 1 and signals. */
    atomic_store(&idle, 1);
    if (purge_pending()) {
      atomic_store(&idle, 0);
      continue;
    }
    hk_lock(&purger_lock);
    while (!work) pthread_cond_wait(&purger_cond, &purger_lock);
    work = 0;
    atomic_store(&idle, 0);
    hk_unlock(&purger_lock);
  }
  return NULL;
}

_Atomic int hk_purger_wanted;

/* Called after memory became purgeable, with no allocator lock held, from
 * malloc's slow path, realloc, thread exit or malloc_trim: contexts that may
 * start the thread. */
void hk_purger_notify(void) {
  /* cleared here whatever happens below: a free that set it just as another
   * thread started the purger would otherwise leave it set, and send every
   * later slow-path malloc here */
  if (HK_UNLIKELY(hk_fork_holder)) { /* inside fork(): no thread started, no lock waited for */
    hk_store_relaxed(&hk_purger_wanted, 1);
    return;
  }
  if (hk_load_relaxed(&hk_purger_wanted))
    hk_store_relaxed(&hk_purger_wanted, 0);
  if (!hk_opt.purge_thread) return;
  if (!hk_load_acquire(&started)) {
    uint64_t now = hk_os_now_ms();
    if (now < hk_load_relaxed(&retry_ms)) return;
    int expect = 0;
    if (!atomic_compare_exchange_strong(&started, &expect, 1)) return;
    if (!hk_os_start_thread(purger_main)) {
      /* (no room for its stack, say, under an address-space limit: the
       * slow paths purge meanwhile, and a call a purge delay later tries
       * again) */
      hk_warning("cannot start the purger thread");
      hk_store_relaxed(&retry_ms, now + (uint64_t)hk_opt.purge_delay_ms);
      atomic_store(&started, 0);
    }
    return;
  }
  if (atomic_load(&idle)) {
    hk_lock(&purger_lock);
    work = 1;
    pthread_cond_signal(&purger_cond);
    hk_unlock(&purger_lock);
  }
}

/* From free(), which glibc itself calls while it holds its lock on the
 * cache of thread stacks (pthread_join, or a detached thread's exit, freeing
 * the thread-local storage of stacks it evicts): pthread_create there waits
 * on that lock forever. In a program that joins many threads the first
 * memory released can be such a free, which would hang. So free()
 * starts the thread only while the process has a single thread; otherwise
 * it leaves the start to the next malloc slow path or thread exit. */
void hk_purger_notify_free(void) {
  if (!hk_load_acquire(&started) && hk_maybe_threaded()) {
    hk_store_relaxed(&hk_purger_wanted, 1);
    return;
  }
  hk_purger_notify();
}

/* Start the purger if it never was: when a second thread makes its first
 * malloc, and when a thread exits (no glibc lock is held there: thread-
 * specific data destructors run first). From then on free() could not
 * start it (above), and a program whose threads free everything and wait,
 * or whose exited threads' pages only the purger gives back, would keep
 * that memory. */
void hk_purger_start(void) {
  if (!hk_load_acquire(&started)) hk_purger_notify();
}

/* fork: the child has no purger thread; it starts one when it needs it. */
void hk_purger_fork_prepare(void) { hk_lock(&purger_lock); }
void hk_purger_fork_parent(void) { hk_unlock(&purger_lock); }
void hk_purger_fork_child(void) {
  pthread_mutex_init(&purger_lock, NULL);
  pthread_cond_init(&purger_cond, NULL);
  work = 0;
  atomic_store(&idle, 0);
  atomic_store(&started, 0);
}
