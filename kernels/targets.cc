#include "kernels/targets.h"

#include <hwy/targets.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace strata::kernels {
namespace {

struct Cap {
  const char* name = "";
  bool avx512 = true;
};

// Applied before any kernel dispatches (a static initialiser of this library): Highway then never picks a
// target above the cap.
Cap ReadCap() {
  Cap cap;
  const char* value = std::getenv("STRATA_CPU_ISA");
  if (value == nullptr || *value == '\0') return cap;
  int64_t disabled = 0;
  if (std::strcmp(value, "avx2") == 0) {
    disabled = HWY_AVX3 | HWY_AVX3_DL;
  } else if (std::strcmp(value, "sse4") == 0) {
    disabled = HWY_AVX3 | HWY_AVX3_DL | HWY_AVX2;
  } else if (std::strcmp(value, "scalar") == 0) {
    disabled = HWY_AVX3 | HWY_AVX3_DL | HWY_AVX2 | HWY_SSE4 | HWY_SSSE3;
  } else {
    std::fprintf(stderr, "strata: STRATA_CPU_ISA=\"%s\" is not one of avx2, sse4, scalar: ignored\n", value);
    return cap;
  }
  hwy::DisableTargets(disabled);
  cap.name = value;
  cap.avx512 = false;
  return cap;
}

const Cap& TheCap() {
  static const Cap cap = ReadCap();
  return cap;
}

[[maybe_unused]] const bool kApplied = (TheCap(), true);

}  // namespace

#if defined(__x86_64__) || defined(__i386__)
bool Avx512Allowed() {
  static const bool allowed = TheCap().avx512 && __builtin_cpu_supports("avx512f") &&
                              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return allowed;
}
#else
bool Avx512Allowed() { return false; }  // not an x86 CPU
#endif

bool Bf16DotAvailable() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool available = Avx512Allowed() && __builtin_cpu_supports("avx512bf16");
  return available;
#else
  return false;
#endif
}

bool VbmiAvailable() {
#if defined(__x86_64__) || defined(__i386__)
  static const bool available = Avx512Allowed() && __builtin_cpu_supports("avx512vbmi");
  return available;
#else
  return false;
#endif
}

const char* CpuIsaCap() { return TheCap().name; }

}  // namespace strata::kernels
