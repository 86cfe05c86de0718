#include "executor/pipeline_layout.h"

#include <algorithm>

#include "sim/data_load_balancer.h"
#include "sim/input_error.h"

namespace hetplan::executor {

namespace {

SampleRange overlap(const SampleRange& a, const SampleRange& b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

}  // namespace

PipelineLayout::PipelineLayout(const PlanFile& f, const std::vector<int>& rank_types, const ProfileSet* profiles) {
  const PlanResult& p = f.plan;
  const int L = f.model.num_layers;
  batches_ = p.batches;
  micro_batch_ = f.gbs / p.batches;
  if (p.layer_partition.front() != 0 || p.layer_partition.back() != L)
    throw InputError("plan: layer_partition must run from 0 to num_layers (" + std::to_string(L) +
                     "); this plan drops layers, which no executor can train");
  if (p.layer_partition[p.layer_partition.size() - 2] == L)
    throw InputError("plan: the last stage holds no layers (the loss would be computed before it)");

  int begin = 0;
  for (std::size_t s = 0; s < p.device_groups.size(); ++s) {
    StageLayout st;
    st.index = static_cast<int>(s);
    st.begin = begin;
    st.dp = p.strategies[s].dp;
    st.tp = p.strategies[s].tp;
    st.first_layer = p.layer_partition[s];
    st.last_layer = p.layer_partition[s + 1];
    // Split each micro-batch over the replicas.
    std::vector<int> counts(st.dp, micro_batch_ / st.dp);
    for (int d = 0; d < micro_batch_ % st.dp; ++d) ++counts[d];
    if (profiles && !rank_types.empty()) {
      std::vector<int> types(rank_types.begin() + begin, rank_types.begin() + begin + st.size());
      if (types.front() != types.back()) {
        std::vector<int> replica_first(st.dp);
        for (int d = 0; d < st.dp; ++d) replica_first[d] = types[d * st.tp];
        int missing = -1;
        if (!partition_data(*profiles, replica_first.data(), p.strategies[s], micro_batch_, counts.data(), &missing))
          throw InputError(profiles->missing_message(missing, st.tp, 1, "the data load balancer"));
      }
    }
    int at = 0;
    for (int d = 0; d < st.dp; ++d) {
      if (counts[d] < 1)
        throw InputError("plan: stage " + std::to_string(s) + " replica " + std::to_string(d) +
                         " gets no samples (micro-batch " + std::to_string(micro_batch_) + " over dp " +
                         std::to_string(st.dp) + ")");
      st.replica_samples.push_back({at, at + counts[d]});
      at += counts[d];
    }
    stages_.push_back(st);
    begin += st.size();
  }
  world_ = begin;

  forward_.resize(stages_.size());
  backward_.resize(stages_.size());
  for (std::size_t s = 0; s + 1 < stages_.size(); ++s) {
    const StageLayout& a = stages_[s];
    const StageLayout& b = stages_[s + 1];
    for (int db = 0; db < b.dp; ++db)
      for (int tb = 0; tb < b.tp; ++tb)
        for (int da = 0; da < a.dp; ++da) {
          const SampleRange o = overlap(a.replica_samples[da], b.replica_samples[db]);
          if (o.size() > 0) forward_[s].push_back({a.rank(da, tb % a.tp), b.rank(db, tb), o});
        }
    if (b.first_layer == 0) continue;  // b receives token ids: no gradient flows back
    for (int da = 0; da < a.dp; ++da)
      for (int ta = 0; ta < a.tp; ++ta)
        for (int db = 0; db < b.dp; ++db) {
          const SampleRange o = overlap(a.replica_samples[da], b.replica_samples[db]);
          if (o.size() > 0) backward_[s].push_back({b.rank(db, ta % b.tp), a.rank(da, ta), o});
        }
  }
}

const StageLayout& PipelineLayout::stage_of(int rank) const {
  for (const auto& s : stages_)
    if (rank >= s.begin && rank < s.begin + s.size()) return s;
  throw InputError("rank " + std::to_string(rank) + " is outside the plan's " + std::to_string(world_) + " ranks");
}

int PipelineLayout::replica_of(int rank) const {
  const StageLayout& s = stage_of(rank);
  return (rank - s.begin) / s.tp;
}

int PipelineLayout::tp_index_of(int rank) const {
  const StageLayout& s = stage_of(rank);
  return (rank - s.begin) % s.tp;
}

}  // namespace hetplan::executor
