// PlanSimulator: turns a heterogeneous plan into per-stage costs, a
// scheduled StageTimeline and per-rank memory, from the same profiles and
// clusterfile the Metis search reads.
//
// A stage's micro-batch time is the slowest data-parallel replica's profiled
// layer time for its share of the micro-batch (split by the
// DataLoadBalancer; a share without its own profile is costed as Metis does,
// as the sum of its power-of-two slices), split into forward and backward by
// `backward_share`. The last stage adds the profile's time outside the layers
// (fb_sync), stage 0 the batch generator. p2p sizes are bf16 activations,
// split over tp (Megatron's scatter/gather); the dp all-reduce moves each
// stage's gradients (x1.5 for ZeRO-3, Rajbhandari et al. 2020, Sec. 7.2.2)
// over the Network; the optimizer step is the profile's, split over tp and,
// with ZeRO, over dp.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
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
  TrainingSetup setup;  // precision, ZeRO stage, recomputation, framework constant
  NetworkOptions network;
  // Of a layer's profiled forward+backward time, the backward's share: 2/3,
  // backward doing twice the forward's FLOPs (Narayanan et al. 2021, Sec. 5.1).
  double backward_share = 2.0 / 3.0;
  int max_profiled_bs = 1 << 30;  // largest slice a replica's share is split into
};

struct RankMemory {
  int rank = 0, stage = 0;
  std::string device;
  MemoryBreakdown breakdown;
  double capacity_bytes = 0;
  bool fits() const { return breakdown.gpu_total() <= capacity_bytes; }
};

struct PlanSimulation {
  std::vector<StageCosts> stages;
  TimelineResult timeline;
  std::vector<RankMemory> ranks;
  bool fits = true;
  int first_oom_rank = -1;
};

class PlanSimulator {
 public:
  // `profile_type[t]` is the ProfileSet index of cluster type t (-1 absent).
  PlanSimulator(const Cluster& cluster, const ProfileSet& profiles, ModelShape shape, int sequence_length,
                SimulationOptions options);

  // Simulates a plan in the search's terms. Returns false, with `why` set,
  // when a profile it needs is missing. `spans` off skips the trace.
  bool run(const RankLayout& layout, const std::vector<int>& device_groups, const Strategy* strategies,
           const int* layer_partition, int batches, int gbs, PlanSimulation* out, std::string* why,
           bool spans = true) const;

  // A plan as `search --json` writes it. Throws InputError for unknown
  // device types, a plan that does not match the cluster, or missing profiles.
  PlanSimulation simulate(const PlanResult& plan, int gbs) const;

  const std::vector<int>& profile_type() const { return profile_type_; }

 private:
  // Forward+backward ms of layers [start, end) for `bs` samples on profile type `type` at tp; false if missing.
  bool replica_ms(int type, int tp, int bs, int start, int end, double* ms, std::string* why) const;

  const Cluster* cluster_;
  const ProfileSet* profiles_;
  ModelShape shape_;
  int seq_;
  SimulationOptions opt_;
  std::vector<int> profile_type_;
};

ordered_json simulation_to_json(const PlanSimulation& s);

}  // namespace hetplan
