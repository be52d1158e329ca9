// Test-only: a program linked with strata_openmp_wait (as strata-server and strata-generate are) prints the
// OMP_WAIT_POLICY it runs under, the value libgomp's constructor read: PASSIVE by default, the user's own
// where the environment sets OMP_WAIT_POLICY or GOMP_SPINCOUNT (CTest OpenMpWait.*).
#include <cstdio>
#include <cstdlib>

int main() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  std::printf("OMP_WAIT_POLICY=%s\n", policy != nullptr ? policy : "(unset)");
  return 0;
}
