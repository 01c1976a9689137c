/* hakmem: command-line front end.
 *
 *   hakmem run [--stats] [--] PROGRAM [ARGS...]   run PROGRAM with libhakmem.so preloaded
 *   hakmem bench [--quick] [--sweep] [--only NAME] [--with NAME=PATH] [run.py options]
 *   hakmem report [-o FILE] [hakmem_report.py options] -- PROGRAM [ARGS...]
 *   hakmem --version | --help
 *
 * Where things are looked up:
 *  - run from the build tree (build/programs/hakmem): build/libhakmem.so,
 *    the source tree's bench/run.py, programs/hakmem_report.py and build/bench/;
 *  - installed (PREFIX/bin/hakmem): PREFIX/LIBDIR/libhakmem.so,
 *    PREFIX/share/hakmem/{run,report}.py and PREFIX/libexec/hakmem/ (found relative to
 *    the executable, so an installed tree can be moved), then the configured
 *    install paths;
 *  - HAKMEM_LIB=/path/to/libhakmem.so overrides the library. */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Set by programs/CMakeLists.txt (the version: the project's, from the
 * top CMakeLists.txt); the defaults only matter for a hand build. */
#ifndef HAKMEM_VERSION_STRING
#define HAKMEM_VERSION_STRING "unknown"
#endif
#ifndef HAKMEM_BUILD_DIR
#define HAKMEM_BUILD_DIR ""
#endif
#ifndef HAKMEM_SOURCE_DIR
#define HAKMEM_SOURCE_DIR ""
#endif
#ifndef HAKMEM_INSTALL_LIBDIR /* relative to the prefix */
#define HAKMEM_INSTALL_LIBDIR "lib"
#endif
#ifndef HAKMEM_INSTALL_PREFIX
#define HAKMEM_INSTALL_PREFIX "/usr/local"
#endif

static const char usage[] =
    "usage: hakmem run [--stats[=json]] [--stats-file PATH] [--] PROGRAM [ARGS...]\n"
    "       hakmem bench [--quick] [--sweep] [--only NAME] [--with NAME=PATH] [--repeats N] [--out DIR]\n"
    "                    [--callgrind]\n"
    "       hakmem report [-o FILE] [--rate BYTES] [--interval MS] [--keep DIR] -- PROGRAM [ARGS...]\n"
    "       hakmem report --from PROFILE.json [--timeline FILE] [-o FILE]\n"
    "       hakmem --version | --help\n"
    "\n"
    "  run      run PROGRAM with the hakmem allocator preloaded (LD_PRELOAD)\n"
    "           --stats  print hakmem's counters to stderr when PROGRAM exits (HAKMEM_STATS=1);\n"
    "                    =json: as JSON (HAKMEM_STATS=json); each process names itself\n"
    "           --stats-file PATH  write them to PATH instead (HAKMEM_STATS_FILE; the processes\n"
    "                    PROGRAM starts write to PATH.PID)\n"
    "  bench    compare hakmem with glibc, mimalloc, jemalloc and tcmalloc on the benchmark\n"
    "           suite; --sweep: on the workload sweep (generated configurations); options are\n"
    "           passed to the runner (run.py --help lists them all)\n"
    "  report   run PROGRAM with the heap profiler and a timeline of its memory, and write one\n"
    "           HTML page (default hakmem-report.html; docs/REPORT.md); --from: the page of a\n"
    "           profile a running program wrote (hak_profile_dump, SIGUSR2)\n"
    "\n"
    "environment:\n"
    "  HAKMEM_LIB   path of libhakmem.so to use instead of the one found next to hakmem\n"
    "  HAKMEM_*     allocator options, see docs/OPTIONS.md\n";

#ifndef HAKMEM_INSTALL_LIBEXECDIR
#define HAKMEM_INSTALL_LIBEXECDIR "libexec"
#endif
#ifndef HAKMEM_INSTALL_DATADIR
#define HAKMEM_INSTALL_DATADIR "share"
#endif

#define PBUF (PATH_MAX + 256) /* a directory plus a relative path */
static char exe_dir[PATH_MAX]; /* directory holding this executable */

static int is_file(const char *p) { return access(p, R_OK) == 0; }

/* 1 if this executable is build/programs/hakmem of the configured build tree */
static int in_build_tree(void) {
  char want[PATH_MAX], real[PATH_MAX];
  if (!HAKMEM_BUILD_DIR[0]) return 0;
  snprintf(want, sizeof want, "%s/programs", HAKMEM_BUILD_DIR);
  return realpath(want, real) && strcmp(real, exe_dir) == 0;
}

/* Writes the first existing path of candidates (printf-style, NULL-ended
 * list of formats taking one %s) into out; returns 0 if none exists and
 * lists what was tried in tried. */
static int find_first(char *out, size_t outsz, char *tried, size_t triedsz, const char *const *paths) {
  tried[0] = 0;
  for (; *paths; paths++) {
    if (is_file(*paths)) {
      if (!realpath(*paths, out)) snprintf(out, outsz, "%s", *paths);
      return 1;
    }
    size_t len = strlen(tried);
    snprintf(tried + len, triedsz - len, "%s%s", len ? ", " : "", *paths);
  }
  return 0;
}

static const char *find_lib(void) {
  static char lib[PATH_MAX];
  static char c[3][PBUF];
  char tried[3 * PBUF + 16];
  const char *env = getenv("HAKMEM_LIB");
  if (env && *env) {
    if (!is_file(env)) {
      fprintf(stderr, "hakmem: HAKMEM_LIB=%s: %s\n", env, strerror(errno));
      exit(1);
    }
    if (!realpath(env, lib)) snprintf(lib, sizeof lib, "%s", env);
    return lib;
  }
  int n = 0;
  if (in_build_tree()) snprintf(c[n++], PBUF, "%s/libhakmem.so", HAKMEM_BUILD_DIR);
  snprintf(c[n++], PBUF, "%s/../%s/libhakmem.so", exe_dir, HAKMEM_INSTALL_LIBDIR);
  snprintf(c[n++], PBUF, "%s/%s/libhakmem.so", HAKMEM_INSTALL_PREFIX, HAKMEM_INSTALL_LIBDIR);
  const char *list[4] = {c[0], c[1], c[2], NULL};
  list[n] = NULL;
  if (find_first(lib, sizeof lib, tried, sizeof tried, list)) return lib;
  fprintf(stderr,
          "hakmem: cannot find libhakmem.so (looked for %s); build it with 'make' "
          "or set HAKMEM_LIB=/path/to/libhakmem.so\n",
          tried);
  exit(1);
}

static int cmd_run(int argc, char **argv) {
  int i = 0;
  const char *stats = NULL, *stats_file = NULL;
  for (; i < argc; i++) {
    if (strcmp(argv[i], "--") == 0) {
      i++;
      break;
    } else if (strcmp(argv[i], "--stats") == 0) {
      stats = "1";
    } else if (strcmp(argv[i], "--stats=json") == 0) {
      stats = "json";
    } else if (strcmp(argv[i], "--stats-file") == 0 && i + 1 < argc) {
      stats_file = argv[++i];
      if (stats == NULL) stats = "1";
    } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage, stdout);
      return 0;
    } else if (argv[i][0] == '-') {
      fprintf(stderr, "hakmem: run: unknown option '%s'\n%s", argv[i], usage);
      return 2;
    } else {
      break;
    }
  }
  if (i >= argc) {
    fprintf(stderr, "hakmem: run: no program given\n%s", usage);
    return 2;
  }
  const char *lib = find_lib();
  /* hakmem goes first; a preload the caller already had is kept after it */
  const char *old = getenv("LD_PRELOAD");
  char *preload;
  if (old && *old) {
    if (asprintf(&preload, "%s:%s", lib, old) < 0) return 1;
  } else {
    preload = (char *)lib;
  }
  setenv("LD_PRELOAD", preload, 1);
  if (stats) setenv("HAKMEM_STATS", stats, 1);
  if (stats_file) setenv("HAKMEM_STATS_FILE", stats_file, 1);
  execvp(argv[i], argv + i);
  int err = errno;
  fprintf(stderr, "hakmem: cannot run '%s': %s\n", argv[i], strerror(err));
  return err == ENOENT ? 127 : 126;
}

/* A script of ours: SOURCE_PATH in the build tree's sources, else
 * share/hakmem/NAME installed. */
static int find_script(char *out, size_t outsz, const char *source_path, const char *name, const char *what) {
  char tried[3 * PBUF + 16];
  static char c[3][PBUF];
  int n = 0;
  if (in_build_tree()) snprintf(c[n++], PBUF, "%s/%s", HAKMEM_SOURCE_DIR, source_path);
  snprintf(c[n++], PBUF, "%s/../%s/hakmem/%s", exe_dir, HAKMEM_INSTALL_DATADIR, name);
  snprintf(c[n++], PBUF, "%s/%s/hakmem/%s", HAKMEM_INSTALL_PREFIX, HAKMEM_INSTALL_DATADIR, name);
  const char *list[4] = {c[0], c[1], c[2], NULL};
  list[n] = NULL;
  if (find_first(out, outsz, tried, sizeof tried, list)) return 1;
  fprintf(stderr, "hakmem: cannot find %s (looked for %s)\n", what, tried);
  return 0;
}

/* Debian's python3 has python3-matplotlib; prefer it over one earlier in PATH */
static const char *python(void) { return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3"; }

static int cmd_report(int argc, char **argv) {
  char script[PATH_MAX];
  if (!find_script(script, sizeof script, "programs/hakmem_report.py", "hakmem_report.py", "the report generator")) return 1;
  int wants_lib = 1;
  for (int i = 0; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--from") == 0 || strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) wants_lib = 0;
  char **args = calloc((size_t)argc + 6, sizeof *args);
  if (!args) return 1;
  int k = 0;
  args[k++] = (char *)python();
  args[k++] = script;
  if (wants_lib) {
    args[k++] = "--hakmem";
    args[k++] = (char *)find_lib();
  }
  for (int i = 0; i < argc; i++) args[k++] = argv[i];
  args[k] = NULL;
  execvp(args[0], args);
  fprintf(stderr, "hakmem: cannot run '%s': %s\n", args[0], strerror(errno));
  return 127;
}

static int cmd_bench(int argc, char **argv) {
  char runner[PATH_MAX], bindir[PBUF];
  if (!find_script(runner, sizeof runner, "bench/run.py", "run.py", "the benchmark runner")) return 1;
  if (in_build_tree()) snprintf(bindir, sizeof bindir, "%s/bench", HAKMEM_BUILD_DIR);
  else if (snprintf(bindir, sizeof bindir, "%s/../%s/hakmem", exe_dir, HAKMEM_INSTALL_LIBEXECDIR),
           access(bindir, X_OK) != 0)
    snprintf(bindir, sizeof bindir, "%s/%s/hakmem", HAKMEM_INSTALL_PREFIX, HAKMEM_INSTALL_LIBEXECDIR);
  const char *lib = find_lib();

  char **args = calloc((size_t)argc + 8, sizeof *args);
  if (!args) return 1;
  int k = 0;
  args[k++] = (char *)python();
  args[k++] = runner;
  args[k++] = "--bin-dir";
  args[k++] = bindir;
  args[k++] = "--hakmem";
  args[k++] = (char *)lib;
  for (int i = 0; i < argc; i++) args[k++] = argv[i];
  args[k] = NULL;
  execvp(args[0], args);
  fprintf(stderr, "hakmem: cannot run '%s': %s\n", args[0], strerror(errno));
  return 127;
}

int main(int argc, char **argv) {
  char self[PATH_MAX];
  ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) {
    self[len] = 0;
    char *slash = strrchr(self, '/');
    if (slash) *slash = 0;
    snprintf(exe_dir, sizeof exe_dir, "%s", self);
  }
  if (argc < 2) {
    fputs(usage, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--version") == 0 || strcmp(cmd, "-V") == 0 || strcmp(cmd, "version") == 0) {
    puts("hakmem " HAKMEM_VERSION_STRING);
    return 0;
  }
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(usage, stdout);
    return 0;
  }
  if (strcmp(cmd, "run") == 0) return cmd_run(argc - 2, argv + 2);
  if (strcmp(cmd, "bench") == 0) return cmd_bench(argc - 2, argv + 2);
  if (strcmp(cmd, "report") == 0) return cmd_report(argc - 2, argv + 2);
  fprintf(stderr, "hakmem: unknown command '%s'\n%s", cmd, usage);
  return 2;
}
