/* test_secure_env EXPECTED: whether hardened mode is on, as EXPECTED (0 or
 * 1) says, whatever HAKMEM_SECURE the caller put in the environment.
 *
 * Run by ctest in three ways (tests/CMakeLists.txt):
 *  - a library built hardened by default (-DHAKMEM_SECURE_DEFAULT=ON) with
 *    HAKMEM_SECURE=0: still hardened, and a warning says so;
 *  - the default library with HAKMEM_SECURE=1: hardened (the control);
 *  - the default library as a set-user-ID program run by another user
 *    with HAKMEM_SECURE=1 (tests/setuid_env.sh): the environment is not
 *    read (AT_SECURE), so not hardened.
 * Hardened mode shows in malloc_usable_size, which then returns the size
 * asked for (5), not the size class's (8 or more). */
#include "hakmem.h"

#include <stdio.h>
#include <stdlib.h>
#include <sys/auxv.h>

int main(int argc, char **argv) {
  if (argc != 2 || (argv[1][0] != '0' && argv[1][0] != '1')) {
    fprintf(stderr, "usage: test_secure_env 0|1 (hardened mode expected)\n");
    return 2;
  }
  int expected = argv[1][0] - '0';
  const char *env = getenv("HAKMEM_SECURE");
  void *p = hak_malloc(5);
  size_t usable = hak_malloc_usable_size(p);
  int hardened = usable == 5;
  printf("test_secure_env: AT_SECURE=%lu HAKMEM_SECURE=%s usable size of 5 bytes %zu: hardened %d, expected %d\n",
         getauxval(AT_SECURE), env ? env : "(unset)", usable, hardened, expected);
  hak_free(p);
  if (hardened != expected) {
    fprintf(stderr, "test_secure_env: FAIL: hardened mode is %s\n", hardened ? "on" : "off");
    return 1;
  }
  return 0;
}
