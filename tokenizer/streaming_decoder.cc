#include "tokenizer/streaming_decoder.h"

#include "tokenizer/decoders.h"

namespace strata::tokenizer {

namespace {
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";
}  // namespace

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special_tokens)
    : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

bool StreamingDecoder::Stable(const std::string& text) const {
  if (text.size() <= context_text_.size()) return false;
  if (std::string_view(text).ends_with(kReplacementChar)) return false;
  if (!text.starts_with(context_text_)) return false;
  if (tokenizer_.HasByteFallbackDecoder()) {
    const auto token = tokenizer_.IdToToken(window_.back());
    unsigned char byte;
    if (token.has_value() && ParseByteToken(*token, byte)) return false;
  }
  return true;
}

std::string StreamingDecoder::Step(int32_t id) {
  // An id Decode drops (no token, or a special token being skipped) changes no text: it stays out of the
  // window. Otherwise a stream of them (a model whose padded vocabulary is larger than the tokenizer's)
  // would grow the window without end, and each step decodes the whole window: quadratic time.
  if (!tokenizer_.IdToToken(id).has_value() || (skip_special_tokens_ && tokenizer_.IsSpecial(id))) return {};
  window_.push_back(id);
  std::string text = tokenizer_.Decode(window_, skip_special_tokens_);
  if (!Stable(text)) return {};
  std::string emitted = text.substr(context_text_.size());
  // The tokens just emitted become the next context. Its text is decoded on its own, so the next
  // window subtracts exactly what a decode starting at these tokens yields.
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(context_size_));
  context_size_ = window_.size();
  context_text_ = tokenizer_.Decode(window_, skip_special_tokens_);
  return emitted;
}

std::string StreamingDecoder::Finish() {
  std::string text = tokenizer_.Decode(window_, skip_special_tokens_);
  std::string rest = text.starts_with(context_text_) ? text.substr(context_text_.size()) : std::string();
  window_.clear();
  context_size_ = 0;
  context_text_.clear();
  return rest;
}

}  // namespace strata::tokenizer
