#include "metis/layer_balancer.h"

#include <algorithm>
#include <limits>

#include "sim/data_load_balancer.h"

namespace hetplan {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kMemCoef = 5.0;  // Metis's mem_coef
}  // namespace

LayerComputeBalancer::LayerComputeBalancer(const std::vector<double>& norm_layer_duration, int hallucination)
    : num_layers_(static_cast<int>(norm_layer_duration.size())),
      hallucination_(hallucination),
      num_sub_(num_layers_ * hallucination),
      demand_(norm_layer_duration),
      demand_sums_(norm_layer_duration) {
  for (double d : demand_)
    for (int i = 0; i < hallucination_; ++i) sub_demand_.push_back(d / hallucination_);
  owner_.resize(num_sub_);
  real_owner_.resize(num_layers_);
}

void LayerComputeBalancer::assign(int sub, int stage) {
  owner_[sub] = stage;
  if (count_[stage]++ == 0) {
    min_sub_[stage] = max_sub_[stage] = sub;
  } else {
    min_sub_[stage] = std::min(min_sub_[stage], sub);
    max_sub_[stage] = std::max(max_sub_[stage], sub);
  }
}

int LayerComputeBalancer::proper_stage(int q) const {
  const int stages = static_cast<int>(count_.size());
  int lo = 0, hi = stages - 1;
  int max_value = std::numeric_limits<int>::min(), min_value = std::numeric_limits<int>::max();
  bool have_max = false, have_min = false;
  for (int key = 0; key < stages; ++key) {
    if (count_[key] == 0) continue;
    const int cur_min = min_sub_[key], cur_max = max_sub_[key];
    if (q > cur_max && (!have_max || cur_max > max_value)) {
      lo = key;
      max_value = cur_max;
      have_max = true;
    }
    if (q < cur_min && (!have_min || cur_min < min_value)) {
      hi = key;
      min_value = cur_min;
      have_min = true;
    }
  }
  int best = -1;
  double best_capa = -kInf;
  for (int s = lo; s <= hi; ++s) {
    if (capa_[s] > best_capa) {
      best_capa = capa_[s];
      best = s;
    }
  }
  // The reference fails with a TypeError here; it does not happen on sane input.
  if (best < 0) throw std::runtime_error("layer balancer: no stage can take a leftover layer");
  return best;
}

void LayerComputeBalancer::run(const double* stage_capacity, int stages, int* partition) {
  const int H = hallucination_;
  capa_.assign(stage_capacity, stage_capacity + stages);
  bak_.assign(stage_capacity, stage_capacity + stages);
  std::fill(owner_.begin(), owner_.end(), -1);
  count_.assign(stages, 0);
  min_sub_.assign(stages, 0);
  max_sub_.assign(stages, 0);

  // 1. Greedy forward pass over all stages but the last. A sub-layer that does
  //    not fit is skipped (left unassigned) and the next stage starts after it.
  int k = 0;
  const int forward_end = num_sub_ - 1 - H;
  for (int s = 0; s < stages - 1; ++s) {
    for (int l = k; l < forward_end; ++l) {
      k = l + 1;
      if (capa_[s] > sub_demand_[l]) {
        capa_[s] -= sub_demand_[l];
        assign(l, s);
      } else {
        break;
      }
    }
  }

  // 2. Backward pass: the last stage takes the top H sub-layers, then keeps
  //    growing downward while contiguous and while it has capacity.
  const int last = stages - 1;
  for (int l = num_sub_ - 1; l >= 0; --l) {
    if (owner_[l] != -1) continue;
    if (count_[last] < H) {
      capa_[last] -= sub_demand_[l];
      assign(l, last);
      continue;
    }
    if (l + 1 != min_sub_[last]) continue;
    if (capa_[last] > sub_demand_[l]) {
      capa_[last] -= sub_demand_[l];
      assign(l, last);
    }
  }

  // 3. Leftovers, lowest first, go to the stage with the most spare capacity
  //    among those between their neighbours.
  for (int l = 0; l < num_sub_; ++l) {
    if (owner_[l] != -1) continue;
    const int s = proper_stage(l);
    capa_[s] -= sub_demand_[l];
    assign(l, s);
  }

  // 4. Majority vote back to whole layers; recompute spare capacity over the
  //    span [first, last] of each stage's layers.
  real_count_.assign(stages, 0);
  for (int r = 0; r < num_layers_; ++r) {
    // Boyer-Moore majority over the layer's H sub-layers, then a recount.
    const int* sub = &owner_[r * H];
    int candidate = sub[0], lead = 0;
    for (int i = 0; i < H; ++i) {
      if (lead == 0) candidate = sub[i];
      lead += sub[i] == candidate ? 1 : -1;
    }
    int votes = 0;
    for (int i = 0; i < H; ++i) votes += sub[i] == candidate;
    real_owner_[r] = 2 * votes > H ? candidate : -1;  // count > H / 2
    if (real_owner_[r] >= 0) ++real_count_[candidate];
  }
  auto first_layer = [&](int s) {
    for (int r = 0; r < num_layers_; ++r)
      if (real_owner_[r] == s) return r;
    return -1;
  };
  auto last_layer = [&](int s) {
    for (int r = num_layers_ - 1; r >= 0; --r)
      if (real_owner_[r] == s) return r;
    return -1;
  };
  for (int s = 0; s < stages; ++s)
    capa_[s] = real_count_[s] ? bak_[s] - demand_sums_(first_layer(s), last_layer(s) + 1) : bak_[s];

  // 5. Up to four moves of one layer into the stage with most spare capacity,
  //    from its more loaded neighbour; a move that raises the maximum spare
  //    capacity is undone and ends the search.
  committed_capa_ = capa_;
  committed_count_ = real_count_;
  for (int num_search = 1;; ++num_search) {
    int stage = 0;
    for (int s = 1; s < stages; ++s)
      if (capa_[s] > capa_[stage]) stage = s;
    int near = -1;
    double near_value = kInf;
    if (stage - 1 >= 0 && capa_[stage - 1] < near_value) {
      near = stage - 1;
      near_value = capa_[stage - 1];
    }
    if (stage + 1 < stages && capa_[stage + 1] < near_value) near = stage + 1;
    if (near != -1 && committed_count_[near] == 1) near = -1;
    if (near != -1 && real_count_[near] > 0) {
      const int layer = stage > near ? last_layer(near) : first_layer(near);
      real_owner_[layer] = stage;
      --real_count_[near];
      ++real_count_[stage];
      capa_[stage] -= demand_[layer];
      capa_[near] += demand_[layer];
    }
    const double new_max = *std::max_element(capa_.begin(), capa_.end());
    const double old_max = *std::max_element(committed_capa_.begin(), committed_capa_.end());
    if (new_max > old_max || num_search > 3) break;
    committed_capa_ = capa_;
    committed_count_ = real_count_;
  }

  partition[0] = 0;
  for (int s = 0; s < stages; ++s) partition[s + 1] = partition[s] + committed_count_[s];
}

LayerLoadBalancer::LayerLoadBalancer(const ProfileSet& profiles, const std::vector<double>& norm_layer_duration)
    : profiles_(&profiles), compute_(norm_layer_duration) {}

void LayerLoadBalancer::stage_memory_demand(const InterStagePlan& plan, const std::vector<int>& rank_types,
                                            const Strategy* strategies, const int* layer_partition,
                                            double* demand) const {
  const std::vector<int>& groups = *plan.device_groups;
  const int stages = static_cast<int>(groups.size());
  // Reference quirk kept: memory always comes from the first rank's type,
  // and a mixed stage splits its batch as if it spanned the whole cluster.
  const int type0 = rank_types[0];
  int begin = 0;
  for (int s = 0; s < stages; ++s) {
    const Strategy st = strategies[s];
    const int end = begin + groups[s];
    const int start_layer = layer_partition[s], end_layer = layer_partition[s + 1];
    double d = 0.001;
    if (rank_types[begin] == rank_types[end - 1]) {
      const int bs = plan.gbs / plan.batches / st.dp;
      const LayerProfile* p = profiles_->find(type0, st.tp, bs);
      if (!p)
        throw MissingProfileError(type0, st.tp, bs,
                                  profiles_->missing_message(type0, st.tp, bs, "a stage's memory demand"));
      d += p->memory(start_layer, end_layer) * kMemCoef;
    } else {
      int replica_types[kMaxReplicas], hetero_bs[kMaxReplicas];
      replica_types_of(rank_types.data(), 0, static_cast<int>(rank_types.size()), st.dp, replica_types);
      int missing = -1;
      if (!partition_data(*profiles_, replica_types, st, plan.gbs / plan.batches, hetero_bs, &missing))
        throw MissingProfileError(missing, st.tp, 1, profiles_->missing_message(missing, st.tp, 1, "the data load balancer"));
      for (int i = 0; i < st.dp; ++i) {
        const int h = hetero_bs[i];
        for (int bit = 30; bit >= 0; --bit) {
          const int slice = 1 << bit;
          if (!(h & slice)) continue;
          const LayerProfile* p = profiles_->find(type0, st.tp, slice);
          if (!p)
            throw MissingProfileError(type0, st.tp, slice,
                                      profiles_->missing_message(type0, st.tp, slice, "a mixed stage's memory demand"));
          d += p->memory(start_layer, end_layer) * kMemCoef;
        }
      }
    }
    demand[s] = d;
    begin = end;
  }
}

bool LayerLoadBalancer::adjust_compute_share(const double* share, const double* capacity, const double* demand,
                                             int n, double* adjusted) {
  std::vector<double> available(n), extra_alloc(n, 0.0);
  double extra_required = 0.0;
  for (int s = 0; s < n; ++s) {
    const double c = share[s], m = capacity[s], d = demand[s];
    if (m > d) {
      adjusted[s] = c;
      available[s] = (c * m / d) - c;
    } else {
      available[s] = 0;
      const double a = c * (m / d) * 0.9;
      adjusted[s] = a;
      extra_required += (c - a);
    }
  }
  double total_available = 0.0;
  for (double a : available) total_available += a;
  if (total_available < extra_required) return false;

  std::vector<double> ratio(n);
  for (int guard = 0; extra_required > 0.01; ++guard) {
    double total = 0.0;
    for (int s = 0; s < n; ++s) total += available[s] > 0.001 ? share[s] : 0.0;
    // The reference divides by zero here (and would loop forever without
    // progress); both mean no rebalancing is possible.
    if (total == 0.0 || guard > 100000) return false;
    for (int s = 0; s < n; ++s) ratio[s] = available[s] > 0.001 ? share[s] / total : 0.0;
    for (int s = 0; s < n; ++s) {
      const double want = extra_required * ratio[s];
      const double alloc = want > available[s] ? available[s] : want;
      extra_alloc[s] += alloc;
      available[s] -= alloc;
      extra_required -= alloc;
    }
  }
  for (int s = 0; s < n; ++s) adjusted[s] = extra_alloc[s] + adjusted[s];
  return true;
}

void LayerLoadBalancer::partition_layer(const InterStagePlan& plan, const std::vector<int>& rank_types,
                                        const Strategy* strategies, const double* compute_share,
                                        const double* memory_capacity, LayerPartitionResult* out) {
  const int stages = plan.num_stages();
  share_.assign(compute_share, compute_share + stages);
  demand_.resize(stages);
  usage_.resize(stages);
  partition_.resize(stages + 1);
  out->ok = false;
  out->num_repartition = -1;
  out->failed_memory_stage.clear();
  out->new_partition_count = 0;
  adjusted_.resize(stages);
  for (int attempt = 1; attempt <= 3; ++attempt) {
    compute_.run(share_.data(), stages, partition_.data());
    stage_memory_demand(plan, rank_types, strategies, partition_.data(), demand_.data());
    bool exceeded = false;
    for (int s = 0; s < stages; ++s) {
      usage_[s] = memory_capacity[s] - demand_[s];
      exceeded |= usage_[s] < 0;
    }
    if (!exceeded) {
      out->ok = true;
      out->num_repartition = attempt;
      out->layer_partition.assign(partition_.begin(), partition_.end());
      out->memory_state.assign(usage_.begin(), usage_.end());
      return;
    }
    if (attempt == 1) out->failed_memory_stage.assign(usage_.begin(), usage_.end());
    ++out->new_partition_count;
    if (!adjust_compute_share(share_.data(), memory_capacity, demand_.data(), stages, adjusted_.data())) return;
    share_ = adjusted_;
  }
}

}  // namespace hetplan
