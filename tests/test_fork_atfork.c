/* test_fork_atfork: fork() while the program's own pthread_atfork handlers
 * allocate, whatever the order in which they and hakmem's were registered.
 *
 * Every scenario runs in a process of its own (forked from this one, which
 * registers nothing), so registrations do not pile up; a scenario that
 * hangs is killed after SCENARIO_TIMEOUT_S and reported. A scenario is:
 *   - which of the program's handlers allocate: prepare, parent, child, all;
 *   - when the program registers them: first thing (before any allocation
 *     or thread), after its first allocation, after a first thread has run,
 *     or while worker threads run;
 *   - the tier its handlers allocate from: 40 B, 70000 B, 3 MiB (malloc,
 *     realloc to twice the size, free), or all three;
 *   - whether worker threads allocate, free and exchange blocks while the
 *     main thread forks.
 * Each scenario forks NFORKS times; each child allocates and frees in every
 * tier, frees blocks the parent's workers owned, starts a thread that
 * allocates, and exits 0. Then posix_spawn, vfork + exec and system() run
 * while workers allocate. */
#define _GNU_SOURCE
#include "api.h"

#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define NFORKS 20
#define NWORKERS 2
#define NSLOTS 256
#ifndef SCENARIO_TIMEOUT_S
#define SCENARIO_TIMEOUT_S 30
#endif

enum { H_PREPARE = 1, H_PARENT = 2, H_CHILD = 4, H_ALL = 7 };
enum { REG_FIRST, REG_AFTER_ALLOC, REG_AFTER_THREAD, REG_WHILE_WORKERS };
enum { TIER_SMALL, TIER_MEDIUM, TIER_LARGE, TIER_ALL };
static const size_t tier_size[] = {40, 70000, 3u << 20};
static const char *const reg_name[] = {"first", "after-alloc", "after-thread", "while-workers"};
static const char *const tier_name[] = {"40 B", "70000 B", "3 MiB", "all tiers"};

static int handler_kinds, handler_tier;
static _Atomic(void *) slots[NSLOTS];
static atomic_int stop;
static atomic_long handler_calls;

static void use_tier(int tier) {
  size_t n = tier_size[tier];
  unsigned char *p = malloc(n);
  if (p == NULL) abort();
  memset(p, 0x5a, n);
  unsigned char *q = realloc(p, 2 * n);
  if (q == NULL || q[0] != 0x5a || q[n - 1] != 0x5a) abort();
  free(q);
}
static void use_tiers(int tier) {
  if (tier == TIER_ALL)
    for (int t = 0; t < TIER_ALL; t++) use_tier(t);
  else
    use_tier(tier);
}

static void on_prepare(void) {
  if (handler_kinds & H_PREPARE) use_tiers(handler_tier), handler_calls++;
}
static void on_parent(void) {
  if (handler_kinds & H_PARENT) use_tiers(handler_tier), handler_calls++;
}
static void on_child(void) {
  if (handler_kinds & H_CHILD) use_tiers(handler_tier);
}

static void *worker(void *arg) {
  uint64_t rng = (uint64_t)(uintptr_t)arg * 0x9E3779B97F4A7C15ull + 1;
  while (!atomic_load(&stop)) {
    uint64_t r = hkt_rand(&rng);
    size_t n = r % 64 == 0 ? (1u << 20) + r % (3u << 20) : r % 8 == 0 ? 8192 + r % 100000 : 1 + r % 512;
    void *p = malloc(n);
    if (p == NULL) abort();
    memset(p, 1, n < 256 ? n : 256);
    void *old = atomic_exchange(&slots[r % NSLOTS], p);
    free(old); /* often a block another worker allocated */
  }
  return NULL;
}

static void *one_alloc(void *arg) {
  (void)arg;
  use_tiers(TIER_ALL);
  return NULL;
}

/* In a child: allocate everywhere, free what the parent's workers left in
 * the slots (their threads are gone here), run a thread, exit. */
static void child_work(void) {
  use_tiers(TIER_ALL);
  for (int i = 0; i < NSLOTS; i++) free(atomic_exchange(&slots[i], NULL));
  pthread_t t;
  if (pthread_create(&t, NULL, one_alloc, NULL) != 0) _exit(3);
  pthread_join(t, NULL);
  _exit(0);
}

static int wait_exit(pid_t pid, const char *what) {
  int st;
  if (waitpid(pid, &st, 0) != pid) {
    fprintf(stderr, "%s: waitpid failed\n", what);
    return 1;
  }
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "%s: child ended with status 0x%x\n", what, st);
    return 1;
  }
  return 0;
}

static int scenario(int kinds, int reg, int tier, int workers) {
  handler_kinds = kinds;
  handler_tier = tier;
  if (reg == REG_FIRST) pthread_atfork(on_prepare, on_parent, on_child);
  free(malloc(100));
  if (reg == REG_AFTER_ALLOC) pthread_atfork(on_prepare, on_parent, on_child);
  pthread_t t, w[NWORKERS];
  if (pthread_create(&t, NULL, one_alloc, NULL) != 0) return 1;
  pthread_join(t, NULL);
  if (reg == REG_AFTER_THREAD) pthread_atfork(on_prepare, on_parent, on_child);
  if (workers)
    for (int i = 0; i < NWORKERS; i++)
      if (pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)(i + 1)) != 0) return 1;
  if (reg == REG_WHILE_WORKERS) pthread_atfork(on_prepare, on_parent, on_child);
  int bad = 0;
  for (int i = 0; i < NFORKS && !bad; i++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) child_work();
    bad |= wait_exit(pid, "fork child");
  }
  if (workers) {
    atomic_store(&stop, 1);
    for (int i = 0; i < NWORKERS; i++) pthread_join(w[i], NULL);
  }
  if ((kinds & (H_PREPARE | H_PARENT)) && handler_calls == 0) {
    fprintf(stderr, "the program's fork handlers never ran\n");
    bad = 1;
  }
  return bad;
}

/* posix_spawn, vfork + exec and system() while workers allocate */
static int spawners(void) {
  pthread_t w[NWORKERS];
  for (int i = 0; i < NWORKERS; i++)
    if (pthread_create(&w[i], NULL, worker, (void *)(uintptr_t)(i + 1)) != 0) return 1;
  int bad = 0;
  for (int i = 0; i < 10 && !bad; i++) {
    pid_t pid;
    char *argv[] = {"/bin/sh", "-c", "exit 0", NULL};
    if (posix_spawn(&pid, "/bin/sh", NULL, NULL, argv, environ) != 0) return 1;
    bad |= wait_exit(pid, "posix_spawn");
    pid = vfork();
    if (pid < 0) return 1;
    if (pid == 0) {
      execve("/bin/sh", argv, environ);
      _exit(127);
    }
    bad |= wait_exit(pid, "vfork+exec");
    int st = system("exit 0");
    if (st != 0) {
      fprintf(stderr, "system() returned 0x%x\n", st);
      bad = 1;
    }
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < NWORKERS; i++) pthread_join(w[i], NULL);
  return bad;
}

/* Run fn-like scenario in a process of its own, with a time limit. */
static int run_isolated(int kinds, int reg, int tier, int workers, const char *label) {
  pid_t pid = fork();
  CHECK(pid >= 0, "fork failed");
  if (pid == 0) {
    setpgid(0, 0);             /* its children too are killed below */
    alarm(SCENARIO_TIMEOUT_S); /* a deadlock ends in SIGALRM */
    _exit(kinds < 0 ? spawners() : scenario(kinds, reg, tier, workers));
  }
  int st;
  CHECK(waitpid(pid, &st, 0) == pid, "waitpid");
  kill(-pid, SIGKILL); /* a hung fork child of a failed scenario */
  if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
  fprintf(stderr, "test_fork_atfork: FAILED %s: %s\n", label,
          WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? "hung (deadlock)" : "child failed");
  return 1;
}

int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  static const int kinds[] = {H_PREPARE, H_PARENT, H_CHILD, H_ALL};
  static const char *const kind_name[] = {"prepare", "parent", "child", "all"};
  int failed = 0, ran = 0;
  char label[160];
  for (int k = 0; k < 4; k++)
    for (int reg = REG_FIRST; reg <= REG_WHILE_WORKERS; reg++)
      for (int tier = TIER_SMALL; tier <= TIER_ALL; tier++)
        for (int workers = 0; workers <= 1; workers++) {
          if (reg == REG_WHILE_WORKERS && !workers) continue;
          /* the full tier matrix for "all handlers"; one tier otherwise */
          if (k != 3 && tier != TIER_ALL) continue;
          snprintf(label, sizeof label, "handlers allocating in %s, registered %s, %s, %s", kind_name[k],
                   reg_name[reg], tier_name[tier], workers ? "workers allocating" : "no workers");
          failed += run_isolated(kinds[k], reg, tier, workers, label);
          ran++;
        }
  failed += run_isolated(-1, 0, 0, 1, "posix_spawn / vfork+exec / system() while threads allocate");
  ran++;
  CHECK(failed == 0, "%d of %d fork scenarios failed", failed, ran);
  printf("test_fork_atfork: %d scenarios, %d forks each, passed\n", ran, NFORKS);
  return 0;
}
