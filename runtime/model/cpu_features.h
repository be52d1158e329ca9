#pragma once
// Internal: what this x86 CPU can run, asked once per process (cpu_features.cc). strata's CPU kernels
// check it before they take over work from ATen. Plain C++.

namespace strata::runtime {

// AVX-512 F/BW/VL, unless STRATA_CPU_ISA caps strata below it (kernels/targets.h): linear.cc's kernels.
bool CpuHasAvx512();
// AVX-512 BF16 (VDPBF16PS) besides the above: linear.cc's bfloat16 dot products.
bool CpuHasAvx512Bf16();

}  // namespace strata::runtime
