/* test_page_commit: a page commits the memory of the blocks it hands out,
 * not of blocks it might hand out later. Carving a block onto a page's
 * free list writes its first word, which commits an OS page for a block of
 * 4 KiB or more; a page of such blocks that serves one block must leave the
 * OS pages of the next blocks untouched (docs/DESIGN.md, "The malloc slow
 * path": carving).
 */
#include "api.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define BLOCK 20000 /* a medium class: several blocks to a page */

int main(void) {
  if (hkt_hardened()) { /* blocks carved in random order there */
    printf("test_page_commit: hardened mode, skipped\n");
    return 0;
  }

  /* the first block of its class in this process: a fresh page */
  unsigned char *p = (unsigned char *)API(malloc)(BLOCK);
  CHECK(p != NULL, "malloc(%d) failed", BLOCK);
  size_t usable = API(malloc_usable_size)(p);
  CHECK(usable >= BLOCK && usable < 2 * BLOCK, "usable size %zu for %d bytes", usable, BLOCK);
  memset(p, 0x5a, usable);
  long ps = sysconf(_SC_PAGESIZE);
  uintptr_t after = ((uintptr_t)p + usable + (uintptr_t)ps - 1) & ~(uintptr_t)(ps - 1);
  uintptr_t end = (uintptr_t)p + 4 * usable;
  size_t touched = hkt_resident_pages(after, end);
  printf("test_page_commit: %zu of the %zu OS pages after a fresh %zu-byte block are resident\n", touched,
         (size_t)((end - after + (uintptr_t)ps - 1) / (uintptr_t)ps), usable);
  CHECK(touched == 0, "a page serving one block committed %zu OS pages beyond it", touched);

  /* the next blocks come from there all the same, one by one */
  unsigned char *q = (unsigned char *)API(malloc)(BLOCK);
  CHECK(q != NULL, "malloc(%d) failed", BLOCK);
  memset(q, 0x5b, usable);
  for (size_t i = 0; i < usable; i++) CHECK(p[i] == 0x5a, "the first block changed at byte %zu", i);
  API(free)(q);
  API(free)(p);
  return 0;
}
