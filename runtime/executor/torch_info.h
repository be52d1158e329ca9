#pragma once
// What the linked LibTorch is and which devices it sees, in plain C++ types (no torch headers), so
// that server/ and tools can report it.

#include <string>

namespace strata::runtime {

struct TorchInfo {
  std::string torch_version;     // e.g. "2.15.0"
  bool built_with_cuda = false;  // the LibTorch was compiled with CUDA support
  bool cuda_available = false;   // a CUDA driver and at least one GPU are present now
  int cuda_device_count = 0;
  std::string cuda_load;  // what LoadCuda() did (runtime/executor/cuda_loader.h)
  bool cuda_load_failed = false;
};

// Loads LibTorch's CUDA half where a driver is (LoadCuda), then queries LibTorch. Never throws; with no
// GPU, cuda_available is false.
TorchInfo QueryTorch();

}  // namespace strata::runtime
