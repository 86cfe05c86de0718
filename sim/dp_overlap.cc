#include "sim/dp_overlap.h"

#include <algorithm>
#include <cmath>

namespace hetplan {

double megatron_default_bucket_params(int dp) { return std::max(4e7, 1e6 * dp); }

int bucket_count(double params, double bucket_params, int dp) {
  const double b = bucket_params > 0 ? bucket_params : megatron_default_bucket_params(dp);
  if (!(params > 0)) return 1;
  return std::max(1, static_cast<int>(std::ceil(params / b)));
}

double exposed_after_window(double per_bucket_s, int buckets, double window_s) {
  const double n = buckets;
  return std::max(per_bucket_s, n * per_bucket_s - window_s * (n - 1) / n);
}

double overlap_slowdown_s(double comm_s, double window_s, double slowdown) {
  return std::max(0.0, slowdown - 1) * std::min(window_s, comm_s);
}

}  // namespace hetplan
