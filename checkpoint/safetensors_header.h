#pragma once
// The safetensors format's header (huggingface/safetensors README): an 8-byte little-endian length,
// then that many bytes of JSON naming each tensor's dtype, shape and [begin, end) byte offsets into the
// data section that follows. Parsed and validated here once, torch-free, for both the planner (which
// reads headers only) and the runtime's mmap reader (checkpoint/safetensors.h).

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace strata::checkpoint {

// One tensor of a header. Offsets are relative to the data section (the byte after the header).
struct SafetensorsEntry {
  std::string name;
  std::string dtype;         // the format's name: "F32", "BF16", ...
  int64_t element_size = 0;  // bytes per element of `dtype`
  std::vector<int64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;               // 8 + header length: where the data section starts in the file
  uint64_t data_size = 0;                 // bytes from data_offset to the end of the file
  std::vector<SafetensorsEntry> tensors;  // in name order
};

// The safetensors library refuses headers above 100 MB; so do we, before allocating.
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Decodes the header length from the file's first 8 bytes and checks that the header fits in a file of
// `file_size` bytes. `file` names the file in messages.
absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view file, absl::string_view first_bytes,
                                                 uint64_t file_size);

// Parses the JSON header of a file of `file_size` bytes and validates everything it claims: entries are
// objects with a known dtype, a shape of non-negative integers and data_offsets [begin, end] with
// begin <= end inside the data section, spanning exactly dtype size x shape bytes; no two tensors'
// bytes overlap. Errors are InvalidArgument "checkpoint: FILE: tensor NAME: ...".
absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file, absl::string_view header_json,
                                                         uint64_t file_size);

// Reads and parses the header of DIR/FILE without touching the data section.
absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const std::filesystem::path& dir, const std::string& file);

// The file names transformers' save_pretrained writes.
inline constexpr char kSafetensorsSingleFile[] = "model.safetensors";
inline constexpr char kSafetensorsIndexFile[] = "model.safetensors.index.json";

// The weight files of a checkpoint directory: model.safetensors, or the shards that
// model.safetensors.index.json lists (which must exist and be plain names in the directory).
struct CheckpointFiles {
  std::vector<std::string> files;                 // in first-mention order
  std::map<std::string, std::string> weight_map;  // tensor -> shard; empty for a single file
};
// nullopt when the directory holds neither (planning from config.json alone is allowed).
absl::StatusOr<std::optional<CheckpointFiles>> FindCheckpointFiles(const std::filesystem::path& dir);

}  // namespace strata::checkpoint
