// PlanCostModel: "cost this plan", the fast path of the simulator. It is
// the one definition of a stage's costs: PlanSimulator::run ("explain this
// plan": labels, per-rank memory records, the Boost timeline and its trace)
// takes its StageCosts from here too, so the two agree exactly.
//
// A stage's costs follow PlanSimulator's model (see sim/plan_simulator.h)
// on the rank grid of sim/parallel_layout.h (Megatron's order). The
// micro-batch is gbs / batches samples (batches must divide gbs): a
// homogeneous stage splits it over its dp replicas as evenly as possible
// (split_micro_batch), a mixed-type stage with the data load balancer; the
// stage runs at its slowest replica, and each rank's memory uses its own
// replica's share. A tp group that spans nodes pays, for each of Megatron's
// 2 forward and 2 backward tensor-parallel all-reduces per transformer layer
// (micro-batch share x seq x hidden x 2 bytes, bf16), the inter-node ring
// all-reduce time less the intra-node one the profile measured (a ring at
// the node's collective bandwidth; never negative). Recomputation reruns
// the forward's compute, not these all-reduces.
//
// Costing shares what does not change between the training settings
// searched as dimensions (ZeRO stage, recomputation): profile look-ups, data
// balancing, p2p, and the network work for equal gradient bytes; the cluster's
// Network is built once per model. The hot path (stage, iteration_ms)
// builds no strings, no graph and allocates nothing once the caller's
// PipelineScratch has grown.
//
// iteration_ms is the longest path of simulate_timeline's task graph
// (forward/backward per stage and micro-batch, sends per link in micro-batch
// order, each stage's compute in its StageOps order (sim/schedule.h),
// all-reduce then optimizer after a stage's last compute) computed as an
// O(p x m) recurrence, with the same
// floating-point operations, so it equals simulate_timeline's iteration_ms
// bit for bit. It also stretches the pace-setting stage to its sustained
// clocks as PlanSimulator::run does (SimulationOptions::sustained_clocks).
#pragma once

#include <string>
#include <vector>

#include "sim/network.h"
#include "sim/parallel_layout.h"
#include "sim/plan_simulator.h"

namespace hetplan {

// One pipeline stage of a candidate plan.
struct StageChoice {
  int begin = 0, size = 1;             // ranks [begin, begin + size) of the RankLayout
  Strategy st;                         // st.dp * st.tp == size
  int layer_begin = 0, layer_end = 0;  // Metis layers [layer_begin, layer_end), non-empty
                                       // (an empty range, which Metis's layer balancer can yield, costs no compute)
};

// What the timeline needs of one stage, and its memory verdict, for one TrainingSetup.
struct FastStageCost {
  double forward_ms = 0, backward_ms = 0, accumulation_ms = 0;  // one micro-batch, before any sustained stretch
  double send_forward_ms = 0, send_backward_ms = 0;             // 0 where there is no neighbour
  double allreduce_ms = 0, optimizer_ms = 0;
  double sustained_factor = 1;
  double peak_memory_bytes = 0;   // largest rank total of the stage
  double min_headroom_bytes = 0;  // min over the stage's ranks of capacity - total (< 0: out of memory)
  int first_oom_rank = -1;
  double first_oom_total_bytes = 0;  // that rank's total (added: the search's skip reason)
  bool fits = true;
  double busy_ms(int m) const { return m * (forward_ms + backward_ms) + (m - 1) * accumulation_ms; }
};

// The timeline's per-micro-batch times of a stage (sim/timeline.h) from the search's: the passes, sends,
// all-reduce and optimizer step; the label, sustained factor and peak FLOP/s stay the caller's.
inline StageCosts timeline_stage_times(const FastStageCost& f) {
  StageCosts c;
  c.forward_ms = f.forward_ms;
  c.backward_ms = f.backward_ms;
  c.accumulation_ms = f.accumulation_ms;
  c.send_forward_ms = f.send_forward_ms;
  c.send_backward_ms = f.send_backward_ms;
  c.allreduce_ms = f.allreduce_ms;
  c.optimizer_ms = f.optimizer_ms;
  return c;
}

// Caller-owned scratch for iteration_ms (grown once, reused: no allocation after warm-up).
// One per thread.
struct PipelineScratch {
  std::vector<double> a, b, c, d;
  std::vector<int> pos;
  std::vector<FastStageCost> one;  // best_setup: one setup's stages
  std::vector<int> order, done;    // best_setup: setups by cost estimate, those computed
};

// The explain path's detail of one stage for one setup (allocates).
struct StageDetail {
  std::vector<int> replica_types;  // profile type index of each dp replica (its first rank's)
  std::vector<int> shares;         // each dp replica's share of the micro-batch
  std::vector<RankMemory> ranks;   // each rank of the stage, in rank order
  double cp_exchange_forward_ms = 0, cp_exchange_backward_ms = 0;  // exposed ring-attention K/V exchange
  double cp_merge_forward_ms = 0, cp_merge_backward_ms = 0;        // the ring's merging of partial results
};

// The fast cost of candidates of one search over one node sequence.
// Built once per (simulator, layout); thread-safe for concurrent const calls.
// REQUIRES: `sim` and `layout` outlive it.
class PlanCostModel {
 public:
  // `setups`: the training settings searched as dimensions (ZeRO stage, recompute); size >= 1.
  // Every other option (schedule, network, clocks) is `sim`'s.
  PlanCostModel(const PlanSimulator& sim, const RankLayout& layout, std::vector<TrainingSetup> setups);

  int num_setups() const { return static_cast<int>(setups_.size()); }
  // The least over the setups of the share of the blocks' forward that recomputation runs again in the
  // backward (0 where some setup does not recompute): what every setup's backward adds at least.
  double least_recompute_fraction() const {
    double f = recompute_fraction_.empty() ? 0.0 : recompute_fraction_[0];
    for (double x : recompute_fraction_) f = std::min(f, x);
    return f;
  }
  // What recomputation adds at least, under every setup, to one pass of Metis layer l as profile file
  // `p` measured it (ms): that fraction of the layer's measured forward where it is a transformer block
  // (layers 1 .. L - 2; the embedding and the head are not recomputed); 0 where the file does not split
  // out the forward (stage() then spreads the forward over a stage's layers, not additive per layer).
  double least_recompute_ms(const LayerProfile& p, int l) const {
    const int layers = static_cast<int>(p.layer_ms.size());
    if (l < 1 || l >= layers - 1 || !p.has_forward()) return 0.0;
    return least_recompute_fraction() * p.forward_time(l, l + 1);
  }
  const TrainingSetup& setup(int k) const { return setups_[k]; }
  // The share of the blocks' forward that setup k recomputes in the backward (0 without recomputation).
  double recompute_fraction(int k) const { return recompute_fraction_[k]; }
  Schedule schedule() const;
  const ParallelLayout& grid() const { return grid_; }
  const Network& network() const { return net_; }
  // PlanSimulator::tied_copy_bytes: the tied word table's copy a piece of Metis layers [begin, end) keeps.
  double tied_copy_bytes(int begin, int end) const;

  // Costs stage `index` of `num_stages` for every setup at once (out[k] for setups[k]), sharing the
  // profile look-ups, data balancing and network work between setups. `micro_batch` = gbs / batches.
  // Returns false if a profile is missing (then, if `why` is non-null, sets it; only that path may allocate).
  bool stage(const StageChoice& s, int index, int num_stages, int batches, int micro_batch, FastStageCost* out,
             std::string* why = nullptr) const;

  // stage() for setup `k` alone, also filling `detail` (the explain path; allocates).
  bool explain_stage(const StageChoice& s, int index, int num_stages, int batches, int micro_batch, int k,
                     FastStageCost* out, StageDetail* detail, std::string* why) const;

  // A p2p send of one micro-batch's activations (or their gradients) from rank `from` to rank `to` by a
  // stage whose largest replica share is `max_share` samples at tp and context-parallel size cp (bf16,
  // split over tp, and over cp: each cp rank sends its chunk of every sequence): the send_forward_ms /
  // send_backward_ms stage() gives under sequence parallelism (without it, stage() adds
  // scatter_gather_ms). No allocation. REQUIRES: cp >= 1.
  double p2p_ms(int from, int to, int max_share, int tp, int cp = 1) const {
    return net_.p2p_seconds(from, to, act_bytes_per_sample_ * max_share / tp / cp) * 1e3;
  }

  // p2p_ms from rank `from` to rank `to` for stage s's micro-batch shares (0 where a profile is missing):
  // an interleaved pipeline's sends between its last and first stage; *gather_ms (if non-null) the
  // receiver's scatter_gather_ms for them. No allocation.
  double p2p_ms_of(const StageChoice& s, int from, int to, int micro_batch, double* gather_ms = nullptr) const;

  // Megatron's scatter/gather of pipeline sends (Narayanan et al. SC'21, Sec. 4.1; on by default,
  // --no-scatter-gather-tensors-in-pipeline): each of the sender's tp ranks sends 1/tp of the activation
  // (p2p_ms) and the receiving stage all-gathers the pieces over its tp ranks, a ring all-gather of the
  // whole micro-batch share (1/cp of it under context parallelism) at the collective bandwidth of the node
  // of rank `to`. Setups with sequence parallelism send a tensor already split by tp and gather nothing, so
  // stage() adds this to their sends only without it. 0 at tp 1. No allocation.
  double scatter_gather_ms(int to, int max_share, int tp, int cp) const;
  // The simulator's chunks per stage: its virtual_stages under the interleaved schedule, else 1.
  int virtual_stages() const;

  // Interleaved 1F1B: the costs of the p * v virtual stages of the pipeline `stages` for every setup,
  // out[k * num_setups() + q] for virtual stage k (chunk k / p of stage k % p, its layers chunk_layers,
  // sim/schedule.h) and setup q. A chunk is costed as a stage of its layers numbered as its virtual
  // stage of p * v (so only virtual stage 0 runs the batch generator); the sends from the last stage's
  // chunk c to the first stage's chunk c + 1, and back, go over the link between those stages. Their
  // all-reduce, optimizer and memory fields are not the stage's (those come from stage()). Returns false
  // where a profile is missing (then, if `why` is non-null, sets it).
  // REQUIRES: v >= 2, every stage at least v blocks (stage_blocks). No allocation (but `why`).
  bool chunk_costs(const StageChoice* stages, int p, int batches, int micro_batch, int v, FastStageCost* out,
                   std::string* why = nullptr) const;

  // The least, over the setups, of the gradient accumulation per micro-batch that stage() gives a
  // replica of profile type `ptype` at tp on layers [start, end) whose profile does not measure it (its
  // gradient read twice and written once at the datasheet's HBM bandwidth; 0 where that is unknown).
  // A lower bound for the search, which tabulates it once per search (not on its hot path).
  double unmeasured_accumulation_ms(int ptype, int tp, int start, int end) const;

  // The least, over the setups, of the model-state bytes (weights, gradients and optimizer state, as ZeRO
  // shards them) that a rank holding layers [start, end) at (tp, dp) keeps: a lower bound on the GPU memory
  // stage() finds for each of that stage's ranks (activations, working sets, gathered ZeRO-3 units and the
  // framework only add to it).
  // Non-increasing in dp (ZeRO partitions over it). Not on the hot path: the search tabulates it.
  double state_bytes_lower_bound(int tp, int dp, int start, int end) const;
  // The GPU memory of rank r less the headroom (bytes; DeviceMemoryOptions::usable_bytes), which stage()
  // checks each rank's device memory in use against.
  double rank_capacity_bytes(int r) const { return rank_capacity_[r]; }

  // The stage that sets the pipeline's pace (largest busy_ms(batches), the first on ties), whose
  // forward and backward iteration_ms stretches by its sustained_factor; -1 when the simulator's
  // sustained_clocks is off or that factor is 1.
  int pace_stage(const FastStageCost* stages, int p, int batches) const;

  // The iteration time of a pipeline of these stages (one setup), exactly the number
  // simulate_timeline gives for the same stages, including the sustained-clock stretch of the
  // pace-setting stage (as PlanSimulator::run applies it). O(p * v * m), no allocation once scratch is
  // grown. Interleaved (schedule kInterleaved1F1B, virtual_stages v > 1): `chunks` holds the p * v
  // virtual stages' costs in model order (their forward, backward, accumulation and send times are
  // read); `stages` still gives each stage's all-reduce, optimizer and the pace (as a whole stage).
  // REQUIRES: interleaving_error(schedule, p, batches, virtual_stages) empty.
  double iteration_ms(const FastStageCost* stages, int p, int batches, Schedule schedule, PipelineScratch* scratch,
                      const FastStageCost* chunks = nullptr, int virtual_stages = 1) const;

  // The fastest setup that fits every stage's memory, from stage()'s output for all p stages laid out
  // stage-major (`all[i * num_setups() + k]`): the minimum of iteration_ms over the fitting setups,
  // exactly, without computing it for a setup that another computed setup dominates (every timing
  // field of every stage <=, same pace-setting stage: the longest path cannot be shorter). Returns
  // the setup index (-1 if none fits) and sets *ms. No allocation once scratch is grown.
  int best_setup(const FastStageCost* all, int p, int batches, Schedule schedule, PipelineScratch* scratch,
                 double* ms) const;

 private:
  struct StageBasis;  // what the setups of one stage share (plan_cost.cc)
  struct SetupReuse;  // what one setup's costing leaves for the next (plan_cost.cc)
  // ZeRO-3 (FSDP2's and replay's): the 16-bit weight bytes a rank's forward and backward all-gather, as a
  // fraction of the stage's weights. The forward gathers every layer's just before it, the tied embedding
  // twice where both ends are on the stage (the embedding's and the head's use); the model's last layer
  // keeps its weights after its forward (its backward comes next), so the backward re-gathers the others.
  struct Zero3Gathers {
    double forward_share = 1, backward_share = 1;
  };
  bool stage_impl(const StageChoice& s, int index, int num_stages, int batches, int micro_batch, int first_setup,
                  int num_setups, FastStageCost* out, StageDetail* detail, std::string* why) const;
  bool stage_basis(const StageChoice& s, int index, int num_stages, int batches, int micro_batch, int cp, StageBasis* b,
                   StageDetail* detail, std::string* why) const;
  bool replica_shares(const StageChoice& s, int micro_batch, StageBasis* b, std::string* why) const;
  void ring_attention_ms(const StageChoice& s, StageBasis* b) const;
  bool slowest_replica(const StageChoice& s, int index, StageBasis* b, std::string* why) const;
  double cross_node_tp_ms(int begin, Strategy st, int d, int share, int blocks) const;
  void setup_times(const StageChoice& s, int index, int num_stages, const StageBasis& b, int k, SetupReuse* reuse,
                   FastStageCost* c) const;
  void replica_step_ms(Strategy st, const StageBasis& b, double trainable, double full_on_rank, double grad_bytes,
                       double* accumulation, double* optimizer) const;
  double gradient_pack_ms(const TrainingSetup& setup, double trainable, int ptype) const;
  void add_gradient_sync(const StageChoice& s, int index, int num_stages, const TrainingSetup& setup,
                         double trainable, double grad_bytes, double hbm_bytes_per_s, SetupReuse* reuse,
                         FastStageCost* c) const;
  double slowest_dp_all_reduce(int begin, Strategy st, double bytes) const;
  void add_overlapped_sync(Strategy st, int zero, double trainable, double grad_bytes, double weight_bytes,
                           double last_grad_bytes, const CommOverlap& ov, double rs, double ag, const Zero3Gathers& z3,
                           SetupReuse* reuse, FastStageCost* c) const;
  Zero3Gathers zero3_gathers(const StageChoice& s, double full_on_rank, double weight_bytes) const;
  void add_offload(const StageChoice& s, const TrainingSetup& setup, int ptype, double trainable,
                   double full_on_rank, FastStageCost* c) const;
  void add_zero3_gathers(const StageChoice& s, const TrainingSetup& setup, double hbm_bytes_per_s,
                         FastStageCost* c) const;
  HostSpec host_for(int rank) const;
  void stage_memory(const StageChoice& s, int index, int num_stages, const StageBasis& b,
                    const TrainingSetup& setup, const ShardParams& sp, FastStageCost* c, StageDetail* detail) const;
  MemoryBreakdown rank_breakdown(const StageChoice& s, int index, int num_stages, int in_flight, int batches, int r,
                                 int mb, int gpn, const TrainingSetup& setup, const ShardParams& sp) const;

  const PlanSimulator* sim_;
  const RankLayout* layout_;
  std::vector<TrainingSetup> setups_;
  Network net_;
  ParallelLayout grid_;
  double model_bytes_ = 0;                // parameter bytes of the whole model
  double act_bytes_per_sample_ = 0;       // seq x hidden x 2 (bf16)
  std::vector<int> rank_ptype_;           // profile type of each rank (-1: none)
  std::vector<double> rank_capacity_;     // usable bytes of each rank (its GPU's, less the headroom)
  std::vector<double> ptype_framework_;   // [profile type * (max tp + 1) + tp]: ProfileSet::framework_mb in
                                          // bytes (0: none), when the setup asks (< 0) for the measured one
  int framework_tps_ = 1;                 // max tp + 1
  std::vector<double> ptype_hbm_bytes_per_s_;  // per profile type: datasheet HBM bandwidth (0: unknown)
  std::vector<double> recompute_fraction_;     // per setup: recomputed_forward_fraction
};

}  // namespace hetplan
