#include "runtime/executor/device_memory.h"

#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>

#include "runtime/executor/pipeline.h"

#ifdef STRATA_TORCH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace strata::runtime {
namespace {

struct HostMemory {
  int64_t rss = 0;
  int64_t total = 0;
  int64_t available = 0;
};

HostMemory ReadHostMemory() {
  HostMemory m;
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (statm >> size_pages >> resident_pages) m.rss = resident_pages * sysconf(_SC_PAGESIZE);
  std::ifstream meminfo("/proc/meminfo");
  std::string key, unit;
  int64_t kib = 0;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemTotal:") m.total = kib * 1024;
    if (key == "MemAvailable:") m.available = kib * 1024;
  }
  return m;
}

}  // namespace

std::vector<DeviceMemory> MeasureDeviceMemory(LoadedModel& model) {
  // The physical device of each plan device: from the stages that run there ("cpu"/"disk" entries
  // without a stage of their own run on the main device, but their bytes live in host memory).
  std::map<std::string, at::Device> physical;
  for (const Stage& stage : model.pipeline().stages()) physical.emplace(stage.label, stage.device);
  const HostMemory host = ReadHostMemory();
  std::vector<DeviceMemory> out;
  for (const planner::DeviceUsage& usage : model.report().plan.devices) {
    DeviceMemory m;
    m.device = usage.device.ToString();
    at::Device device = at::kCPU;
    if (usage.device.is_gpu()) {
      if (auto it = physical.find(m.device); it != physical.end()) device = it->second;
    }
    m.physical_device = device.str();
#ifdef STRATA_TORCH_CUDA
    if (device.is_cuda()) {
      const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
      using Stat = c10::CachingAllocator::StatType;
      m.allocated_bytes = stats.allocated_bytes[static_cast<size_t>(Stat::AGGREGATE)].current;
      m.reserved_bytes = stats.reserved_bytes[static_cast<size_t>(Stat::AGGREGATE)].current;
      c10::cuda::CUDAGuard guard(device.index());
      size_t free = 0, total = 0;
      if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
        m.free_bytes = static_cast<int64_t>(free);
        m.total_bytes = static_cast<int64_t>(total);
      }
      out.push_back(m);
      continue;
    }
#endif
    m.allocated_bytes = host.rss;
    m.reserved_bytes = host.rss;
    m.total_bytes = host.total;
    m.free_bytes = host.available;
    out.push_back(m);
  }
  return out;
}

}  // namespace strata::runtime
