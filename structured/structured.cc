#include "structured/structured.h"

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <deque>
#include <list>
#include <mutex>
#include <new>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/absl_compat.h"
#include "base/json.h"
#include "nlohmann/json.hpp"
#include "structured/gbnf.h"
#include "structured/json_schema_check.h"
#include "structured/xgrammar_log.h"
#include "tokenizer/tokenizer.h"
#include "xgrammar/xgrammar.h"

namespace strata::structured {

// A compiled constraint: xgrammar's compiled grammar, for one model's vocabulary.
class Grammar {
 public:
  Grammar(xgrammar::CompiledGrammar compiled, int64_t vocab_size)
      : compiled_(std::move(compiled)),
        vocab_size_(vocab_size),
        bytes_(static_cast<int64_t>(compiled_.MemorySizeBytes())) {}

  const xgrammar::CompiledGrammar& compiled() const { return compiled_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t bytes() const { return bytes_; }

 private:
  xgrammar::CompiledGrammar compiled_;
  int64_t vocab_size_;
  int64_t bytes_;
};

namespace {

// The longest run of whitespace the JSON kinds allow between tokens (xgrammar's max_whitespace_cnt): enough for
// a pretty-printed document a few levels deep, too little for a model to spend its tokens on spaces.
constexpr int kMaxWhitespaceRun = 20;

// Compile times kept for TakeStats between two calls (a caller that never takes them does not grow memory).
constexpr size_t kMaxPendingSamples = 4096;

std::string FieldOf(const Constraint& c) { return c.field.empty() ? ConstraintKindName(c.kind) : c.field; }

absl::Status Refusal(const Constraint& c, std::string_view message) {
  return absl::InvalidArgumentError(base::StrCat(FieldOf(c), ": ", message));
}

// What a refusal by xgrammar says the constraint was.
const char* ErrorPrefix(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonObject:
    case ConstraintKind::kJsonSchema:
      return "invalid JSON schema: ";
    case ConstraintKind::kRegex:
      return "invalid regular expression: ";
    case ConstraintKind::kChoice:
      return "invalid choices: ";
    case ConstraintKind::kGrammar:
      return "invalid grammar: ";
    case ConstraintKind::kStructuralTag:
      return "invalid structural tag: ";
  }
  return "";
}

// `root ::= "a" | "b"`, each choice a string literal of xgrammar's EBNF: quote and backslash escaped, control
// characters as \uXXXX (its \x takes any number of hex digits), other bytes as they are.
std::string ChoiceGrammar(const std::vector<std::string>& choices) {
  std::string ebnf = "root ::= ";
  for (size_t i = 0; i < choices.size(); ++i) {
    if (i > 0) ebnf += " | ";
    ebnf += '"';
    for (char ch : choices[i]) {
      const auto byte = static_cast<unsigned char>(ch);
      if (ch == '"' || ch == '\\') {
        ebnf += '\\';
        ebnf += ch;
      } else if (byte < 0x20 || byte == 0x7f) {
        ebnf += absl::StrFormat("\\u%04x", byte);
      } else {
        ebnf += ch;
      }
    }
    ebnf += '"';
  }
  return ebnf;
}

// A structural tag in xgrammar's format ({"type": "structural_tag", "format": {...}}), or vLLM's older form
// ({"structures": [{"begin", "schema", "end"}, ...], "triggers": [...]}) converted as xgrammar's Python API converts
// it (StructuralTag.from_legacy_structural_tag): free text in which each trigger opens one of the tags, whose content
// is its schema (an object, or its JSON text, read by the bounded parser as deep as `max_depth`).
absl::StatusOr<std::string> StructuralTagText(const std::string& text, int max_depth) {
  nlohmann::json tag = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!tag.is_object() || !tag.contains("structures") || tag.contains("format")) return text;
  const nlohmann::json& structures = tag["structures"];
  const nlohmann::json triggers = tag.value("triggers", nlohmann::json());
  if (!structures.is_array()) return absl::InvalidArgumentError("\"structures\" is not a list");
  if (!triggers.is_array()) return absl::InvalidArgumentError("\"triggers\" is not a list of strings");
  nlohmann::json tags = nlohmann::json::array();
  for (size_t i = 0; i < structures.size(); ++i) {
    const nlohmann::json& s = structures[i];
    const std::string at = base::StrCat("structures[", i, "]");
    if (!s.is_object() || !s.contains("begin") || !s.contains("end") || !s.contains("schema") ||
        !s["begin"].is_string() || !s["end"].is_string()) {
      return absl::InvalidArgumentError(base::StrCat(at, " needs \"begin\" and \"end\" strings and a \"schema\""));
    }
    nlohmann::json schema = s["schema"];
    if (schema.is_string()) {
      absl::StatusOr<nlohmann::json> parsed = base::ParseJson(schema.get<std::string>(), max_depth, at + ".schema");
      if (!parsed.ok()) return parsed.status();
      schema = *std::move(parsed);
    }
    tags.push_back({{"type", "tag"},
                    {"begin", s["begin"]},
                    {"content", {{"type", "json_schema"}, {"json_schema", std::move(schema)}}},
                    {"end", s["end"]}});
  }
  return nlohmann::json{{"type", "structural_tag"},
                        {"format", {{"type", "triggered_tags"}, {"triggers", triggers}, {"tags", std::move(tags)}}}}
      .dump();
}

std::string Seconds(std::chrono::milliseconds d) {
  if (d.count() % 1000 == 0) return base::StrCat(d.count() / 1000);
  return absl::StrFormat("%g", static_cast<double>(d.count()) / 1000.0);
}

xgrammar::VocabType VocabTypeOf(tokenizer::Tokenizer::TokenSpelling spelling) {
  switch (spelling) {
    case tokenizer::Tokenizer::TokenSpelling::kByteLevel:
      return xgrammar::VocabType::BYTE_LEVEL;
    case tokenizer::Tokenizer::TokenSpelling::kByteFallback:
      return xgrammar::VocabType::BYTE_FALLBACK;
    case tokenizer::Tokenizer::TokenSpelling::kRaw:
      break;
  }
  return xgrammar::VocabType::RAW;
}

}  // namespace

const char* ConstraintKindName(ConstraintKind kind) {
  switch (kind) {
    case ConstraintKind::kJsonObject:
      return "json_object";
    case ConstraintKind::kJsonSchema:
      return "json_schema";
    case ConstraintKind::kRegex:
      return "regex";
    case ConstraintKind::kChoice:
      return "choice";
    case ConstraintKind::kGrammar:
      return "grammar";
    case ConstraintKind::kStructuralTag:
      return "structural_tag";
  }
  return "unknown";
}

std::string CacheKey(const Constraint& constraint) {
  // Length-prefixed parts, so that no two constraints share a key. The options are those that change the grammar
  // or, for a schema, whether it is refused (strict).
  std::string key = ConstraintKindName(constraint.kind);
  const bool json = constraint.kind == ConstraintKind::kJsonObject || constraint.kind == ConstraintKind::kJsonSchema;
  if (json) key += constraint.any_whitespace ? " any-whitespace" : " compact";
  if (constraint.kind == ConstraintKind::kJsonSchema) key += constraint.strict ? " strict" : " lax";
  if (constraint.kind == ConstraintKind::kChoice) {
    for (const std::string& choice : constraint.choices) absl::StrAppend(&key, " ", choice.size(), ":", choice);
  } else if (constraint.kind != ConstraintKind::kJsonObject) {
    absl::StrAppend(&key, " ", constraint.text.size(), ":", constraint.text);
  }
  return key;
}

int64_t MaskWords(int64_t vocab_size) { return (vocab_size + 31) / 32; }

int64_t GrammarBytes(const Grammar& grammar) { return grammar.bytes(); }

// ---------------------------------------------------------------------------------------------------------------
// Compiler

struct Compiler::Impl {
  // One constraint's compile: queued, running, or done and cached. Guarded by `mu`.
  struct Entry {
    bool done = false;
    int waiters = 0;
    std::shared_ptr<const Grammar> grammar;  // done and compiled
    std::string error;                       // done and refused: the message after "<field>: "
    bool cached = false;
    std::list<std::string>::iterator lru;  // where it is in `lru` when cached
    std::condition_variable finished;
  };
  struct Job {
    std::string key;
    Constraint constraint;
    std::shared_ptr<Entry> entry;
  };
  struct Built {
    std::shared_ptr<const Grammar> grammar;
    std::string error;
  };

  Impl(const CompilerOptions& o, int64_t vocab, const xgrammar::TokenizerInfo& info)
      : options(o), vocab_size(vocab), engine(info, o.threads, /*cache_enabled=*/false, /*max_memory_bytes=*/-1) {
    for (int i = 0; i < options.concurrent_compiles; ++i) workers.emplace_back([this] { Work(); });
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
      queue.clear();
    }
    work.notify_all();
    for (std::thread& t : workers) t.join();
  }

  // Size, depth and the strict keyword check: what the calling thread decides before any compile.
  absl::Status Check(const Constraint& c) const {
    int64_t bytes = static_cast<int64_t>(c.text.size());
    for (const std::string& choice : c.choices) bytes += static_cast<int64_t>(choice.size());
    if (bytes > options.max_constraint_bytes) {
      return Refusal(c, base::StrCat(bytes, " bytes, more than the limit of ", options.max_constraint_bytes));
    }
    switch (c.kind) {
      case ConstraintKind::kJsonObject:
        return absl::OkStatus();
      case ConstraintKind::kJsonSchema: {
        auto schema = base::ParseOrderedJson(c.text, options.max_schema_depth, FieldOf(c));
        if (!schema.ok()) return schema.status();
        if (!schema->is_object() && !schema->is_boolean()) return Refusal(c, "a JSON schema is an object or a boolean");
        return c.strict ? CheckStrictSchema(*schema, FieldOf(c)) : absl::OkStatus();
      }
      case ConstraintKind::kStructuralTag:
        return base::CheckJsonDepth(c.text, options.max_schema_depth, FieldOf(c));
      case ConstraintKind::kChoice:
        return c.choices.empty() ? Refusal(c, "no choices") : absl::OkStatus();
      case ConstraintKind::kRegex:
      case ConstraintKind::kGrammar:
        // xgrammar reads the text up to its first NUL: what follows would be dropped without a word.
        if (c.text.find('\0') != std::string::npos) return Refusal(c, "contains a NUL byte");
        return absl::OkStatus();
    }
    return absl::OkStatus();
  }

  // Compiles on the calling (compile) thread; xgrammar's exceptions end here.
  Built Build(const Constraint& c) {
    const auto separators =
        c.any_whitespace ? std::nullopt : std::optional<std::pair<std::string, std::string>>({",", ":"});
    try {
      switch (c.kind) {
        case ConstraintKind::kJsonObject: {
          // Any object: xgrammar's strict_mode would forbid the properties a schema does not name.
          auto grammar = xgrammar::Grammar::FromJSONSchema(R"({"type": "object"})", c.any_whitespace, std::nullopt,
                                                           separators, /*strict_mode=*/false, kMaxWhitespaceRun);
          return Done(engine.CompileGrammar(grammar));
        }
        case ConstraintKind::kJsonSchema: {
          EngineWarnings warnings;
          auto grammar = xgrammar::Grammar::FromJSONSchema(c.text, c.any_whitespace, std::nullopt, separators,
                                                           /*strict_mode=*/true, kMaxWhitespaceRun);
          if (c.strict && !warnings.messages().empty()) {
            return {nullptr, base::StrCat("the grammar engine would not enforce part of the schema: ",
                                          warnings.messages().front(), " (send strict: false to let it be ignored)")};
          }
          return Done(engine.CompileGrammar(grammar));
        }
        case ConstraintKind::kRegex:
          return Done(engine.CompileRegex(c.text));
        case ConstraintKind::kChoice:
          return Done(engine.CompileGrammar(ChoiceGrammar(c.choices), "root"));
        case ConstraintKind::kGrammar:
          return Done(engine.CompileGrammar(FillEmptyAlternatives(c.text), "root"));
        case ConstraintKind::kStructuralTag: {
          absl::StatusOr<std::string> tag = StructuralTagText(c.text, options.max_schema_depth);
          if (!tag.ok()) return {nullptr, base::StrCat(ErrorPrefix(c.kind), tag.status().message())};
          return Done(engine.CompileStructuralTag(*tag));
        }
      }
      return {nullptr, "unknown constraint kind"};
    } catch (const std::bad_alloc&) {
      return {nullptr, "the grammar took more memory than the process could get"};
    } catch (const std::exception& e) {
      return {nullptr, base::StrCat(ErrorPrefix(c.kind), e.what())};
    } catch (...) {
      return {nullptr, base::StrCat(ErrorPrefix(c.kind), "the grammar engine failed")};
    }
  }

  Built Done(xgrammar::CompiledGrammar compiled) {
    return {std::make_shared<const Grammar>(std::move(compiled), vocab_size), ""};
  }

  void Work() {
    while (true) {
      Job job;
      {
        std::unique_lock<std::mutex> lock(mu);
        work.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) return;
        job = std::move(queue.front());
        queue.pop_front();
        if (job.entry->waiters == 0) {
          // Everyone who asked gave up before it started: not compiled (a later request queues it again).
          Forget(job.key, job.entry);
          continue;
        }
        ++stats.compiles;
      }
      const auto start = std::chrono::steady_clock::now();
      Built built = Build(job.constraint);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::lock_guard<std::mutex> lock(mu);
      if (stats.compile_seconds.size() < kMaxPendingSamples) stats.compile_seconds.push_back(seconds);
      Entry& e = *job.entry;
      e.done = true;
      e.grammar = std::move(built.grammar);
      e.error = std::move(built.error);
      if (e.grammar != nullptr && e.grammar->bytes() <= options.cache_bytes) {
        e.cached = true;
        e.lru = lru.insert(lru.begin(), job.key);
        cached_bytes += e.grammar->bytes();
        while (cached_bytes > options.cache_bytes) Evict();
      } else {
        Forget(job.key, job.entry);  // refused, or larger than the whole cache: its requesters still get it
      }
      e.finished.notify_all();
    }
  }

  // Drops the least recently used compiled grammar (sequences using it keep it).
  void Evict() {
    auto it = entries.find(lru.back());
    cached_bytes -= it->second->grammar->bytes();
    it->second->cached = false;
    entries.erase(it);
    lru.pop_back();
  }

  void Forget(const std::string& key, const std::shared_ptr<Entry>& entry) {
    auto it = entries.find(key);
    if (it != entries.end() && it->second == entry) entries.erase(it);
  }

  absl::StatusOr<std::shared_ptr<const Grammar>> Compile(const Constraint& c) {
    const auto deadline = std::chrono::steady_clock::now() + options.max_compile_time;
    if (absl::Status checked = Check(c); !checked.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      ++stats.failures;
      return checked;
    }
    std::string key = CacheKey(c);
    std::unique_lock<std::mutex> lock(mu);
    std::shared_ptr<Entry> entry;
    if (auto it = entries.find(key); it != entries.end()) {
      entry = it->second;
      ++stats.cache_hits;
      if (entry->cached) lru.splice(lru.begin(), lru, entry->lru);
    } else {
      entry = std::make_shared<Entry>();
      entries.emplace(key, entry);
      queue.push_back(Job{std::move(key), c, entry});
      work.notify_one();
    }
    ++entry->waiters;
    const bool done = entry->finished.wait_until(lock, deadline, [&] { return entry->done; });
    --entry->waiters;
    if (!done) {
      ++stats.timeouts;
      return Refusal(c, base::StrCat("the grammar did not compile within ", Seconds(options.max_compile_time),
                                     " s (--max-grammar-compile-seconds)"));
    }
    if (entry->grammar == nullptr) {
      ++stats.failures;
      return Refusal(c, entry->error);
    }
    return entry->grammar;
  }

  const CompilerOptions options;
  const int64_t vocab_size;
  xgrammar::GrammarCompiler engine;  // no cache of its own; thread-safe without one

  std::mutex mu;
  std::condition_variable work;  // a job was queued, or stopping
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> entries;
  std::list<std::string> lru;  // keys of the cached entries, most recently used first
  int64_t cached_bytes = 0;
  std::deque<Job> queue;
  bool stopping = false;
  CompilerStats stats;
  std::vector<std::thread> workers;  // last: they start once everything above exists
};

Compiler::Compiler(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Compiler::~Compiler() = default;

absl::StatusOr<std::unique_ptr<Compiler>> Compiler::Create(const tokenizer::Tokenizer& tokenizer, int64_t vocab_size,
                                                           std::vector<int32_t> eos_ids,
                                                           const CompilerOptions& options) {
  if (vocab_size <= 0 || vocab_size > INT32_MAX) {
    return absl::InvalidArgumentError(
        base::StrCat("structured outputs: vocab_size ", vocab_size, " is not in 1..", INT32_MAX));
  }
  for (int32_t id : eos_ids) {
    if (id < 0) return absl::InvalidArgumentError(base::StrCat("structured outputs: end-of-sequence id ", id));
  }
  // An end-of-sequence id past the logits' columns can never be sampled: xgrammar must not index its tables with it.
  std::erase_if(eos_ids, [&](int32_t id) { return id >= vocab_size; });
  if (options.threads < 1 || options.concurrent_compiles < 1 || options.max_constraint_bytes < 1 ||
      options.max_schema_depth < 1 || options.cache_bytes < 0) {
    return absl::InvalidArgumentError(base::StrCat(
        "structured outputs: threads (", options.threads, "), concurrent_compiles (", options.concurrent_compiles,
        "), max_constraint_bytes (", options.max_constraint_bytes, ") and max_schema_depth (", options.max_schema_depth,
        ") must be at least 1, cache_bytes (", options.cache_bytes, ") at least 0"));
  }
  // The tokens in id order; ids past the logits columns can never be sampled. Ids without a token and special
  // tokens other than the end-of-sequence ones are empty strings, which xgrammar never allows: a special token's
  // text is not what decoding writes (skip_special_tokens drops it), so it must not stand for that text inside a
  // JSON string. Ids from the tokenizer's end to vocab_size are padding, never allowed either.
  const int64_t count = std::min(tokenizer.IdCount(), vocab_size);
  std::vector<std::string> vocab(static_cast<size_t>(count));
  for (int32_t id = 0; id < count; ++id) {
    const bool eos = std::find(eos_ids.begin(), eos_ids.end(), id) != eos_ids.end();
    if (tokenizer.IsSpecial(id) && !eos) continue;
    if (auto token = tokenizer.IdToToken(id)) vocab[id] = *std::move(token);
  }
  try {
    xgrammar::TokenizerInfo info(vocab, VocabTypeOf(tokenizer.token_spelling()), static_cast<int>(vocab_size), eos_ids,
                                 tokenizer.adds_prefix_space());
    return std::unique_ptr<Compiler>(new Compiler(std::make_unique<Impl>(options, vocab_size, info)));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(base::StrCat("structured outputs: the vocabulary: ", e.what()));
  }
}

absl::StatusOr<std::shared_ptr<const Grammar>> Compiler::Compile(const Constraint& constraint) {
  return impl_->Compile(constraint);
}

CompilerStats Compiler::TakeStats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  CompilerStats taken = impl_->stats;
  impl_->stats.compile_seconds.clear();
  return taken;
}

int64_t Compiler::vocab_size() const { return impl_->vocab_size; }

// ---------------------------------------------------------------------------------------------------------------
// Matcher

struct Matcher::Impl {
  explicit Impl(std::shared_ptr<const Grammar> g)
      : grammar(std::move(g)),
        matcher(grammar->compiled(), std::nullopt, /*terminate_without_stop_token=*/false,
                /*max_rollback_tokens=*/0) {}

  std::shared_ptr<const Grammar> grammar;
  xgrammar::GrammarMatcher matcher;
  bool failed = false;  // xgrammar threw: only the end-of-sequence ids are allowed from here on
};

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : impl_(std::make_unique<Impl>(std::move(grammar))) {}
Matcher::Matcher(Matcher&&) noexcept = default;
Matcher& Matcher::operator=(Matcher&&) noexcept = default;
Matcher::~Matcher() = default;

bool Matcher::Accept(int32_t id) {
  if (impl_->failed) return false;
  try {
    return impl_->matcher.AcceptToken(id);
  } catch (...) {
    impl_->failed = true;
    return false;
  }
}

void Matcher::Rollback(int32_t tokens) {
  if (tokens <= 0 || impl_->failed) return;
  try {
    impl_->matcher.Rollback(tokens);
  } catch (...) {
    impl_->failed = true;
  }
}

void Matcher::FillMask(int32_t* words) {
  const int64_t n = MaskWords(vocab_size());
  if (!impl_->failed && !Ended()) {
    try {
      int64_t shape[2] = {1, n};
      DLTensor mask{};
      mask.data = words;
      mask.device = DLDevice{kDLCPU, 0};
      mask.ndim = 2;
      mask.dtype = xgrammar::GetBitmaskDLType();
      mask.shape = shape;
      impl_->matcher.FillNextTokenBitmask(&mask);
      return;
    } catch (...) {
      impl_->failed = true;
    }
  }
  // A matcher xgrammar failed on ends its sequence, as one that accepted an EOS id (a speculative proposal's
  // positions after it, never kept): only the end-of-sequence ids.
  std::fill(words, words + n, 0);
  for (int32_t id : impl_->matcher.GetStopTokenIds()) words[id / 32] |= static_cast<int32_t>(1u << (id % 32));
}

bool Matcher::CanEnd() const {
  try {
    return impl_->failed || impl_->matcher.IsCompleted();
  } catch (...) {
    return true;
  }
}

bool Matcher::Ended() const {
  try {
    return impl_->matcher.IsTerminated();
  } catch (...) {
    return false;
  }
}

std::string Matcher::ForcedText() {
  if (impl_->failed) return "";
  try {
    return impl_->matcher.FindJumpForwardString();
  } catch (...) {
    return "";
  }
}

int64_t Matcher::vocab_size() const { return impl_->grammar->vocab_size(); }

bool Completes(const Grammar& grammar, const std::string& text) {
  try {
    xgrammar::GrammarMatcher matcher(grammar.compiled(), std::nullopt, false, 0);
    return matcher.AcceptString(text) && matcher.IsCompleted();
  } catch (...) {
    return false;
  }
}

}  // namespace strata::structured
