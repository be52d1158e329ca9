#pragma once
// What the C++ micro-benchmarks share: medians and their comma-separated integer flags.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace strata::bench {

inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// "1,2,4" -> {1, 2, 4}; anything else exits 2 naming `program` and the text.
inline std::vector<int> Ints(const char* program, const char* text) {
  std::vector<int> out;
  for (absl::string_view piece : absl::StrSplit(text, ',')) {
    int value = 0;
    if (!absl::SimpleAtoi(piece, &value) || value <= 0) {
      std::fprintf(stderr, "%s: \"%s\" is not a list of positive integers\n", program, text);
      std::exit(2);
    }
    out.push_back(value);
  }
  return out;
}

}  // namespace strata::bench
