// transport/wire_codec.h: one field list, visited by the encoder, the decoder and the minimum-size counter, gives
// back what was encoded; what a peer could send wrongly is the first error, naming the message and the field.
#include "transport/wire_codec.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace strata::transport {
namespace {

struct Item {
  int32_t id = 0;
  std::string name;
};

struct Sample {
  uint64_t id = 0;
  bool flag = false;
  std::string text;
  std::vector<int32_t> numbers;
  absl::Status status;
  std::vector<Item> items;
  std::optional<Item> extra;
};

template <typename V, typename S>
void SampleFields(V& v, S& s) {
  v.Scalar("id", s.id);
  v.Flag("flag", s.flag);
  v.Bytes("text", s.text);
  v.Vector("numbers", s.numbers);
  v.Status("status", s.status);
  v.List("items", s.items, [](auto& v, auto& item) {
    v.Scalar("item id", item.id);
    v.Bytes("item name", item.name);
  });
  v.Optional("extra present", s.extra, [](auto& v, auto& item) {
    v.Scalar("item id", item.id);
    v.Bytes("item name", item.name);
  });
}

Sample SomeSample() {
  Sample s;
  s.id = 1234567890123ull;
  s.flag = true;
  s.text = "hello";
  s.numbers = {1, -2, 3};
  s.status = absl::NotFoundError("gone");
  s.items = {{7, "seven"}, {8, ""}};
  s.extra = Item{9, "nine"};
  return s;
}

std::string Encode(const Sample& s) {
  WireEncoder w;
  SampleFields(w, s);
  return w.Take();
}

absl::Status Decode(absl::string_view bytes, Sample& s) {
  WireDecoder r(bytes, "sample");
  SampleFields(r, s);
  return r.Finish();
}

TEST(WireCodec, WhatIsEncodedDecodesToTheSame) {
  const Sample sent = SomeSample();
  const std::string bytes = Encode(sent);
  // id, flag, text, numbers, status, the items' count and each item, extra present and extra
  EXPECT_EQ(bytes.size(), 8u + 1 + (8 + 5) + (8 + 3 * 4) + (4 + 8 + 4) + 8 + (4 + 8 + 5) + (4 + 8) + 1 + (4 + 8 + 4));
  Sample got;
  ASSERT_TRUE(Decode(bytes, got).ok()) << Decode(bytes, got);
  EXPECT_EQ(got.id, sent.id);
  EXPECT_EQ(got.flag, sent.flag);
  EXPECT_EQ(got.text, sent.text);
  EXPECT_EQ(got.numbers, sent.numbers);
  EXPECT_EQ(got.status, sent.status);
  ASSERT_EQ(got.items.size(), 2u);
  EXPECT_EQ(got.items[0].id, 7);
  EXPECT_EQ(got.items[0].name, "seven");
  EXPECT_EQ(got.items[1].name, "");
  ASSERT_TRUE(got.extra.has_value());
  EXPECT_EQ(got.extra->name, "nine");
}

TEST(WireCodec, MinBytesCountEveryFieldOnceWithListsEmptyAndOptionalsAbsent) {
  WireMinBytes min;
  const Sample empty;
  SampleFields(min, empty);
  EXPECT_EQ(min.bytes(), 8u + 1 + 8 + 8 + (4 + 8) + 8 + 1);
  Sample none;
  none.status = absl::OkStatus();
  EXPECT_EQ(Encode(none).size(), min.bytes());
}

TEST(WireCodec, ACutMessageNamesTheFieldAndStopsThere) {
  const std::string bytes = Encode(SomeSample());
  Sample got;
  got.text = "untouched";
  const absl::Status status = Decode(absl::string_view(bytes).substr(0, 12), got);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "sample: text needs 8 bytes, 3 are left");
  EXPECT_EQ(got.text, "untouched");
}

TEST(WireCodec, ACountThatLiesIsRefusedBeforeAnyAllocation) {
  WireEncoder w;
  w.Scalar("count", uint64_t{1} << 40);
  std::vector<Item> items;
  const std::string bytes = w.Take() + std::string(100, '\0');
  WireDecoder r(bytes, "sample");
  r.List("items", items, [](auto& v, auto& item) {
    v.Scalar("item id", item.id);
    v.Bytes("item name", item.name);
  });
  EXPECT_EQ(r.status().message(), "sample: items says 1099511627776 elements of 12 bytes, but only 100 bytes are left");
  EXPECT_TRUE(items.empty());
}

TEST(WireCodec, TrailingBytesMustBeTheRestOfTheMessage) {
  WireEncoder w;
  w.Trailing("payload bytes", "the payload", "abc");
  const std::string header = w.Take();
  absl::string_view payload;
  const std::string exact_bytes = header + "abc";
  WireDecoder exact(exact_bytes, "frame");
  exact.Trailing("payload bytes", "the payload", payload);
  EXPECT_TRUE(exact.Finish().ok());
  EXPECT_EQ(payload, "abc");
  const std::string longer_bytes = header + "abcd";
  WireDecoder longer(longer_bytes, "frame");
  longer.Trailing("payload bytes", "the payload", payload);
  EXPECT_EQ(longer.Finish().message(), "frame: the payload says 3 bytes, the message has 4");
}

TEST(WireCodec, BytesAfterTheLastFieldAndBadStatusCodesAreErrors) {
  Sample got;
  EXPECT_EQ(Decode(Encode(SomeSample()) + "xy", got).message(), "sample: 2 bytes after the last field");
  WireEncoder w;
  w.Scalar("code", int32_t{99});
  w.Bytes("message", "");
  const std::string bytes = w.Take();
  WireDecoder r(bytes, "sample");
  absl::Status status;
  r.Status("status", status);
  EXPECT_EQ(r.Finish().message(), "sample: status: 99 is not a status code");
}

}  // namespace
}  // namespace strata::transport
