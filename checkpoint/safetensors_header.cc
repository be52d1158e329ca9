// Safetensors header parsing and validation, shared by the planner's header check and the runtime's
// mmap reader so that both accept and reject exactly the same files.

#include "checkpoint/safetensors_header.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_reader.h"
#include "base/json.h"
#include "nlohmann/json.hpp"

namespace strata::checkpoint {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// Element sizes of the safetensors dtypes with whole-byte elements.
constexpr std::pair<absl::string_view, int64_t> kSafetensorsDTypes[] = {
    {"BOOL", 1}, {"U8", 1},   {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1}, {"I16", 2}, {"U16", 2},
    {"F16", 2},  {"BF16", 2}, {"I32", 4}, {"U32", 4},     {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8},
};

absl::Status CheckpointError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("checkpoint: ", what));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::optional<uint64_t> AsNonNegative(const json& v) {
  if (!v.is_number_integer()) return std::nullopt;
  if (!v.is_number_unsigned() && v.get<int64_t>() < 0) return std::nullopt;
  return v.get<uint64_t>();
}

absl::StatusOr<SafetensorsEntry> ParseEntry(absl::string_view file, const std::string& name, const json& entry,
                                            uint64_t data_size) {
  const std::string where = absl::StrCat(file, ": tensor ", name);
  if (!entry.is_object()) return CheckpointError(absl::StrCat(where, ": header entry is not an object"));

  SafetensorsEntry tensor;
  tensor.name = name;
  auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return CheckpointError(absl::StrCat(where, ": header entry has no dtype string"));
  }
  tensor.dtype = dtype_it->get<std::string>();
  for (const auto& [known, size] : kSafetensorsDTypes) {
    if (known == tensor.dtype) tensor.element_size = size;
  }
  if (tensor.element_size == 0) {
    return CheckpointError(absl::StrCat(where, ": unknown safetensors dtype \"", tensor.dtype, "\""));
  }

  auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return CheckpointError(absl::StrCat(where, ": header entry has no shape array"));
  }
  for (const json& d : *shape_it) {
    std::optional<uint64_t> dim = AsNonNegative(d);
    if (!dim || *dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return CheckpointError(absl::StrCat(where, ": shape ", shape_it->dump(), " is not non-negative integers"));
    }
    tensor.shape.push_back(static_cast<int64_t>(*dim));
  }
  // The bytes dtype x shape needs; `too_large` when that overflows 64 bits (no file can hold it then).
  uint64_t bytes = static_cast<uint64_t>(tensor.element_size);
  bool too_large = false;
  if (std::find(tensor.shape.begin(), tensor.shape.end(), 0) != tensor.shape.end()) {
    bytes = 0;
  } else {
    for (int64_t dim : tensor.shape) too_large = too_large || __builtin_mul_overflow(bytes, dim, &bytes);
  }

  auto offsets_it = entry.find("data_offsets");
  std::optional<uint64_t> begin, end;
  if (offsets_it != entry.end() && offsets_it->is_array() && offsets_it->size() == 2) {
    begin = AsNonNegative((*offsets_it)[0]);
    end = AsNonNegative((*offsets_it)[1]);
  }
  if (!begin || !end || *begin > *end) {
    return CheckpointError(absl::StrCat(where, ": header entry needs data_offsets [begin, end] with begin <= end"));
  }
  if (*end > data_size) {
    return CheckpointError(absl::StrCat(where, ": data_offsets end ", *end, " is past the ", data_size,
                                        " data bytes in the file (truncated file?)"));
  }
  if (too_large || *end - *begin != bytes) {
    return CheckpointError(absl::StrCat(where, ": data_offsets span ", *end - *begin, " bytes, but ", tensor.dtype, " ",
                                        ShapeString(tensor.shape), " needs ",
                                        too_large ? std::string("more than 2^64") : absl::StrCat(bytes)));
  }
  tensor.begin = *begin;
  tensor.end = *end;
  return tensor;
}

}  // namespace

absl::StatusOr<uint64_t> SafetensorsHeaderLength(absl::string_view file, absl::string_view first_bytes,
                                                 uint64_t file_size) {
  if (file_size < 8 || first_bytes.size() < 8) {
    return CheckpointError(absl::StrCat(file, ": ", file_size, " bytes is too short for a safetensors header"));
  }
  uint64_t header_length = 0;
  for (int i = 7; i >= 0; --i) header_length = (header_length << 8) | static_cast<unsigned char>(first_bytes[i]);
  if (header_length > file_size - 8 || header_length > kMaxSafetensorsHeaderBytes) {
    return CheckpointError(absl::StrCat(file, ": header length ", header_length, " exceeds the file size (", file_size,
                                        " bytes) or the 100 MB limit"));
  }
  return header_length;
}

absl::StatusOr<SafetensorsHeader> ParseSafetensorsHeader(absl::string_view file, absl::string_view header_json,
                                                         uint64_t file_size) {
  absl::StatusOr<json> parsed_or =
      base::ParseJson(std::string_view(header_json.data(), header_json.size()), base::kMaxJsonDepth,
                      absl::StrCat("checkpoint: ", file, ": the header"));
  if (!parsed_or.ok()) return parsed_or.status();
  const json& parsed = *parsed_or;
  if (!parsed.is_object()) return CheckpointError(absl::StrCat(file, ": the header is not a JSON object"));

  SafetensorsHeader header;
  header.data_offset = 8 + header_json.size();
  header.data_size = file_size - header.data_offset;
  for (const auto& [name, entry] : parsed.items()) {
    if (name == "__metadata__") continue;
    absl::StatusOr<SafetensorsEntry> tensor = ParseEntry(file, name, entry, header.data_size);
    if (!tensor.ok()) return tensor.status();
    header.tensors.push_back(*std::move(tensor));
  }

  // Two tensors sharing bytes would alias in memory once mapped: the format forbids it, and a loader that
  // trusted such a file could hand one parameter another's data. Empty tensors occupy no bytes.
  std::vector<const SafetensorsEntry*> by_offset;
  for (const SafetensorsEntry& t : header.tensors) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const SafetensorsEntry* a, const SafetensorsEntry* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const SafetensorsEntry& a = *by_offset[i - 1];
    const SafetensorsEntry& b = *by_offset[i];
    if (b.begin < a.end) {
      return CheckpointError(absl::StrCat(file, ": tensor ", b.name, ": data_offsets [", b.begin, ", ", b.end,
                                          ") overlap tensor ", a.name, " [", a.begin, ", ", a.end, ")"));
    }
  }
  return header;
}

absl::StatusOr<SafetensorsHeader> ReadSafetensorsHeader(const fs::path& dir, const std::string& file) {
  const fs::path path = dir / file;
  std::error_code ec;
  const uint64_t file_size = fs::file_size(path, ec);
  if (ec) return CheckpointError(absl::StrCat(file, ": cannot read the file (", ec.message(), ")"));
  std::ifstream in(path, std::ios::binary);
  char length_bytes[8] = {};
  if (file_size >= 8 && (!in || !in.read(length_bytes, 8))) {
    return CheckpointError(absl::StrCat(file, ": cannot read the header length"));
  }
  absl::StatusOr<uint64_t> header_length =
      SafetensorsHeaderLength(file, absl::string_view(length_bytes, file_size >= 8 ? 8 : 0), file_size);
  if (!header_length.ok()) return header_length.status();
  std::string text(*header_length, '\0');
  if (!in.read(text.data(), static_cast<std::streamsize>(*header_length))) {
    return CheckpointError(absl::StrCat(file, ": cannot read the ", *header_length, "-byte header"));
  }
  return ParseSafetensorsHeader(file, text, file_size);
}

absl::StatusOr<std::optional<CheckpointFiles>> FindCheckpointFiles(const fs::path& dir) {
  CheckpointFiles found;
  std::error_code ec;
  if (base::PathMayExist(dir / kSafetensorsIndexFile)) {
    absl::StatusOr<std::string> text = base::ReadRegularFile(dir / kSafetensorsIndexFile, base::kMaxIndexFileBytes);
    if (!text.ok()) return CheckpointError(text.status().message());
    const std::string index_path = (dir / kSafetensorsIndexFile).string();
    absl::StatusOr<json> index_or = base::ParseJson(*text, base::kMaxJsonDepth, index_path);
    if (!index_or.ok()) return CheckpointError(index_or.status().message());
    const json& index = *index_or;
    auto map_it = index.is_object() ? index.find("weight_map") : index.end();
    if (!index.is_object() || map_it == index.end() || !map_it->is_object()) {
      return CheckpointError(absl::StrCat(kSafetensorsIndexFile, ": expected an object with a \"weight_map\" object"));
    }
    std::set<std::string> seen;
    for (const auto& [tensor, shard] : map_it->items()) {
      if (!shard.is_string()) {
        return CheckpointError(
            absl::StrCat(kSafetensorsIndexFile, ": weight_map[\"", tensor, "\"] is not a file name"));
      }
      const std::string file = shard.get<std::string>();
      // Shards are plain names in the directory; anything else would read outside the checkpoint.
      if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..") {
        return CheckpointError(absl::StrCat(kSafetensorsIndexFile, ": weight_map[\"", tensor, "\"] = \"", file,
                                            "\" is not a file name in the checkpoint directory"));
      }
      found.weight_map[tensor] = file;
      if (seen.insert(file).second) found.files.push_back(file);
    }
    for (const std::string& file : found.files) {
      if (!fs::is_regular_file(dir / file, ec)) {
        return CheckpointError(absl::StrCat("shard ", file, " listed in ", kSafetensorsIndexFile, " is missing"));
      }
    }
    return std::optional<CheckpointFiles>(std::move(found));
  }
  if (fs::is_regular_file(dir / kSafetensorsSingleFile, ec)) {
    found.files.push_back(std::string(kSafetensorsSingleFile));
    return std::optional<CheckpointFiles>(std::move(found));
  }
  return std::optional<CheckpointFiles>();
}

}  // namespace strata::checkpoint
