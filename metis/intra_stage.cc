#include "metis/intra_stage.h"

#include "sim/data_load_balancer.h"

namespace hetplan {

IntraStageSearch::IntraStageSearch(const ProfileSet& profiles, const IntraStageOptions& options)
    : profiles_(&profiles), opt_(options), balancer_(profiles, profiles.model().norm_layer_duration) {}

void IntraStageSearch::prepare(const InterStagePlan& plan, const RankLayout& layout) {
  const int stages = plan.num_stages();
  strategies_.resize(stages);
  share_.resize(stages);
  capacity_.resize(stages);
  order_.resize(stages);
  order_key_.resize(stages);
  memory_state_.clear();
  failed_memory_stage_.clear();
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const int end = begin + (*plan.device_groups)[s];
    capacity_[s] = layout.memory_capacity_mb(begin, end);
    begin = end;
  }
}

bool IntraStageSearch::valid(const InterStagePlan& plan) const {
  for (const Strategy& st : strategies_) {
    const int mbs = plan.gbs / st.dp / plan.batches;
    if (mbs == 0 || mbs > opt_.max_profiled_bs) return false;
    if (st.tp > opt_.max_profiled_tp) return false;
  }
  return true;
}

bool IntraStageSearch::next_strategy() {
  const int stages = static_cast<int>(strategies_.size());
  const std::vector<double>* state = nullptr;
  if (opt_.use_strat && !failed_memory_stage_.empty()) {
    state = &failed_memory_stage_;
  } else if (!memory_state_.empty()) {
    state = &memory_state_;
  }
  for (int s = 0; s < stages; ++s) order_key_[s] = state ? (*state)[s] : 1.0 / strategies_[s].dp;
  // Stable sort of stage ids by headroom, least first.
  for (int s = 0; s < stages; ++s) {
    int j = s;
    while (j > 0 && order_key_[order_[j - 1]] > order_key_[s]) {
      order_[j] = order_[j - 1];
      --j;
    }
    order_[j] = s;
  }
  for (int i = 0; i < stages; ++i) {
    Strategy& st = strategies_[order_[i]];
    if (st.dp != 1) {
      st = Strategy{st.dp / 2, st.tp * 2};
      return true;
    }
  }
  return false;
}

void IntraStageSearch::compute_share(const InterStagePlan& plan, const std::vector<int>& rank_types,
                                     const Strategy* strategies, double* share) const {
  const std::vector<int>& groups = *plan.device_groups;
  const int stages = static_cast<int>(groups.size());
  const ProfileSet& prof = *profiles_;
  auto missing = [&](int type, int tp, int bs) {
    return MissingProfileError(type, tp, bs,
                               prof.missing_message(type, tp, bs, "a stage's compute time"));
  };
  double total = 0.0;
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const Strategy st = strategies[s];
    const int end = begin + groups[s];
    if (rank_types[begin] == rank_types[end - 1]) {
      const int bs = plan.gbs / plan.batches / st.dp;
      const LayerProfile* p = prof.find(rank_types[begin], st.tp, bs);
      if (!p) throw missing(rank_types[begin], st.tp, bs);
      share[s] = 1.0 / p->total_layer_ms;
    } else {
      int replica_types[kMaxReplicas], hetero_bs[kMaxReplicas];
      replica_types_of(rank_types.data(), begin, groups[s], st.dp, replica_types);
      int missing_type = -1;
      if (!partition_data(prof, replica_types, st, plan.gbs / plan.batches, hetero_bs, &missing_type))
        throw missing(missing_type, st.tp, 1);
      double slowest = 0;
      for (int i = 0; i < st.dp; ++i) {
        double inner = 0.0;
        for (int bit = 30; bit >= 0; --bit) {
          const int slice = 1 << bit;
          if (!(hetero_bs[i] & slice)) continue;
          const LayerProfile* p = prof.find(replica_types[i], st.tp, slice);
          if (!p) throw missing(replica_types[i], st.tp, slice);
          inner += p->total_layer_ms;
        }
        if (i == 0 || inner > slowest) slowest = inner;
      }
      share[s] = slowest != 0 ? 1.0 / slowest : 0.0;
    }
    total += share[s];
    begin = end;
  }
  for (int s = 0; s < stages; ++s) share[s] = share[s] / total;
}

}  // namespace hetplan
