// Test-only: strata's dequantization of every quantized linear layer of a checkpoint, written as a safetensors
// file, for tests/runtime_parity/test_quantized_parity.py to compare bit for bit with the weights transformers
// dequantizes on load.
//
//   strata_dequantize_probe CHECKPOINT_DIR OUT.safetensors float32|bfloat16 [kernels|aten]
//   strata_dequantize_probe mxfp4 DIR OUT.safetensors float32|bfloat16 [kernels|aten] [unchecked]
//
// "kernels" (the default) dequantizes on the CPU with kernels/quantized.h, "aten" with the ATen expressions a GPU
// runs (DequantizeWithAten).
//
// mxfp4: every `X_blocks` uint8 [E, N, K / 32, 16] of DIR's safetensors with its `X_scales` [E, N, K / 32] (gpt-oss's
// experts, for tests/runtime_parity/test_mxfp4_parity.py), each expert through runtime::Mxfp4Linear and
// Dequantize; written as X [E, N, K]. "unchecked" builds the PackedLinear without Mxfp4Linear (scale bytes past 252,
// which it refuses, to compare their infinities with transformers'). A refused tensor exits 2 with the error.

#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/stack.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "nlohmann/json.hpp"
#include "planner/model_spec.h"
#include "runtime/model/quantized_linear.h"
#include "runtime/model/weights.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "strata_dequantize_probe: " << message << "\n";
  return 2;
}

// Appends tensor `name` to a safetensors header and data.
void Append(nlohmann::json& header, std::string& data, const std::string& name, const at::Tensor& t) {
  std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
  header[name] = {{"dtype", t.scalar_type() == at::kBFloat16 ? "BF16" : "F32"},
                  {"shape", shape},
                  {"data_offsets", {data.size(), data.size() + t.nbytes()}}};
  data.append(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

int Write(const std::string& out_path, const nlohmann::json& header, const std::string& data) {
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::ofstream out(out_path, std::ios::binary);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << text << data;
  return out.good() ? 0 : Fail("cannot write " + out_path);
}

// A CPU tensor over a mapped tensor's bytes, in its stored dtype (Mxfp4Linear checks it).
at::Tensor Mapped(const strata::checkpoint::TensorView& view) {
  return at::from_blob(const_cast<std::byte*>(view.data()), view.shape,
                       at::TensorOptions().dtype(strata::runtime::ToScalarType(view.dtype)));
}

int Mxfp4(int argc, char** argv) {
  if (argc < 5) return Fail("usage: mxfp4 DIR OUT.safetensors float32|bfloat16 [kernels|aten] [unchecked]");
  const std::string dir = argv[2];
  const std::string out_path = argv[3];
  const at::ScalarType dtype = std::string(argv[4]) == "bfloat16" ? at::kBFloat16 : at::kFloat;
  const bool aten = argc > 5 && std::string(argv[5]) == "aten";
  const bool unchecked = argc > 6 && std::string(argv[6]) == "unchecked";
  absl::StatusOr<strata::checkpoint::Checkpoint> checkpoint = strata::checkpoint::Checkpoint::Open(dir);
  if (!checkpoint.ok()) return Fail(std::string(checkpoint.status().message()));
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  const std::string suffix = "_blocks";
  for (const auto& [name, view] : checkpoint->tensors()) {
    if (name.size() <= suffix.size() || name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string base = name.substr(0, name.size() - suffix.size());
    const strata::checkpoint::TensorView* scales = checkpoint->Find(base + "_scales");
    if (scales == nullptr) return Fail(base + "_scales is missing");
    const at::Tensor blocks = Mapped(view), exponents = Mapped(*scales);
    if (blocks.dim() < 1 || exponents.dim() < 1 || exponents.size(0) != blocks.size(0)) {
      return Fail(base + ": blocks and scales do not have the same experts");
    }
    std::vector<at::Tensor> experts;
    for (int64_t e = 0; e < blocks.size(0); ++e) {
      const std::string expert = base + "[" + std::to_string(e) + "]";
      strata::runtime::PackedLinear w;
      if (unchecked) {
        w.kind = strata::runtime::PackedLinear::Kind::kMxfp4;
        w.out_features = blocks.size(1);
        w.in_features = blocks.size(2) * 32;
        w.group = 32;
        w.data = blocks[e];
        w.scale = exponents[e];
      } else {
        absl::StatusOr<strata::runtime::PackedLinear> packed =
            strata::runtime::Mxfp4Linear(blocks[e], exponents[e], expert);
        if (!packed.ok()) return Fail(std::string(packed.status().message()));
        w = *std::move(packed);
      }
      experts.push_back(aten ? strata::runtime::DequantizeWithAten(w, dtype) : strata::runtime::Dequantize(w, dtype));
    }
    Append(header, data, base, at::stack(experts).contiguous());
  }
  return Write(out_path, header, data);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "mxfp4") return Mxfp4(argc, argv);
  if (argc < 4) return Fail("usage: CHECKPOINT_DIR OUT.safetensors float32|bfloat16 [kernels|aten]");
  const std::string dir = argv[1];
  const std::string out_path = argv[2];
  const std::string dtype_name = argv[3];
  const bool aten = argc > 4 && std::string(argv[4]) == "aten";
  const at::ScalarType dtype = dtype_name == "bfloat16" ? at::kBFloat16 : at::kFloat;
  absl::StatusOr<strata::planner::ModelSpec> spec = strata::planner::LoadModelSpec(dir, std::nullopt);
  if (!spec.ok()) return Fail(std::string(spec.status().message()));
  if (!spec->quantization) return Fail("the checkpoint is not quantized");
  absl::StatusOr<strata::checkpoint::Checkpoint> checkpoint = strata::checkpoint::Checkpoint::Open(dir);
  if (!checkpoint.ok()) return Fail(std::string(checkpoint.status().message()));

  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, q] : spec->quantization->linears) {
    absl::StatusOr<strata::runtime::PackedLinear> packed =
        strata::runtime::LoadPackedLinear(*checkpoint, q, at::kCPU, /*pinned=*/false);
    if (!packed.ok()) return Fail(std::string(packed.status().message()));
    const at::Tensor w =
        (aten ? strata::runtime::DequantizeWithAten(*packed, dtype) : strata::runtime::Dequantize(*packed, dtype))
            .contiguous();
    Append(header, data, name, w);
  }
  return Write(out_path, header, data);
}
