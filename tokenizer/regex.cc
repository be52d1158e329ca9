#include "tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/absl_compat.h"

namespace strata::tokenizer {

namespace {

void InitializeOnigurumaOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

// A region per thread: onig_search fills it, and reusing it avoids an allocation per search.
struct RegionDeleter {
  void operator()(OnigRegion* r) const { onig_region_free(r, 1); }
};

OnigRegion* ThreadRegion() {
  thread_local std::unique_ptr<OnigRegion, RegionDeleter> region(onig_region_new());
  return region.get();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Regex>> Regex::Compile(std::string_view pattern) {
  InitializeOnigurumaOnce();
  regex_t* reg = nullptr;
  OnigErrorInfo info;
  const auto* begin = reinterpret_cast<const OnigUChar*>(pattern.data());
  // ONIG_SYNTAX_DEFAULT is what the `onig` crate's Regex::new uses, so the same pattern means the same.
  const int r =
      onig_new(&reg, begin, begin + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  if (r != ONIG_NORMAL) {
    OnigUChar message[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(message, r, &info);
    return absl::InvalidArgumentError(
        base::StrCat("invalid regex \"", pattern, "\": ", reinterpret_cast<const char*>(message)));
  }
  return std::unique_ptr<Regex>(new Regex(reg));
}

Regex::~Regex() { onig_free(static_cast<regex_t*>(compiled_)); }

void Regex::FindAll(std::string_view text, std::vector<Match>& out) const {
  auto* reg = static_cast<regex_t*>(compiled_);
  OnigRegion* region = ThreadRegion();
  const auto* str = reinterpret_cast<const OnigUChar*>(text.data());
  const OnigUChar* end = str + text.size();
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    onig_region_clear(region);
    const int r = onig_search(reg, str, end, str + last_end, end, region, ONIG_OPTION_NONE);
    if (r < 0) break;  // ONIG_MISMATCH (or an engine error, which upstream also treats as no match)
    const size_t s = static_cast<size_t>(region->beg[0]);
    const size_t e = static_cast<size_t>(region->end[0]);
    if (s == e && have_last && last_match_end == e) {
      ++last_end;
      continue;
    }
    last_end = e;
    have_last = true;
    last_match_end = e;
    out.emplace_back(s, e);
  }
}

}  // namespace strata::tokenizer
