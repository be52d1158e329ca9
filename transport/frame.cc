#include "transport/frame.h"

#include <string>

#include "transport/group_handshake.h"

namespace strata::transport::internal {

void PutLe(uint8_t* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(value >> (8 * i));
}

uint64_t GetLe(const uint8_t* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{in[i]} << (8 * i);
  return value;
}

void PutDataHeader(uint8_t* out, const DataHeader& header) {
  PutLe(out, header.kind, 4);
  PutLe(out + 4, 0, 4);
  PutLe(out + 8, header.sequence, 8);
  PutLe(out + 16, header.token, kTokenBytes);
}

DataHeader ReadDataHeader(const uint8_t* in) {
  DataHeader header;
  header.kind = static_cast<uint32_t>(GetLe(in, 4));
  header.sequence = GetLe(in + 8, 8);
  header.token = GetLe(in + 16, kTokenBytes);
  return header;
}

size_t PutCloseHeader(uint8_t* out, uint64_t token, bool abort) {
  PutLe(out, token, kTokenBytes);
  if (!abort) return kTokenBytes;
  out[kTokenBytes] = 1;
  return kTokenBytes + 1;
}

uint64_t RandomToken() {
  const std::string bytes = HandshakeNonce();
  uint64_t token = GetLe(reinterpret_cast<const uint8_t*>(bytes.data()), 8);
  return token == 0 ? 1 : token;
}

}  // namespace strata::transport::internal
