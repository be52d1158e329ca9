#pragma once
// Which instruction sets strata's CPU kernels may use. By default the best this CPU has; the environment
// variable STRATA_CPU_ISA caps it for a run ("avx2", "sse4", "scalar"; as oneDNN's ONEDNN_MAX_CPU_ISA and
// ATen's ATEN_CPU_CAPABILITY do): the same binary then runs the code an AVX2-only server would, for
// benchmarks and tests on a machine that has more. Plain C++.

namespace strata::kernels {

// Whether AVX-512 (F/BW/VL) may be used: the CPU has it and STRATA_CPU_ISA does not forbid it. Read once.
bool Avx512Allowed();

// Whether AVX512_BF16's VDPBF16PS may be used (the above, and the CPU has it): kernels/linear's bfloat16 rows.
bool Bf16DotAvailable();

// Whether AVX512_VBMI's byte permutes may be used (Avx512Allowed() and the CPU has them): kernels/quantized's FP8
// rows on VDPBF16PS look the bfloat16 of each e4m3 code up with VPERMI2B.
bool VbmiAvailable();

// The STRATA_CPU_ISA the process runs under ("" when unset). An unknown value is reported on stderr once and
// ignored.
const char* CpuIsaCap();

}  // namespace strata::kernels
