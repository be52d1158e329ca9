#pragma once
// What the linked LibTorch is and which devices it sees, in plain C++ types (no torch headers), so
// that server/ and tools can report it.

#include <string>

#include "absl/status/status.h"

namespace strata::runtime {

struct TorchInfo {
  std::string torch_version;     // e.g. "2.15.0"
  bool built_with_cuda = false;  // the LibTorch was compiled with CUDA support
  bool cuda_available = false;   // a CUDA driver and at least one GPU are present now
  int cuda_device_count = 0;
  std::string cuda_load;  // what LoadCuda() did (runtime/executor/cuda_loader.h)
  bool cuda_load_failed = false;
  std::string cuda_version;  // the CUDA the wheel's LibTorch was built for ("13.2"); empty for a CPU build
};

// Loads LibTorch's CUDA half where a driver is (LoadCuda), then queries LibTorch. Never throws; with no
// GPU, cuda_available is false.
TorchInfo QueryTorch();

// Where the CUDA driver sees GPUs (`driver_gpus`, the planner's inventory) but LibTorch sees fewer, a plan for those
// GPUs would fail later with "no CUDA device is visible". The usual cause: a driver older than the CUDA of the wheel
// (a CUDA 13 wheel needs an R580 driver or newer). FailedPrecondition saying both versions and what to do; OK where
// the counts agree or the driver sees none.
absl::Status CheckTorchSeesTheGpus(int driver_gpus, int cuda_driver_version, const TorchInfo& torch);

}  // namespace strata::runtime
