/* Every system call hakmem makes lives here. None of these run on the
 * malloc/free fast path. */
#include "internal.h"

/* The thread inside fork() that holds every allocator lock (sync.h). */
__thread bool hk_fork_holder __attribute__((tls_model("initial-exec")));

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef MAP_NORESERVE
#define MAP_NORESERVE 0
#endif

size_t hk_os_page = HK_OS_PAGE_MIN; /* (hk_init sets the kernel's) */

#ifdef HAKMEM_SIMULATED_PAGE
/* A test build (tests/CMakeLists.txt) that acts as a kernel with pages of
 * HAKMEM_SIMULATED_PAGE bytes would: each memory system call below goes
 * through these, which refuse a range that starts inside such a page
 * (the kernel's EINVAL, made fatal here so that no caller can ignore it)
 * and apply the call to whole pages, rounding the length up as the kernel
 * does; mappings the kernel places start on such a page. The tests then
 * find any live block that a guard, purge or commit reaches. */
#define SIM_PAGE ((uintptr_t)HAKMEM_SIMULATED_PAGE)
static void sim_check(const void *p, const char *call) {
  if (((uintptr_t)p & (SIM_PAGE - 1)) == 0) return;
  static const char msg[] = "hakmem: simulated pages: a range that starts inside a page, in ";
  hk_os_write_stderr(msg, sizeof msg - 1);
  hk_os_write_stderr(call, strlen(call));
  hk_os_write_stderr("\n", 1);
  abort();
}
static size_t sim_len(size_t n) { return n > SIZE_MAX - SIM_PAGE ? n : (n + SIM_PAGE - 1) & ~(SIM_PAGE - 1); }
static void *sim_mmap(void *hint, size_t size, int prot, int flags) {
  if (flags & MAP_FIXED) {
    sim_check(hint, "mmap");
    return mmap(hint, sim_len(size), prot, flags, -1, 0);
  }
  size_t len = sim_len(size);
  if (len > SIZE_MAX - SIM_PAGE) return MAP_FAILED;
  if (hint != NULL && ((uintptr_t)hint & (SIM_PAGE - 1)) == 0) {
    char *q = mmap(hint, len, prot, flags, -1, 0);
    if (q == MAP_FAILED || ((uintptr_t)q & (SIM_PAGE - 1)) == 0) return q;
    munmap(q, len);
  }
  char *q = mmap(NULL, len + SIM_PAGE, prot, flags, -1, 0);
  if (q == MAP_FAILED) return q;
  char *a = (char *)(((uintptr_t)q + SIM_PAGE - 1) & ~(SIM_PAGE - 1));
  if (a > q) munmap(q, (size_t)(a - q));
  munmap(a + len, SIM_PAGE - (size_t)(a - q));
  return a;
}
static int sim_munmap(void *p, size_t n) { sim_check(p, "munmap"); return munmap(p, sim_len(n)); }
static int sim_mprotect(void *p, size_t n, int prot) { sim_check(p, "mprotect"); return mprotect(p, sim_len(n), prot); }
static int sim_madvise(void *p, size_t n, int advice) { sim_check(p, "madvise"); return madvise(p, sim_len(n), advice); }
static void *sim_mremap(void *p, size_t old_size, size_t new_size, int flags, ...) {
  sim_check(p, "mremap");
  void *to = NULL;
  if (flags & MREMAP_FIXED) {
    va_list ap;
    va_start(ap, flags);
    to = va_arg(ap, void *);
    va_end(ap);
    sim_check(to, "mremap");
  }
  return mremap(p, sim_len(old_size), sim_len(new_size), flags, to);
}
#define mmap(hint, size, prot, flags, fd, off) sim_mmap(hint, size, prot, flags)
#define munmap sim_munmap
#define mprotect sim_mprotect
#define madvise sim_madvise
#define mremap sim_mremap
#endif

/* Writable mappings are charged against the commit limit as glibc's are:
 * with MAP_NORESERVE the kernel's overcommit heuristic would let
 * malloc(1 TiB) return a block on a machine with far less memory (a program
 * then dies when it touches it, instead of seeing NULL). Reservations
 * (PROT_NONE) are charged nothing either way. */
static int map_flags(int prot) { return MAP_PRIVATE | MAP_ANONYMOUS | (prot == PROT_NONE ? MAP_NORESERVE : 0); }

static void *map_raw(void *hint, size_t size, int prot) {
  void *p = mmap(hint, size, prot, map_flags(prot), -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

/* Map `size` bytes aligned to `align` (a power of two >= the OS page):
 * over-map by `align` and trim both ends (three system calls, once per
 * region or large block). */
/* Near a limit on mapped bytes the over-mapping can fail where `size`
 * alone fits: then map `size` where the kernel puts it, and if that is not
 * aligned, ask for the aligned address just below or above it. */
static void *map_aligned_exact(size_t size, size_t align, int prot) {
  char *q = map_raw(NULL, size, prot);
  if (q == NULL || ((uintptr_t)q & (align - 1)) == 0) return q;
  munmap(q, size);
  uintptr_t down = (uintptr_t)q & ~(uintptr_t)(align - 1);
  uintptr_t hints[2] = {down, down + align};
  for (int i = 0; i < 2; i++) {
    if (hints[i] == 0) continue;
    char *h = map_raw((void *)hints[i], size, prot);
    if (h == (char *)hints[i]) return h;
    if (h != NULL) munmap(h, size);
  }
  return NULL;
}

static void *map_aligned(size_t size, size_t align, int prot) {
  /* (whole pages: the trim below must start on one) */
  if (align < hk_os_page) align = hk_os_page;
  if (size > SIZE_MAX - 2 * align) return NULL;
  size = hk_page_up(size);
  size_t over = size + align;
  char *q = map_raw(NULL, over, prot);
  if (q == NULL) return errno == ENOMEM ? map_aligned_exact(size, align, prot) : NULL;
  uintptr_t aligned = ((uintptr_t)q + align - 1) & ~(uintptr_t)(align - 1);
  size_t lead = aligned - (uintptr_t)q, trail = over - lead - size;
  if (lead) munmap(q, lead);
  if (trail) munmap((char *)aligned + size, trail);
  return (void *)aligned;
}

void *hk_os_map_aligned(size_t size, size_t align) { return map_aligned(size, align, PROT_READ | PROT_WRITE); }

/* Address space only: no access, no commit charge (the arena, arena.c). */
void *hk_os_reserve(size_t size, size_t align) { return map_aligned(size, align, PROT_NONE); }

/* Make reserved memory usable (fresh zero pages), or give it back and
 * make it inaccessible again; one mmap over the range either way. */
bool hk_os_commit(void *p, size_t size) {
  void *q = mmap(p, size, PROT_READ | PROT_WRITE, map_flags(PROT_READ | PROT_WRITE) | MAP_FIXED, -1, 0);
  return q == p;
}
void hk_os_decommit(void *p, size_t size) {
  void *q = mmap(p, size, PROT_NONE, map_flags(PROT_NONE) | MAP_FIXED, -1, 0);
  if (q != p) hk_warning("mmap of a reserved range failed");
}

/* The kernel's page size (the auxiliary vector: no system call, no
 * allocation). */
#ifdef HAKMEM_SIMULATED_PAGE
size_t hk_os_page_size(void) { return SIM_PAGE; }
#else
size_t hk_os_page_size(void) { return (size_t)getauxval(AT_PAGESZ); }
#endif

/* A guard of no pages (slab 0 with pages of 32 KiB or more) is none. */
void hk_os_guard(void *p, size_t size) {
  if (size != 0 && mprotect(p, size, PROT_NONE) != 0) hk_warning("mprotect of a guard page failed");
}

#ifndef MADV_GUARD_INSTALL
#define MADV_GUARD_INSTALL 102 /* Linux 6.13 (linux/mman.h) */
#endif
/* A guard of read-write memory that takes no mapping (VMA) of its own
 * (MADV_GUARD_INSTALL): an access faults as at a PROT_NONE page, the guard
 * stays through MADV_DONTNEED and fork, and the range stays part of its
 * mapping, which merges with its neighbours'. False, having done nothing,
 * where the kernel has no such guards (older than 6.13): the caller makes
 * a PROT_NONE one.
 * The first guard is checked: an emulator of the system calls (qemu's user
 * mode, which runs aarch64 containers on x86-64 hosts) answers 0 to advice
 * it does not know and installs nothing. The check is a system call that
 * reads the guard's first byte as a path, and must fail there with EFAULT
 * (made directly: a library that wraps faccessat could read the path
 * itself, and fault). */
static _Atomic int guards_light_state; /* 0: not tried yet, 1: they work, -1: they do not */
/* Whether hk_os_guard_light may work: false once it failed. */
bool hk_os_has_guard_light(void) { return hk_load_relaxed(&guards_light_state) >= 0; }
bool hk_os_guard_light(void *p, size_t size) {
  int state = hk_load_relaxed(&guards_light_state);
  if (state < 0) return false;
  if (size == 0) return true;
  int saved = errno;
  bool ok = madvise(p, size, MADV_GUARD_INSTALL) == 0;
  if (!ok && errno == EINVAL) {
    hk_store_relaxed(&guards_light_state, -1);
  } else if (ok && state == 0) {
    ok = syscall(SYS_faccessat, AT_FDCWD, p, F_OK, 0) != 0 && errno == EFAULT;
    hk_store_relaxed(&guards_light_state, ok ? 1 : -1);
  }
  errno = saved;
  return ok;
}
/* A guard page usable again, its old contents kept (false: it stays a guard) */
bool hk_os_unguard(void *p, size_t size) { return mprotect(p, size, PROT_READ | PROT_WRITE) == 0; }

void hk_os_unmap(void *p, size_t size) {
  if (munmap(p, size) != 0) hk_warning("munmap failed");
}

/* Transparent huge pages for [p, p + size): asked for (on) or refused
 * (HAKMEM_THP, docs/OPTIONS.md). Advice only: a kernel without THP, or
 * with it off, ignores it. */
void hk_os_huge(void *p, size_t size, bool on) {
#if defined(MADV_HUGEPAGE) && defined(MADV_NOHUGEPAGE)
  madvise(p, size, on ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
#else
  (void)p, (void)size, (void)on;
#endif
}

void hk_os_purge(void *p, size_t size) {
  /* MADV_DONTNEED (not MADV_FREE): the pages leave RSS immediately and read
   * back as zero. */
  madvise(p, size, MADV_DONTNEED);
}

/* Grow or shrink a mapping; the result keeps `align`. Moving is done with
 * mremap so the pages are not copied. */
void *hk_os_remap(void *p, size_t old_size, size_t new_size, size_t align) {
#ifdef MREMAP_MAYMOVE
  int saved = errno; /* a failed first try must not show in a realloc that succeeds */
  void *q = mremap(p, old_size, new_size, 0);
  if (q != MAP_FAILED) return q;
#ifdef MREMAP_FIXED
  void *dst = hk_os_map_aligned(new_size, align);
  if (dst == NULL) return NULL;
  q = mremap(p, old_size, new_size, MREMAP_MAYMOVE | MREMAP_FIXED, dst);
  if (q != MAP_FAILED) {
    errno = saved;
    return q;
  }
  munmap(dst, new_size);
#endif
#endif
  (void)p; (void)old_size; (void)new_size; (void)align;
  return NULL;
}

/* hk_os_remap for a mapping whose first `head` bytes (a header page and a
 * guard page: different protections, so separate mappings that one mremap
 * cannot take together) stay as they are: the rest grows in place, or all
 * of it moves to a new reservation, the guard staying inaccessible there. */
void *hk_os_remap_headed(void *p, size_t old_size, size_t new_size, size_t align, size_t head, size_t header) {
#if defined(MREMAP_MAYMOVE) && defined(MREMAP_FIXED)
  int saved = errno;
  char *c = (char *)p;
  if (mremap(c + head, old_size - head, new_size - head, 0) != MAP_FAILED) return p;
  char *dst = hk_os_reserve(new_size, align);
  if (dst == NULL) return NULL;
  if (mremap(c + head, old_size - head, new_size - head, MREMAP_MAYMOVE | MREMAP_FIXED, dst + head) == MAP_FAILED) {
    munmap(dst, new_size);
    return NULL;
  }
  if (mremap(c, header, header, MREMAP_MAYMOVE | MREMAP_FIXED, dst) == MAP_FAILED) {
    /* the data has moved, its header has not: bring the data back */
    if (mremap(dst + head, new_size - head, old_size - head, MREMAP_MAYMOVE | MREMAP_FIXED, c + head) == MAP_FAILED) {
      static const char msg[] = "hakmem: error: mremap could move neither a large block's header to its data "
                                "nor the data back (out of mappings?)\n";
      hk_os_write_stderr(msg, sizeof msg - 1);
      abort();
    }
    munmap(dst, new_size);
    return NULL;
  }
  munmap(c + header, head - header); /* the old guard */
  errno = saved;
  return dst;
#else
  (void)p; (void)old_size; (void)new_size; (void)align; (void)head; (void)header;
  return NULL;
#endif
}

/* Is there an address-space limit (RLIMIT_AS) that a mapping of `need`
 * bytes could fit under? Only then does giving up unused reserved address
 * space help a mapping that failed. */
bool hk_os_space_limited(size_t need) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return false;
  return need < (size_t)rl.rlim_cur;
}

/* Does a limit on address space (RLIMIT_AS) or on data (RLIMIT_DATA, which
 * counts private writable mappings) hold now? */
bool hk_os_space_tight(void) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) return true;
  return getrlimit(RLIMIT_DATA, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY;
}

/* The calling thread's kernel id. */
int hk_os_tid(void) { return (int)syscall(SYS_gettid); }

/* The system call rather than sysconf(), which may read /sys through stdio
 * and so allocate: this runs while the allocator initialises. */
unsigned hk_os_cpu_count(void) {
  uint64_t mask[16]; /* 1024 CPUs */
  long bytes = syscall(SYS_sched_getaffinity, 0L, sizeof mask, mask);
  unsigned n = 0;
  for (long w = 0; w < bytes / 8; w++)
    for (uint64_t m = mask[w]; m != 0; m &= m - 1) n++;
  return n ? n : 1;
}

/* The system call rather than getpid(), which is one too (glibc caches no
 * pid since 2.25): getpid lies in a part of libc's text that a program
 * seldom runs, and the page fault of a heap's first call would map 64 KiB
 * of it around the function (the kernel maps the neighbouring pages of a
 * file with the one that faults), resident memory a small program does not
 * otherwise need. */
int hk_os_pid(void) { return (int)syscall(SYS_getpid); }

/* Has the thread with kernel id tid of process pid exited? Only a
 * definite "no such thread" counts: any other answer (a tid the kernel has
 * given to a new thread since, a tgkill that is refused) says no. */
bool hk_os_thread_gone(int tid, int pid) {
  int saved = errno;
  bool gone = syscall(SYS_tgkill, (long)pid, (long)tid, 0L) != 0 && errno == ESRCH;
  errno = saved;
  return gone;
}

bool hk_os_shrink(void *p, size_t old_size, size_t new_size) {
  if (new_size >= old_size) return new_size == old_size;
  return munmap((char *)p + new_size, old_size - new_size) == 0;
}

uint64_t hk_os_now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* sync.h's spin lock, held by another thread: spin a while (its holders
 * run a few dozen instructions), then give the CPU up between tries (the
 * holder may have been preempted). */
void hk_spin_wait(_Atomic uint32_t *l) {
  for (unsigned i = 0;; i++) {
    if (!hk_load_relaxed(l) && !atomic_exchange_explicit(l, 1, memory_order_acquire)) return;
    if (i >= 100) {
      sched_yield();
    } else {
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#elif defined(__aarch64__)
      __asm__ volatile("yield");
#endif
    }
  }
}

void hk_os_sleep_ms(long ms) {
  struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) != 0) {
  }
}

uint64_t hk_os_now_ms(void) {
  struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts); /* vDSO: no system call */
#else
  clock_gettime(CLOCK_MONOTONIC, &ts);
#endif
  return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* 64 random bits from the kernel: getrandom, or /dev/urandom where the
 * system call is missing or filtered. False if neither gives them. */
bool hk_os_random(uint64_t *v) {
#ifdef SYS_getrandom
  if (syscall(SYS_getrandom, v, sizeof *v, 0) == (long)sizeof *v) return true;
#endif
  int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  ssize_t n = fd >= 0 ? read(fd, v, sizeof *v) : -1;
  if (fd >= 0) close(fd);
  return n == (ssize_t)sizeof *v;
}

size_t hk_os_peak_rss_kb(void) {
  struct rusage ru;
  if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
  return (size_t)ru.ru_maxrss;
}

size_t hk_os_current_rss_kb(void) {
  char buf[128];
  int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char *s = buf;
  while (*s && *s != ' ') s++;
  size_t pages = 0;
  while (*s == ' ') s++;
  while (*s >= '0' && *s <= '9') pages = pages * 10 + (size_t)(*s++ - '0');
  return pages * ((size_t)sysconf(_SC_PAGESIZE) / 1024);
}

/* A file's first bytes, NUL-terminated (-1: not readable). */
long hk_os_read_file(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, size - 1);
  close(fd);
  if (n < 0) return -1;
  buf[n] = 0;
  return n;
}

/* A thread of hakmem's own (the purger, the timeline): detached, a small
 * stack, every signal blocked (it never takes the program's: the mask is
 * inherited from here, then restored). pthread_create may call malloc: the
 * caller holds no allocator lock. */
bool hk_os_start_thread(void *(*main)(void *)) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_BLOCK, &all, &old);
  pthread_attr_t attr;
  pthread_t tid;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_attr_setstacksize(&attr, 128u << 10);
  bool ok = pthread_create(&tid, &attr, main, NULL) == 0;
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  return ok;
}

void hk_os_write_stderr(const char *s, size_t n) { hk_os_write(2, s, n); }

void hk_os_write(int fd, const char *s, size_t n) {
  while (n > 0) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

int hk_os_open_locked(const char *path) {
  int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

int hk_os_create(const char *path) { return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644); }

void hk_os_truncate(int fd) {
  if (ftruncate(fd, 0) == 0) lseek(fd, 0, SEEK_SET);
}

void hk_os_close(int fd) { close(fd); }

void hk_os_copy_file(const char *path, int fd) {
  int in = open(path, O_RDONLY | O_CLOEXEC);
  if (in < 0) return;
  char buf[4096];
  for (;;) {
    ssize_t n = read(in, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    hk_os_write(fd, buf, (size_t)n);
  }
  close(in);
}

void hk_os_on_signal(int sig, void (*handler)(int)) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(sig, &sa, NULL);
}

bool hk_verbose; /* HAKMEM_VERBOSE (set by hk_options_init) */

void hk_warning(const char *msg) {
  if (!hk_verbose) return;
  hk_os_write_stderr("hakmem: warning: ", 17);
  hk_os_write_stderr(msg, strlen(msg));
  hk_os_write_stderr("\n", 1);
}
