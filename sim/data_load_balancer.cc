#include "sim/data_load_balancer.h"

#include <stdexcept>

#include "base/input_error.h"
#include "sim/parallel_layout.h"

namespace hetplan {

void replica_types_of(const int* rank_types, int begin, int size, int dp, int* replica_types) {
  if (dp > kMaxReplicas) throw std::length_error("data load balancer: more than 4096 data-parallel replicas");
  // Replicas of size / dp ranks each, in the grid's order: replica i's first rank is rank(i, 0).
  const StageGrid grid(begin, dp, size / dp);
  for (int i = 0; i < dp; ++i) replica_types[i] = rank_types[grid.rank(i, 0)];
}

bool partition_data(const ProfileSet& profiles, const int* replica_types, Strategy strategy, int bs, int* out,
                    int* missing_type) {
  const int dp = strategy.dp;
  if (dp > kMaxReplicas) throw std::length_error("data load balancer: more than 4096 data-parallel replicas");
  double share[kMaxReplicas];
  double remainder_ratio[kMaxReplicas];
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
  }
  // The remainder goes one by one in a stable sort of the replicas by fractional part, largest first.
  // Replicas of one type have the same fractional part, so the sort is by the few distinct values
  // (largest first), each value's replicas in index order: the same order, without a sort over dp.
  double distinct[kMaxReplicas];
  int n_distinct = 0;
  for (int i = 0; i < dp; ++i) {
    int j = 0;
    while (j < n_distinct && !(distinct[j] == remainder_ratio[i])) ++j;
    if (j < n_distinct) continue;
    // Insert keeping `distinct` in decreasing order.
    for (j = n_distinct++; j > 0 && distinct[j - 1] < remainder_ratio[i]; --j) distinct[j] = distinct[j - 1];
    distinct[j] = remainder_ratio[i];
  }
  long left = bs - assigned;
  for (int v = 0; v < n_distinct && left > 0; ++v)
    for (int i = 0; i < dp && left > 0; ++i)
      if (remainder_ratio[i] == distinct[v]) {
        out[i] += 1;
        --left;
      }
  return true;
}

std::vector<int> partition_data(const ProfileSet& profiles, const std::vector<int>& rank_types, Strategy strategy,
                                int bs) {
  std::vector<int> replica_types(strategy.dp), out(strategy.dp);
  replica_types_of(rank_types.data(), 0, static_cast<int>(rank_types.size()), strategy.dp, replica_types.data());
  int missing = -1;
  if (!partition_data(profiles, replica_types.data(), strategy, bs, out.data(), &missing))
    throw InputError(profiles.missing_message(missing, strategy.tp, 1, "the data load balancer"));
  return out;
}

}  // namespace hetplan
