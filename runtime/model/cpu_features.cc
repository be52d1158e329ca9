#include "runtime/model/cpu_features.h"

namespace strata::runtime {

bool CpuHasAvx512() {
  static const bool has =
      __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return has;
}

bool CpuHasAvx512Bf16() {
  static const bool has = CpuHasAvx512() && __builtin_cpu_supports("avx512bf16");
  return has;
}

}  // namespace strata::runtime
