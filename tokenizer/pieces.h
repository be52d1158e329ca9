// The text a tokenizer pipeline hands from stage to stage: pieces of the input that the pre-tokenizers
// split and rewrite, and the arena that owns every rewritten string so pieces can stay string_views.
#ifndef STRATA_RUNTIME_TOKENIZER_PIECES_H_
#define STRATA_RUNTIME_TOKENIZER_PIECES_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace strata::tokenizer {

struct Piece {
  std::string_view text;
  // Whether the piece starts at byte 0 of the caller's input (HF: offsets_original().0 == 0).
  // Metaspace's prepend_scheme "first" prepends its replacement only to such a piece.
  bool at_origin = false;
};

// Owns the strings that stages write. A buffer never moves once handed out (each string lives in its
// own heap cell), and writers reserve their worst case before taking views into it. Reset() keeps the
// buffers' capacity, so an arena reused across calls stops allocating once warm.
class PieceArena {
 public:
  std::string& NewBuffer(size_t reserve) {
    if (used_ == buffers_.size()) buffers_.push_back(std::make_unique<std::string>());
    std::string& buf = *buffers_[used_++];
    buf.clear();
    buf.reserve(reserve);
    return buf;
  }
  void Reset() { used_ = 0; }

 private:
  std::vector<std::unique_ptr<std::string>> buffers_;
  size_t used_ = 0;
};

}  // namespace strata::tokenizer

#endif  // STRATA_RUNTIME_TOKENIZER_PIECES_H_
