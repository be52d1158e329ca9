#include "transport/group_handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstdio>
#include <cstdlib>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace strata::transport {
namespace {

constexpr absl::string_view kProtocol = "strata-group-v2";
constexpr size_t kMacBytes = 32;
constexpr size_t kTokenBytes = 8;
constexpr size_t kMaxFacts = 256;
constexpr size_t kMaxFactNameBytes = 256;
constexpr size_t kMaxFactValueBytes = 4096;

enum Step : uint8_t { kHello = 1, kAuth = 2, kAccept = 3, kRefuse = 4, kFacts = 5, kReady = 6 };

using Facts = std::vector<std::pair<std::string, std::string>>;

void AppendLength(std::string& out, size_t size) {
  const uint32_t n = static_cast<uint32_t>(size);
  const char length[4] = {static_cast<char>(n >> 24), static_cast<char>(n >> 16), static_cast<char>(n >> 8),
                          static_cast<char>(n)};
  out.append(length, 4);
}

uint32_t ReadLength(absl::string_view bytes) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string EncodeFields(const std::vector<absl::string_view>& fields) {
  std::string out;
  for (absl::string_view field : fields) {
    AppendLength(out, field.size());
    out.append(field.data(), field.size());
  }
  return out;
}

std::string EncodeFrame(Step step, const std::vector<absl::string_view>& fields) {
  return std::string(1, static_cast<char>(step)) + EncodeFields(fields);
}

struct Frame {
  Step step;
  std::vector<absl::string_view> fields;  // views into the received bytes
};

std::optional<Frame> DecodeFrame(absl::string_view body) {
  if (body.empty()) return std::nullopt;
  const uint8_t step = static_cast<uint8_t>(body[0]);
  if (step < kHello || step > kReady) return std::nullopt;
  Frame frame{static_cast<Step>(step), {}};
  size_t at = 1;
  while (at < body.size()) {
    if (body.size() - at < 4 || frame.fields.size() >= 2 * kMaxFacts + 4) return std::nullopt;
    const size_t n = ReadLength(body.substr(at, 4));
    at += 4;
    if (n > body.size() - at) return std::nullopt;
    frame.fields.push_back(body.substr(at, n));
    at += n;
  }
  return frame;
}

std::string RankBytes(int rank) {
  std::string out;
  AppendLength(out, static_cast<uint32_t>(rank));
  return out;
}

std::optional<int> ParseRank(absl::string_view bytes) {
  if (bytes.size() != 4) return std::nullopt;
  const uint32_t r = ReadLength(bytes);
  if (r > (1u << 20)) return std::nullopt;
  return static_cast<int>(r);
}

std::string TokenBytes(uint64_t token) {
  std::string out(kTokenBytes, '\0');
  for (size_t i = 0; i < kTokenBytes; ++i) out[i] = static_cast<char>(token >> (8 * (kTokenBytes - 1 - i)));
  return out;
}

uint64_t ParseToken(absl::string_view bytes) {
  uint64_t token = 0;
  for (char c : bytes) token = (token << 8) | static_cast<uint8_t>(c);
  return token;
}

// HMAC-SHA256(secret, label | nonce A | nonce B | rank | rest): the labels are distinct and none is a prefix of
// another, and the nonces and rank have fixed lengths, so the concatenation is unambiguous.
std::string Mac(const std::string& secret, absl::string_view label, absl::string_view a, absl::string_view b, int rank,
                absl::string_view rest = "") {
  const std::string data = absl::StrCat(label, a, b, RankBytes(rank), rest);
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int out_len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out, &out_len);
  return std::string(reinterpret_cast<const char*>(out), out_len);
}

bool SameMac(absl::string_view a, absl::string_view b) {
  return a.size() == kMacBytes && b.size() == kMacBytes && CRYPTO_memcmp(a.data(), b.data(), kMacBytes) == 0;
}

// A frame whose first field is a MAC over the rest of the frame's bytes (the fields after it, as sent; a receiver
// re-encodes the fields it decoded, which gives the same bytes).
std::string SealedFrame(Step step, const std::string& secret, absl::string_view label, absl::string_view a,
                        absl::string_view b, int rank, const std::vector<absl::string_view>& fields) {
  const std::string rest = EncodeFields(fields);
  const std::string mac = Mac(secret, label, a, b, rank, rest);
  return EncodeFrame(step, {mac}) + rest;
}

// What a peer sent, made printable and short enough for a status message.
std::string Printable(absl::string_view untrusted, size_t limit = 200) {
  std::string out = absl::CHexEscape(untrusted.substr(0, limit));
  if (untrusted.size() > limit) out += "...";
  return out;
}

void AppendFacts(const Facts& facts, std::vector<absl::string_view>& fields) {
  for (const auto& [name, value] : facts) {
    fields.push_back(name);
    fields.push_back(value);
  }
}

// Fields [first, end) as name/value pairs with bounds; nullopt when malformed.
std::optional<Facts> ParseFacts(const std::vector<absl::string_view>& fields, size_t first) {
  if (fields.size() < first || (fields.size() - first) % 2 != 0 || (fields.size() - first) / 2 > kMaxFacts) {
    return std::nullopt;
  }
  Facts facts;
  for (size_t i = first; i < fields.size(); i += 2) {
    if (fields[i].empty() || fields[i].size() > kMaxFactNameBytes || fields[i + 1].size() > kMaxFactValueBytes) {
      return std::nullopt;
    }
    for (const auto& [name, value] : facts) {
      if (name == fields[i]) return std::nullopt;  // a name twice
    }
    facts.emplace_back(std::string(fields[i]), std::string(fields[i + 1]));
  }
  return facts;
}

// Every fact that differs, as seen from node `self`: empty when the two agree.
std::string CompareFacts(const Facts& mine, const Facts& theirs, int self, int peer) {
  auto find = [](const Facts& facts, const std::string& name) -> const std::string* {
    for (const auto& [n, v] : facts) {
      if (n == name) return &v;
    }
    return nullptr;
  };
  auto quoted = [](const std::string* value) {
    return value == nullptr ? std::string("not set") : absl::StrCat("\"", Printable(*value), "\"");
  };
  std::vector<std::string> differences;
  auto compare = [&](const std::string& name) {
    const std::string* here = find(mine, name);
    const std::string* there = find(theirs, name);
    if (here != nullptr && there != nullptr && *here == *there) return;
    differences.push_back(absl::StrCat("node ", self, " differs from node ", peer, ": ", Printable(name), " is ",
                                       quoted(here), " here and ", quoted(there), " on node ", peer));
  };
  for (const auto& [name, value] : mine) compare(name);
  for (const auto& [name, value] : theirs) {
    if (find(mine, name) == nullptr) compare(name);
  }
  return absl::StrJoin(differences, "; ");
}

// The worker address and token fields of Accept and Facts (fields 1 and 2).
bool ValidEndpointFields(const std::vector<absl::string_view>& fields) {
  return fields.size() >= 3 && !fields[1].empty() && fields[1].size() <= kMaxWorkerAddressBytes &&
         fields[2].size() == kTokenBytes;
}

}  // namespace

std::string HandshakeNonce() {
  std::string nonce(kHandshakeNonceBytes, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()), static_cast<int>(nonce.size())) != 1) {
    std::fprintf(stderr, "strata transport: RAND_bytes failed\n");
    std::abort();
  }
  return nonce;
}

std::unique_ptr<Handshake> Handshake::ForAcceptor(HandshakeSide self, std::string nonce, Admit admit) {
  std::unique_ptr<Handshake> h(new Handshake());
  h->acceptor_ = true;
  h->self_ = std::move(self);
  h->admit_ = std::move(admit);
  h->nonce_a_ = std::move(nonce);
  h->step_ = Step::kAwaitAuth;
  h->Send(EncodeFrame(kHello, {kProtocol, h->nonce_a_, RankBytes(h->self_.rank)}));
  return h;
}

std::unique_ptr<Handshake> Handshake::ForConnector(HandshakeSide self, int peer_rank, std::string peer,
                                                   std::string nonce) {
  std::unique_ptr<Handshake> h(new Handshake());
  h->self_ = std::move(self);
  h->peer_rank_ = peer_rank;
  h->peer_ = std::move(peer);
  h->nonce_b_ = std::move(nonce);
  h->step_ = Step::kAwaitHello;
  return h;
}

size_t Handshake::wanted() const {
  if (outcome_ != Outcome::kPending) return 0;
  if (in_.size() < 4) return 4 - in_.size();
  return 4 + ReadLength(in_) - in_.size();
}

void Handshake::Feed(absl::string_view bytes) {
  while (!bytes.empty() && outcome_ == Outcome::kPending) {
    const size_t n = std::min(wanted(), bytes.size());
    in_.append(bytes.data(), n);
    bytes.remove_prefix(n);
    if (in_.size() == 4) {
      const uint32_t length = ReadLength(in_);
      if (length == 0 || length > kMaxHandshakeFrameBytes) {
        OnFrame("");  // malformed: refused (acceptor) or failed (connector)
        return;
      }
      continue;
    }
    if (in_.size() > 4 && wanted() == 0) {
      const std::string frame = std::move(in_);
      in_.clear();
      OnFrame(absl::string_view(frame).substr(4));
    }
  }
}

void Handshake::PeerClosed() {
  if (outcome_ != Outcome::kPending) return;
  if (acceptor_) {
    status_ = absl::PermissionDeniedError("it went away mid-handshake");
    outcome_ = Outcome::kRefused;
  } else if (step_ == Step::kAwaitVerdict) {
    Fail(verdict_);
  } else if (step_ == Step::kAwaitHello) {
    Fail(absl::UnavailableError(absl::StrCat(peer_, " is not reachable (it closed the connection)")), true);
  } else {
    Fail(absl::UnavailableError(absl::StrCat(peer_, " closed the connection during the handshake")), true);
  }
}

void Handshake::Expired() {
  if (outcome_ != Outcome::kPending) return;
  if (acceptor_) {
    status_ = absl::PermissionDeniedError("the handshake did not complete in time");
    outcome_ = Outcome::kRefused;  // silent: nothing to say to a peer that says nothing
  } else if (step_ == Step::kAwaitVerdict) {
    Fail(verdict_);
  } else {
    Fail(absl::DeadlineExceededError(absl::StrCat(peer_, " did not complete the handshake in time")), true);
  }
}

std::string Handshake::TakeOutput() { return std::exchange(out_, std::string()); }

void Handshake::Send(std::string frame_body) {
  AppendLength(out_, frame_body.size());
  out_ += frame_body;
}

void Handshake::Refuse(const std::string& reason) {
  refusal_ = reason;
  status_ = absl::PermissionDeniedError(reason);
  Send(EncodeFrame(kRefuse, {reason}));
  outcome_ = Outcome::kRefused;
  step_ = Step::kDone;
}

void Handshake::Fail(absl::Status status, bool retryable) {
  status_ = std::move(status);
  retryable_ = retryable;
  outcome_ = Outcome::kFailed;
  step_ = Step::kDone;
}

void Handshake::OnFrame(absl::string_view body) {
  if (acceptor_) {
    AcceptorFrame(body);
  } else {
    ConnectorFrame(body);
  }
}

void Handshake::AcceptorFrame(absl::string_view body) {
  std::optional<Frame> frame = DecodeFrame(body);
  if (!frame || (step_ == Step::kAwaitAuth && frame->step != kAuth) ||
      (step_ == Step::kAwaitFacts && frame->step != kFacts)) {
    Refuse("the handshake was malformed");
    return;
  }
  if (step_ == Step::kAwaitAuth) {
    OnAuth(frame->fields);
    return;
  }
  if (!ValidEndpointFields(frame->fields) ||
      !SameMac(frame->fields[0], Mac(self_.secret, "strata-group-v2 facts", nonce_a_, nonce_b_, peer_rank_,
                                     EncodeFields({frame->fields.begin() + 1, frame->fields.end()})))) {
    Refuse("the handshake was malformed");
    return;
  }
  OnFacts(frame->fields);
}

void Handshake::OnAuth(const std::vector<absl::string_view>& fields) {
  std::optional<int> rank;
  if (fields.size() != 3 || !(rank = ParseRank(fields[0])) || fields[1].size() != kHandshakeNonceBytes ||
      fields[2].size() != kMacBytes) {
    Refuse("the handshake was malformed");
    return;
  }
  claim_ = absl::StrCat(" (claims rank ", *rank, ")");
  nonce_b_ = std::string(fields[1]);
  if (!SameMac(Mac(self_.secret, "strata-group-v2 connect", nonce_a_, nonce_b_, *rank), fields[2])) {
    Refuse("the group secret differs");
    return;
  }
  const int self = self_.rank;
  if (*rank < 1 || *rank >= self_.group_size) {
    Refuse(absl::StrCat("rank ", *rank, " is not in [1, ", self_.group_size, ") in a group of ", self_.group_size));
    return;
  }
  if (*rank == self) {
    Refuse(absl::StrCat("rank ", *rank, " is node ", self, "'s own"));
    return;
  }
  if (admit_) {
    const std::string reason = admit_(*rank);
    if (!reason.empty()) {
      Refuse(reason);
      return;
    }
  }
  peer_rank_ = *rank;
  claim_ = absl::StrCat(" (rank ", *rank, ")");
  const std::string token = TokenBytes(self_.token);
  std::vector<absl::string_view> rest{self_.worker_address, token};
  AppendFacts(self_.facts, rest);
  Send(SealedFrame(kAccept, self_.secret, "strata-group-v2 accept", nonce_a_, nonce_b_, peer_rank_, rest));
  step_ = Step::kAwaitFacts;
}

void Handshake::OnFacts(const std::vector<absl::string_view>& fields) {
  std::optional<Facts> theirs = ParseFacts(fields, 3);
  if (!theirs) {
    Refuse("the handshake was malformed");
    return;
  }
  const std::string differences = CompareFacts(self_.facts, *theirs, self_.rank, peer_rank_);
  if (!differences.empty()) {
    Refuse("the facts differ");
    status_ = absl::FailedPreconditionError(differences);
    return;
  }
  peer_worker_address_ = std::string(fields[1]);
  peer_token_ = ParseToken(fields[2]);
  Send(EncodeFrame(kReady, {}));
  outcome_ = Outcome::kEstablished;
  step_ = Step::kDone;
}

void Handshake::ConnectorFrame(absl::string_view body) {
  std::optional<Frame> frame = DecodeFrame(body);
  const int self = self_.rank;
  if (step_ == Step::kAwaitVerdict) {  // the acceptor answered this node's facts: fail with the difference
    Fail(verdict_);
    return;
  }
  if (frame && frame->step == kRefuse && frame->fields.size() == 1) {
    Fail(absl::PermissionDeniedError(
        absl::StrCat(peer_, " refused this node (rank ", self, "): ", Printable(frame->fields[0]))));
    return;
  }
  if (step_ == Step::kAwaitHello) {
    if (!frame || frame->step != kHello || frame->fields.size() != 3 || frame->fields[0] != kProtocol ||
        frame->fields[1].size() != kHandshakeNonceBytes) {
      Fail(absl::PermissionDeniedError(absl::StrCat(peer_, " does not speak ", kProtocol)));
      return;
    }
    const std::optional<int> their_rank = ParseRank(frame->fields[2]);
    if (!their_rank || *their_rank != peer_rank_) {
      Fail(absl::FailedPreconditionError(
          absl::StrCat(peer_, " is node ", their_rank ? std::to_string(*their_rank) : "?", ", not node ", peer_rank_)));
      return;
    }
    nonce_a_ = std::string(frame->fields[1]);
    const std::string mac = Mac(self_.secret, "strata-group-v2 connect", nonce_a_, nonce_b_, self);
    Send(EncodeFrame(kAuth, {RankBytes(self), nonce_b_, mac}));
    step_ = Step::kAwaitAccept;
    return;
  }
  if (step_ == Step::kAwaitAccept && frame && frame->step == kAccept && !frame->fields.empty()) {
    OnAccept(frame->fields);
    return;
  }
  if (step_ == Step::kAwaitReady && frame && frame->step == kReady && frame->fields.empty()) {
    outcome_ = Outcome::kEstablished;
    step_ = Step::kDone;
    return;
  }
  Fail(absl::PermissionDeniedError(absl::StrCat(peer_, " sent a malformed handshake")));
}

void Handshake::OnAccept(const std::vector<absl::string_view>& fields) {
  const int self = self_.rank;
  // The MAC covers the frame's bytes after it: the fields after it re-encode to exactly those bytes.
  const std::string after = EncodeFields({fields.begin() + 1, fields.end()});
  if (!SameMac(fields[0], Mac(self_.secret, "strata-group-v2 accept", nonce_a_, nonce_b_, self, after))) {
    Fail(absl::PermissionDeniedError(absl::StrCat(
        peer_, " could not prove it holds the group secret (its answer to this node's challenge is wrong)")));
    return;
  }
  std::optional<Facts> theirs;
  if (!ValidEndpointFields(fields) || !(theirs = ParseFacts(fields, 3))) {
    Fail(absl::PermissionDeniedError(absl::StrCat(peer_, " sent a malformed handshake")));
    return;
  }
  peer_worker_address_ = std::string(fields[1]);
  peer_token_ = ParseToken(fields[2]);
  const std::string token = TokenBytes(self_.token);
  std::vector<absl::string_view> rest{self_.worker_address, token};
  AppendFacts(self_.facts, rest);
  // Sent either way: the acceptor reports the difference too.
  Send(SealedFrame(kFacts, self_.secret, "strata-group-v2 facts", nonce_a_, nonce_b_, self, rest));
  const std::string differences = CompareFacts(self_.facts, *theirs, self, peer_rank_);
  if (!differences.empty()) {
    verdict_ = absl::FailedPreconditionError(differences);
    step_ = Step::kAwaitVerdict;
    return;
  }
  step_ = Step::kAwaitReady;
}

}  // namespace strata::transport
