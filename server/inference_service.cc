#include "server/inference_service.h"

#include <grpc/grpc_security_constants.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/flags.h"
#include "server/generate_reactor.h"
#include "server/generate_validation.h"
#include "server/grpc_handoff.h"
#include "server/grpc_status.h"

namespace strata::server {
namespace {

std::string BufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// strata_structured_requests_total's kind of a request's constraint.
const char* StructuredKindName(v1::GenerateRequest::StructuredOutputCase field) {
  using Kind = structured::ConstraintKind;
  switch (field) {
    case v1::GenerateRequest::kJsonSchema:
      return structured::ConstraintKindName(Kind::kJsonSchema);
    case v1::GenerateRequest::kJsonObject:
      return structured::ConstraintKindName(Kind::kJsonObject);
    case v1::GenerateRequest::kRegex:
      return structured::ConstraintKindName(Kind::kRegex);
    case v1::GenerateRequest::kChoice:
      return structured::ConstraintKindName(Kind::kChoice);
    case v1::GenerateRequest::kGrammar:
      return structured::ConstraintKindName(Kind::kGrammar);
    case v1::GenerateRequest::kStructuralTag:
      return structured::ConstraintKindName(Kind::kStructuralTag);
    case v1::GenerateRequest::STRUCTURED_OUTPUT_NOT_SET:
      break;
  }
  return "none";
}

}  // namespace

v1::GetDeviceMapResponse DeviceMapResponse(const ServedPlan& served,
                                           const std::vector<runtime::DeviceMemory>* measured) {
  const planner::Plan& plan = served.plan;
  v1::GetDeviceMapResponse response;
  auto& device_map = *response.mutable_device_map();
  for (const auto& [module, device] : plan.device_map) {
    device_map[module] = device.ToString();
  }
  response.set_strategy(std::string(planner::StrategyName(plan.strategy)));
  for (const planner::DeviceUsage& usage : plan.devices) {
    v1::DeviceUsage& out = *response.add_devices();
    out.set_device(usage.device.ToString());
    out.set_budget_bytes(usage.budget_bytes);
    out.set_planned_bytes(usage.planned_bytes);
    out.set_kv_cache_bytes(usage.kv_cache_bytes);
    out.set_runtime_reserve_bytes(usage.runtime_reserve.total());
    out.set_node(planner::NodeOf(plan, usage.device));
    if (usage.runtime_reserve.total() > 0) out.set_runtime_reserve(usage.runtime_reserve.Describe());
    if (std::find(served.kv_devices.begin(), served.kv_devices.end(), out.device()) != served.kv_devices.end()) {
      out.set_kv_cache_capacity_tokens(served.kv_cache_blocks * served.kv_block_tokens);
    }
    if (measured == nullptr) continue;
    for (const runtime::DeviceMemory& m : *measured) {
      if (m.device != out.device()) continue;
      v1::DeviceMemory& mem = *out.mutable_measured();
      mem.set_physical_device(m.physical_device);
      mem.set_allocated_bytes(m.allocated_bytes);
      mem.set_reserved_bytes(m.reserved_bytes);
      mem.set_total_bytes(m.total_bytes);
      mem.set_free_bytes(m.free_bytes);
    }
  }
  for (const planner::Stage& stage : plan.stages) {
    v1::Stage& out = *response.add_stages();
    out.set_device(stage.device.ToString());
    out.set_node(planner::NodeOf(plan, stage.device));
    for (const std::string& module : stage.modules) out.add_modules(module);
  }
  response.set_architecture(served.spec.architecture);
  response.set_dtype(std::string(planner::DTypeName(served.spec.dtype)));
  response.set_kv_cache_tokens(served.kv_cache_tokens);
  response.set_kv_cache_blocks(served.kv_cache_blocks);
  response.set_kv_block_tokens(served.kv_block_tokens);
  if (plan.inventory) {
    for (size_t i = 0; i < plan.inventory->gpus.size(); ++i) {
      v1::InventoryDevice& out = *response.add_inventory();
      out.set_device(std::to_string(i));
      out.set_free_bytes(plan.inventory->gpus[i].free_bytes);
      out.set_total_bytes(plan.inventory->gpus[i].total_bytes);
    }
    v1::InventoryDevice& cpu = *response.add_inventory();
    cpu.set_device("cpu");
    cpu.set_free_bytes(plan.inventory->host_available_bytes);
  }
  for (const std::string& warning : plan.warnings) response.add_warnings(warning);
  if (served.draft != nullptr) {
    // The draft's devices are measured as the model's are (MeasureDeviceMemory covers the process's devices).
    *response.mutable_draft() = DeviceMapResponse(*served.draft, measured);
  }
  return response;
}

void InferenceService::ServePlan(const ServedPlan* plan) {
  std::lock_guard lock(mutex_);
  plan_ = plan;
  plan_response_ = DeviceMapResponse(*plan);
}

void InferenceService::ServeModel(ServedModel* model) {
  std::lock_guard lock(mutex_);
  model_ = model;
  plan_ = &model->plan();
}

int64_t InferenceService::BeginDrain(std::function<void()> on_drained) {
  // Under the mutex, as Generate adds its calls: none is added once this returns.
  std::lock_guard lock(mutex_);
  draining_ = true;
  return in_flight_.BeginDrain(std::move(on_drained));
}

void InferenceService::Stop() {
  std::lock_guard lock(mutex_);
  draining_ = true;
  model_ = nullptr;
}

grpc::Status InferenceService::Authenticate(const grpc::CallbackServerContext& context, const char* method) const {
  if (tls_only_) {
    const std::vector<grpc::string_ref> security =
        context.auth_context()->FindPropertyValues(GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
    if (security.empty() || security.front() != GRPC_SSL_TRANSPORT_SECURITY_TYPE) {
      return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                          "this port is plaintext for health probes (--health-listen): call strata's methods over "
                          "TLS on --listen");
    }
  }
  if (api_keys_ == nullptr || open_methods_.contains(method)) return grpc::Status::OK;
  std::vector<absl::string_view> authorization;
  const auto [begin, end] = context.client_metadata().equal_range("authorization");
  for (auto it = begin; it != end; ++it) authorization.emplace_back(it->second.data(), it->second.size());
  const absl::Status verdict = CheckAuthorization(*api_keys_, authorization);
  if (verdict.ok()) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, std::string(verdict.message()));
}

absl::StatusOr<ServedModel*> InferenceService::ModelForGeneration() {
  std::lock_guard lock(mutex_);
  if (draining_) return absl::UnavailableError("the server is draining");
  if (plan_ != nullptr && model_ == nullptr && plan_response_.has_value()) {
    return absl::FailedPreconditionError("the server only plans: --model DIR holds no safetensors weights");
  }
  if (model_ == nullptr) return absl::UnavailableError("the model is still loading");
  return model_;
}

absl::Status InferenceService::SubmitUnlessDraining(ServedModel* model, const std::function<absl::Status()>& submit) {
  // Under the mutex: a drain that has begun counts this generation, or it is refused; Stop() cannot take
  // the engine away during the hand-off. `model` itself lives until the server has shut down.
  std::lock_guard lock(mutex_);
  if (draining_) {
    return absl::UnavailableError(model_ == model ? "the server is draining" : "the server is shutting down");
  }
  return submit();
}

grpc::ServerUnaryReactor* InferenceService::GetDeviceMap(grpc::CallbackServerContext* context,
                                                         const v1::GetDeviceMapRequest* /*request*/,
                                                         v1::GetDeviceMapResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  // The key first: the plan shows the host's memory.
  if (grpc::Status refusal = Authenticate(*context, kGetDeviceMapMethod); !refusal.ok()) {
    {
      std::lock_guard lock(mutex_);
      if (metrics_ != nullptr) metrics_->RecordUnauthenticated(Api::kGrpc);
    }
    reactor->Finish(refusal);
    return reactor;
  }
  std::lock_guard lock(mutex_);
  if (plan_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
  } else if (model_ != nullptr) {
    // Memory is measured per call: it changes as the caches and allocators fill.
    const std::vector<runtime::DeviceMemory> measured = runtime::MeasureDeviceMemory(model_->model());
    *response = DeviceMapResponse(*plan_, &measured);
    reactor->Finish(grpc::Status::OK);
  } else {
    if (plan_response_) *response = *plan_response_;
    reactor->Finish(plan_response_ ? grpc::Status::OK : grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down"));
  }
  return reactor;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* InferenceService::Generate(grpc::CallbackServerContext* context,
                                                                       const grpc::ByteBuffer* request) {
  // Only the checks of the server's state and the hand-off to the engine hold the mutex. Validation and
  // tokenization run off it: here for a small request, on the admission pool for a large one.
  grpc::Status refusal = Authenticate(*context, kGenerateMethod);
  ServedModel* model = nullptr;
  Metrics* metrics = this->metrics();
  // The key first: a caller without one learns nothing of the server's state.
  if (refusal.ok()) {
    absl::StatusOr<ServedModel*> serving = ModelForGeneration();
    if (serving.ok()) {
      model = *serving;
    } else {
      refusal = ToGrpcStatus(serving.status());
    }
  }
  auto* reactor = new GenerateReactor(context, metrics, &open_streams_, limits_.max_stream_buffer_bytes);
  if (refusal.ok() && reactor->open_streams() > limits_.max_streams) {
    refusal = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                           absl::StrCat(reactor->open_streams() - 1, " Generate calls are open, the server's limit is ",
                                        limits_.max_streams));
  }
  const int64_t request_bytes = static_cast<int64_t>(request->Length());
  if (refusal.ok() && request_bytes > limits_.max_message_bytes) {
    refusal = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                           absl::StrCat("request: ", request_bytes, " bytes, more than the server's limit of ",
                                        limits_.max_message_bytes, " bytes"));
  }
  if (!refusal.ok()) {
    reactor->Refuse(refusal);
    HandToGrpc(reactor);
    return reactor;
  }
  if (request_bytes <= kInlineAdmissionBytes) {
    Admit(reactor, model, BufferToString(*request));
  } else {
    // Off gRPC's threads: they serve every other call (health checks too). The ByteBuffer copy shares the
    // received slices; the reactor stays alive until it is refused or its generation ends.
    pool_->Post([this, reactor, model, bytes = grpc::ByteBuffer(*request)] {
      if (reactor->abandoned()) {
        reactor->Refuse(grpc::Status::CANCELLED);
        return;
      }
      Admit(reactor, model, BufferToString(bytes));
    });
  }
  HandToGrpc(reactor);
  return reactor;
}

void InferenceService::Admit(GenerateReactor* reactor, ServedModel* model, std::string_view wire) {
  absl::StatusOr<v1::GenerateRequest> request = ParseGenerateRequest(wire);
  if (!request.ok()) {
    reactor->Refuse(ToGrpcStatus(request.status()));
    return;
  }
  if (request->structured_output_case() == v1::GenerateRequest::STRUCTURED_OUTPUT_NOT_SET) {
    AdmitParsed(reactor, model, *request);
    return;
  }
  // Its grammar may take up to --max-grammar-compile-seconds to compile: not on gRPC's threads, nor on the
  // admission pool's.
  grammar_pool_->Post(
      [this, reactor, model, parsed = std::make_shared<const v1::GenerateRequest>(*std::move(request))] {
        if (reactor->abandoned()) {
          reactor->Refuse(grpc::Status::CANCELLED);
          return;
        }
        AdmitParsed(reactor, model, *parsed);
      });
}

void InferenceService::AdmitParsed(GenerateReactor* reactor, ServedModel* model, const v1::GenerateRequest& request) {
  absl::StatusOr<runtime::GenerationRequest> valid =
      ValidateGenerateRequest(request, model->limits(), model->tokenizer(), model->chat_template());
  if (!valid.ok()) {
    reactor->Refuse(ToGrpcStatus(valid.status()));
    return;
  }
  const bool structured = valid->grammar != nullptr;
  const absl::Status submitted =
      SubmitUnlessDraining(model, [&] { return reactor->Submit(model->engine(), *std::move(valid), &in_flight_); });
  if (!submitted.ok()) {
    reactor->Refuse(ToGrpcStatus(submitted));
    return;
  }
  if (structured) RecordStructuredRequest(StructuredKindName(request.structured_output_case()));
}

void InferenceService::RecordStructuredRequest(const char* kind) {
  if (Metrics* metrics = this->metrics()) metrics->RecordStructuredRequest(kind);
}

}  // namespace strata::server
