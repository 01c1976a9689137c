/* test_secure_list: hardened mode finds a page's free list cut short
 * (white box: internal.h). A freed block's link rewritten, with the page
 * key, to the list's end loses the blocks after it; the page's list then
 * ends while blocks it carved are neither handed out nor held anywhere,
 * which the page search of malloc's slow path reports ("free list
 * corrupted"). The corruption runs in a forked child, whose end is
 * checked. Run with HAKMEM_SECURE=1 (tests/CMakeLists.txt). */
#include "../src/internal.h"
#include "hakmem.h"
#include "test_util.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

enum { N = 64, SIZE = 200 };

static void cut_list(void) {
  static void *p[N];
  for (int i = 0; i < N; i++)
    if ((p[i] = hak_malloc(SIZE)) == NULL) _exit(3);
  for (int i = 0; i < N; i += 2) hak_free(p[i]);
  hak_malloc_trim(0); /* (the quarantine's blocks back on the page's list) */
  hk_page *page = hk_block_page(p[1]);
  hk_block *head = page->free;
  if (hk_list_end(head)) _exit(4);
  hk_link_set(head, (hk_block *)hk_region_base(page), page->key); /* the list ends after its head */
  for (int i = 0; i < N; i++)
    if (hak_malloc(SIZE) == NULL) _exit(5);
  _exit(0);
}

int main(void) {
  void *probe = hak_malloc(SIZE);
  if (probe == NULL || !hk_secure) {
    fprintf(stderr, "test_secure_list: FAIL: needs hardened mode (HAKMEM_SECURE=1)\n");
    return 1;
  }
  hak_free(probe);
  int errp[2];
  if (pipe(errp) != 0) return 1;
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(errp[1], 2);
    close(errp[0]);
    cut_list();
  }
  close(errp[1]);
  char err[512] = {0};
  size_t len = 0;
  ssize_t n;
  while (len < sizeof err - 1 && (n = read(errp[0], err + len, sizeof err - 1 - len)) > 0) len += (size_t)n;
  int status;
  waitpid(pid, &status, 0);
  const char *want = "free list corrupted (a link ends the list early";
  if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT || strstr(err, want) == NULL) {
    fprintf(stderr, "test_secure_list: FAIL: a list cut after its head: status %d, stderr \"%s\"\n", status, err);
    return 1;
  }
  printf("test_secure_list: a list cut after its head -> %s", err);
  return 0;
}
