// libFuzzer harness: what a group's peer sends (runtime/executor/group_wire.h), as the receiving node decodes
// it: a hop (a micro-batch's work and activation), a result, a worker's join, the leader's plan, a heartbeat.
// The first byte picks the message; the rest is its bytes. Nothing may overrun, allocate past the input or
// abort, and whatever decodes must survive a round trip through the senders' encoders.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/executor/group_wire.h"

namespace {

using namespace strata::runtime;
using namespace strata::runtime::wire;

void Check(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

// Whatever decodes, re-encoded, decodes again to the same encoding (the encoders are the senders': a flag byte
// other than 0 and 1 reads as set, so the first encoding is canonical, not the input).
template <typename T, typename Decode, typename Encode>
void RoundTrip(absl::string_view message, Decode decode, Encode encode) {
  absl::StatusOr<T> first = decode(message);
  if (!first.ok()) return;
  const std::string once = encode(*first);
  absl::StatusOr<T> second = decode(once);
  Check(second.ok() && encode(*second) == once);
}

std::string EncodeHop(const Hop& hop) {
  return EncodeHopHeader(hop.stage, hop.work, hop.activation) + std::string(hop.activation.bytes);
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const absl::string_view message(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: {
      // A hop's activation is a view into its message: the re-encoding is kept alive while it is read.
      absl::StatusOr<Hop> hop = DecodeHop(message);
      if (!hop.ok()) return 0;
      const std::string once = EncodeHop(*hop);
      absl::StatusOr<Hop> again = DecodeHop(once);
      Check(again.ok() && EncodeHop(*again) == once);
      return 0;
    }
    case 1:
      RoundTrip<MicroBatchResult>(message, DecodeResult, EncodeResult);
      return 0;
    case 2:
      RoundTrip<JoinRequest>(message, DecodeJoin, EncodeJoin);
      return 0;
    case 3:
      RoundTrip<GroupPlan>(message, DecodeGroupPlan, EncodeGroupPlan);
      return 0;
    default:
      RoundTrip<HeartbeatReport>(message, DecodeHeartbeat, EncodeHeartbeat);
      return 0;
  }
}
