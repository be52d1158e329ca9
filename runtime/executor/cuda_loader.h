#pragma once
// Plain C++ (no torch headers). LibTorch's CUDA half - libtorch_cuda.so and through it cuBLAS(Lt), cuDNN,
// NVRTC, NCCL - is loaded at run time, and only on a host with an NVIDIA driver. Linked in, it costs every
// process about 250 MB of resident memory before any GPU is touched (cuBLASLt alone writes 90 MB of
// tables at load): on a CPU-only host that was most of the gap to llama.cpp's footprint
// (bench/peer_llamacpp.py, peak RSS). Loaded with RTLD_GLOBAL, its static initializers register the CUDA
// device, allocator, streams and kernels with LibTorch, exactly as when it is linked.

#include <string>

namespace strata::runtime {

struct CudaLoad {
  bool built_with_cuda = false;  // the wheel's LibTorch has a CUDA half (libtorch_cuda.so)
  bool loaded = false;           // it is loaded in this process
  std::string detail;            // why not, or the library that was loaded; the loader's error on failure
  bool failed = false;           // a driver is present but the CUDA half did not load
};

// Loads the CUDA half once per process when a driver (libcuda.so.1) can be opened; STRATA_CUDA=0 never loads
// it, STRATA_CUDA=1 always tries. It runs as the executable starts (a static initializer of the executor
// library), before anything can ask LibTorch about CUDA; later calls return that outcome.
const CudaLoad& LoadCuda();

}  // namespace strata::runtime
