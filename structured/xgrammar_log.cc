// xgrammar's customised logging (see xgrammar_log.h). Compiled into strata_xgrammar, with its definitions
// (XGRAMMAR_LOG_CUSTOMIZE=1), so that every xgrammar source and this file agree on the logging classes.
#include "structured/xgrammar_log.h"

#include "support/logging.h"
#include "xgrammar/exception.h"

namespace strata::structured {
namespace {
thread_local EngineWarnings* current_warnings = nullptr;
}  // namespace

EngineWarnings::EngineWarnings() : outer_(current_warnings) { current_warnings = this; }
EngineWarnings::~EngineWarnings() { current_warnings = outer_; }

}  // namespace strata::structured

namespace xgrammar {

[[noreturn]] void LogFatalImpl(const std::string& /*file*/, int /*lineno*/, const std::string& message) {
  throw XGrammarError(message);
}

void LogMessageImpl(const std::string& /*file*/, int /*lineno*/, int level, const std::string& message) {
  if (level == XGRAMMAR_LOG_LEVEL_WARNING && strata::structured::current_warnings != nullptr) {
    strata::structured::current_warnings->Add(message);
  }
}

}  // namespace xgrammar
