/* Statistics' counters: global ones updated on slow paths only (page,
 * region and large-block events), and per-thread ones merged when a thread
 * exits. What reads them, with the live figures no counter holds, is
 * inspect.c. */
#include "internal.h"

#include <string.h>

hk_stats_t hk_stats;
/* merged from exited threads (relaxed adds: a print reads a consistent
 * enough sum, and a thread exiting needs no lock here) */
static struct {
  _Atomic uint64_t pages_acquired, pages_released, pages_adopted, remote_frees, cache_reused;
} exited;

/* The exited threads' counters added to *s. */
void hk_stats_add_exited(hk_heap_stats *s) {
  s->pages_acquired += hk_load_relaxed(&exited.pages_acquired);
  s->pages_released += hk_load_relaxed(&exited.pages_released);
  s->remote_frees += hk_load_relaxed(&exited.remote_frees);
  s->pages_adopted += hk_load_relaxed(&exited.pages_adopted);
  s->cache_reused += hk_load_relaxed(&exited.cache_reused);
}

void hk_stat_peak(_Atomic uint64_t *peak, uint64_t v) {
  uint64_t cur = hk_load_relaxed(peak);
  while (v > cur && !atomic_compare_exchange_weak_explicit(peak, &cur, v, memory_order_relaxed, memory_order_relaxed)) {
  }
}

void hk_stats_merge_heap(const hk_heap_stats *s) {
  hk_add_relaxed(&exited.pages_acquired, s->pages_acquired);
  hk_add_relaxed(&exited.pages_released, s->pages_released);
  hk_add_relaxed(&exited.remote_frees, s->remote_frees);
  hk_add_relaxed(&exited.pages_adopted, s->pages_adopted);
  hk_add_relaxed(&exited.cache_reused, s->cache_reused);
}


/* ---- where the report goes ----
 * HAKMEM_STATS_FILE names a file. The first process that names it holds an
 * flock on it from its start, so that the processes it runs (an exec
 * inherits the variable) and those it forks do not write over its report:
 * they add their pid to the name. "%p" in the name is replaced by the pid
 * in every process instead. No file: stderr. */
static int file_fd = -1;
static int file_pid;

void hk_stats_init(void) {
  const char *path = hk_opt.stats_file;
  if (hk_opt.stats == 0 || path == NULL || strstr(path, "%p") != NULL) return;
  file_fd = hk_os_open_locked(path);
  file_pid = hk_os_pid();
}

/* The file for this process's report, opened now and empty, or 2. */
int hk_stats_report_fd(void) {
  const char *path = hk_opt.stats_file;
  if (path == NULL) return 2;
  int pid = hk_os_pid();
  if (file_fd >= 0 && pid == file_pid) {
    hk_os_truncate(file_fd);
    return file_fd;
  }
  char name[1100], d[24];
  size_t dn = hk_fmt_dec(d, (uint64_t)pid), n = strlen(path);
  const char *p = strstr(path, "%p");
  if (n + dn + 2 > sizeof name) return 2;
  if (p != NULL) { /* path with the pid for %p */
    size_t head = (size_t)(p - path);
    memcpy(name, path, head);
    memcpy(name + head, d, dn);
    memcpy(name + head + dn, p + 2, n - head - 2 + 1);
  } else { /* path.PID */
    memcpy(name, path, n);
    name[n] = '.';
    memcpy(name + n + 1, d, dn);
    name[n + 1 + dn] = 0;
  }
  int fd = hk_os_create(name);
  return fd >= 0 ? fd : 2;
}

void hk_stats_report_done(int fd) {
  if (fd != 2 && fd != file_fd) hk_os_close(fd);
}
