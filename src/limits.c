/* Memory limits (docs/OPTIONS.md, "Memory limits"): what hakmem may hold
 * for the program, checked where it maps more (a region for small blocks,
 * a large mapping or its growth), never on a fast path.
 *
 *   HAKMEM_MEMORY_LIMIT: a mapping that would take what hakmem holds (its
 *     regions and large mappings) past it is refused; the caller gives back
 *     what its caches hold and tries once more (thread.c), then malloc
 *     returns NULL with ENOMEM instead of the kernel killing the process.
 *   the cgroup's memory.max (v1: memory.limit_in_bytes), less a margin of
 *     1/16 (4 MiB to 256 MiB): the same, against the cgroup's usage
 *     (memory.current, v1 memory.usage_in_bytes), which counts the memory
 *     that is not hakmem's too.
 *   HAKMEM_MEMORY_SOFT_LIMIT, and the cgroup's memory.high (v1:
 *     memory.soft_limit_in_bytes) against its usage: crossing one gives back
 *     everything free at once, rather than after the purge delay, and calls
 *     the program's handler (hak_set_pressure_handler), at most every
 *     100 ms (pressure.c).
 *
 * The cgroup is the process's own (/proc/self/cgroup), or the directory
 * HAKMEM_CGROUP_DIR names; its limits are read at start-up and again at
 * most once a second, so a limit changed while the program runs applies. */
#include "internal.h"

#include <string.h>

static int fd_current = -1, fd_max = -1, fd_high = -1; /* the cgroup's files (-1: none) */
static _Atomic uint64_t cg_max = UINT64_MAX, cg_high = UINT64_MAX; /* UINT64_MAX: no limit */
static _Atomic uint64_t cg_read_ms;   /* when they were last read */
static bool cgroup_on;                /* a cgroup's files are open */
static int thp_system;                /* the kernel's THP mode: 0 never, 1 madvise, 2 always */
_Atomic bool hk_limit_soft_crossed;   /* a soft limit was crossed: the slow path gives back (thread.c) */

/* What hakmem holds: its regions and large mappings. */
uint64_t hk_limit_held(void) {
  return hk_load_relaxed(&hk_stats.regions_live) * HK_REGION_SIZE + hk_load_relaxed(&hk_stats.large_mapped_bytes);
}

static uint64_t margin(uint64_t max) {
  uint64_t m = max / 16;
  return m < (4u << 20) ? 4u << 20 : m > (256u << 20) ? 256u << 20 : m;
}

/* Opens dir/name (of PATH_MAX at most). */
static int open_in(const char *dir, const char *name) {
  char path[1100];
  size_t n = strlen(dir), k = strlen(name);
  if (n + k + 2 > sizeof path) return -1;
  memcpy(path, dir, n);
  path[n] = '/';
  memcpy(path + n + 1, name, k + 1);
  return hk_os_open_read(path);
}

/* The cgroup's files in dir: v2's (version 2), v1's (1), or v2's if dir
 * has them, else v1's (0: a directory HAKMEM_CGROUP_DIR names). A known
 * version tries no name of the other: each open costs some microseconds
 * of every process's start. */
static bool open_cgroup(const char *dir, int version) {
  bool v2 = version != 1 && (fd_max = open_in(dir, "memory.max")) >= 0;
  if (!v2 && version == 2) return false;
  if (!v2) fd_max = open_in(dir, "memory.limit_in_bytes");
  fd_high = open_in(dir, v2 ? "memory.high" : "memory.soft_limit_in_bytes");
  fd_current = open_in(dir, v2 ? "memory.current" : "memory.usage_in_bytes");
  if (fd_max >= 0 && fd_current >= 0) return true;
  int *fds[3] = {&fd_max, &fd_high, &fd_current};
  for (int i = 0; i < 3; i++) {
    if (*fds[i] >= 0) hk_os_close(*fds[i]);
    *fds[i] = -1;
  }
  return false;
}

/* root followed by the path in [path, end): the cgroup's directory. */
static bool open_cgroup_at(const char *root, const char *path, const char *end, int version) {
  char dir[1100];
  size_t rn = strlen(root), pn = (size_t)(end - path);
  if (rn + pn + 1 > sizeof dir) return false;
  memcpy(dir, root, rn);
  memcpy(dir + rn, path, pn);
  dir[rn + pn] = 0;
  return open_cgroup(dir, version);
}

/* Does the comma-separated list in [s, e) name the memory controller? */
static bool names_memory(const char *s, const char *e) {
  while (s < e) {
    const char *c = memchr(s, ',', (size_t)(e - s));
    if (c == NULL) c = e;
    if (c - s == 6 && strncmp(s, "memory", 6) == 0) return true;
    s = c + 1;
  }
  return false;
}

/* The process's cgroup from /proc/self/cgroup: v2's ("0::PATH") where its
 * directory has the memory files, else v1's memory hierarchy's. */
static bool find_cgroup(void) {
  char buf[4096];
  if (hk_os_read_file("/proc/self/cgroup", buf, sizeof buf) <= 0) return false;
  for (int v1 = 0; v1 < 2; v1++) {
    for (const char *line = buf; *line;) {
      const char *end = strchr(line, '\n');
      if (end == NULL) end = line + strlen(line);
      const char *c1 = memchr(line, ':', (size_t)(end - line));
      const char *c2 = c1 != NULL ? memchr(c1 + 1, ':', (size_t)(end - c1 - 1)) : NULL;
      if (c2 != NULL && (v1 ? names_memory(c1 + 1, c2) : c2 == c1 + 1) &&
          open_cgroup_at(v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup", c2 + 1, end, v1 ? 1 : 2))
        return true;
      line = *end ? end + 1 : end;
    }
  }
  return false;
}

static void read_cgroup(uint64_t now) {
  hk_store_relaxed(&cg_max, hk_os_read_number(fd_max));
  hk_store_relaxed(&cg_high, fd_high >= 0 ? hk_os_read_number(fd_high) : UINT64_MAX);
  hk_store_relaxed(&cg_read_ms, now);
}

/* At start-up, after the options. */
void hk_limits_init(void) {
  const char *dir = hk_opt.cgroup_dir;
  bool cgroup = dir == NULL ? find_cgroup() : strcmp(dir, "none") != 0 && open_cgroup(dir, 0);
  if (cgroup) read_cgroup(hk_os_now_ms());
  cgroup_on = cgroup;
  char thp[128];
  if (hk_os_read_file("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof thp) > 0)
    thp_system = strstr(thp, "[always]") ? 2 : strstr(thp, "[madvise]") ? 1 : 0;
}

/* May hakmem map `more` bytes? False when a hard limit would be crossed;
 * a soft one crossed is noted for the slow path. */
bool hk_limit_allows(size_t more) {
  /* (the options are read each time: hak_option_set may set them) */
  if (!cgroup_on && hk_opt.memory_limit == 0 && hk_opt.memory_soft_limit == 0) return true;
  uint64_t now = hk_os_now_ms(), last = hk_load_relaxed(&cg_read_ms);
  if (fd_max >= 0 && now >= last + 1000 && atomic_compare_exchange_strong(&cg_read_ms, &last, now))
    read_cgroup(now);
  uint64_t held = hk_limit_held();
  bool ok = true, soft = false;
  if (hk_opt.memory_limit != 0 && held + more > (uint64_t)hk_opt.memory_limit) ok = false;
  if (hk_opt.memory_soft_limit != 0 && held + more > (uint64_t)hk_opt.memory_soft_limit) soft = true;
  uint64_t max = hk_load_relaxed(&cg_max), high = hk_load_relaxed(&cg_high);
  if (max != UINT64_MAX || high != UINT64_MAX) {
    uint64_t used = hk_os_read_number(fd_current);
    if (used != UINT64_MAX) {
      if (max != UINT64_MAX && used + more + margin(max) > max) ok = false;
      if (high != UINT64_MAX && used + more > high) soft = true;
    }
  }
  if (soft || !ok) hk_store_relaxed(&hk_limit_soft_crossed, true);
  if (!ok) hk_stat_add(limit_refusals, 1);
  return ok;
}

/* Transparent huge pages for a new mapping of `size` bytes, a region or a
 * large block (HAKMEM_THP): always, for what holds a huge page; never;
 * auto, for large blocks of 32 MiB and more, and for regions once hakmem
 * holds 1 GiB (a heap that size gains from fewer TLB misses more than it
 * loses to pages half used). Refused explicitly otherwise, so that a system
 * set to THP "always" adds no huge-page bloat to a small heap. 1: ask for
 * them (MADV_HUGEPAGE), -1: refuse them, 0: nothing to say. */
int hk_thp_advice(size_t size, bool region) {
  long mode = hk_opt.thp;
  bool want = mode == 2   ? size >= ((size_t)2 << 20)
              : mode == 0 ? false
              : region    ? hk_limit_held() >= ((uint64_t)1 << 30)
                          : size >= ((size_t)32 << 20);
  /* (advice the kernel's mode makes moot costs a system call for nothing) */
  if (thp_system == 0) return 0;
  if (want) return 1;
  return thp_system == 2 ? -1 : 0;
}

/* The limits in effect, for the statistics (0: none). */
void hk_limits_get(uint64_t *hard, uint64_t *soft) {
  uint64_t max = hk_load_relaxed(&cg_max), high = hk_load_relaxed(&cg_high);
  *hard = (uint64_t)hk_opt.memory_limit;
  *soft = (uint64_t)hk_opt.memory_soft_limit;
  if (max != UINT64_MAX && (*hard == 0 || max - margin(max) < *hard)) *hard = max > margin(max) ? max - margin(max) : 1;
  if (high != UINT64_MAX && (*soft == 0 || high < *soft)) *soft = high;
}
