/* Memory limits (docs/OPTIONS.md): tests/limits_check.sh runs each mode
 * with the environment it needs.
 *   test_limits hard    HAKMEM_MEMORY_LIMIT=64M: blocks of 256 KiB and of
 *                       8 MiB run into NULL with ENOMEM within the limit;
 *                       freed, the memory serves again; a realloc past the
 *                       limit fails and keeps the block
 *   test_limits soft    HAKMEM_MEMORY_SOFT_LIMIT=16M: the handler runs,
 *                       and allocations go on
 *   test_limits cgroup  HAKMEM_CGROUP_DIR names a directory of cgroup v2
 *                       files this test writes: memory.max less the margin
 *                       against memory.current refuses, memory.high calls
 *                       the handler, a lowered memory.max applies within a
 *                       second
 *   test_limits small   HAKMEM_CGROUP_DIR as for cgroup, its usage above
 *                       memory.max less the margin: small blocks are
 *                       served (a heap of 8 MiB or less is not checked
 *                       against the cgroup, whose files it never reads),
 *                       a 32 MiB block is refused
 *   test_limits descriptors   HAKMEM_CGROUP_DIR as for cgroup: hakmem
 *                       holds none of its files open; the program's own
 *                       files at the lowest free descriptors, holding a
 *                       small number, change no limit (a descriptor
 *                       hakmem held, closed and reused by the program,
 *                       would be read as the cgroup's)
 *   test_limits fill    blocks of 1 MiB, written, until malloc returns NULL
 *                       (in a real cgroup: NULL comes before the OOM killer)
 *   test_limits thp     a 64 MiB block, written: prints its process's
 *                       AnonHugePages (HAKMEM_THP decides: limits_check.sh)
 *   test_limits thp_sparse | thp_dense | thp_half
 *                       1.25 GiB in blocks of 512 KiB (a region's
 *                       class), each written at its first byte only, or
 *                       whole, or in blocks of 64 KiB written whole (each
 *                       in a span of two slabs, the second holding its
 *                       colour's bytes only): prints AnonHugePages
 *                       (HAKMEM_THP=auto gives the regions huge pages once
 *                       hakmem holds 1 GiB, three quarters of it resident:
 *                       the dense heap only)
 *   test_limits         without a limit, 256 MiB in blocks of 8 MiB */
#include "api.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <unistd.h>

enum { MAX_BLOCKS = 4096 };
static void *blocks[MAX_BLOCKS];

/* Blocks of `size` until NULL (or `max` of them); their count. */
static int fill(size_t size, int max, bool touch) {
  int n = 0;
  for (; n < max; n++) {
    errno = 0;
    blocks[n] = malloc(size);
    if (blocks[n] == NULL) {
      CHECK(errno == ENOMEM, "malloc(%zu) returned NULL with errno %d, not ENOMEM", size, errno);
      break;
    }
    if (touch) memset(blocks[n], 0x5a, size);
  }
  return n;
}

static void free_all(int n) {
  for (int i = 0; i < n; i++) free(blocks[i]);
}

static unsigned handler_calls;
static void on_pressure(void *arg) {
  CHECK(arg == &handler_calls, "the handler's argument");
  handler_calls++;
  void *p = malloc(100); /* (it may allocate) */
  free(p);
}

/* A cgroup file's value, written without allocating (while the simulated
 * usage is high, hakmem refuses this process's new mappings too). */
static void put(const char *dir, const char *name, unsigned long long v) {
  char path[4096], text[32];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int n = snprintf(text, sizeof text, "%llu\n", v);
  int fd = open(path, O_WRONLY | O_TRUNC);
  CHECK(fd >= 0 && write(fd, text, (size_t)n) == n, "cannot write %s: %s", path, strerror(errno));
  close(fd);
}

/* a figure of /proc/self/smaps_rollup, in KiB */
static unsigned long smaps_kb(const char *name) {
  FILE *f = fopen("/proc/self/smaps_rollup", "r");
  CHECK(f != NULL, "/proc/self/smaps_rollup: %s", strerror(errno));
  char line[256];
  unsigned long kb = 0;
  size_t n = strlen(name);
  while (fgets(line, sizeof line, f) != NULL)
    if (strncmp(line, name, n) == 0) kb = strtoul(line + n, NULL, 10);
  fclose(f);
  return kb;
}

/* Is descriptor fd open on a file under dir? */
static bool fd_in(int fd, const char *dir) {
  char link[64], target[4096];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, target, sizeof target - 1);
  if (n < 0) return false;
  target[n] = 0;
  return strncmp(target, dir, strlen(dir)) == 0;
}

int main(int argc, char **argv) {
  const char *mode = argc > 1 ? argv[1] : "";
  const size_t MiB = (size_t)1 << 20;
  if (strcmp(mode, "hard") == 0) {
    int n = fill(256 << 10, MAX_BLOCKS, true);
    printf("test_limits: hard: %d blocks of 256 KiB (%zu MiB) before NULL\n", n, (size_t)n / 4);
    CHECK(n < MAX_BLOCKS && (size_t)n * (256 << 10) >= 32 * MiB && (size_t)n * (256 << 10) <= 64 * MiB,
          "256 KiB blocks: %d within a limit of 64 MiB", n);
    free_all(n);
    n = fill(8 * MiB, MAX_BLOCKS, true);
    printf("test_limits: hard: then %d blocks of 8 MiB\n", n);
    CHECK(n >= 5 && n <= 8, "8 MiB blocks after freeing: %d within 64 MiB", n);
    free_all(n);
    char *p = malloc(16 * MiB);
    CHECK(p != NULL, "16 MiB within the limit");
    memset(p, 0x3c, 16 * MiB);
    errno = 0;
    char *q = realloc(p, 128 * MiB);
    CHECK(q == NULL && errno == ENOMEM, "realloc past the limit: %p, errno %d", (void *)q, errno);
    CHECK(p[0] == 0x3c && p[16 * MiB - 1] == 0x3c, "the block a failed realloc keeps");
    free(p);
    CHECK(fill(256 << 10, 64, true) == 64, "small blocks again after the large ones");
    printf("test_limits: hard: OK\n");
    return 0;
  }
  if (strcmp(mode, "soft") == 0) {
    hak_set_pressure_handler(on_pressure, &handler_calls);
    int n = fill(256 << 10, 256, true); /* 64 MiB */
    printf("test_limits: soft: %d blocks of 256 KiB, the handler called %u times\n", n, handler_calls);
    CHECK(n == 256, "a soft limit refuses nothing (%d blocks)", n);
    CHECK(handler_calls >= 1, "the handler was not called");
    free_all(n);
    printf("test_limits: soft: OK\n");
    return 0;
  }
  if (strcmp(mode, "cgroup") == 0) {
    const char *dir = getenv("HAKMEM_CGROUP_DIR");
    CHECK(dir != NULL, "HAKMEM_CGROUP_DIR");
    hak_set_pressure_handler(on_pressure, &handler_calls);
    /* max 1 GiB, 970 MiB used: a region (4 MiB) and the margin (64 MiB) do not fit */
    put(dir, "memory.current", 970 * MiB);
    errno = 0;
    void *big = malloc(32 * MiB);
    CHECK(big == NULL && errno == ENOMEM, "memory.max: 32 MiB with 970 MiB of 1 GiB used: %p", big);
    put(dir, "memory.current", 100 * MiB);
    big = malloc(32 * MiB);
    CHECK(big != NULL, "memory.max: 32 MiB with 100 MiB of 1 GiB used");
    free(big);
    /* memory.high 200 MiB, 300 MiB used: the handler (64 MiB: more than
     * the large-block cache holds, so that hakmem maps) */
    unsigned before = handler_calls;
    put(dir, "memory.current", 300 * MiB);
    usleep(150 * 1000); /* (the handler runs at most every 100 ms) */
    big = malloc(64 * MiB);
    CHECK(big != NULL && handler_calls > before, "memory.high: the handler (%u calls)", handler_calls);
    free(big);
    /* memory.max lowered to 256 MiB while running: applies within a second
     * (220 MiB used, 128 MiB asked and a margin of 16 MiB do not fit) */
    put(dir, "memory.current", 220 * MiB);
    put(dir, "memory.max", 256 * MiB);
    usleep(1100 * 1000);
    errno = 0;
    big = malloc(128 * MiB);
    CHECK(big == NULL && errno == ENOMEM, "a lowered memory.max: 128 MiB with 220 of 256 MiB used: %p", big);
    printf("test_limits: cgroup: OK (the handler called %u times)\n", handler_calls);
    return 0;
  }
  if (strcmp(mode, "small") == 0) {
    for (int i = 0; i < 1000; i++) CHECK((blocks[i] = malloc(1000)) != NULL, "small block %d refused", i);
    errno = 0;
    void *big = malloc(32 * MiB);
    CHECK(big == NULL && errno == ENOMEM, "32 MiB with the cgroup full: %p", big);
    free_all(1000);
    printf("test_limits: small: OK\n");
    return 0;
  }
  if (strcmp(mode, "descriptors") == 0) {
    const char *dir = getenv("HAKMEM_CGROUP_DIR");
    CHECK(dir != NULL, "HAKMEM_CGROUP_DIR");
    char real[4096], num[4200];
    CHECK(realpath(dir, real) != NULL, "realpath(%s)", dir);
    free(malloc(100)); /* (hakmem has started) */
    /* a daemon closes what it inherited, then opens its own files */
    DIR *d = opendir("/proc/self/fd");
    CHECK(d != NULL, "/proc/self/fd");
    int held = 0, mine[64], n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
      if (e->d_name[0] != '.' && fd_in(atoi(e->d_name), real)) {
        close(atoi(e->d_name));
        held++;
      }
    closedir(d);
    snprintf(num, sizeof num, "%s/number", real);
    int fd = open(num, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    CHECK(fd >= 0 && write(fd, "1000\n", 5) == 5, "cannot write %s", num);
    close(fd);
    while (n < 8 && (fd = open(num, O_RDONLY)) >= 0 && fd < 64) mine[n++] = fd;
    usleep(1100 * 1000); /* (the limits are read again at most once a second) */
    errno = 0;
    void *big = malloc(64 * MiB);
    CHECK(big != NULL, "64 MiB with the program's files (\"1000\") at descriptors %d..%d: errno %d", mine[0],
          mine[n - 1], errno);
    free(big);
    for (int i = 0; i < n; i++) close(mine[i]);
    CHECK(held == 0, "hakmem held %d of the cgroup's files open", held);
    printf("test_limits: descriptors: OK (the program's files at %d..%d)\n", mine[0], mine[n - 1]);
    return 0;
  }
  if (strcmp(mode, "thp") == 0 || strcmp(mode, "thp_first") == 0) {
    /* thp_first: only the block's first byte written; the RSS it added */
    unsigned long rss0 = smaps_kb("Rss:");
    char *p = malloc(64 * MiB);
    CHECK(p != NULL, "malloc(64 MiB)");
    for (size_t i = 0; i < (mode[3] ? 1 : 64 * MiB); i += 4096) p[i] = 1;
    printf("AnonHugePages %lu\n", smaps_kb("AnonHugePages:"));
    printf("RssAdded %lu\n", smaps_kb("Rss:") - rss0);
    free(p);
    return 0;
  }
  if (strcmp(mode, "thp_sparse") == 0 || strcmp(mode, "thp_dense") == 0 || strcmp(mode, "thp_half") == 0) {
    enum { HEAP = 1280 << 20 };
    static char *blocks[HEAP / (64 << 10)];
    bool half = mode[4] == 'h', whole = half || mode[4] == 'd';
    size_t size = half ? (size_t)64 << 10 : (size_t)512 << 10;
    int n = (int)(HEAP / size);
    for (int i = 0; i < n; i++) {
      blocks[i] = malloc(size);
      CHECK(blocks[i] != NULL, "malloc(%zu) #%d", size, i);
      if (whole) memset(blocks[i], 1, size);
      else blocks[i][0] = 1;
    }
    printf("AnonHugePages %lu\n", smaps_kb("AnonHugePages:"));
    for (int i = 0; i < n; i++) free(blocks[i]);
    return 0;
  }
  if (strcmp(mode, "fill") == 0) {
    int n = fill(MiB, MAX_BLOCKS, true);
    printf("test_limits: fill: %d MiB written before NULL\n", n);
    CHECK(n < MAX_BLOCKS, "no NULL within 4 GiB");
    free_all(n);
    return 0;
  }
  /* no mode: without a limit, nothing is refused */
  int n = fill(8 * MiB, 32, false);
  CHECK(n == 32, "without a limit: %d blocks of 8 MiB", n);
  free_all(n);
  printf("test_limits: no limit: OK\n");
  return 0;
}
