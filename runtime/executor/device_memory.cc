#include "runtime/executor/device_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "runtime/executor/group.h"
#include "runtime/executor/pipeline.h"

// The CUDA allocator through c10's device-generic interface: libc10_cuda is loaded at run time (cuda_loader.h).
#include <c10/core/CachingDeviceAllocator.h>

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

int64_t AnonHugePageBytes() {
  std::ifstream rollup("/proc/self/smaps_rollup");
  std::string line;
  while (std::getline(rollup, line)) {
    int64_t kib = 0;
    if (std::sscanf(line.c_str(), "AnonHugePages: %ld kB", &kib) == 1) return kib * 1024;
  }
  return 0;
}

std::vector<DeviceMemory> MeasureDeviceMemory(LoadedModel& model) {
  // The physical device of each plan device: from the stages that run there ("cpu"/"disk" entries
  // without a stage of their own run on the main device, but their bytes live in host memory).
  std::map<std::string, at::Device> physical;
  for (const Stage& stage : model.pipeline().stages()) physical.emplace(stage.label, stage.device);
  const HostMemory host = ReadHostMemory();
  const planner::Plan& plan = model.report().plan;
  const int here = model.pipeline().node();
  std::map<int, std::vector<DeviceMemory>> reported;  // a group's leader: what each node's heartbeat measured
  std::vector<DeviceMemory> out;
  for (const planner::DeviceUsage& usage : plan.devices) {
    DeviceMemory m;
    m.device = usage.device.ToString();
    // Another node's device: as that node last measured it (its heartbeat), else unknown ("node N", zeros).
    if (const int node = planner::NodeOf(plan, usage.device); node != here) {
      if (model.group() != nullptr && !reported.contains(node)) reported[node] = model.group()->ReportedMemory(node);
      const std::vector<DeviceMemory>& theirs = reported[node];
      auto it = std::find_if(theirs.begin(), theirs.end(), [&](const DeviceMemory& d) { return d.device == m.device; });
      if (it != theirs.end()) {
        out.push_back(*it);
      } else {
        m.physical_device = absl::StrCat("node ", node);
        out.push_back(m);
      }
      continue;
    }
    at::Device device = at::kCPU;
    if (usage.device.is_gpu()) {
      if (auto it = physical.find(m.device); it != physical.end()) device = it->second;
    }
    m.physical_device = device.str();
    if (device.is_cuda()) {
      c10::DeviceAllocator* allocator = c10::getDeviceAllocator(at::kCUDA);
      const auto stats = allocator->getDeviceStats(device.index());
      using Stat = c10::CachingAllocator::StatType;
      m.allocated_bytes = stats.allocated_bytes[static_cast<size_t>(Stat::AGGREGATE)].current;
      m.reserved_bytes = stats.reserved_bytes[static_cast<size_t>(Stat::AGGREGATE)].current;
      const auto [free, total] = allocator->getMemoryInfo(device.index());
      m.free_bytes = static_cast<int64_t>(free);
      m.total_bytes = static_cast<int64_t>(total);
      out.push_back(m);
      continue;
    }
    m.allocated_bytes = host.rss;
    m.reserved_bytes = host.rss;
    m.total_bytes = host.total;
    m.free_bytes = host.available;
    out.push_back(m);
  }
  return out;
}

int64_t PageOutLibraryCode(const std::string& library) {
#ifdef MADV_PAGEOUT
  std::ifstream maps("/proc/self/maps");
  int64_t asked = 0;
  for (std::string line; std::getline(maps, line);) {
    // "start-end perms offset dev inode path"
    std::istringstream fields(line);
    std::string range, perms, offset, dev, inode, path;
    if (!(fields >> range >> perms >> offset >> dev >> inode >> path)) continue;
    // Code and read-only data (the operators' schemas and tables): pages backed by the file, clean.
    if (perms.size() < 3 || perms[0] != 'r' || perms[1] != '-' || path.find(library) == std::string::npos) continue;
    const size_t dash = range.find('-');
    if (dash == std::string::npos) continue;
    const uintptr_t begin = std::stoull(range.substr(0, dash), nullptr, 16);
    const uintptr_t end = std::stoull(range.substr(dash + 1), nullptr, 16);
    if (end <= begin) continue;
    if (madvise(reinterpret_cast<void*>(begin), end - begin, MADV_PAGEOUT) == 0) {
      asked += static_cast<int64_t>(end - begin);
    }
  }
  return asked;
#else
  (void)library;
  return 0;
#endif
}

}  // namespace strata::runtime
