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
 * HAKMEM_CGROUP_DIR names; it is looked for, and its limits read, once
 * hakmem holds more than CG_UNCHECKED, and its limits again at most once a
 * second, so a limit changed while the program runs applies. */
#include "internal.h"

#include <string.h>

static char cg_dir[1100];             /* the cgroup's directory (empty: none) */
static bool cg_v2;                    /* its files have cgroup v2's names, else v1's */
static _Atomic uint64_t cg_max = UINT64_MAX, cg_high = UINT64_MAX; /* UINT64_MAX: no limit */
static _Atomic uint64_t cg_read_ms;   /* when they were last read */
static bool cgroup_on;                /* a cgroup was found */
static _Atomic int thp_system = -1;   /* the kernel's THP mode: 0 never, 1 madvise, 2 always; -1: not read yet */
_Atomic bool hk_limit_soft_crossed;   /* a soft limit was crossed: the slow path gives back (thread.c) */

/* What hakmem holds: its regions and large mappings. */
uint64_t hk_limit_held(void) {
  return hk_load_relaxed(&hk_stats.regions_live) * HK_REGION_SIZE + hk_load_relaxed(&hk_stats.large_mapped_bytes);
}

static uint64_t margin(uint64_t max) {
  uint64_t m = max / 16;
  return m < (4u << 20) ? 4u << 20 : m > (256u << 20) ? 256u << 20 : m;
}

/* The cgroup's files are opened for each read, and closed: a descriptor
 * held open could be closed by the program (a daemon closing every one it
 * inherited) and its number reused for a file of the program's, which
 * hakmem would then read as its limit; and it would take a number the
 * program may expect free (a shell's `exec 3<file`). Reading one costs
 * three system calls, made where hakmem maps more, never on a fast path. */
#define CG_MAX 0     /* v2 memory.max, v1 memory.limit_in_bytes */
#define CG_HIGH 1    /* v2 memory.high, v1 memory.soft_limit_in_bytes */
#define CG_CURRENT 2 /* v2 memory.current, v1 memory.usage_in_bytes */
static const char *const CG_NAMES[2][3] = {
    {"memory.limit_in_bytes", "memory.soft_limit_in_bytes", "memory.usage_in_bytes"},
    {"memory.max", "memory.high", "memory.current"},
};
#define CG_NAME_MAX 28 /* the longest name, its '/' and its NUL */

/* dir's file (CG_*) under its name in v2 or v1 into buf (-1: not
 * readable). */
static long cg_file(const char *dir, bool v2, int file, char buf[32]) {
  char path[sizeof cg_dir + CG_NAME_MAX];
  size_t n = strlen(dir);
  memcpy(path, dir, n);
  path[n] = '/';
  strcpy(path + n + 1, CG_NAMES[v2][file]);
  return hk_os_read_file(path, buf, 32);
}

/* The number a cgroup file holds: UINT64_MAX for "max", for a value of
 * 2^58 or more (v1's "no limit" is about 2^63), and when unreadable. */
static uint64_t cg_number(long n, const char *buf) {
  if (n <= 0 || buf[0] < '0' || buf[0] > '9') return UINT64_MAX;
  uint64_t v = 0;
  for (const char *s = buf; *s >= '0' && *s <= '9'; s++) {
    if (v >= (uint64_t)1 << 58) return UINT64_MAX;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  return v;
}
static uint64_t cg_read(int file) {
  char buf[32];
  return cg_number(cg_file(cg_dir, cg_v2, file, buf), buf);
}

/* Is dir a cgroup with memory files: v2's (version 2), v1's (1), or v2's
 * if dir has them, else v1's (0: a directory HAKMEM_CGROUP_DIR names)?
 * If so, it becomes the one hakmem reads (cg_dir), and its hard limit is
 * read. A known version tries no name of the other: each try costs some
 * microseconds of every process's start. */
static bool use_cgroup(const char *dir, int version) {
  if (strlen(dir) >= sizeof cg_dir) return false;
  for (int v2 = version != 1; v2 >= (version == 2); v2--) {
    char buf[32];
    long n = cg_file(dir, v2, CG_MAX, buf);
    if (n >= 0) {
      strcpy(cg_dir, dir);
      cg_v2 = v2;
      hk_store_relaxed(&cg_max, cg_number(n, buf));
      return true;
    }
  }
  return false;
}

/* root followed by the path in [path, end): the cgroup's directory. */
static bool cgroup_at(const char *root, const char *path, const char *end, int version) {
  char dir[1100];
  size_t rn = strlen(root), pn = (size_t)(end - path);
  if (rn + pn + 1 > sizeof dir) return false;
  memcpy(dir, root, rn);
  memcpy(dir + rn, path, pn);
  dir[rn + pn] = 0;
  return use_cgroup(dir, version);
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
          cgroup_at(v1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup", c2 + 1, end, v1 ? 1 : 2))
        return true;
      line = *end ? end + 1 : end;
    }
  }
  return false;
}

static void read_cgroup(uint64_t now) {
  hk_store_relaxed(&cg_max, cg_read(CG_MAX));
  hk_store_relaxed(&cg_high, cg_read(CG_HIGH));
  hk_store_relaxed(&cg_read_ms, now);
}

/* The cgroup is looked for when hakmem first holds more than this: a
 * process that stays smaller (most short-lived ones: a shell's commands, a
 * compiler's passes) reads no cgroup file, which would cost tens of
 * microseconds of its start, and a heap this small is not what a memory
 * limit is there to stop. */
#define CG_UNCHECKED ((uint64_t)8 << 20)

/* 0: the cgroup not looked for yet; 1: being looked for (by one thread:
 * another one's check meanwhile goes without it); 2: looked for, and
 * cgroup_on says whether one was found. */
static _Atomic int cg_looked;

static bool cgroup_found(void) {
  int state = hk_load_acquire(&cg_looked);
  if (HK_LIKELY(state == 2)) return cgroup_on;
  if (state != 0 || !atomic_compare_exchange_strong(&cg_looked, &state, 1)) return false;
  const char *dir = hk_opt.cgroup_dir;
  bool cgroup = dir == NULL ? find_cgroup() : strcmp(dir, "none") != 0 && use_cgroup(dir, 0);
  if (cgroup) { /* (use_cgroup read the hard limit) */
    hk_store_relaxed(&cg_high, cg_read(CG_HIGH));
    hk_store_relaxed(&cg_read_ms, hk_os_now_ms());
  }
  cgroup_on = cgroup;
  hk_store_release(&cg_looked, 2);
  return cgroup;
}

/* In a child of fork(): a look that another thread of the parent had
 * begun is begun again. */
void hk_limits_fork_child(void) {
  if (hk_load_relaxed(&cg_looked) == 1) hk_store_relaxed(&cg_looked, 0);
}

/* May hakmem map `more` bytes? False when a hard limit would be crossed;
 * a soft one crossed is noted for the slow path. */
bool hk_limit_allows(size_t more) {
  uint64_t held = hk_limit_held();
  bool cgroup = held + more > CG_UNCHECKED && cgroup_found();
  /* (the options are read each time: hak_option_set may set them) */
  if (!cgroup && hk_opt.memory_limit == 0 && hk_opt.memory_soft_limit == 0) return true;
  uint64_t now = hk_os_now_ms(), last = hk_load_relaxed(&cg_read_ms);
  if (cgroup && now >= last + 1000 && atomic_compare_exchange_strong(&cg_read_ms, &last, now))
    read_cgroup(now);
  bool ok = true, soft = false;
  if (hk_opt.memory_limit != 0 && held + more > (uint64_t)hk_opt.memory_limit) ok = false;
  if (hk_opt.memory_soft_limit != 0 && held + more > (uint64_t)hk_opt.memory_soft_limit) soft = true;
  uint64_t max = hk_load_relaxed(&cg_max), high = hk_load_relaxed(&cg_high);
  if (cgroup && (max != UINT64_MAX || high != UINT64_MAX)) {
    uint64_t used = cg_read(CG_CURRENT);
    if (used != UINT64_MAX) {
      if (max != UINT64_MAX && used + more + margin(max) > max) ok = false;
      if (high != UINT64_MAX && used + more > high) soft = true;
    }
  }
  if (soft || !ok) hk_store_relaxed(&hk_limit_soft_crossed, true);
  if (!ok) hk_stat_add(limit_refusals, 1);
  return ok;
}

/* auto's test for a new region: hakmem holds 1 GiB, and the process's
 * resident memory is three quarters of that at least. A heap that size,
 * its pages used, gains from fewer TLB misses more than it loses to the
 * parts of its spans it leaves untouched, which a huge page makes
 * resident: a third more RSS at most. A heap of big blocks each written
 * only near its start (buffers sized for the largest message, say), or of
 * 64 KiB blocks, each in a span of two slabs whose second holds only its
 * colour's bytes (sizeclass.c), would take a huge page, 2 MiB to clear,
 * where it uses a fraction: up to twice the RSS, and the time to clear it. */
static bool region_thp_auto(void) {
  uint64_t held = hk_limit_held();
  return held >= ((uint64_t)1 << 30) && (uint64_t)hk_os_current_rss_kb() << 10 >= held / 4 * 3;
}

/* Transparent huge pages for a new mapping of `size` bytes, a region or a
 * large block (HAKMEM_THP): always, for what holds a huge page; never;
 * auto, for large blocks of 32 MiB and more, and for regions once hakmem
 * holds 1 GiB, three quarters of it resident (region_thp_auto). Refused explicitly
 * otherwise, so that a system set to THP "always" adds no huge-page bloat
 * to a small heap. 1: ask for them (MADV_HUGEPAGE), -1: refuse them, 0:
 * nothing to say. */
int hk_thp_advice(size_t size, bool region) {
  int system = hk_load_relaxed(&thp_system);
  if (HK_UNLIKELY(system < 0)) { /* (read at the first mapping, not at every process's start) */
    char thp[128];
    system = 0;
    if (hk_os_read_file("/sys/kernel/mm/transparent_hugepage/enabled", thp, sizeof thp) > 0)
      system = strstr(thp, "[always]") ? 2 : strstr(thp, "[madvise]") ? 1 : 0;
    hk_store_relaxed(&thp_system, system);
  }
  long mode = hk_opt.thp;
  bool want = mode == 2   ? size >= ((size_t)2 << 20)
              : mode == 0 ? false
              : region    ? region_thp_auto()
                          : size >= ((size_t)32 << 20);
  /* (advice the kernel's mode makes moot costs a system call for nothing) */
  if (system == 0) return 0;
  if (want) return 1;
  return system == 2 ? -1 : 0;
}

/* The limits in effect, for the statistics (0: none). */
void hk_limits_get(uint64_t *hard, uint64_t *soft) {
  cgroup_found();
  uint64_t max = hk_load_relaxed(&cg_max), high = hk_load_relaxed(&cg_high);
  *hard = (uint64_t)hk_opt.memory_limit;
  *soft = (uint64_t)hk_opt.memory_soft_limit;
  if (max != UINT64_MAX && (*hard == 0 || max - margin(max) < *hard)) *hard = max > margin(max) ? max - margin(max) : 1;
  if (high != UINT64_MAX && (*soft == 0 || high < *soft)) *soft = high;
}
