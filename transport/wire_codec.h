#pragma once
// The codec of the group's messages (no torch, no UCX): each message lists its fields once, as a function template
// over a visitor, and three visitors walk that list.
//
//   template <typename V, typename M>  // M: JoinRequest (decoding) or const JoinRequest (encoding)
//   void JoinFields(V& v, M& join) {
//     v.Vector("gpu bytes", join.gpu_bytes);
//     v.Scalar("host bytes", join.host_bytes);
//     v.List("addresses", join.addresses, [](auto& v, auto& a) { v.Bytes("address", a); });
//   }
//
// WireEncoder appends the fields; WireDecoder reads them back, each checked against the bytes left before anything
// is allocated, and keeps the first error, which names the message and the field; WireMinBytes adds up the fewest
// bytes an element can take (every list empty, every optional absent), which bounds a list's count on decoding.
//
// The layout: fields after one another in the host's byte order (little-endian: every x86-64 and AArch64 Linux host
// is), fixed widths (a field's C++ type is its width), a bool as one byte, lengths and counts as uint64 before their
// elements, a Status as its code (int32) and message. The group's messages (runtime/executor/group_wire.h) are
// declared where their types live; the handshake (group_handshake.h) has a framing of its own.
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace strata::transport {

class WireEncoder {
 public:
  template <typename T>
  void Scalar(const char*, const T& value) {
    Put<T>(value);
  }
  void Flag(const char*, bool value) { Put<uint8_t>(value); }
  void Bytes(const char*, absl::string_view bytes) {
    Put<uint64_t>(bytes.size());
    out_.append(bytes.data(), bytes.size());
  }
  template <typename T>
  void Vector(const char*, const std::vector<T>& values) {
    Put<uint64_t>(values.size());
    for (const T& v : values) Put<T>(v);
  }
  void Status(const char* field, const absl::Status& status) {
    Put<int32_t>(static_cast<int32_t>(status.code()));
    Bytes(field, status.message());
  }
  // `each(visitor, element)` visits one element's fields.
  template <typename T, typename Each>
  void List(const char*, const std::vector<T>& items, Each each) {
    Put<uint64_t>(items.size());
    for (const T& item : items) each(*this, item);
  }
  template <typename T, typename Each>
  void Optional(const char*, const std::optional<T>& value, Each each) {
    Put<uint8_t>(value.has_value());
    if (value) each(*this, *value);
  }
  // The length of bytes that are not encoded here: they follow as the message's next part (no copy of them).
  void Trailing(const char*, const char*, absl::string_view bytes) { Put<uint64_t>(bytes.size()); }

  std::string Take() { return std::move(out_); }

 private:
  template <typename T>
  void Put(T value) {
    static_assert(std::is_arithmetic_v<T>);
    out_.append(reinterpret_cast<const char*>(&value), sizeof(T));
  }

  std::string out_;
};

class WireMinBytes {
 public:
  template <typename T>
  void Scalar(const char*, const T&) {
    static_assert(std::is_arithmetic_v<T>);
    bytes_ += sizeof(T);
  }
  void Flag(const char*, bool) { bytes_ += 1; }
  void Bytes(const char*, absl::string_view) { bytes_ += sizeof(uint64_t); }
  template <typename T>
  void Vector(const char*, const std::vector<T>&) {
    bytes_ += sizeof(uint64_t);
  }
  void Status(const char*, const absl::Status&) { bytes_ += sizeof(int32_t) + sizeof(uint64_t); }
  template <typename T, typename Each>
  void List(const char*, const std::vector<T>&, Each) {
    bytes_ += sizeof(uint64_t);
  }
  template <typename T, typename Each>
  void Optional(const char*, const std::optional<T>&, Each) {
    bytes_ += 1;
  }
  void Trailing(const char*, const char*, absl::string_view) { bytes_ += sizeof(uint64_t); }

  uint64_t bytes() const { return bytes_; }

  // The fewest bytes an element of type T takes, as `each` visits it.
  template <typename T, typename Each>
  static uint64_t Of(Each& each) {
    WireMinBytes min;
    const T probe{};
    each(min, probe);
    return min.bytes();
  }

 private:
  uint64_t bytes_ = 0;
};

// Reads the fields of one message, `what` ("join"), from `in`, which must outlive the decoder and the views it hands
// out (Trailing). After the first error every later field is left as it is and status() holds that error.
class WireDecoder {
 public:
  WireDecoder(absl::string_view in, const char* what) : in_(in), what_(what) {}

  template <typename T>
  void Scalar(const char* field, T& value) {
    static_assert(std::is_arithmetic_v<T>);
    if (!ok()) return;
    if (in_.size() < sizeof(T)) return Fail(Short(field, sizeof(T)));
    std::memcpy(&value, in_.data(), sizeof(T));
    in_.remove_prefix(sizeof(T));
  }
  void Flag(const char* field, bool& value) {
    uint8_t flag = 0;
    Scalar(field, flag);
    if (ok()) value = flag != 0;
  }
  void Bytes(const char* field, std::string& value) {
    const uint64_t n = Count(field, 1);
    if (!ok()) return;
    value = std::string(in_.substr(0, n));
    in_.remove_prefix(n);
  }
  template <typename T>
  void Vector(const char* field, std::vector<T>& values) {
    static_assert(std::is_arithmetic_v<T>);
    const uint64_t n = Count(field, sizeof(T));
    if (!ok()) return;
    values.assign(n, T{});
    if (n == 0) return;  // memcpy takes no null pointer, even for 0 bytes
    std::memcpy(values.data(), in_.data(), n * sizeof(T));
    in_.remove_prefix(n * sizeof(T));
  }
  void Status(const char* field, absl::Status& value) {
    int32_t code = 0;
    Scalar(field, code);
    if (!ok()) return;
    if (code < 0 || code > static_cast<int32_t>(absl::StatusCode::kUnauthenticated)) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(what_, ": ", field, ": ", code, " is not a status code")));
    }
    std::string message;
    Bytes(field, message);
    if (ok()) value = absl::Status(static_cast<absl::StatusCode>(code), message);
  }
  // The count is checked against what the bytes left could hold (WireMinBytes), so a count that lies cannot make
  // the decoder allocate; elements are added as they are read.
  template <typename T, typename Each>
  void List(const char* field, std::vector<T>& items, Each each) {
    const uint64_t n = Count(field, WireMinBytes::Of<T>(each));
    for (uint64_t i = 0; i < n && ok(); ++i) each(*this, items.emplace_back());
  }
  template <typename T, typename Each>
  void Optional(const char* field, std::optional<T>& value, Each each) {
    uint8_t present = 0;
    Scalar(field, present);
    if (ok() && present != 0) each(*this, value.emplace());
  }
  // The rest of the message, whose length `field` gives: it must be exactly what is left ("`owner` says N bytes").
  void Trailing(const char* field, const char* owner, absl::string_view& bytes) {
    uint64_t n = 0;
    Scalar(field, n);
    if (!ok()) return;
    if (n != in_.size()) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(what_, ": ", owner, " says ", n, " bytes, the message has ", in_.size())));
    }
    bytes = in_;
    in_.remove_prefix(n);
  }

  bool ok() const { return status_.ok(); }
  const absl::Status& status() const { return status_; }
  // The first error, or an error for bytes left after the last field.
  absl::Status Finish() const {
    if (!ok()) return status_;
    if (in_.empty()) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(what_, ": ", in_.size(), " bytes after the last field"));
  }

 private:
  // A count of elements of at least `element_bytes` each: never more than the bytes left could hold.
  uint64_t Count(const char* field, uint64_t element_bytes) {
    uint64_t n = 0;
    Scalar(field, n);
    if (!ok()) return 0;
    if (element_bytes > 0 && n > in_.size() / element_bytes) {
      Fail(absl::InvalidArgumentError(absl::StrCat(what_, ": ", field, " says ", n, " elements of ", element_bytes,
                                                   " bytes, but only ", in_.size(), " bytes are left")));
      return 0;
    }
    return n;
  }
  absl::Status Short(const char* field, size_t need) const {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": ", field, " needs ", need, " bytes, ", in_.size(), " are left"));
  }
  void Fail(absl::Status status) { status_ = std::move(status); }

  absl::string_view in_;
  const char* what_;
  absl::Status status_;
};

}  // namespace strata::transport
