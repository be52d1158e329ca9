// Test-only probe of the device sampler for tests/sampling_parity: reads one micro-batch as JSON on
// stdin and prints what the sampler made of it, so pytest can compare it with transformers live.
//
//   in:  {"logits": [[float|null, ...], ...], "rows": [{"temperature", "top_k", "top_p",
//         "repetition_penalty", "uniform", "top_logprobs", "context": [ids]}, ...], "device": "cpu"}
//        (null logits are -inf; every row field is optional, defaulting as RowSampling does)
//   out: {"scores": [[float|null]], "ids": [int], "logprobs": [float], "top": [[[id, logprob], ...]]}
//        scores: ProcessedScores (removed tokens, -inf, as null); ids etc.: SampleAsync + FinishSamples.
// Exit 0, or 2 with a message on stderr for bad input, 1 when the sampler fails.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>

#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "runtime/executor/sampler.h"

namespace {

using nlohmann::json;
using strata::runtime::BatchRow;

int Fail(int code, const std::string& message) {
  std::cerr << "strata_sampler_probe: " << message << "\n";
  return code;
}

}  // namespace

int main() {
  json in;
  try {
    in = json::parse(std::cin);
  } catch (const json::exception& e) {
    return Fail(2, std::string("stdin is not JSON: ") + e.what());
  }
  std::vector<BatchRow> rows;
  at::Tensor logits;
  std::string device = "cpu";
  try {
    const json& values = in.at("logits");
    const json& params = in.at("rows");
    if (!values.is_array() || values.empty() || values.size() != params.size()) {
      return Fail(2, "logits and rows must be non-empty arrays of the same length");
    }
    const int64_t vocab = static_cast<int64_t>(values.at(0).size());
    logits = at::empty({static_cast<int64_t>(values.size()), vocab}, at::kFloat);
    float* out = logits.data_ptr<float>();
    for (size_t r = 0; r < values.size(); ++r) {
      if (static_cast<int64_t>(values[r].size()) != vocab) {
        return Fail(2, "logits row " + std::to_string(r) + " has " + std::to_string(values[r].size()) +
                           " values, row 0 has " + std::to_string(vocab));
      }
      for (int64_t v = 0; v < vocab; ++v) {
        const json& x = values[r][v];
        out[r * vocab + v] = x.is_null() ? -std::numeric_limits<float>::infinity() : x.get<float>();
      }
    }
    for (const json& p : params) {
      BatchRow row;
      row.samples = true;
      row.sampling.temperature = p.value("temperature", 0.0f);
      row.sampling.top_k = p.value("top_k", 0);
      row.sampling.top_p = p.value("top_p", 1.0f);
      row.sampling.repetition_penalty = p.value("repetition_penalty", 1.0f);
      row.sampling.uniform = p.value("uniform", 0.0);
      row.sampling.top_logprobs = p.value("top_logprobs", 0);
      row.penalty_tokens = p.value("context", std::vector<int32_t>{});  // the whole context: a first step
      row.penalty_reset = true;
      rows.push_back(std::move(row));
    }
    device = in.value("device", std::string("cpu"));
  } catch (const json::exception& e) {
    return Fail(2, std::string("bad input: ") + e.what());
  }
  try {
    const at::Device target(device);
    logits = logits.to(target);
    std::vector<const BatchRow*> pointers;
    for (const BatchRow& row : rows) pointers.push_back(&row);
    const strata::runtime::SamplingInputs inputs = strata::runtime::StageSamplingInputs(pointers, target.is_cuda());
    at::Tensor scores = strata::runtime::ProcessedScores(logits, inputs).to(at::kCPU).contiguous();
    strata::runtime::PendingSamples pending = strata::runtime::SampleAsync(logits, inputs);
    const std::vector<strata::runtime::GeneratedToken> tokens = strata::runtime::FinishSamples(pending, inputs);

    json result;
    json& score_rows = result["scores"] = json::array();
    const int64_t vocab = scores.size(1);
    const float* s = scores.data_ptr<float>();
    for (int64_t r = 0; r < scores.size(0); ++r) {
      json row = json::array();
      for (int64_t v = 0; v < vocab; ++v) {
        const float x = s[r * vocab + v];
        row.push_back(x == -std::numeric_limits<float>::infinity() ? json(nullptr) : json(static_cast<double>(x)));
      }
      score_rows.push_back(std::move(row));
    }
    result["ids"] = json::array();
    result["logprobs"] = json::array();
    result["top"] = json::array();
    for (const auto& token : tokens) {
      result["ids"].push_back(token.id);
      result["logprobs"].push_back(token.logprob);
      json top = json::array();
      for (const auto& [id, logprob] : token.top) top.push_back({id, logprob});
      result["top"].push_back(std::move(top));
    }
    std::cout << result.dump() << "\n";
  } catch (const c10::Error& e) {
    return Fail(1, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return Fail(1, e.what());
  }
  return 0;
}
