#include "executor/pipeline_layout.h"

#include <algorithm>

#include "sim/data_load_balancer.h"
#include "base/input_error.h"
#include "sim/schedule.h"

namespace hetplan::executor {

namespace {

SampleRange overlap(const SampleRange& a, const SampleRange& b) {
  return {std::max(a.begin, b.begin), std::min(a.end, b.end)};
}

// Activations from a's ranks to b's (receiver tp index t from the sender's t mod tp_a; under context
// parallelism, of the receiver's cp index only), and, where `gradients`, the gradients back.
void link(const StageLayout& a, const StageLayout& b, int cp, bool gradients, std::vector<Transfer>* fwd,
          std::vector<Transfer>* bwd) {
  for (int db = 0; db < b.dp; ++db)
    for (int tb = 0; tb < b.tp; ++tb)
      for (int da = db % cp; da < a.dp; da += cp) {
        const SampleRange o = overlap(a.replica_samples[da], b.replica_samples[db]);
        if (o.size() > 0) fwd->push_back({a.rank(da, tb % a.tp), b.rank(db, tb), o});
      }
  if (!gradients) return;
  for (int da = 0; da < a.dp; ++da)
    for (int ta = 0; ta < a.tp; ++ta)
      for (int db = da % cp; db < b.dp; db += cp) {
        const SampleRange o = overlap(a.replica_samples[da], b.replica_samples[db]);
        if (o.size() > 0) bwd->push_back({b.rank(db, ta % b.tp), a.rank(da, ta), o});
      }
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

  virtual_stages_ = f.virtual_stages;
  const int pp = static_cast<int>(p.device_groups.size());
  if (virtual_stages_ > 1) {
    if (pp < 2) throw InputError("plan: virtual_stages " + std::to_string(virtual_stages_) + " needs pp >= 2");
    if (const std::string e = interleaving_error(Schedule::kInterleaved1F1B, pp, batches_, virtual_stages_);
        !e.empty())
      throw InputError("plan: " + e);
    for (int s = 0; s < pp; ++s)
      if (stage_blocks(p.layer_partition[s], p.layer_partition[s + 1], L) < virtual_stages_)
        throw InputError("plan: stage " + std::to_string(s) + " holds fewer transformer blocks than its " +
                         std::to_string(virtual_stages_) + " virtual stages");
  }
  context_parallel_ = std::max(1, f.context_parallel);
  const int cp = context_parallel_;
  int begin = 0;
  for (std::size_t s = 0; s < p.device_groups.size(); ++s) {
    StageLayout st;
    st.index = static_cast<int>(s);
    st.begin = begin;
    st.dp = p.strategies[s].dp;
    st.tp = p.strategies[s].tp;
    st.first_layer = p.layer_partition[s];
    st.last_layer = p.layer_partition[s + 1];
    for (int c = 0; c < virtual_stages_; ++c) {
      int first = st.first_layer, last = st.last_layer;
      if (virtual_stages_ > 1)
        chunk_model_layers(p.layer_partition.data(), pp, virtual_stages_, static_cast<int>(s), c, &first, &last);
      st.chunk_layers.emplace_back(first, last);
    }
    if (st.dp % cp != 0)
      throw InputError("plan: context_parallel " + std::to_string(cp) + " does not divide stage " + std::to_string(s) +
                       "'s dp " + std::to_string(st.dp));
    // Split each micro-batch over the (Megatron) replicas.
    const int replicas = st.dp / cp;
    std::vector<int> counts(replicas);
    split_micro_batch(micro_batch_, replicas, counts.data());
    if (cp == 1 && profiles && !rank_types.empty()) {
      if (rank_types[st.begin] != rank_types[st.end() - 1]) {
        std::vector<int> replica_first(st.dp);
        for (int d = 0; d < st.dp; ++d) replica_first[d] = rank_types[st.rank(d, 0)];
        int missing = -1;
        if (!partition_data(*profiles, replica_first.data(), p.strategies[s], micro_batch_, counts.data(), &missing))
          throw InputError(profiles->missing_message(missing, st.tp, 1, "the data load balancer"));
      }
    }
    int at = 0;
    for (int d = 0; d < replicas; ++d) {
      if (counts[d] < 1)
        throw InputError("plan: stage " + std::to_string(s) + " replica " + std::to_string(d) +
                         " gets no samples (micro-batch " + std::to_string(micro_batch_) + " over dp " +
                         std::to_string(replicas) + ")");
      for (int c = 0; c < cp; ++c) st.replica_samples.push_back({at, at + counts[d]});  // its cp ranks
      at += counts[d];
    }
    stages_.push_back(st);
    begin += st.size();
  }
  world_ = begin;

  forward_.resize(stages_.size());
  backward_.resize(stages_.size());
  for (std::size_t s = 0; s + 1 < stages_.size(); ++s) {
    // A stage that receives token ids sends no gradient back.
    link(stages_[s], stages_[s + 1], cp, stages_[s + 1].first_layer != 0, &forward_[s], &backward_[s]);
  }
  // Chunk c + 1 of the first stage never starts at layer 0: its gradients flow back.
  if (virtual_stages_ > 1) link(stages_.back(), stages_.front(), cp, true, &wrap_forward_, &wrap_backward_);
}

const StageLayout& PipelineLayout::stage_of(int rank) const {
  for (const auto& s : stages_)
    if (s.contains(rank)) return s;
  throw InputError("rank " + std::to_string(rank) + " is outside the plan's " + std::to_string(world_) + " ranks");
}

int PipelineLayout::replica_of(int rank) const { return stage_of(rank).replica(rank); }

int PipelineLayout::tp_index_of(int rank) const { return stage_of(rank).tp_index(rank); }

GroupSeat PipelineLayout::tp_seat(int rank) const {
  const StageLayout& s = stage_of(rank);
  if (s.tp == 1) return {};
  return {"tp." + std::to_string(s.index) + "." + std::to_string(s.replica(rank)),
          s.tp_group(s.replica(rank)).position_of(rank), s.tp};
}

GroupSeat PipelineLayout::dp_seat(int rank) const {
  const StageLayout& s = stage_of(rank);
  if (s.dp == 1) return {};
  return {"dp." + std::to_string(s.index) + "." + std::to_string(s.tp_index(rank)),
          s.dp_group(s.tp_index(rank)).position_of(rank), s.dp};
}

GroupSeat PipelineLayout::cp_seat(int rank) const {
  if (context_parallel_ == 1) return {};
  const StageLayout& s = stage_of(rank);
  const int d = s.replica(rank), t = s.tp_index(rank);
  return {"cp." + std::to_string(s.index) + "." + std::to_string(d / context_parallel_) + "." + std::to_string(t),
          s.cp_group(d, t, context_parallel_).position_of(rank), context_parallel_};
}

bool PipelineLayout::embedding_group_full() const {
  const StageLayout& a = stages_.front();
  const StageLayout& z = stages_.back();
  return !(a.dp == z.dp && a.tp == z.tp);
}

GroupSeat PipelineLayout::embedding_seat(int rank) const {
  if (num_stages() < 2) return {};
  const StageLayout& a = stages_.front();
  const StageLayout& z = stages_.back();
  if (!a.contains(rank) && !z.contains(rank)) return {};
  const bool first = a.contains(rank);
  if (embedding_group_full()) return {"emb", first ? rank - a.begin : a.size() + (rank - z.begin), a.size() + z.size()};
  const StageLayout& mine = first ? a : z;
  return {"emb." + std::to_string(mine.replica(rank)) + "." + std::to_string(mine.tp_index(rank)), first ? 0 : 1, 2};
}

}  // namespace hetplan::executor
