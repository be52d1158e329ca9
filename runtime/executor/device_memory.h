#pragma once
// Measured memory per device of a loaded plan (plain C++), for GetDeviceMap and /metrics.

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/executor/loaded_model.h"

namespace strata::runtime {

struct DeviceMemory {
  std::string device;           // the plan's device: "0", "1", "cpu", "disk"
  std::string physical_device;  // where it runs: "cuda:0", "cpu"
  // CUDA: the caching allocator's allocated and reserved bytes, cudaMemGetInfo's total and free.
  // CPU (a "cpu"/"disk" entry, or a logical GPU mapped to the CPU): the process's resident set for
  // allocated and reserved (one process: every CPU device shows the same), MemTotal and MemAvailable.
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;
};

// One entry per device of the plan, in the plan's order.
std::vector<DeviceMemory> MeasureDeviceMemory(LoadedModel& model);

// This process's anonymous memory in transparent huge pages (AnonHugePages of /proc/self/smaps_rollup): the
// CPU weights' 2 MiB pages (runtime/model/weights.h) where the kernel gave them; 0 where it cannot be read.
int64_t AnonHugePageBytes();

// Asks the kernel to page out the resident pages of the read-only mappings (code and constant data) of shared libraries
// whose path contains
// `library` (MADV_PAGEOUT, Linux 5.4 and later; elsewhere nothing happens): LibTorch's static initialisers touch tens
// of megabytes of libtorch_cpu.so's code (every operator's registration) that serving never runs, and they stay in
// the resident set. The code a step runs faults back in from the page cache. The bytes of the mappings asked about.
int64_t PageOutLibraryCode(const std::string& library);

}  // namespace strata::runtime
