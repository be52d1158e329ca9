#pragma once
// What the machine has: each visible CUDA device's free and total memory and the host's available
// memory, as plain numbers. Discovered once (DiscoverInventory, through the CUDA driver API, no torch)
// or given by hand (ParseInventory, `strata-plan --inventory`), then turned into the max_memory
// transformers would use when none is given (DefaultMaxMemory).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "planner/device.h"

namespace strata::planner {

enum class Strategy;  // plan.h

struct GpuMemory {
  int64_t free_bytes = 0;   // torch.cuda.mem_get_info(i)[0]
  int64_t total_bytes = 0;  // torch.cuda.mem_get_info(i)[1]
  // Shares host RAM (Jetson and the like: cudaDeviceProp.integrated). accelerate then gives no "cpu"
  // budget, so as not to count that memory twice.
  bool integrated = false;
  // CUDA compute capability (cuDeviceGetAttribute COMPUTE_CAPABILITY_MAJOR / MINOR); 0.0 when unknown (an
  // --inventory entry that does not state it). transformers' FP8 quantizer keeps FP8 weights only when
  // device 0's is 8.9 or more (planner/quantized_spec.h).
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
};

struct MachineInventory {
  std::vector<GpuMemory> gpus;       // gpus[i] is CUDA device i as CUDA_VISIBLE_DEVICES numbers them
  int64_t host_available_bytes = 0;  // psutil.virtual_memory().available (MemAvailable)
  // The newest CUDA version the driver supports (cuDriverGetVersion: 12080 is CUDA 12.8); 0 when unknown (no
  // driver, or an --inventory).
  int cuda_driver_version = 0;
  // A group of nodes planned as one machine (GroupInventory): the node of each GPU, gpus' order; empty for one
  // machine (every GPU on node 0).
  std::vector<int> gpu_nodes;
  int NodeOf(size_t gpu) const { return gpu < gpu_nodes.size() ? gpu_nodes[gpu] : 0; }
  int nodes() const { return gpu_nodes.empty() ? 1 : gpu_nodes.back() + 1; }
};

// A group of nodes (issue 24: one model served by one process per node) as one machine, the union of their GPUs
// node-major (node 0's GPUs, then node 1's, ...), so that every strategy keeps transformers' semantics over them
// (balanced_low_0 keeps the leader's GPU 0 light). "cpu" and "disk" entries execute on the map's lowest GPU, the
// leader's GPU 0 (the runtime runs them on its main device), so they live on the leader's host: the group's cpu
// budget is node 0's available memory; the other hosts hold no weights. The driver version is the lowest any node
// reports. Errors: no node.
absl::StatusOr<MachineInventory> GroupInventory(const std::vector<MachineInventory>& nodes);

// "0=79GiB@8.9,1=79GiB,cpu=200GiB": each GPU's free memory, optionally "@MAJOR.MINOR" its compute capability (its total
// is taken to be the same) and the host's available memory, in ParseMemorySize's units. GPUs must be numbered 0..n-1
// without gaps (as CUDA numbers visible devices); "cpu" is required (every machine has a host); "disk" is not memory
// and is refused. "cpu=64GiB" alone is a machine without GPUs. Errors name the entry.
absl::StatusOr<MachineInventory> ParseInventory(absl::string_view spec);

// "0=79.00 GiB free of 80.00 GiB, 1=..., cpu=200.00 GiB available": for messages and tables.
std::string InventoryToString(const MachineInventory& inventory);

// Asks the CUDA driver (libcuda.so.1, loaded with dlopen, so nothing links against CUDA) for every
// visible device's free and total memory with its primary context current, as
// torch.cuda.mem_get_info does, and reads MemAvailable from /proc/meminfo. No driver, or no device
// (CUDA_ERROR_NO_DEVICE), is a machine without GPUs; any other CUDA failure is an error naming the
// device and the CUDA error.
absl::StatusOr<MachineInventory> DiscoverInventory();

// The max_memory transformers' from_pretrained(device_map=strategy) computes when it is given none,
// before rebalancing: every GPU's free memory (plus the torch allocator's reserved-but-unallocated
// memory, none in a process that has not allocated), "cpu" at 90% of the available host memory (no
// "cpu" when a GPU is integrated), and, for the strategies that rebalance (auto, balanced,
// balanced_low_0), when exactly one GPU has memory, 90% of the first GPU's (the rest is left to
// activations). Sorted as MaxMemory is; no "disk". Manual maps get the budgets "sequential" gets.
MaxMemory DefaultMaxMemory(const MachineInventory& inventory, Strategy strategy);

namespace internal {
// The MemAvailable line of /proc/meminfo text, in bytes (the kernel's "kB" are KiB).
absl::StatusOr<int64_t> MemAvailableBytes(absl::string_view meminfo);
}  // namespace internal

}  // namespace strata::planner
