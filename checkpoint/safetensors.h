#pragma once
// strata's own safetensors reader: the file is memory-mapped read-only and each tensor is a view of
// its bytes in the mapping, never a copy. Headers are parsed and validated by
// checkpoint/safetensors_header.h (the same code that checks a checkpoint while planning); this adds the
// mapping and the dtypes the runtime computes in. Plain C++, no torch.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/dtype.h"

namespace strata::checkpoint {

// A whole file mapped read-only (MAP_PRIVATE, PROT_READ). Tensors viewing it keep it alive through a
// shared_ptr, so a zero-copy weight outlives the reader that created it.
class MappedFile {
 public:
  static absl::StatusOr<std::shared_ptr<const MappedFile>> Open(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& name() const { return name_; }

  // Hints the kernel to read [offset, offset + length) ahead (weights about to be read).
  void WillNeed(uint64_t offset, uint64_t length) const;
  // Drops the resident pages of [offset, offset + length) once their bytes were copied elsewhere, so a
  // checkpoint loaded onto GPUs or cast to another dtype does not stay in this process's RSS.
  void Release(uint64_t offset, uint64_t length) const;

 private:
  MappedFile(std::string name, const std::byte* data, uint64_t size)
      : name_(std::move(name)), data_(data), size_(size) {}
  std::string name_;
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// One tensor's bytes inside a mapped file.
struct TensorView {
  std::string name;
  DType dtype = DType::kFloat32;  // F32, F16 or BF16; quantized checkpoints' F8_E4M3, I32, I64, U8, I8
  std::vector<int64_t> shape;
  std::shared_ptr<const MappedFile> file;
  uint64_t offset = 0;  // from the start of the file
  uint64_t bytes = 0;

  const std::byte* data() const { return file->data() + offset; }
};

// The dtypes the runtime loads; any other is an error naming the tensor and its dtype.
absl::StatusOr<DType> RuntimeDType(const std::string& safetensors_dtype);

// One mapped .safetensors file with every header claim validated (see ParseSafetensorsHeader) and every
// tensor in a dtype the runtime computes in.
absl::StatusOr<std::vector<TensorView>> OpenSafetensors(const std::filesystem::path& dir, const std::string& file);

// All weight files of a checkpoint directory (model.safetensors, or the shards of
// model.safetensors.index.json), mapped. A tensor in two files, or not where the index says, is an error.
class Checkpoint {
 public:
  static absl::StatusOr<Checkpoint> Open(const std::filesystem::path& dir);

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  // nullptr when the checkpoint does not hold `name`.
  const TensorView* Find(const std::string& name) const;
  uint64_t total_bytes() const;  // sum of the mapped files' sizes

 private:
  std::map<std::string, TensorView> tensors_;
  std::vector<std::shared_ptr<const MappedFile>> files_;
};

}  // namespace strata::checkpoint
