#include "sim/dp_overlap.h"

#include <algorithm>
#include <cmath>

#include <nlohmann/json.hpp>

#include "base/input_error.h"
#include "base/file_access.h"

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

OverlapSlowdowns read_overlap_probe(const std::string& path) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_regular_file(path, 1 << 20, "overlap probe JSON"));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not JSON (" + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("compute_slowdown") || !j["compute_slowdown"].is_object())
    throw InputError(path + ": expected an object with key 'compute_slowdown' {\"reduce\": x, \"gather\": y} "
                     "(scripts/gpu_overlap_probe.py's output)");
  const nlohmann::json& c = j["compute_slowdown"];
  auto factor = [&](const char* key) {
    if (!c.contains(key) || !c[key].is_number())
      throw InputError(path + ": key 'compute_slowdown." + key + "' must be a number in [1, 10]");
    const double v = c[key].get<double>();
    if (!(v >= 1 && v <= 10))
      throw InputError(path + ": key 'compute_slowdown." + key + "' must be a number in [1, 10]");
    return v;
  };
  OverlapSlowdowns s;
  s.reduce = factor("reduce");
  s.gather = factor("gather");
  if (c.contains("ring")) s.ring = factor("ring");
  return s;
}

}  // namespace hetplan
