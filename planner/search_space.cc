#include "planner/search_space.h"

#include <tbb/parallel_for.h>

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>

#include "base/input_error.h"

namespace hetplan {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// The most (type, tp, share) profile slicings the search keeps (ShareSlices), and the most entries of the
// model-state table (state_lb, only prunes: beyond this it is left out, as the exhaustive search does).
constexpr double kMaxShareSlicings = 4194304.0;
constexpr double kMaxStateLbEntries = 33554432.0;  // 2^25 doubles, 256 MB

// Per device type of the cluster: which tp degrees up to max_tp the search may take: those with profiles
// that split the model's attention heads (tp_splits_heads: Megatron-LM's rule, sim/model_shape.h).
std::vector<std::vector<char>> profiled_tps(const Cluster& cluster, const ProfileSet& profiles, const ModelShape& shape,
                                            int max_tp) {
  const int n_types = static_cast<int>(cluster.device_types().size());
  std::vector<std::vector<char>> type_tp(n_types, std::vector<char>(max_tp + 1, 0));
  for (int t = 0; t < n_types; ++t) {
    const int pt = profiles.type_index(cluster.device_types()[t]);
    for (const LayerProfile& e : profiles.entries()) {
      if (e.tp < 1 || e.tp > max_tp || e.bs < 1 || profiles.find(pt, e.tp, e.bs) != &e) continue;
      if (!tp_splits_heads(shape, e.tp)) continue;
      type_tp[t][e.tp] = 1;
    }
  }
  return type_tp;
}

// The node order `sequence` (type indices), its layout and fast cost model, and its tables.
NodeOrder make_node_order(const Cluster& cluster, const PlanSimulator& simulator,
                          const std::vector<TrainingSetup>& setups, const std::vector<std::vector<char>>& type_tp,
                          const std::vector<int>& sequence, int index, int max_tp) {
  const int n_types = static_cast<int>(sequence.size());
  NodeOrder o;
  o.index = index;
  o.sequence = sequence;
  o.layout = std::make_unique<RankLayout>(cluster, sequence);
  o.cost = std::make_unique<PlanCostModel>(simulator, *o.layout, setups);
  o.ranks = o.layout->num_ranks();
  o.node_run.assign(o.ranks + 1, 0);
  for (int r = o.ranks - 1; r >= 0; --r)
    o.node_run[r] = (r + 1 < o.ranks && o.layout->node_of(r + 1) == o.layout->node_of(r)) ? o.node_run[r + 1] + 1 : 1;
  o.block.resize(o.ranks);
  for (int r = 0; r < o.ranks; ++r)
    o.block[r] = static_cast<int>(std::find(sequence.begin(), sequence.end(), o.layout->type_of(r)) - sequence.begin());
  o.block_capacity.assign(n_types, kInf);
  for (int r = 0; r < o.ranks; ++r) o.block_capacity[o.block[r]] = o.cost->rank_capacity_bytes(r);
  o.tp_ok.assign(n_types + 1, std::vector<char>(max_tp + 1, 0));
  for (int k = n_types - 1; k >= 0; --k) {
    for (int tp = 1; tp <= max_tp; ++tp) o.tp_ok[k][tp] = type_tp[sequence[k]][tp];
  }
  o.tp_fail.assign(max_tp + 1, std::vector<int>(o.ranks + 1, o.ranks));
  for (int tp = 1; tp <= max_tp; ++tp)
    for (int g = o.ranks - 1; g >= 0; --g) {
      const bool ok = o.node_run[g] >= tp;
      o.tp_fail[tp][g] = !ok ? g : (g + tp < o.ranks ? o.tp_fail[tp][g + tp] : o.ranks);
    }
  return o;
}

}  // namespace

SearchSpace::SearchSpace(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& simulator,
                         std::vector<TrainingSetup> setups_searched, const PlanSearchOptions& options)
    : setups(std::move(setups_searched)),
      layers(profiles.num_layers()),
      gpus(cluster.num_devices()),
      device_types(static_cast<int>(cluster.device_types().size())),
      gbs(options.gbs) {
  cp = setups.front().context_parallel;
  for (const TrainingSetup& st : setups)
    if (st.context_parallel != cp || cp < 1)
      throw std::invalid_argument("SearchSpace: every setting searched at once must have one context-parallel size");
  for (const auto& e : profiles.entries()) max_tp = std::max(max_tp, e.tp);
  max_tp = std::min(max_tp, options.max_tp);
  type_tp = profiled_tps(cluster, profiles, simulator.shape(), max_tp);
  add_node_orders(cluster, simulator);
  // Without cross-node tp, no tp above the largest node can be used: the tables stop there.
  if (!options.allow_cross_node_tp) {
    int largest_node = 1;
    for (int x : orders[0].node_run) largest_node = std::max(largest_node, x);
    max_tp = std::min(max_tp, largest_node);
  }
  whole_nodes = whole_node_stages(options.stage_boundaries, gpus);
  max_stages = std::min({layers, whole_nodes ? static_cast<int>(cluster.nodes().size()) : gpus, options.max_stages});
  for (int micro_batches = gbs; micro_batches >= 1; --micro_batches)
    if (gbs % micro_batches == 0 && gbs / micro_batches <= options.max_micro_batch) micro_batch_counts.push_back(micro_batches);
  refuse_too_many_slicings();
  count_units();
}

// The slicings grow with the largest micro-batch: refuse, naming the input, what would exhaust memory.
void SearchSpace::refuse_too_many_slicings() const {
  const double slicings = static_cast<double>(device_types) * (max_tp + 1) * (max_share() + 1);
  if (slicings <= kMaxShareSlicings) return;
  throw InputError("--gbs " + std::to_string(gbs) + ": the search keeps the profile slicings of every share of "
                   "a micro-batch of up to " + std::to_string(max_share()) + " sequences for " +
                   std::to_string(device_types) + " GPU type(s) and tp up to " + std::to_string(max_tp) + ", " +
                   std::to_string(static_cast<long long>(slicings)) + " entries, past the 4194304 it can hold "
                   "(use a smaller --gbs)");
}

// Node orders: the permutations of the device types, in lexicographic order.
void SearchSpace::add_node_orders(const Cluster& cluster, const PlanSimulator& simulator) {
  std::vector<int> perm(device_types);
  for (int t = 0; t < device_types; ++t) perm[t] = t;
  do {
    orders.push_back(
        make_node_order(cluster, simulator, setups, type_tp, perm, static_cast<int>(orders.size()), max_tp));
  } while (std::next_permutation(perm.begin(), perm.end()));
}

void SearchSpace::count_units() {
  // Units also split by stage 0's layers where that keeps them few: one (p, m, first size) can
  // otherwise hold a fifth of the whole search, and the threads wait on it.
  double split_units = 0;
  for (int stages = 2; stages <= max_stages; ++stages)
    split_units += static_cast<double>(micro_batch_counts.size()) * orders.size() * (gpus - stages + 1) * (layers - stages + 1);
  split_layers = split_units <= 2e6;
  p_first_.assign(max_stages + 2, 0);
  const long long n_groups = static_cast<long long>(num_ms()) * static_cast<int>(orders.size());
  for (int stages = 1; stages <= max_stages; ++stages) p_first_[stages + 1] = p_first_[stages] + n_groups * units_per_group(stages);
}

double SearchSpace::stage_positions(const Cluster& cluster) const {
  return whole_nodes ? static_cast<double>(cluster.nodes().size()) : gpus;
}

long long SearchSpace::units_per_group(int stages) const {
  return stages == 1 ? 1 : static_cast<long long>(gpus - stages + 1) * (split_layers ? layers - stages + 1 : 1);
}

long long SearchSpace::group_unit_count(int p_begin, int p_end) const {
  long long n = 0;
  for (int stages = p_begin; stages <= std::min(p_end, max_stages); ++stages) n += units_per_group(stages);
  return n;
}

// The unit (p, m's index, node order, stage 0's size and layers; first_layers = 0: any), with its place
// in the search's order of units, by those fields in turn (the first infeasible one found gives the
// reason reported).
Unit SearchSpace::make_unit(int stages, int m_index, int order, int first_size, int first_layers) const {
  const int n_orders = static_cast<int>(orders.size());
  const long long base = ((static_cast<long long>(stages) * num_ms() + m_index) * n_orders + order) * (gpus + 1) + first_size;
  return Unit{order,      micro_batch_counts[m_index], stages, order * num_ms() + m_index, first_size, first_layers,
              base * (layers + 1) + first_layers};
}

Unit SearchSpace::group_unit(int group, int stages, long long j) const {
  while (j >= units_per_group(stages)) j -= units_per_group(stages++);
  const int s0 = stages == 1 ? gpus : 1 + static_cast<int>(split_layers ? j / (layers - stages + 1) : j);
  const int k0 = stages == 1 || !split_layers ? 0 : 1 + static_cast<int>(j % (layers - stages + 1));
  return make_unit(stages, group % num_ms(), group / num_ms(), s0, k0);
}

Unit SearchSpace::next_in_group(const Unit& u) const {
  int stages = u.stages, s0 = u.first_size, k0 = u.first_layers;
  if (stages > 1 && split_layers && k0 < layers - stages + 1) {
    ++k0;
  } else if (stages > 1 && s0 < gpus - (stages - 1)) {
    ++s0;
    k0 = split_layers ? 1 : 0;
  } else {
    ++stages;
    s0 = 1;
    k0 = split_layers ? 1 : 0;
  }
  return make_unit(stages, u.group % num_ms(), u.order, s0, k0);
}

Unit SearchSpace::unit_at(long long index) const {
  const int n_orders = static_cast<int>(orders.size());
  const int stages = static_cast<int>(std::upper_bound(p_first_.begin() + 1, p_first_.end(), index) - p_first_.begin()) - 1;
  const long long per_group = units_per_group(stages);
  const long long rem = index - p_first_[stages], g_in_p = rem / per_group;
  return group_unit(static_cast<int>(g_in_p % n_orders) * num_ms() + static_cast<int>(g_in_p / n_orders), stages,
                    rem % per_group);
}

FeasibilityTables::FeasibilityTables(const SearchSpace& space)
    : layers_(space.layers),
      max_tp_(space.max_tp),
      dp_buckets_([&] {
        int j = 0;
        while ((1 << j) < space.gpus) ++j;
        return j + 1;
      }()),
      unmeasured_acc_(static_cast<std::size_t>(space.device_types) * (space.max_tp + 1) * (space.layers + 1) *
                          (space.layers + 1),
                      0.0) {}

void FeasibilityTables::fill(const SearchSpace& space, const ProfileSet& profiles, const Cluster& cluster,
                             SearchControl& control) {
  // The two tables' rows, one task each: [type][tp] of unmeasured_acc, then [tp][dp bucket] of state_lb.
  const double state_lb_entries = static_cast<double>(max_tp_ + 1) * dp_buckets_ * (layers_ + 1) * (layers_ + 1);
  if (state_lb_entries <= kMaxStateLbEntries) state_lb_.assign(static_cast<std::size_t>(state_lb_entries), 0.0);
  const int acc_rows = space.device_types * max_tp_;
  const int state_rows = state_lb_.empty() ? 0 : max_tp_ * dp_buckets_;
  tbb::parallel_for(0, acc_rows + state_rows, [&](int i) {
    if (i < acc_rows) fill_unmeasured_row(space, profiles, cluster, control, i);
    else fill_states_row(space, control, i - acc_rows);
  });
}

void FeasibilityTables::fill_unmeasured_row(const SearchSpace& space, const ProfileSet& profiles,
                                            const Cluster& cluster, SearchControl& control, int row) {
  const int t = row / max_tp_, tp = 1 + row % max_tp_;
  if (!space.type_tp[t][tp]) return;  // no slicing of the type at tp: never read
  const int pt = profiles.type_index(cluster.device_types()[t]);
  for (int l = 0; l < layers_ && !control.check_stop(); ++l)
    for (int e = l + 1; e <= layers_; ++e)
      unmeasured_acc_[((static_cast<std::size_t>(t) * (max_tp_ + 1) + tp) * (layers_ + 1) + l) * (layers_ + 1) + e] =
          space.orders[0].cost->unmeasured_accumulation_ms(pt, tp, l, e);
}

void FeasibilityTables::fill_states_row(const SearchSpace& space, SearchControl& control, int row) {
  const int tp = 1 + row / dp_buckets_, j = row % dp_buckets_;
  bool profiled = false;
  for (int t = 0; t < space.device_types; ++t) profiled = profiled || space.type_tp[t][tp];
  if (!profiled) return;
  for (int l = 0; l < layers_ && !control.check_stop(); ++l) {
    double* row_l = state_lb_.data() + ((static_cast<std::size_t>(tp) * dp_buckets_ + j) * (layers_ + 1) + l) * (layers_ + 1);
    for (int e = l + 1; e <= layers_; ++e)
      row_l[e] = space.orders[0].cost->state_bytes_lower_bound(tp, 1 << j, l, e);
  }
}

}  // namespace hetplan
