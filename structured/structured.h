#pragma once
// structured/: constrained decoding (structured outputs) on xgrammar, a kept engine (Apache-2.0; vLLM's and
// SGLang's default) built from its PyPI sdist at configure time (structured/CMakeLists.txt). No torch, no gRPC:
// the server compiles a request's constraint here (off the engine thread, with a deadline), the engine keeps
// one Matcher per sequence and fills its allowed-token mask while the forward pass runs; the executor's
// sampler applies the mask (runtime/executor/sampler.h).
//
//   Constraint (what the request asked: a JSON schema, a regex, choices, a grammar) --Compiler--> Grammar
//   (compiled against the model's vocabulary, cached by constraint) --> Matcher (per sequence: accept each
//   token, fill the next token's mask).
//
// The mask is xgrammar's: int32 words, bit (id % 32) of word (id / 32) set when token `id` is allowed.
// The model's vocabulary (logits columns) may be larger than the tokenizer's: padding ids are never allowed.
// The end-of-sequence ids are allowed exactly where the grammar may end.

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace strata::tokenizer {
class Tokenizer;
}

namespace strata::structured {

enum class ConstraintKind {
  kJsonObject,     // any JSON object (OpenAI's response_format json_object)
  kJsonSchema,     // `text` is a JSON schema
  kRegex,          // `text` is a regular expression the whole output matches
  kChoice,         // the output is exactly one of `choices`
  kGrammar,        // `text` is an EBNF grammar (xgrammar's, a superset of llama.cpp's GBNF; root rule "root")
  kStructuralTag,  // `text` is an xgrammar structural tag (JSON), as vLLM's structured_outputs.structural_tag
};
const char* ConstraintKindName(ConstraintKind kind);  // "json_object", "json_schema", ...

// One request's constraint, as validated at the edge. `field` is the request field it came from
// ("response_format.json_schema.schema", "structured_outputs.regex", ...): every error names it.
struct Constraint {
  ConstraintKind kind = ConstraintKind::kJsonObject;
  std::string text;
  std::vector<std::string> choices;  // kChoice
  // kJsonSchema: refuse (InvalidArgument naming the keyword's path) any keyword the engine would not enforce
  // (`not`, `if`/`then`/`else`, `uniqueItems`, `contains`, `multipleOf`, `pattern` with a length bound, ...)
  // instead of dropping it silently. Off only when the client said strict: false.
  bool strict = true;
  // JSON kinds: any whitespace between tokens (true) or the compact form (false). Whitespace runs are bounded
  // either way so a model cannot loop on spaces (xgrammar's max_whitespace_cnt).
  bool any_whitespace = true;
  std::string field;
};

// The key a compiled grammar is cached under: the kind, the text, the choices and the options.
std::string CacheKey(const Constraint& constraint);

struct CompilerOptions {
  int threads = 2;  // compile threads (xgrammar's own parallelism within one compile)
  // Compiles that run at once, each on a compile thread of its own; more wait in line, the wait counting against
  // max_compile_time. One whose every requester gave up before it started is not compiled.
  int concurrent_compiles = 2;
  // A compile still running after this long is given up on: the request gets InvalidArgument naming the field
  // (--max-grammar-compile-seconds). The compile itself finishes in the background and fills the cache.
  std::chrono::milliseconds max_compile_time{10000};
  int64_t max_constraint_bytes = 256 * 1024;  // schema, regex or grammar text; choices together
  int max_schema_depth = 64;                  // nesting of a JSON schema (objects and arrays)
  int64_t cache_bytes = 512ll << 20;          // compiled grammars kept (xgrammar's estimate), least recent go
};

class Grammar;  // a compiled constraint: immutable, shared by every sequence using it

struct CompilerStats {
  uint64_t compiles = 0;                // compiles started (cache misses)
  uint64_t cache_hits = 0;              // requests served by a compiled (or compiling) grammar
  uint64_t timeouts = 0;                // requests that gave up waiting (max_compile_time)
  uint64_t failures = 0;                // constraints refused (invalid or unsupported)
  std::vector<double> compile_seconds;  // each finished compile's time since the last TakeStats
};

// Compiles constraints against one model's vocabulary. Thread-safe; many requests may compile at once.
class Compiler {
 public:
  // `vocab_size`: the model's logits columns (>= the tokenizer's ids). `eos_ids`: the ids that end a sequence.
  static absl::StatusOr<std::unique_ptr<Compiler>> Create(const tokenizer::Tokenizer& tokenizer, int64_t vocab_size,
                                                          std::vector<int32_t> eos_ids, const CompilerOptions& options);
  ~Compiler();

  // Checks the constraint (size, depth, strict keywords, syntax) and compiles it, or returns the cached grammar.
  // Blocks the calling thread (never the engine's) for at most max_compile_time. InvalidArgument naming
  // `constraint.field` (and the keyword's path, the regex's position, ...) for anything refused.
  absl::StatusOr<std::shared_ptr<const Grammar>> Compile(const Constraint& constraint);

  // Counters since creation; compile_seconds since the last call.
  CompilerStats TakeStats();
  int64_t vocab_size() const;

 private:
  struct Impl;
  explicit Compiler(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// xgrammar's estimate of a compiled grammar's memory: what the cache counts against cache_bytes.
int64_t GrammarBytes(const Grammar& grammar);

// Whether `text`, from the start, is a whole sentence of the grammar (it may end right after it). Stop strings
// end a constrained request only where this holds for the output before them.
bool Completes(const Grammar& grammar, const std::string& text);

// Words of the mask of a vocabulary of `vocab_size` ids: ceil(vocab_size / 32).
int64_t MaskWords(int64_t vocab_size);

// One sequence's position in its grammar. Not thread-safe: the engine calls it from one thread at a time
// (its own, or the mask thread while the engine waits for the micro-batch).
class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);
  Matcher(Matcher&&) noexcept;
  Matcher& operator=(Matcher&&) noexcept;
  ~Matcher();

  // Advances by one sampled token. False when the grammar does not allow it (the matcher is then unchanged).
  bool Accept(int32_t id);
  // Undoes the last `tokens` Accepts (speculative decoding: a proposal's masks are filled position by position).
  void Rollback(int32_t tokens);
  // Writes the next token's mask: MaskWords(vocab_size()) words.
  void FillMask(int32_t* words);
  // The grammar may end here (an EOS id is allowed).
  bool CanEnd() const;
  // An EOS id was accepted: nothing more may follow.
  bool Ended() const;
  // The text every continuation must begin with (empty when there is a choice): jump-forward decoding.
  std::string ForcedText();
  int64_t vocab_size() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace strata::structured
