#include "metis/metis_cost.h"

#include <algorithm>
#include <stdexcept>

#include "sim/data_load_balancer.h"

namespace hetplan {

namespace {

constexpr double kMiB = 1024.0 * 1024.0;

bool skip(SkippedPlan* s, int type, int tp, int bs, const char* reason) {
  if (s) *s = SkippedPlan{type, tp, bs, reason};
  return false;
}

}  // namespace

MetisCostModel::MetisCostModel(const ProfileSet& profiles, const ModelConfig& model, std::vector<int> profile_type,
                               int max_profiled_batch_size)
    : profiles_(&profiles),
      model_(model),
      profile_type_(std::move(profile_type)),
      max_profiled_batch_size_(max_profiled_batch_size) {
  const auto& params = profiles.model().parameters_per_layer_bytes;
  input_params_ = params.front();
  output_params_ = params.back();
  transformer_params_ = params.size() > 1 ? params[1] : 0.0;
}

double MetisCostModel::activation_size(int layer, int mbs, int tp) const {
  if (layer == model_.num_layers - 1)
    return static_cast<double>(static_cast<long long>(mbs) * model_.sequence_length * model_.vocab_size) / tp;
  return static_cast<double>(static_cast<long long>(mbs) * model_.sequence_length * model_.hidden_size);
}

double MetisCostModel::stage_parameters(int tp, int start, int end) const {
  int transformer_layers = end - start;
  double params = 0.0;
  if (start == 0) {
    params += input_params_ / tp;
    transformer_layers -= 1;
  }
  if (end == model_.num_layers) {
    params += output_params_ / tp;
    transformer_layers -= 1;
  }
  params += transformer_params_ / tp * transformer_layers;
  return params;
}

bool MetisCostModel::cost(const InterStagePlan& plan, const RankLayout& layout, const Strategy* strategies,
                          const int* layer_partition, CostTerms* out, SkippedPlan* skipped) const {
  const std::vector<int>& groups = *plan.device_groups;
  const int stages = std::min(plan.num_stage, static_cast<int>(groups.size()));
  const ProfileSet& prof = *profiles_;

  double max_l = 0, sum_l = 0, pp_cost = 0, fb_sync_cost = 0;
  double max_dp = 0, max_update = 0;
  int begin = 0;
  for (int stage = 0; stage < stages; ++stage) {
    const int start = layer_partition[stage], end = layer_partition[stage + 1];
    const int size = groups[stage];
    const int stop = begin + size;
    const Strategy st = strategies[stage];
    const int mbs = plan.gbs / st.dp / plan.batches;

    double lens;
    if (layout.homogeneous(begin, stop)) {
      const int type = profile_type_[layout.type_of(begin)];
      const LayerProfile* p = prof.find(type, st.tp, mbs);
      if (!p) return skip(skipped, type, st.tp, mbs, "no profile for the stage's micro-batch");
      lens = p->time(start, end);
    } else {
      int replica_types[kMaxReplicas], hetero_bs[kMaxReplicas];
      if (st.dp > kMaxReplicas) throw std::length_error("cost model: more than 4096 data-parallel replicas");
      const int group = size / st.dp;
      for (int i = 0; i < st.dp; ++i) replica_types[i] = profile_type_[layout.type_of(begin + i * group)];
      int missing = -1;
      if (!partition_data(prof, replica_types, st, plan.gbs / plan.batches, hetero_bs, &missing))
        return skip(skipped, missing, st.tp, 1, "no bs1 profile for the data load balancer");
      bool any = false;
      lens = 0;
      for (int i = 0; i < st.dp; ++i) {
        const int h = hetero_bs[i];
        if (h == 0) continue;
        double inner = 0.0;
        for (int bit = 30; bit >= 0; --bit) {
          const int slice = 1 << bit;
          if (!(h & slice)) continue;
          if (slice > max_profiled_batch_size_)
            return skip(skipped, replica_types[i], st.tp, slice, "batch slice above --max_profiled_batch_size");
          const LayerProfile* p = prof.find(replica_types[i], st.tp, slice);
          if (!p) return skip(skipped, replica_types[i], st.tp, slice, "no profile for a replica's batch slice");
          inner += p->time(start, end);
        }
        if (!any || inner > lens) lens = inner;
        any = true;
      }
    }
    if (stage == 0 || lens > max_l) max_l = lens;
    sum_l += lens;

    if (stage == plan.num_stage - 1) {
      double fb = 0;
      int prev = -1;
      for (int r = begin; r < stop; ++r) {
        const int type = profile_type_[layout.type_of(r)];
        if (type == prev) continue;
        prev = type;
        const LayerProfile* p = prof.find(type, st.tp, mbs);
        // The reference raises on a missing key and also on a zero value.
        if (!p || p->fb_sync_ms == 0.0) return skip(skipped, type, st.tp, mbs, "no fb_sync for the last stage");
        if (r == begin || p->fb_sync_ms > fb) fb = p->fb_sync_ms;
      }
      fb_sync_cost = fb * plan.batches;
    } else {
      const double bw = layout.pp_bandwidth(begin, stop + groups[stage + 1]);
      pp_cost += activation_size(end, mbs, st.tp) / (bw * kMiB);
    }

    const double params = stage_parameters(st.tp, start, end);
    const double dp_bw = layout.dp_bandwidth(begin, st.dp, st.tp);
    const double dp_const = static_cast<double>(2 * (st.dp - 1)) / (st.dp * (dp_bw * kMiB));
    const double dp_cost = dp_const * params;
    const double update = prof.model().optimizer_ms / st.tp *
                          (static_cast<double>(end - start) / model_.num_layers);
    if (stage == 0 || dp_cost > max_dp) max_dp = dp_cost;
    if (stage == 0 || update > max_update) max_update = update;
    begin = stop;
  }

  CostTerms t;
  t.execution = ((plan.batches - 1) * max_l) + sum_l;
  t.fb_sync = fb_sync_cost;
  t.parameter_update = max_update;
  t.dp = max_dp;
  t.pp = pp_cost;
  t.batch_generate = prof.model().batch_generator_ms * plan.batches;
  t.total = t.execution + t.fb_sync + t.parameter_update + t.dp + t.pp + t.batch_generate;
  if (out) *out = t;
  return true;
}

}  // namespace hetplan
