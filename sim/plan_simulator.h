// PlanSimulator: "explain this plan". Turns a heterogeneous plan into
// per-stage costs, a scheduled timeline (sim/timeline.h) with its spans and
// per-rank memory, from the same profiles and clusterfile the Metis search
// reads. It promises the numbers the search's fast path (PlanCostModel)
// gives for the same plan: the iteration time bit for bit, the same memory
// verdict.
//
// REQUIRES: the Cluster and ProfileSet given to the constructor outlive it
// (it keeps pointers to them; the shape and options are copied).
// Thread-safety: immutable after construction; concurrent const calls are
// safe.
//
// The per-stage numbers come from PlanCostModel (sim/plan_cost.h), the one
// definition the search's fast path uses too; this class adds the labels,
// per-rank memory records and the task-graph timeline with its trace. Ranks
// follow Megatron's grid (sim/parallel_layout.h). The micro-batch is
// gbs / batches samples (batches must divide gbs).
//
// A stage's micro-batch time is the slowest data-parallel replica's profiled
// layer time for its share of the micro-batch (split evenly over a
// homogeneous stage's replicas, the first b % dp taking one more; by the
// DataLoadBalancer over a mixed stage's; a share without its own profile is
// costed as Metis does, as the sum of its power-of-two slices; a tp group
// across nodes adds its all-reduces' inter-node time), split into forward and backward by
// the profile's layer_forward_ms where it records it, else by
// `backward_share`. Recomputation adds the recomputed part of the forward to
// the backward. Each stage adds its share of the parameters times the
// profile's time outside the layers (fb_sync: mostly the pass over every
// parameter that adds new gradients into the fp32 main gradients), stage 0
// the batch generator.
//
// Every micro-batch after an iteration's first also adds its gradients into
// the ones already there (the profile measures each layer's backward with
// fresh gradients, so it misses this): the profile's
// layer_grad_accumulation_ms where recorded, else three passes over the
// rank's gradient bytes at the datasheet HBM bandwidth. On 4 x H200 this was
// 1.3-4.6 ms per micro-batch, 12-20% of a micro-batch of one sample.
// Not what replay runs today (issue 34, `scripts/resimulate_run.py RUN --phases`): replay adds each
// gradient into its fp32 main gradient in the backward (MixedPrecisionAdam's in-backward hooks), the pass
// fb_sync already charges, so its backwards are alike: first over later 0.98-1.03 on every stage of the
// pipeline, tp and cp rows of the 2 x H100 runs 5 and 6 (but run 6 gpt-tp2-sp-selective-m2: 1.42) and of
// the 4 x H100 run 1's pipeline rows, against the 0.90-0.98 this charge gives (the ZeRO data-parallel rows
// differ, 0.93-0.97: their reduction falls in the later backwards). Left in: taking it out fixes the GPT pp
// 4 rows (-3.3% -> -0.5%, -2.1% -> +0.5%) but moves the 2 x H100 suites from 1.84% / 2.05% to 3.97% / 3.79%
// (there the time it adds stands in for time the model misses elsewhere in those rows, not yet found).
// Likewise fb_sync's forward share: replay's forward spans match the profiled layer forwards alone
// (gpt-dp2-zero1-m2 14.53 ms against 14.56; the simulated 16.22 carries a third of fb_sync), but moving it
// to the backward changes no iteration here and would need the search's StageEstimator
// (planner/stage_estimator.h) to split it the same way.
//
// The pace-setting stage (most compute per iteration) runs at the sustained
// clocks the profiler measured (SimulationOptions::sustained_clocks): on
// 4 x H200 the bottleneck GPU of a pipeline held 1740 MHz at 683-686 W of its
// 700 W limit while its neighbours, idle a third of the time, held 1980 MHz
// at about 550 W.
//
// p2p sizes are bf16 activations, split over tp (Megatron's scatter/gather,
// with the receiver's all-gather over tp without sequence parallelism:
// PlanCostModel::scatter_gather_ms);
// the dp all-reduce moves each stage's gradients (x1.5 for ZeRO-3,
// Rajbhandari et al. 2020, Sec. 7.2.2) over the Network; with tied
// embeddings over a pipeline, the first and the last stage also all-reduce
// the embedding's gradient between them before the step. The optimizer step
// is the profile's at the stage's tp (optimizer_time_ms, once: Metis counts
// it twice), times the stage's share of the parameter bytes, over dp with
// ZeRO. With ZeRO-Offload (TrainingSetup::offload_optimizer / offload_params)
// the step runs on the CPU and the host copies show where they exceed the
// forward or backward, by DeepSpeed's overlap rules (sim/offload.h), from
// SimulationOptions::host or the stated defaults for the stage's GPU.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/device_memory.h"
#include "sim/memory_model.h"
#include "sim/model_shape.h"
#include "sim/network.h"
#include "sim/plan.h"
#include "sim/profile.h"
#include "sim/rank_layout.h"
#include "sim/timeline.h"

namespace hetplan {

struct SimulationOptions {
  Schedule schedule = Schedule::k1F1B;
  // Model chunks per stage (Megatron's vp): > 1 only with Schedule::kInterleaved1F1B. Stage i's layers
  // split into v chunks (chunk_layers, sim/schedule.h); each chunk is costed as a stage of its layers.
  int virtual_stages = 1;
  TrainingSetup setup;  // precision, ZeRO stage, recomputation, framework constant
  NetworkOptions network;
  // Of a layer's profiled forward+backward time, the backward's share: 2/3,
  // backward doing twice the forward's FLOPs (Narayanan et al. 2021, Sec. 5.1).
  double backward_share = 2.0 / 3.0;
  int max_profiled_bs = 1 << 30;  // largest slice a replica's share is split into
  // All-reduces inside a node at the bus bandwidth the profiles measured for
  // the device type (communication.allreduce_busbw_gbs), where they did,
  // net of the measured calls' latency (the network charges latency per
  // collective itself; LayerProfile::net_allreduce_busbw_gbs);
  // false: always the clusterfile's intra_bandwidth.
  bool measured_collectives = true;
  // The stage that sets the pipeline's pace computes without idling, so its
  // GPUs run at the clocks they sustain under their power limit: its forward
  // and backward are stretched by the profiles' sustained_ratio. The other
  // stages wait for it between micro-batches and keep burst clocks. false:
  // every stage at burst clocks (the profiles' ordinary timings).
  bool sustained_clocks = true;
  // The host ranks offload to (sim/offload.h): measured pinned copy bandwidth and CPU Adam throughput.
  // Zero fields: the defaults of default_host_spec for the stage's GPU (catalogue host_link_gbs).
  HostSpec host;
  // What a rank's GPU holds beyond the allocated peak (framework default, NCCL, allocator reserve)
  // and the headroom every plan keeps free (sim/device_memory.h).
  DeviceMemoryOptions device_memory;
};

struct RankMemory {
  int rank = 0, stage = 0;
  std::string device;
  MemoryBreakdown breakdown;
  double capacity_bytes = 0;  // the GPU's memory
  double usable_bytes = 0;    // less the headroom: what gpu_total() must fit
  bool fits() const { return breakdown.gpu_total() <= usable_bytes; }
};

struct PlanSimulation {
  std::vector<StageCosts> stages;
  TimelineResult timeline;
  std::vector<RankMemory> ranks;
  bool fits = true;
  int first_oom_rank = -1;
};

class PlanCostModel;

class PlanSimulator {
 public:
  // Matches each cluster device type to its profiles (by name). Throws InputError when the
  // profiles' layer count is not the model's.
  PlanSimulator(const Cluster& cluster, const ProfileSet& profiles, ModelShape shape, int sequence_length,
                SimulationOptions options);

  // Simulates a plan in the search's terms. Returns false, with `why` set,
  // when a profile it needs is missing or batches does not divide gbs.
  // `spans` off skips the trace.
  bool run(const RankLayout& layout, const std::vector<int>& device_groups, const Strategy* strategies,
           const int* layer_partition, int batches, int gbs, PlanSimulation* out, std::string* why,
           bool spans = true) const;

  // A plan as `search --json` writes it. Throws InputError for unknown
  // device types, a plan that does not match the cluster, batches that do
  // not divide gbs, or missing profiles.
  PlanSimulation simulate(const PlanResult& plan, int gbs) const;

  // profile_type()[t]: the ProfileSet index of cluster device type t (-1: no profiles for it).
  const std::vector<int>& profile_type() const { return profile_type_; }
  const SimulationOptions& options() const { return opt_; }
  const ModelShape& shape() const { return shape_; }
  // The profiled bytes of the copy of a tied embedding's word table that a pipeline piece (a stage, or a
  // chunk of one) holding Metis layers [start, end) keeps for its LM head: the table's part of layer 0's
  // bytes where the piece holds the head but not the embedding (Megatron's last stage, replay's last
  // chunk), else 0. The profiles count the table once, in layer 0, where one process holds both ends; a
  // pipeline's copy adds its gradient into its own fp32 main gradients every micro-batch and is stepped
  // by the optimizer like the first stage's. O(1).
  double tied_copy_bytes(int start, int end) const;
  const Cluster& cluster() const { return *cluster_; }
  // Where each cluster device type's intra-node collective bandwidth comes
  // from, e.g. "H200: all-reduce 301.2 GB/s measured (profiles)".
  std::vector<std::string> collective_sources() const;

 private:
  bool add_chunk_costs(const PlanCostModel& model, const std::vector<int>& groups, const Strategy* strategies,
                       const int* partition, int batches, int micro_batch, TimelineInput* tin,
                       std::string* why) const;
  friend class PlanCostModel;  // the per-stage costs (sim/plan_cost.h): one definition for both paths
  // Parameter bytes of layers [start, end), from the profiles' model block.
  double layer_bytes(int start, int end) const;
  // Parameter bytes a pipeline piece (a stage, or a chunk of one) holding Metis layers [start, end)
  // accumulates into its fp32 main gradients every micro-batch and steps: layer_bytes plus
  // tied_copy_bytes.
  double piece_param_bytes(int start, int end) const { return layer_bytes(start, end) + tied_copy_bytes(start, end); }

  const Cluster* cluster_;
  const ProfileSet* profiles_;
  ModelShape shape_;
  int seq_;
  SimulationOptions opt_;
  std::vector<int> profile_type_;
};

ordered_json simulation_to_json(const PlanSimulation& s);

// `s` with what the profiled runs record of how they trained (when every file
// of the set that records it agrees): Megatron's accounting when they kept 18
// bytes per bf16 parameter (bf16 weights, fp32 main gradients, masters and
// Adam moments), and no stored score matrix when their attention was fused.
// `keep_accounting` / `keep_attention`: the user chose those; leave them.
TrainingSetup as_profiled(TrainingSetup s, const ProfileSet& profiles, bool keep_accounting, bool keep_attention);

// --collectives: "measured" (true) or "clusterfile" (false); throws InputError.
bool parse_collectives(const std::string& s);

}  // namespace hetplan
