// SearchSpace: the plans PlanSearch enumerates (see planner/plan_search.md):
// the node orders, each with its rank layout, fast cost model and the tables
// that say where a stage may start and which (dp, tp) it may take; the
// micro-batch counts; and the work units, (node order, m, stages, stage 0's
// size and layers), in the search's fixed order. A --gbs whose micro-batches
// need more profile slicings than the search can hold is an InputError.
// FeasibilityTables: the least model-state bytes of a stage
// (PlanCostModel::state_bytes_lower_bound; left out past 2^25 entries, as it
// only prunes) and the unmeasured accumulation times, per layer span, shared
// by the node orders; filled within the search's time budget (past it, rows
// are left part-filled and the search is stopped).
// Read-only after construction (FeasibilityTables: after fill()), so
// thread-safe. REQUIRES: the cluster, profiles and simulator outlive them; a
// SearchSpace is not moved (its cost models refer to its layouts).
#pragma once

#include <algorithm>
#include <limits>
#include <memory>
#include <vector>

#include "planner/plan_search.h"
#include "planner/search_control.h"
#include "sim/cluster.h"
#include "sim/memory_model.h"
#include "sim/plan_cost.h"
#include "sim/plan_simulator.h"
#include "sim/profile.h"
#include "sim/rank_layout.h"

namespace hetplan {

// One node order, and what does not change within it.
struct NodeOrder {
  int index = 0;                // lexicographic index of the node order
  std::vector<int> sequence;    // type indices
  std::unique_ptr<RankLayout> layout;
  std::unique_ptr<PlanCostModel> cost;
  int ranks = 0;
  std::vector<int> node_run;    // ranks from r to the end of r's node
  std::vector<int> block;       // position in `sequence` of rank r's type
  std::vector<double> block_capacity;  // [position in `sequence`]: the GPU memory of that type's ranks (bytes)
  std::vector<std::vector<char>> tp_ok;  // [block][tp]: SearchSpace::type_tp of the type at that sequence position
  // tp_fail[tp][g]: the first rank g' >= g, g' = g mod tp, whose tp group [g', g' + tp) leaves its node
  // (ranks if none): a stage [r, r + s) keeps its tp groups inside nodes iff tp_fail[tp][r] >= r + s.
  std::vector<std::vector<int>> tp_fail;

  // Ranks [r, r + s) hold one device type.
  bool homogeneous(int r, int s) const { return block[r] == block[r + s - 1]; }
  // Every type ranks [r, r + s) hold has profiles at tp.
  bool tp_profiled(int r, int s, int tp) const {
    for (int k = block[r]; k <= block[r + s - 1]; ++k)
      if (!tp_ok[k][tp]) return false;
    return true;
  }
  bool tp_inside_nodes(int r, int s, int tp) const { return tp_fail[tp][r] >= r + s; }
  // Rank r (0 <= r <= ranks) starts a node, or is the end of the ranks.
  bool node_start(int r) const { return r == 0 || r == ranks || node_run[r - 1] == 1; }
  // The least GPU memory of ranks [r, r + s).
  double capacity(int r, int s) const {
    double c = std::numeric_limits<double>::infinity();
    for (int k = block[r]; k <= block[r + s - 1]; ++k) c = std::min(c, block_capacity[k]);
    return c;
  }
};

// One work unit: the plans of one node order, micro-batch count and pipeline depth whose stage 0 has
// `first_size` GPUs (and `first_layers` layers, where not 0).
struct Unit {
  int order = 0, micro_batches = 1, stages = 1;
  int group = 0;         // index of the (node order, m) group: order * (micro-batch counts) + m's index
  int first_size = 1;    // GPUs of stage 0 (units this small balance the threads)
  int first_layers = 0;  // layers of stage 0; 0: any
  long long ordinal = 0;  // place in the search's order of units
};

class SearchSpace {
 public:
  // REQUIRES: every device type of the cluster has profiles; setups not empty.
  SearchSpace(const Cluster& cluster, const ProfileSet& profiles, const PlanSimulator& simulator,
              std::vector<TrainingSetup> setups, const PlanSearchOptions& options);
  SearchSpace(const SearchSpace&) = delete;
  SearchSpace& operator=(const SearchSpace&) = delete;

  std::vector<TrainingSetup> setups;  // the settings searched, at least one
  // The settings' context-parallel size (sim/sequence_parallel.h), the same for all: a search of several
  // sizes runs one SearchSpace per size (PlanSearch's cp parts, planner/plan_search.md).
  int cp = 1;
  int layers = 0;
  int gpus = 0;          // ranks of every node order
  int device_types = 0;
  int gbs = 0;
  int max_tp = 0;        // the largest tp searched (at most the largest node's GPUs without cross-node tp)
  bool whole_nodes = false;  // stages are runs of whole nodes
  int max_stages = 0;    // the deepest pipeline
  std::vector<std::vector<char>> type_tp;  // [type][tp]: the type has tp profiles and tp splits the heads
  std::vector<NodeOrder> orders;
  std::vector<int> micro_batch_counts;  // the m searched, most micro-batches first
  bool split_layers = false;  // units also split by stage 0's layers

  int num_setups() const { return static_cast<int>(setups.size()); }
  // A stage of dp replicas (the plan's dp, cp included) may take a micro-batch of b samples: cp divides dp
  // and each of the dp / cp Megatron replicas (cp groups) trains at least one sample. (At cp 1: dp <= b.)
  bool splits_micro_batch(int dp, int b) const { return cp == 1 ? dp <= b : dp % cp == 0 && dp / cp <= b; }
  int num_groups() const { return static_cast<int>(orders.size() * micro_batch_counts.size()); }
  const NodeOrder& order_of_group(int group) const { return orders[group / num_ms()]; }
  int micro_batches_of_group(int group) const { return micro_batch_counts[group % num_ms()]; }
  // The largest micro-batch searched (sequences; 1 where no micro-batch count is searched).
  int max_share() const { return micro_batch_counts.empty() ? 1 : gbs / micro_batch_counts.back(); }
  // Stage boundaries: ranks, or node starts only.
  double stage_positions(const Cluster& cluster) const;

  // The units, in the search's order: by stages, then m's index, node order, stage 0's size and layers.
  long long units_total() const { return p_first_.back(); }
  // A group's units of p stages: stage 0's size (all ranks for p = 1), and its layers where split.
  long long units_per_group(int stages) const;
  // A group's units of p_begin .. p_end stages.
  long long group_unit_count(int p_begin, int p_end) const;
  // Group g's units from its first of p stages on, in the search's order: unit j of them (j < the sum
  // of units_per_group over the p that follow). Made when run, never listed.
  Unit group_unit(int group, int stages, long long j) const;
  // The unit after u in its group's order.
  Unit next_in_group(const Unit& u) const;
  // Unit `index` of the search's order.
  Unit unit_at(long long index) const;

 private:
  int num_ms() const { return static_cast<int>(micro_batch_counts.size()); }
  void add_node_orders(const Cluster& cluster, const PlanSimulator& simulator);
  void refuse_too_many_slicings() const;
  void count_units();
  Unit make_unit(int stages, int m_index, int order, int first_size, int first_layers) const;

  std::vector<long long> p_first_;  // index of the first unit of each p; the last entry: the number of units
};

class FeasibilityTables {
 public:
  explicit FeasibilityTables(const SearchSpace& space);
  // Fills both tables, a task per row (a few hundred microseconds in all; seconds at thousands of
  // layers), each row stopping once control.check_stop() says so. Not called: states_row() is null and
  // unmeasured_accumulation() all zeros.
  void fill(const SearchSpace& space, const ProfileSet& profiles, const Cluster& cluster, SearchControl& control);

  // [l .. layers] row over e of the least model-state bytes of layers [l, e) at (dp, tp), over the
  // setups, a bound for every dp' <= dp's power-of-two bucket (the states only shrink as dp grows);
  // nullptr where not filled (or left out as too large).
  const double* states_row(int tp, int dp, int l) const {
    if (state_lb_.empty()) return nullptr;
    int j = 0;
    while ((1 << j) < dp) ++j;
    return state_lb_.data() + ((static_cast<std::size_t>(tp) * dp_buckets_ + j) * (layers_ + 1) + l) * (layers_ + 1);
  }
  // [type][tp][l][e]: PlanCostModel::unmeasured_accumulation_ms of the type's profiles (any node order's
  // model: it does not depend on the layout), for the estimates of replicas whose files do not measure it.
  const std::vector<double>& unmeasured_accumulation() const { return unmeasured_acc_; }

 private:
  void fill_unmeasured_row(const SearchSpace& space, const ProfileSet& profiles, const Cluster& cluster,
                           SearchControl& control, int row);
  void fill_states_row(const SearchSpace& space, SearchControl& control, int row);

  int layers_, max_tp_, dp_buckets_;
  std::vector<double> unmeasured_acc_;
  std::vector<double> state_lb_;  // [tp][dp bucket][l][e]
};

}  // namespace hetplan
