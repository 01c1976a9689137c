/* test_medium_churn: a thread that keeps a few medium blocks (8-32 KiB) live
 * and frees and allocates them in a loop must reuse its memory, not give it
 * back to the OS and fault it in again.
 *
 * 64 slots, each freed or given a new 8-32 KiB block at random: about 32
 * blocks live, two per size class, so a class's page keeps running empty.
 * Were each emptied page retired, its span would go back to its region,
 * whose purges on "growth" would give it to the OS, and the next blocks
 * would fault it in again. An emptied current page stays instead (queue.c,
 * hk_heap_page_emptied), and only net growth purges (region.c).
 *
 * Checked: the page faults of the steady phase (after a warm-up) stay below
 * one per 1000 operations, and every block keeps its contents (a word at
 * its start, middle and end, as a program that touches a few lines of each
 * buffer; filling them all would also count the refaults that the timed
 * purge of free blocks' insides costs, one per 4 KiB per purge delay). */
#define _GNU_SOURCE
#include "api.h"

#include <stdbool.h>
#include <sys/resource.h>

#define SLOTS 64
#define WARMUP 200000
#define OPS 1000000

static long minor_faults(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return ru.ru_minflt;
}

static uint64_t word(const void *p, size_t n, size_t at) { return ((uintptr_t)p ^ (n << 32) ^ at) * 0x9e3779b97f4a7c15ull; }
static void stamp(unsigned char *p, size_t n) {
  size_t at[3] = {0, n / 2 & ~(size_t)7, n - 8};
  for (int i = 0; i < 3; i++) {
    uint64_t w = word(p, n, at[i]);
    memcpy(p + at[i], &w, 8);
  }
}
static bool intact(const unsigned char *p, size_t n) {
  size_t at[3] = {0, n / 2 & ~(size_t)7, n - 8};
  for (int i = 0; i < 3; i++) {
    uint64_t w;
    memcpy(&w, p + at[i], 8);
    if (w != word(p, n, at[i])) return false;
  }
  return true;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;

int main(void) {
  unsigned char *slot[SLOTS] = {0};
  size_t size[SLOTS] = {0};
  long faults0 = 0;
  for (long i = 0; i < WARMUP + OPS; i++) {
    if (i == WARMUP) faults0 = minor_faults();
    size_t k = hkt_rand(&rng) % SLOTS;
    if (slot[k] != NULL) {
      CHECK(intact(slot[k], size[k]), "block of %zu bytes at %p corrupted", size[k], (void *)slot[k]);
      API(free)(slot[k]);
      slot[k] = NULL;
    } else {
      size[k] = (8u << 10) + hkt_rand(&rng) % (24u << 10);
      slot[k] = (unsigned char *)API(malloc)(size[k]);
      CHECK(slot[k] != NULL, "malloc(%zu) failed", size[k]);
      stamp(slot[k], size[k]);
    }
  }
  long faults = minor_faults() - faults0;
  for (size_t k = 0; k < SLOTS; k++) API(free)(slot[k]);
  printf("test_medium_churn [%s]: %d operations on %d slots of 8-32 KiB: %ld page faults after the warm-up\n",
         API_MODE, OPS, SLOTS, faults);
  CHECK(faults < OPS / 1000, "%ld page faults in %d operations: freed medium memory is given back and faulted in again",
        faults, OPS);
  printf("test_medium_churn [%s]: all passed\n", API_MODE);
  return 0;
}
