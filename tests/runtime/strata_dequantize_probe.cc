// Test-only: strata's dequantization of every quantized linear layer of a checkpoint, written as a safetensors
// file, for tests/runtime_parity/test_quantized_parity.py to compare bit for bit with the weights transformers
// dequantizes on load.
//
//   strata_dequantize_probe CHECKPOINT_DIR OUT.safetensors float32|bfloat16 [kernels|aten]
//
// "kernels" (the default) dequantizes on the CPU with kernels/quantized.h, "aten" with the ATen expressions a GPU
// runs (DequantizeWithAten).

#include <ATen/ops/empty.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>

#include "checkpoint/safetensors.h"
#include "nlohmann/json.hpp"
#include "planner/model_spec.h"
#include "runtime/model/quantized_linear.h"

namespace {

int Fail(const std::string& message) {
  std::cerr << "strata_dequantize_probe: " << message << "\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
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
    header[name] = {{"dtype", dtype == at::kBFloat16 ? "BF16" : "F32"},
                    {"shape", {w.size(0), w.size(1)}},
                    {"data_offsets", {data.size(), data.size() + w.nbytes()}}};
    data.append(static_cast<const char*>(w.data_ptr()), w.nbytes());
  }
  std::string text = header.dump();
  while ((text.size() + 8) % 8 != 0) text.push_back(' ');
  std::ofstream out(out_path, std::ios::binary);
  const uint64_t length = text.size();
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << text << data;
  return out.good() ? 0 : Fail("cannot write " + out_path);
}
