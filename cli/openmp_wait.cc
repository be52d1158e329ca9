// Linked into each program that runs decode steps (strata-server, strata-generate, the kernel benches) as an
// object of its own (CMake object library strata_openmp_wait), so that its .preinit_array entry is in the
// executable: it runs before any shared library's constructor, libgomp's included.
//
// Why: a stage's ATen operators run their parallel regions on libgomp's team, strata's own kernels on
// runtime/model/parallel.h's team. After every region libgomp's workers spin (GOMP_SPINCOUNT, 300000 by
// default when a team is no larger than the CPUs) while the next kernel wants those cores for strata's team:
// at 16 batched decodes of a 768-wide model on 2 vCPUs, 38% of the server's samples were libgomp spinning
// after the small ATen regions of each layer (a bfloat16 input widened, the logits cast), and the server
// served about half the tokens it served with OMP_WAIT_POLICY=PASSIVE (bench/README.md, "A real AVX2 server").
//
// libgomp reads its environment once, in its constructor; and a setenv() this early is lost (libc's own
// constructor resets `environ` to the process's original block after it). So where neither
// OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set, the program executes itself again at once, with
// OMP_WAIT_POLICY=PASSIVE added to its environment: before any library's constructor has run, so the second
// start costs only the dynamic loader's work. A policy or spin count set by the user is left as it is, and
// so is a run under valgrind (whose child would run uninstrumented) or a sanitizer. If the exec fails, the
// program goes on with libgomp's default.
#include <unistd.h>

#include <cstddef>
#include <cstring>

// Sanitized builds (GCC's macros, clang's features) keep libgomp's default: their runtimes start first.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define STRATA_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define STRATA_SANITIZED 1
#endif
#endif

namespace {

bool Has(char** envp, const char* name) {
  const size_t length = std::strlen(name);
  for (char** e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, name, length) == 0 && (*e)[length] == '=') return true;
  }
  return false;
}

bool UnderValgrind(char** envp) {
  for (char** e = envp; *e != nullptr; ++e) {
    if (std::strncmp(*e, "LD_PRELOAD=", 11) == 0 && std::strstr(*e, "vgpreload") != nullptr) return true;
  }
  return false;
}

void PassiveOpenMpWait(int /*argc*/, char** argv, char** envp) {
#ifdef STRATA_SANITIZED
  return;
#endif
  if (argv == nullptr || envp == nullptr) return;
  if (Has(envp, "OMP_WAIT_POLICY") || Has(envp, "GOMP_SPINCOUNT") || UnderValgrind(envp)) return;
  size_t count = 0;
  while (envp[count] != nullptr) ++count;
  // On the stack: nothing of libc's is initialised yet but its system-call wrappers.
  constexpr size_t kMaxEntries = 4096;
  if (count + 2 > kMaxEntries) return;
  char* entries[kMaxEntries];
  for (size_t i = 0; i < count; ++i) entries[i] = envp[i];
  static char kPassive[] = "OMP_WAIT_POLICY=PASSIVE";
  entries[count] = kPassive;
  entries[count + 1] = nullptr;
  execve("/proc/self/exe", argv, entries);  // returns only on failure: go on as we are
}

}  // namespace

__attribute__((section(".preinit_array"), used)) void (*const strata_passive_openmp_wait)(int, char**,
                                                                                          char**) = &PassiveOpenMpWait;
