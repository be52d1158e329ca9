#include "runtime/executor/group_wire.h"

#include <cstring>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace strata::runtime::wire {
namespace {

// Fields after one another, little-endian (every x86-64 and AArch64 Linux host is), lengths as uint64.
class Writer {
 public:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_arithmetic_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }
  void PutBytes(absl::string_view bytes) {
    Put<uint64_t>(bytes.size());
    out_.append(bytes.data(), bytes.size());
  }
  template <typename T>
  void PutVector(const std::vector<T>& values) {
    Put<uint64_t>(values.size());
    for (const T& v : values) Put<T>(v);
  }
  void PutStatus(const absl::Status& status) {
    Put<int32_t>(static_cast<int32_t>(status.code()));
    PutBytes(status.message());
  }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

class Reader {
 public:
  Reader(absl::string_view in, const char* what) : in_(in), what_(what) {}

  template <typename T>
  absl::StatusOr<T> Get(const char* field) {
    static_assert(std::is_arithmetic_v<T>);
    if (in_.size() < sizeof(T)) return Short(field, sizeof(T));
    T value;
    std::memcpy(&value, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
    return value;
  }
  // A count of elements of at least `element_bytes` each: never more than the bytes left could hold, so a
  // count that lies cannot make the reader allocate.
  absl::StatusOr<uint64_t> Count(const char* field, uint64_t element_bytes) {
    absl::StatusOr<uint64_t> n = Get<uint64_t>(field);
    if (!n.ok()) return n.status();
    if (element_bytes > 0 && *n > in_.size() / element_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": ", field, " says ", *n, " elements of ", element_bytes,
                                                     " bytes, but only ", in_.size(), " bytes are left"));
    }
    return n;
  }
  absl::StatusOr<absl::string_view> GetBytes(const char* field) {
    absl::StatusOr<uint64_t> n = Count(field, 1);
    if (!n.ok()) return n.status();
    absl::string_view bytes = in_.substr(0, *n);
    in_.remove_prefix(*n);
    return bytes;
  }
  template <typename T>
  absl::StatusOr<std::vector<T>> GetVector(const char* field) {
    absl::StatusOr<uint64_t> n = Count(field, sizeof(T));
    if (!n.ok()) return n.status();
    std::vector<T> values(*n);
    if (*n == 0) return values;  // memcpy takes no null pointer, even for 0 bytes
    std::memcpy(values.data(), in_.data(), *n * sizeof(T));
    in_.remove_prefix(*n * sizeof(T));
    return values;
  }
  // A Status field into `out` (not a StatusOr<Status>: that would take an error as its value).
  absl::Status GetStatus(const char* field, absl::Status* out) {
    absl::StatusOr<int32_t> code = Get<int32_t>(field);
    if (!code.ok()) return code.status();
    if (*code < 0 || *code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
      return absl::InvalidArgumentError(absl::StrCat(what_, ": ", field, ": ", *code, " is not a status code"));
    }
    absl::StatusOr<absl::string_view> message = GetBytes(field);
    if (!message.ok()) return message.status();
    *out = absl::Status(static_cast<absl::StatusCode>(*code), *message);
    return absl::OkStatus();
  }
  absl::Status Done() const {
    if (in_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", in_.size(), " bytes after the last field"));
  }
  absl::string_view rest() const { return in_; }

 private:
  absl::Status Short(const char* field, size_t need) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": ", field, " needs ", need, " bytes, ", in_.size(), " are left"));
  }
  absl::string_view in_;
  const char* what_;
};

// Assigns a StatusOr's value or returns its error from the enclosing function.
#define STRATA_WIRE_READ(target, expr)            \
  do {                                            \
    auto value_or = (expr);                       \
    if (!value_or.ok()) return value_or.status(); \
    target = *std::move(value_or);                \
  } while (false)

void PutToken(Writer& w, const GeneratedToken& t) {
  w.Put<int32_t>(t.id);
  w.Put<double>(t.logprob);
  w.Put<uint64_t>(t.top.size());
  for (const auto& [id, logprob] : t.top) {
    w.Put<int32_t>(id);
    w.Put<double>(logprob);
  }
}

absl::StatusOr<GeneratedToken> GetToken(Reader& r) {
  GeneratedToken t;
  STRATA_WIRE_READ(t.id, r.Get<int32_t>("token id"));
  STRATA_WIRE_READ(t.logprob, r.Get<double>("token logprob"));
  uint64_t top = 0;
  STRATA_WIRE_READ(top, r.Count("top logprobs", sizeof(int32_t) + sizeof(double)));
  for (uint64_t i = 0; i < top; ++i) {
    int32_t id = 0;
    double logprob = 0;
    STRATA_WIRE_READ(id, r.Get<int32_t>("top id"));
    STRATA_WIRE_READ(logprob, r.Get<double>("top logprob"));
    t.top.emplace_back(id, logprob);
  }
  return t;
}

void PutWork(Writer& w, const MicroBatchWork& work) {
  w.Put<uint64_t>(work.id);
  w.Put<uint64_t>(work.rows.size());
  for (const BatchRow& row : work.rows) {
    w.PutVector(row.blocks);
    w.Put<int64_t>(row.start);
    w.PutVector(row.tokens);
    w.Put<uint8_t>(row.samples);
    const RowSampling& s = row.sampling;
    w.Put<float>(s.temperature);
    w.Put<int32_t>(s.top_k);
    w.Put<float>(s.top_p);
    w.Put<float>(s.repetition_penalty);
    w.Put<float>(s.frequency_penalty);
    w.Put<float>(s.presence_penalty);
    w.Put<uint64_t>(s.logit_bias.size());
    for (const auto& [id, bias] : s.logit_bias) {
      w.Put<int32_t>(id);
      w.Put<float>(bias);
    }
    w.Put<double>(s.uniform);
    w.Put<int32_t>(s.top_logprobs);
    w.Put<uint64_t>(row.sequence);
    w.PutVector(row.penalty_tokens);
    w.PutVector(row.output_tokens);
    w.Put<uint8_t>(row.penalty_reset);
    w.Put<int32_t>(row.prompt_logprobs);
    w.PutVector(row.prompt_targets);
    w.Put<int64_t>(row.length);
  }
  w.PutVector(work.released);
}

// The smallest a row can be on the wire: its fixed fields and empty vectors.
constexpr uint64_t kMinRowBytes = 8 + 8 + 8 + 1 + 4 * 6 + 8 + 8 + 4 + 8 + 8 + 8 + 1 + 4 + 8 + 8;

absl::StatusOr<MicroBatchWork> GetWork(Reader& r) {
  MicroBatchWork work;
  STRATA_WIRE_READ(work.id, r.Get<uint64_t>("micro-batch id"));
  uint64_t rows = 0;
  STRATA_WIRE_READ(rows, r.Count("rows", kMinRowBytes));
  work.rows.resize(rows);
  for (BatchRow& row : work.rows) {
    STRATA_WIRE_READ(row.blocks, r.GetVector<int32_t>("row blocks"));
    STRATA_WIRE_READ(row.start, r.Get<int64_t>("row start"));
    STRATA_WIRE_READ(row.tokens, r.GetVector<int32_t>("row tokens"));
    uint8_t flag = 0;
    STRATA_WIRE_READ(flag, r.Get<uint8_t>("row samples"));
    row.samples = flag != 0;
    RowSampling& s = row.sampling;
    STRATA_WIRE_READ(s.temperature, r.Get<float>("temperature"));
    STRATA_WIRE_READ(s.top_k, r.Get<int32_t>("top_k"));
    STRATA_WIRE_READ(s.top_p, r.Get<float>("top_p"));
    STRATA_WIRE_READ(s.repetition_penalty, r.Get<float>("repetition_penalty"));
    STRATA_WIRE_READ(s.frequency_penalty, r.Get<float>("frequency_penalty"));
    STRATA_WIRE_READ(s.presence_penalty, r.Get<float>("presence_penalty"));
    uint64_t biases = 0;
    STRATA_WIRE_READ(biases, r.Count("logit_bias", sizeof(int32_t) + sizeof(float)));
    for (uint64_t i = 0; i < biases; ++i) {
      int32_t id = 0;
      float bias = 0;
      STRATA_WIRE_READ(id, r.Get<int32_t>("logit_bias id"));
      STRATA_WIRE_READ(bias, r.Get<float>("logit_bias value"));
      s.logit_bias.emplace_back(id, bias);
    }
    STRATA_WIRE_READ(s.uniform, r.Get<double>("uniform"));
    STRATA_WIRE_READ(s.top_logprobs, r.Get<int32_t>("top_logprobs"));
    STRATA_WIRE_READ(row.sequence, r.Get<uint64_t>("sequence"));
    STRATA_WIRE_READ(row.penalty_tokens, r.GetVector<int32_t>("penalty_tokens"));
    STRATA_WIRE_READ(row.output_tokens, r.GetVector<int32_t>("output_tokens"));
    STRATA_WIRE_READ(flag, r.Get<uint8_t>("penalty_reset"));
    row.penalty_reset = flag != 0;
    STRATA_WIRE_READ(row.prompt_logprobs, r.Get<int32_t>("prompt_logprobs"));
    STRATA_WIRE_READ(row.prompt_targets, r.GetVector<int32_t>("prompt_targets"));
    STRATA_WIRE_READ(row.length, r.Get<int64_t>("row length"));
  }
  STRATA_WIRE_READ(work.released, r.GetVector<uint64_t>("released"));
  return work;
}

}  // namespace

std::string KindName(uint32_t kind) {
  switch (kind) {
    case kHop:
      return "hop";
    case kResult:
      return "result";
    case kHeartbeat:
      return "heartbeat";
    case kGoodbye:
      return "goodbye";
    case kJoin:
      return "join";
    case kPlan:
      return "plan";
    case kReady:
      return "ready";
    case kFailed:
      return "failed";
    default:
      return absl::StrCat("kind ", kind);
  }
}

std::string EncodeHopHeader(uint32_t stage, const MicroBatchWork& work, const Activation& activation) {
  Writer w;
  w.Put<uint32_t>(stage);
  PutWork(w, work);
  w.Put<int32_t>(activation.dtype);
  w.PutVector(activation.sizes);
  w.Put<uint64_t>(activation.bytes.size());  // the bytes themselves are the message's next part
  return w.Take();
}

absl::StatusOr<Hop> DecodeHop(absl::string_view message) {
  Reader r(message, "hop");
  Hop hop;
  STRATA_WIRE_READ(hop.stage, r.Get<uint32_t>("stage"));
  STRATA_WIRE_READ(hop.work, GetWork(r));
  STRATA_WIRE_READ(hop.activation.dtype, r.Get<int32_t>("activation dtype"));
  STRATA_WIRE_READ(hop.activation.sizes, r.GetVector<int64_t>("activation sizes"));
  uint64_t bytes = 0;
  STRATA_WIRE_READ(bytes, r.Get<uint64_t>("activation bytes"));
  if (bytes != r.rest().size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hop: the activation says ", bytes, " bytes, the message has ", r.rest().size()));
  }
  hop.activation.bytes = r.rest();
  return hop;
}

std::string EncodeResult(const MicroBatchResult& result) {
  Writer w;
  w.Put<uint64_t>(result.id);
  w.Put<uint64_t>(result.tokens.size());
  for (const std::optional<GeneratedToken>& token : result.tokens) {
    w.Put<uint8_t>(token.has_value());
    if (token) PutToken(w, *token);
  }
  w.Put<uint64_t>(result.prompt_logprobs.size());
  for (const std::vector<GeneratedToken>& row : result.prompt_logprobs) {
    w.Put<uint64_t>(row.size());
    for (const GeneratedToken& t : row) PutToken(w, t);
  }
  w.PutStatus(result.status);
  w.PutBytes(result.failed_stage);
  w.PutBytes(result.failed_device);
  w.Put<uint8_t>(result.device_lost);
  w.Put<uint64_t>(result.row_errors.size());
  for (const absl::Status& s : result.row_errors) w.PutStatus(s);
  w.PutBytes(result.last_stage);
  w.PutBytes(result.last_device);
  return w.Take();
}

absl::StatusOr<MicroBatchResult> DecodeResult(absl::string_view message) {
  Reader r(message, "result");
  MicroBatchResult result;
  constexpr uint64_t kMinToken = 4 + 8 + 8;
  STRATA_WIRE_READ(result.id, r.Get<uint64_t>("micro-batch id"));
  uint64_t n = 0;
  STRATA_WIRE_READ(n, r.Count("tokens", 1));
  result.tokens.resize(n);
  for (std::optional<GeneratedToken>& token : result.tokens) {
    uint8_t present = 0;
    STRATA_WIRE_READ(present, r.Get<uint8_t>("token present"));
    if (present != 0) STRATA_WIRE_READ(token, GetToken(r));
  }
  STRATA_WIRE_READ(n, r.Count("prompt logprob rows", 8));
  result.prompt_logprobs.resize(n);
  for (std::vector<GeneratedToken>& row : result.prompt_logprobs) {
    uint64_t m = 0;
    STRATA_WIRE_READ(m, r.Count("prompt logprobs", kMinToken));
    for (uint64_t i = 0; i < m; ++i) {
      GeneratedToken t;
      STRATA_WIRE_READ(t, GetToken(r));
      row.push_back(std::move(t));
    }
  }
  if (absl::Status s = r.GetStatus("status", &result.status); !s.ok()) return s;
  absl::string_view text;
  STRATA_WIRE_READ(text, r.GetBytes("failed stage"));
  result.failed_stage = std::string(text);
  STRATA_WIRE_READ(text, r.GetBytes("failed device"));
  result.failed_device = std::string(text);
  uint8_t lost = 0;
  STRATA_WIRE_READ(lost, r.Get<uint8_t>("device lost"));
  result.device_lost = lost != 0;
  STRATA_WIRE_READ(n, r.Count("row errors", 4 + 8));
  for (uint64_t i = 0; i < n; ++i) {
    absl::Status& row = result.row_errors.emplace_back();
    if (absl::Status s = r.GetStatus("row error", &row); !s.ok()) return s;
  }
  STRATA_WIRE_READ(text, r.GetBytes("last stage"));
  result.last_stage = std::string(text);
  STRATA_WIRE_READ(text, r.GetBytes("last device"));
  result.last_device = std::string(text);
  if (absl::Status s = r.Done(); !s.ok()) return s;
  return result;
}

std::string EncodeJoin(const JoinRequest& join) {
  Writer w;
  w.PutVector(join.gpu_bytes);
  w.PutVector(join.gpu_total_bytes);
  w.PutVector(join.gpu_runs_on_cpu);
  w.Put<int64_t>(join.host_bytes);
  w.Put<uint8_t>(join.given);
  w.Put<int32_t>(join.cuda_driver_version);
  w.Put<int32_t>(join.data_port);
  return w.Take();
}

absl::StatusOr<JoinRequest> DecodeJoin(absl::string_view message) {
  Reader r(message, "join");
  JoinRequest join;
  STRATA_WIRE_READ(join.gpu_bytes, r.GetVector<int64_t>("gpu bytes"));
  STRATA_WIRE_READ(join.gpu_total_bytes, r.GetVector<int64_t>("gpu total bytes"));
  STRATA_WIRE_READ(join.gpu_runs_on_cpu, r.GetVector<uint8_t>("gpu runs on cpu"));
  STRATA_WIRE_READ(join.host_bytes, r.Get<int64_t>("host bytes"));
  uint8_t given = 0;
  STRATA_WIRE_READ(given, r.Get<uint8_t>("given"));
  join.given = given != 0;
  STRATA_WIRE_READ(join.cuda_driver_version, r.Get<int32_t>("cuda driver version"));
  STRATA_WIRE_READ(join.data_port, r.Get<int32_t>("data port"));
  if (join.gpu_total_bytes.size() != join.gpu_bytes.size() || join.gpu_runs_on_cpu.size() != join.gpu_bytes.size()) {
    return absl::InvalidArgumentError("join: the GPU lists differ in length");
  }
  if (absl::Status s = r.Done(); !s.ok()) return s;
  return join;
}

std::string EncodeGroupPlan(const GroupPlan& plan) {
  Writer w;
  w.PutBytes(plan.device_map_json);
  w.PutVector(plan.gpu_nodes);
  w.PutBytes(plan.dtype);
  w.Put<int64_t>(plan.kv_blocks);
  w.Put<int64_t>(plan.kv_block_tokens);
  w.Put<int64_t>(plan.max_batch);
  w.Put<int64_t>(plan.max_context);
  w.Put<uint64_t>(plan.addresses.size());
  for (const std::string& a : plan.addresses) w.PutBytes(a);
  return w.Take();
}

absl::StatusOr<GroupPlan> DecodeGroupPlan(absl::string_view message) {
  Reader r(message, "plan");
  GroupPlan plan;
  absl::string_view text;
  STRATA_WIRE_READ(text, r.GetBytes("device map"));
  plan.device_map_json = std::string(text);
  STRATA_WIRE_READ(plan.gpu_nodes, r.GetVector<int32_t>("gpu nodes"));
  STRATA_WIRE_READ(text, r.GetBytes("dtype"));
  plan.dtype = std::string(text);
  STRATA_WIRE_READ(plan.kv_blocks, r.Get<int64_t>("kv blocks"));
  STRATA_WIRE_READ(plan.kv_block_tokens, r.Get<int64_t>("kv block tokens"));
  STRATA_WIRE_READ(plan.max_batch, r.Get<int64_t>("max batch"));
  STRATA_WIRE_READ(plan.max_context, r.Get<int64_t>("max context"));
  uint64_t n = 0;
  STRATA_WIRE_READ(n, r.Count("addresses", 8));
  for (uint64_t i = 0; i < n; ++i) {
    STRATA_WIRE_READ(text, r.GetBytes("address"));
    plan.addresses.emplace_back(text);
  }
  if (absl::Status s = r.Done(); !s.ok()) return s;
  return plan;
}

std::string EncodeHeartbeat(const HeartbeatReport& report) {
  Writer w;
  w.Put<uint64_t>(report.transfers.size());
  for (const LinkTransfer& t : report.transfers) {
    w.Put<int32_t>(t.from);
    w.Put<int32_t>(t.to);
    w.Put<uint64_t>(t.messages);
    w.Put<uint64_t>(t.bytes);
    w.Put<double>(t.seconds);
  }
  w.Put<uint64_t>(report.memory.size());
  for (const DeviceMemory& m : report.memory) {
    w.PutBytes(m.device);
    w.PutBytes(m.physical_device);
    w.Put<int64_t>(m.allocated_bytes);
    w.Put<int64_t>(m.reserved_bytes);
    w.Put<int64_t>(m.total_bytes);
    w.Put<int64_t>(m.free_bytes);
  }
  return w.Take();
}

absl::StatusOr<HeartbeatReport> DecodeHeartbeat(absl::string_view message) {
  Reader r(message, "heartbeat");
  HeartbeatReport report;
  uint64_t n = 0;
  STRATA_WIRE_READ(n, r.Count("links", 4 + 4 + 8 + 8 + 8));
  report.transfers.resize(n);
  for (LinkTransfer& t : report.transfers) {
    STRATA_WIRE_READ(t.from, r.Get<int32_t>("link from"));
    STRATA_WIRE_READ(t.to, r.Get<int32_t>("link to"));
    STRATA_WIRE_READ(t.messages, r.Get<uint64_t>("link messages"));
    STRATA_WIRE_READ(t.bytes, r.Get<uint64_t>("link bytes"));
    STRATA_WIRE_READ(t.seconds, r.Get<double>("link seconds"));
  }
  STRATA_WIRE_READ(n, r.Count("devices", 8 + 8 + 4 * 8));
  report.memory.resize(n);
  for (DeviceMemory& m : report.memory) {
    absl::string_view text;
    STRATA_WIRE_READ(text, r.GetBytes("device"));
    m.device = std::string(text);
    STRATA_WIRE_READ(text, r.GetBytes("physical device"));
    m.physical_device = std::string(text);
    STRATA_WIRE_READ(m.allocated_bytes, r.Get<int64_t>("allocated bytes"));
    STRATA_WIRE_READ(m.reserved_bytes, r.Get<int64_t>("reserved bytes"));
    STRATA_WIRE_READ(m.total_bytes, r.Get<int64_t>("total bytes"));
    STRATA_WIRE_READ(m.free_bytes, r.Get<int64_t>("free bytes"));
  }
  if (absl::Status s = r.Done(); !s.ok()) return s;
  return report;
}

}  // namespace strata::runtime::wire
