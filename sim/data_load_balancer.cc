#include "sim/data_load_balancer.h"

#include "sim/input_error.h"

namespace hetplan {

bool partition_data(const ProfileSet& profiles, const int* replica_types, Strategy strategy, int bs, int* out,
                    int* missing_type) {
  const int dp = strategy.dp;
  double share[1024];
  int order[1024];
  double remainder_ratio[1024];
  if (dp > 1024) return false;
  double total = 0.0;
  for (int i = 0; i < dp; ++i) {
    const LayerProfile* p = profiles.find(replica_types[i], strategy.tp, 1);
    if (!p) {
      if (missing_type) *missing_type = replica_types[i];
      return false;
    }
    share[i] = 1.0 / p->total_layer_ms;
    total += share[i];
  }
  long assigned = 0;
  for (int i = 0; i < dp; ++i) {
    share[i] = share[i] / total;
    const double want = bs * share[i];
    out[i] = static_cast<int>(want);  // Python int(): truncation
    remainder_ratio[i] = want - out[i];
    assigned += out[i];
    order[i] = i;
  }
  // Stable sort of replica indices by fractional part, largest first.
  for (int i = 1; i < dp; ++i) {
    const int v = order[i];
    int j = i;
    while (j > 0 && remainder_ratio[order[j - 1]] < remainder_ratio[v]) {
      order[j] = order[j - 1];
      --j;
    }
    order[j] = v;
  }
  for (long i = 0; i < bs - assigned; ++i) out[order[i]] += 1;
  return true;
}

std::vector<int> partition_data(const ProfileSet& profiles, const std::vector<int>& rank_types, Strategy strategy,
                                int bs) {
  const int group = static_cast<int>(rank_types.size()) / strategy.dp;
  std::vector<int> replica_types(strategy.dp), out(strategy.dp);
  for (int i = 0; i < strategy.dp; ++i) replica_types[i] = rank_types[i * group];
  int missing = -1;
  if (!partition_data(profiles, replica_types.data(), strategy, bs, out.data(), &missing))
    throw InputError(profiles.missing_message(missing, strategy.tp, 1, "the data load balancer"));
  return out;
}

}  // namespace hetplan
