#pragma once
// xgrammar's logging, customised (XGRAMMAR_LOG_CUSTOMIZE, structured/xgrammar.cmake): its fatal errors
// (XGRAMMAR_CHECK, LOG(FATAL)) throw xgrammar::XGrammarError with the message alone, which structured.cc catches at
// its boundary; its warnings go to the EngineWarnings alive on the thread that logs them, and are dropped where
// none is (they would otherwise reach stderr once per request). The warnings are how xgrammar says it drops part
// of a JSON schema ("ignoring multipleOf", "falling back to anyOf semantics", ...): a strict constraint is refused
// for them.

#include <string>
#include <vector>

namespace strata::structured {

// Collects xgrammar's warnings logged on this thread while it is alive. Nests: the innermost collects.
class EngineWarnings {
 public:
  EngineWarnings();
  ~EngineWarnings();
  EngineWarnings(const EngineWarnings&) = delete;
  EngineWarnings& operator=(const EngineWarnings&) = delete;

  const std::vector<std::string>& messages() const { return messages_; }
  void Add(std::string message) { messages_.push_back(std::move(message)); }

 private:
  std::vector<std::string> messages_;
  EngineWarnings* outer_;
};

}  // namespace strata::structured
