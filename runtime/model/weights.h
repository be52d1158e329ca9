#pragma once
// Internal (includes ATen): weights loaded from the mapped checkpoint onto the device the plan gave
// them, in the serving dtype. Not for server/ (see runtime/executor/loaded_model.h).

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"
#include "runtime/model/quantized_linear.h"

namespace strata::runtime {

// The checkpoint reader (checkpoint/) is torch-free; the runtime names its types directly.
using checkpoint::Checkpoint;
using checkpoint::MappedFile;
using checkpoint::TensorView;

// Where a weight lives between uses (GUIDE.md, Offload).
enum class Residency {
  kResident,  // on its executing device, in the serving dtype
  kHost,      // a "cpu" entry while the executing device is a GPU: pinned host memory, copied in before use
  kDisk,      // a "disk" entry: the mapped checkpoint bytes in the file's dtype, paged in (and cast) on use
};

// A dense float32 or bfloat16 weight [N, K] of a linear layer that executes on the CPU, packed at load into
// kernels/linear.h's panels (linear.h): `data` holds its N x K values in panel order, flat. Only Linear reads it.
struct PanelWeight {
  at::Tensor data;
  int64_t out_features = 0;  // N
  int64_t in_features = 0;   // K
};

// A weight as a unit runner reads it: a tensor, a quantized linear layer's packed weight, or a CPU linear layer's
// panels. It converts to the tensor, so norms and embeddings read it as a tensor; Linear (linear.h) takes any.
struct WeightTensor {
  at::Tensor tensor;                           // undefined when packed or in panels
  std::shared_ptr<const PackedLinear> packed;  // a quantized linear layer's weight
  std::shared_ptr<const PanelWeight> panels;   // a dense linear layer's weight on the CPU

  operator const at::Tensor&() const { return tensor; }  // NOLINT: implicit by design
};

struct Weight {
  std::string name;
  at::Tensor stored;
  std::shared_ptr<const PackedLinear> packed;  // set instead of `stored` for a quantized linear layer
  Residency residency = Residency::kResident;
  at::Device exec_device = at::kCPU;
  at::ScalarType dtype = at::kFloat;          // serving dtype
  std::shared_ptr<const PanelWeight> panels;  // set instead of `stored` for a CPU linear layer (WeightLoader::Load)

  // The weight on its executing device in the serving dtype (a packed one stays packed). Resident weights are
  // returned as they are; others are copied (non_blocking from pinned memory) on the current stream.
  WeightTensor Use() const;
  bool needs_fetch() const;  // Use() copies
};

// Persistent buffers on a stage's executing device for the weights of its offloaded units (GUIDE.md, Offload):
// two slots, each the size of the stage's largest offloaded unit, allocated once. A unit's fetched weights are
// copied into a slot on the copy stream after that stream waits for the compute stream to be done with the slot's
// previous unit (an event the compute stream records), and the compute stream waits for the copy (another event):
// no allocation per use, no record_stream, at most one unit ahead of the one computing. Weights that need no fetch
// (resident ones) are passed through as they are. Without streams (the CPU) every step runs in host order.
class OffloadBuffers {
 public:
  // The bytes a slot needs for `weights`: what each weight that needs a fetch takes on its executing device in the
  // serving dtype (a packed weight's tensors as they are), each aligned to kAlignment.
  static int64_t SlotBytes(const std::vector<const Weight*>& weights);
  static constexpr int64_t kAlignment = 256;

  OffloadBuffers(at::Device device, int64_t slot_bytes);
  // Starts copying `weights` into the next slot, on `copy_stream` (nullopt: in host order, on the current stream)
  // once the compute stream has released it. Returns the slot.
  int Fill(const std::vector<const Weight*>& weights, std::optional<c10::Stream> copy_stream);
  // The slot's weights in `weights`' order, after making `compute_stream` wait for their copy.
  std::vector<WeightTensor> Take(int slot, std::optional<c10::Stream> compute_stream);
  // The unit that read the slot has been queued on `compute_stream`: the slot's next fill waits for that work.
  void Release(int slot, std::optional<c10::Stream> compute_stream);
  int64_t bytes() const { return 2 * slot_bytes_; }
  const at::Tensor& slot_buffer(int slot) const { return slots_[slot].buffer; }

 private:
  struct Slot {
    at::Tensor buffer;  // uint8 [slot_bytes] on the device
    std::vector<WeightTensor> tensors;
    std::optional<c10::Event> filled;  // recorded on the copy stream after the fill
    std::optional<c10::Event> free;    // recorded on the compute stream after the unit that read it
  };
  int64_t slot_bytes_ = 0;
  Slot slots_[2];
  int next_ = 0;
};

struct WeightLoadStats {
  int64_t copied = 0;             // tensors copied (and cast where needed) to their device
  int64_t on_disk = 0;            // "disk" entries left in the mapping
  uint64_t bytes_on_devices = 0;  // bytes allocated for weights outside the mapping
  int64_t packed = 0;             // quantized linear layers loaded packed
  int64_t panels = 0;             // dense CPU linear layers packed into panels
  int64_t fp8_scaled_mm = 0;      // of them, FP8 layers a GPU runs W8A8 (--fp8-matmul scaled_mm)
  int64_t pinned_bytes = 0;       // page-locked host memory holding offloaded weights (the pinned arena's chunks)
};

// Loads checkpoint tensors one at a time, each straight to its place: a CPU weight is copied (and cast, in
// the same pass) into 2 MiB pages of this loader's arena and its file pages released; a GPU weight is cast
// on its device; nothing builds a whole-model copy in host memory. ("disk" entries stay in the mapping.)
class WeightArena;  // weights.cc

// An uninitialised CPU tensor in a mapping of its own, returned to the system when the tensor goes: for the
// layer-sized temporaries of loading (quantized_linear.cc's codes one a byte, a packed layer before the arena takes
// it). From malloc, glibc's rising mmap threshold puts them on the heap, where the small objects each loaded layer
// leaves behind pin them: a checkpoint's RSS grew by most of its size while loading (bench/quantized_load_rss.py).
at::Tensor MappedEmpty(at::IntArrayRef shape, at::ScalarType dtype);

class WeightLoader {
 public:
  // `fp8_scaled_mm`: FP8 layers of 128 x 128 blocks that a GPU runs are marked for W8A8 (PackedLinear::scaled_mm),
  // after ProbeFp8ScaledMm passes on their device.
  WeightLoader(const Checkpoint& checkpoint, at::ScalarType dtype, bool fp8_scaled_mm = false);
  ~WeightLoader();
  // `linear`: the weight is a linear layer's [N, K], read only by Linear: a resident CPU one in a dtype the panel
  // kernels serve (PanelsServe) is packed into panels (Weight::panels).
  // `as`: another dtype than the serving one (transformers' _keep_in_fp32_modules_strict: ModelSpec::keep_float32).
  absl::StatusOr<Weight> Load(const std::string& name, Residency residency, at::Device exec_device, bool linear = false,
                              std::optional<at::ScalarType> as = std::nullopt);
  // A quantized linear layer, packed (quantized_linear.h); `name` is its dense weight's name.
  absl::StatusOr<Weight> LoadPacked(const std::string& name, const planner::QuantizedLinear& q, Residency residency,
                                    at::Device exec_device);
  // A dense checkpoint tensor copied (and cast) into `destination`, a tensor of its shape in the serving dtype on
  // any device, e.g. one expert's slice of a fused [E, ...] tensor made by Empty: no staging copy the size of the
  // fused tensor. Errors name the tensor (missing, not dense, another shape).
  absl::Status LoadInto(const std::string& name, const at::Tensor& destination);
  // An uninitialised tensor in the serving dtype on `device` (on the CPU, in the arena's 2 MiB pages, as Load's).
  at::Tensor Empty(at::IntArrayRef shape, at::Device device);
  const WeightLoadStats& stats();
  const Checkpoint& checkpoint() const { return checkpoint_; }
  at::ScalarType dtype() const { return dtype_; }  // the serving dtype
  // A packed weight loaded outside LoadPacked (gpt-oss's MXFP4 experts, moe.cc): counted in stats() as LoadPacked's.
  void CountPacked(uint64_t bytes) {
    ++stats_.packed;
    stats_.bytes_on_devices += bytes;
  }

 private:
  const Checkpoint& checkpoint_;
  at::ScalarType dtype_;
  bool fp8_scaled_mm_;
  std::vector<at::Device> probed_;  // devices ProbeFp8ScaledMm passed on
  WeightLoadStats stats_;
  std::unique_ptr<WeightArena> arena_;   // CPU weights, in 2 MiB pages
  std::unique_ptr<WeightArena> pinned_;  // "cpu" weights of a GPU-run model, page-locked chunks
};

at::ScalarType ToScalarType(checkpoint::DType dtype);

}  // namespace strata::runtime
