#pragma once
// The bytes UCX carries for a link (no UCX here): the active message ids and their headers. Every message carries
// the receiver's token (handed over in the handshake, group_handshake.h), which is how a message finds its link:
// UCX's reply endpoint is not used. Little-endian fixed widths.
//   data:  kind (4), reserved (4, zero), sequence number (8), the receiver's token (8); the message's bytes follow
//   close: the receiver's token (8), then one byte 1 when the sender closes after an error on its side
#include <cstddef>
#include <cstdint>

namespace strata::transport::internal {

// Active message ids. Data may be rendezvous; the polite close is a small eager message.
constexpr unsigned kAmData = 0x5702;
constexpr unsigned kAmClose = 0x5703;

constexpr size_t kDataHeaderBytes = 24;
constexpr size_t kTokenBytes = 8;
constexpr size_t kMaxCloseHeaderBytes = kTokenBytes + 1;
// How far ahead of the next message to deliver a sequence number may be (UCX keeps one endpoint's messages in
// order on its default single eager lane; the numbers only guard against lanes that do not).
constexpr uint64_t kMaxSequenceGap = uint64_t{1} << 24;

void PutLe(uint8_t* out, uint64_t value, int bytes);
uint64_t GetLe(const uint8_t* in, int bytes);

struct DataHeader {
  uint32_t kind = 0;
  uint64_t sequence = 0;
  uint64_t token = 0;
};
void PutDataHeader(uint8_t* out, const DataHeader& header);  // kDataHeaderBytes
DataHeader ReadDataHeader(const uint8_t* in);                // kDataHeaderBytes

// Writes a close message's header for the peer's `token` and returns its length; `abort`: this side failed the link.
size_t PutCloseHeader(uint8_t* out, uint64_t token, bool abort);

// A link's token: 64 random bits from the handshake's generator, never 0.
uint64_t RandomToken();

}  // namespace strata::transport::internal
