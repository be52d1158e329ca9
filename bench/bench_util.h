#pragma once
// What the C++ micro-benchmarks share: medians, their comma-separated integer flags and the CPU's name.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
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

// The CPU's model name, as /proc/cpuinfo gives it (the tables name the machine they were measured on).
inline std::string CpuName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

}  // namespace strata::bench
