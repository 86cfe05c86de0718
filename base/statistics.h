// The statistics hetplan reports for repeated measurements: the median, and
// the spread as (max - min) / median. Plain functions; thread-safe.
#pragma once

#include <algorithm>
#include <vector>

namespace hetplan {

inline double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

inline double spread(const std::vector<double>& v) {
  const double m = median(v);
  if (m <= 0) return 0;
  return (*std::max_element(v.begin(), v.end()) - *std::min_element(v.begin(), v.end())) / m;
}

}  // namespace hetplan
