#include "runtime/model/cpu_features.h"

#include "kernels/targets.h"

namespace strata::runtime {

bool CpuHasAvx512() { return kernels::Avx512Allowed(); }

bool CpuHasAvx512Bf16() {
  static const bool has = CpuHasAvx512() && __builtin_cpu_supports("avx512bf16");
  return has;
}

}  // namespace strata::runtime
