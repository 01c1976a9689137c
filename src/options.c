/* Options: one table, read once at initialisation from HAKMEM_* environment
 * variables. docs/OPTIONS.md says what each default trades off.
 * `environ` is scanned by hand: this runs inside the first malloc.
 * Two things the environment cannot do: set options of a set-user-ID or
 * set-group-ID program (the kernel's AT_SECURE, which secure_getenv
 * heeds), whose environment its less privileged caller chose; and lower
 * HAKMEM_SECURE below the level the library was built with
 * (-DHAKMEM_SECURE_DEFAULT=ON), which would let anyone who can set a
 * variable turn a hardened build's checks off. */
#include "internal.h"

bool hk_free_checks; /* hk_init sets it in hardened mode, hk_profile_load with the profiler */
bool hk_secure;      /* HAKMEM_SECURE >= 1 (hk_init sets both from hk_opt.secure) */
bool hk_secure_zero; /* HAKMEM_SECURE == 2 */
bool hk_thread_stats; /* HAKMEM_THREAD_STATS (hk_init sets it) */

#include <errno.h>
#include <string.h>
#include <sys/auxv.h>

extern char **environ;

#ifndef HAKMEM_SECURE_DEFAULT
#define HAKMEM_SECURE_DEFAULT 0
#endif

hk_options hk_opt;

typedef struct option_desc {
  const char *name;   /* without the HAKMEM_ prefix */
  hk_option *value;
  long def, min, max;
  const char *doc;
  const char *const *words; /* names the values min.. may also be given by (NULL: numbers only) */
  bool live;          /* hak_option_set may change it while the program runs: every reader
                         reads it anew */
} option_desc;

static const char *const stats_words[] = {"off", "text", "json", NULL};
static const char *const thp_words[] = {"never", "auto", "always", NULL};

static option_desc options[] = {
  {"STATS", &hk_opt.stats, 0, 0, 2, "statistics at exit: 1 or text: counters and RSS; 2 or json: as JSON",
   stats_words, false},
  {"PURGE_DELAY_MS", &hk_opt.purge_delay_ms, 100, 0, 1000000,
   "how long a free slab stays committed before it is returned with MADV_DONTNEED", NULL, true},
  {"REGION_RESERVE", &hk_opt.region_reserve, 2, 0, 1024,
   "empty 4 MiB regions kept mapped (purged) per region list instead of unmapped", NULL, true},
  {"LARGE_CACHE_MB", &hk_opt.large_cache_mb, 64, 0, 1 << 20,
   "bytes of freed large blocks kept mapped for reuse", NULL, true},
  {"LARGE_CACHE_ENTRIES", &hk_opt.large_cache_max, 256, 0, 4096,
   "number of freed large blocks kept for reuse", NULL, true},
  {"VERBOSE", &hk_opt.verbose, 0, 0, 1, "print warnings (e.g. failed munmap) to stderr", NULL, false},
  {"SECURE", &hk_opt.secure, HAKMEM_SECURE_DEFAULT, 0, 2,
   "hardened mode: 1 guard pages, randomised order, canaries; 2 also zero-on-free", NULL, false},
  {"PURGE_THREAD", &hk_opt.purge_thread, 1, 0, 1,
   "background thread that purges after the delay even if the program makes no call", NULL, false},
  {"ARENA_MB", &hk_opt.arena_mb, 65536, 0, 65536,
   "address space reserved for small regions (regions beyond it take free()'s slow path)", NULL, false},
  {"PROFILE", &hk_opt.profile, 0, 0, 1, "the sampling heap profiler (docs/PROFILE.md)", NULL, false},
  {"PROFILE_RATE", &hk_opt.profile_rate, 524288, 1, 1L << 40, "bytes allocated per heap-profile sample, on average",
   NULL, false},
  {"PROFILE_SIGNAL", &hk_opt.profile_signal, 12, 0, 64, "signal that writes the heap profile (12: SIGUSR2; 0: none)",
   NULL, false},
  {"THP", &hk_opt.thp, 1, 0, 2,
   "transparent huge pages: never, auto (large blocks of 32 MiB and more, regions once 1 GiB is held), always",
   thp_words, true},
  {"MEMORY_LIMIT", &hk_opt.memory_limit, 0, 0, 1L << 60,
   "bytes hakmem may hold (regions, large mappings): beyond, malloc returns NULL (ENOMEM); 0: none", NULL, true},
  {"MEMORY_SOFT_LIMIT", &hk_opt.memory_soft_limit, 0, 0, 1L << 60,
   "crossing it gives back every free byte at once and calls hak_set_pressure_handler's handler; 0: none", NULL, true},
  {"TIMELINE_MS", &hk_opt.timeline_ms, 10, 1, 60000,
   "milliseconds between two lines of HAKMEM_TIMELINE_FILE", NULL, true},
  {"REGION_LISTS", &hk_opt.region_lists, 0, 0, HK_REGION_LISTS_MAX,
   "region lists of a lock each; 0: one per CPU the process may run on, 8 to 64", NULL, false},
  {"THREAD_STATS", &hk_opt.thread_stats, 0, 0, 1,
   "per-thread live bytes exact across cross-thread frees (hak_thread_stats): no thread cache of other threads' blocks",
   NULL, false},
};

static bool parse_long(const char *s, long *out) {
  long v = 0;
  bool neg = false;
  if (*s == '-') { neg = true; s++; }
  if (*s < '0' || *s > '9') return false;
  while (*s >= '0' && *s <= '9') {
    if (v > (1L << 50)) return false;
    v = v * 10 + (*s++ - '0');
  }
  /* sizes: K, M, G or T (powers of 1024) */
  static const char units[] = "KMGT";
  const char *u = *s != 0 && s[1] == 0 ? strchr(units, *s) : NULL;
  if (u != NULL) {
    for (long k = 0; k <= u - units; k++) {
      if (v > (1L << 52)) return false;
      v *= 1024;
    }
    s++;
  }
  if (*s != 0) return false;
  *out = neg ? -v : v;
  return true;
}

/* A word of o's, for its value. */
static bool parse_word(const option_desc *o, const char *s, long *out) {
  for (long i = 0; o->words != NULL && o->words[i] != NULL; i++)
    if (strcmp(o->words[i], s) == 0) {
      *out = o->min + i;
      return true;
    }
  return false;
}

/* Options whose value is text, kept in a buffer of their own (the
 * environment's strings may change under a running program). */
static char stats_file[1024], profile_file[1024], timeline_file[1024], cgroup_dir[1024];
typedef struct text_option_desc {
  const char *name;
  char *buf;
  size_t size;
  const char *doc;
} text_option_desc;
static const text_option_desc text_options[] = {
  {"STATS_FILE", stats_file, sizeof stats_file,
   "where HAKMEM_STATS writes (default stderr); %p: the pid; a second process's name gets .PID"},
  {"PROFILE_FILE", profile_file, sizeof profile_file,
   "where the heap profile goes (default hakmem.%p.heap, and .json beside it); %p: the pid"},
  {"CGROUP_DIR", cgroup_dir, sizeof cgroup_dir,
   "the cgroup whose memory limits apply (default: the process's own; none: no cgroup)"},
  {"TIMELINE_FILE", timeline_file, sizeof timeline_file,
   "a line every HAKMEM_TIMELINE_MS here: RSS, live and mapped bytes (docs/REPORT.md); %p: the pid"},
};

/* The environment's HAKMEM_* entries, found in one pass at start-up: each
 * option is then looked for among them, not in the whole environment (a
 * search of its few dozen entries for each of 30 options would be half of
 * hk_init's instructions). Past HAKMEM_ENV_MAX of them (no real
 * environment has so many), the whole environment is searched. */
#define HAKMEM_ENV_MAX 64
static const char *hakmem_env[HAKMEM_ENV_MAX];
static size_t hakmem_env_count; /* HAKMEM_ENV_MAX + 1: more than fit */

static bool is_hakmem_entry(const char *s) { return s[0] == 'H' && strncmp(s, "HAKMEM_", 7) == 0; }

static void env_collect(void) {
  hakmem_env_count = 0;
  if (environ == NULL) return;
  for (char **e = environ; *e != NULL; e++) {
    if (!is_hakmem_entry(*e)) continue;
    if (hakmem_env_count == HAKMEM_ENV_MAX) {
      hakmem_env_count = HAKMEM_ENV_MAX + 1;
      return;
    }
    hakmem_env[hakmem_env_count++] = *e;
  }
}

/* The i-th HAKMEM_* entry of the environment, or NULL past the last. */
static const char *env_entry(size_t i, char ***scan) {
  if (hakmem_env_count <= HAKMEM_ENV_MAX) return i < hakmem_env_count ? hakmem_env[i] : NULL;
  if (*scan == NULL) *scan = environ;
  while (**scan != NULL && !is_hakmem_entry(**scan)) (*scan)++;
  return **scan != NULL ? *(*scan)++ : NULL;
}

static const char *env_lookup(const char *name) {
  size_t n = strlen(name);
  char **scan = NULL;
  const char *s;
  for (size_t i = 0; (s = env_entry(i, &scan)) != NULL; i++)
    if (strncmp(s + 7, name, n) == 0 && s[7 + n] == '=') return s + 8 + n;
  return NULL;
}

/* HAKMEM_* variables that are not options: the hakmem program's. */
static const char *const not_options[] = {"LIB"};

static bool known_name(const char *name, size_t n) {
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
    if (strlen(options[i].name) == n && strncmp(options[i].name, name, n) == 0) return true;
  for (size_t i = 0; i < sizeof text_options / sizeof text_options[0]; i++)
    if (strlen(text_options[i].name) == n && strncmp(text_options[i].name, name, n) == 0) return true;
  for (size_t i = 0; i < sizeof not_options / sizeof not_options[0]; i++)
    if (strlen(not_options[i]) == n && strncmp(not_options[i], name, n) == 0) return true;
  return false;
}

/* A misspelt option would otherwise be ignored without a word. */
static void warn_unknown(void) {
  char **scan = NULL;
  const char *s;
  for (size_t i = 0; (s = env_entry(i, &scan)) != NULL; i++) {
    const char *eq = strchr(s, '=');
    size_t n = eq ? (size_t)(eq - s) - 7 : strlen(s) - 7;
    if (known_name(s + 7, n)) continue;
    static const char msg[] = "hakmem: warning: unknown option HAKMEM_";
    static const char tail[] = " ignored (docs/OPTIONS.md lists the options)\n";
    hk_os_write_stderr(msg, sizeof msg - 1);
    hk_os_write_stderr(s + 7, n);
    hk_os_write_stderr(tail, sizeof tail - 1);
  }
}

/* The value of HAKMEM_SECURE is below the build's level: kept, and said. */
static void warn_secure_floor(void) {
  static const char msg[] = "hakmem: warning: HAKMEM_SECURE below this build's hardened default ignored "
                            "(built with -DHAKMEM_SECURE_DEFAULT=ON)\n";
  hk_os_write_stderr(msg, sizeof msg - 1);
}

void hk_options_init(void) {
  bool trusted = getauxval(AT_SECURE) == 0;
  if (trusted) env_collect();
  if (trusted) warn_unknown();
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
    option_desc *o = &options[i];
    *o->value = o->def;
    const char *s = trusted ? env_lookup(o->name) : NULL;
    long v;
    if (s == NULL) continue;
    if (parse_long(s, &v) && o->value == &hk_opt.secure && v >= o->min && v < HAKMEM_SECURE_DEFAULT) {
      warn_secure_floor();
    } else if ((parse_long(s, &v) || parse_word(o, s, &v)) && v >= o->min && v <= o->max) {
      *o->value = v;
    } else {
      static const char msg[] = "hakmem: warning: ignoring invalid value of HAKMEM_";
      hk_os_write_stderr(msg, sizeof msg - 1);
      hk_os_write_stderr(o->name, strlen(o->name));
      hk_os_write_stderr("\n", 1);
    }
  }
  for (size_t i = 0; i < sizeof text_options / sizeof text_options[0]; i++) {
    const text_option_desc *o = &text_options[i];
    const char *s = trusted ? env_lookup(o->name) : NULL;
    o->buf[0] = 0;
    if (s == NULL || *s == 0) continue;
    size_t n = strlen(s);
    if (n >= o->size) {
      static const char msg[] = "hakmem: warning: ignoring HAKMEM_";
      static const char tail[] = " (too long)\n";
      hk_os_write_stderr(msg, sizeof msg - 1);
      hk_os_write_stderr(o->name, strlen(o->name));
      hk_os_write_stderr(tail, sizeof tail - 1);
      continue;
    }
    memcpy(o->buf, s, n + 1);
  }
  hk_opt.stats_file = stats_file[0] ? stats_file : NULL;
  hk_opt.profile_file = profile_file[0] ? profile_file : "hakmem.%p.heap";
  hk_opt.timeline_file = timeline_file[0] ? timeline_file : NULL;
  hk_opt.cgroup_dir = cgroup_dir[0] ? cgroup_dir : NULL;
  hk_verbose = hk_opt.verbose != 0;
}

/* The option named `name` (with or without HAKMEM_), or NULL. */
static option_desc *find_option(const char *name) {
  if (strncmp(name, "HAKMEM_", 7) == 0) name += 7;
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
    if (strcmp(options[i].name, name) == 0) return &options[i];
  return NULL;
}

/* hak_option_get: 0, or ENOENT (no such numeric option). */
int hk_option_get(const char *name, long *value) {
  const option_desc *o = name != NULL ? find_option(name) : NULL;
  if (o == NULL) return ENOENT;
  *value = *o->value;
  return 0;
}

/* hak_option_set: 0, or ENOENT, EPERM (fixed once hakmem runs: its
 * structures are sized or chosen by it), EINVAL (out of its range). */
int hk_option_set(const char *name, long value) {
  option_desc *o = name != NULL ? find_option(name) : NULL;
  if (o == NULL) return ENOENT;
  if (!o->live) return EPERM;
  if (value < o->min || value > o->max) return EINVAL;
  *o->value = value;
  return 0;
}

void hk_options_print(int fd) {
  char line[1200];
  for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
    size_t n = 0, len = strlen(options[i].name);
    memcpy(line + n, "  HAKMEM_", 9); n += 9;
    memcpy(line + n, options[i].name, len); n += len;
    line[n++] = '=';
    long v = *options[i].value;
    if (v < 0) { line[n++] = '-'; v = -v; }
    n += hk_fmt_dec(line + n, (uint64_t)v);
    line[n++] = '\n';
    hk_os_write(fd, line, n);
  }
  for (size_t i = 0; i < sizeof text_options / sizeof text_options[0]; i++) {
    const text_option_desc *o = &text_options[i];
    if (o->buf[0] == 0) continue;
    size_t n = 0, len = strlen(o->name), vlen = strlen(o->buf);
    memcpy(line + n, "  HAKMEM_", 9); n += 9;
    memcpy(line + n, o->name, len); n += len;
    line[n++] = '=';
    memcpy(line + n, o->buf, vlen); n += vlen;
    line[n++] = '\n';
    hk_os_write(fd, line, n);
  }
}
