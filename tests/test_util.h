/* Helpers for the test programs that need nothing from hakmem: the tests'
 * one pseudo-random generator. api.h includes this header; programs that
 * use neither api.h nor hakmem's API (rlimit_fill, and the tests built on
 * src/internal.h alone) include it directly. */
#ifndef HAKMEM_TESTS_TEST_UTIL_H
#define HAKMEM_TESTS_TEST_UTIL_H

#include <stdint.h>

/* xorshift64*: a test's own reproducible sequence. *s is the state, any
 * value but 0 (a zero state stays zero); each call advances it and returns
 * the next number, whose bits are all usable (low bits included). */
static inline uint64_t hkt_rand(uint64_t *s) {
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1Dull;
}

#endif /* HAKMEM_TESTS_TEST_UTIL_H */
