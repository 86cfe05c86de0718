// Overlapped data-parallel communication: what of a stage's gradient
// reduce-scatter / all-reduce and parameter all-gather stays exposed when it
// runs in buckets during the backward (or, for gathers, the forward), and how
// much slower the overlapped compute runs while NCCL shares its SMs.
//
// Megatron-LM (--overlap-grad-reduce, --overlap-param-gather, --ddp-bucket-size),
// DeepSpeed (zero_optimization.overlap_comm, reduce_bucket_size,
// allgather_bucket_size) and PyTorch DDP/FSDP2 all do this the same way: the
// parameters are grouped into buckets of about `bucket_params` parameters; a
// bucket's collective starts once its last gradient is produced (or, for a
// gather, the bucket i + 1 gather starts when bucket i is needed). The story
// of the bound is in sim/dp_overlap.md.
//
// Plain values and pure functions; thread-safe; no allocation (the costing
// hot path calls them).
#pragma once

#include <string>

namespace hetplan {

// GEMM time while an NCCL all-reduce stream shares the GPU, over its time alone:
// measured by scripts/gpu_nccl_bench.sh ("overlap.gemm_slowdown", NCCL's own
// algorithm choice) on 2 x H200, logs/validate/nccl-h200x2 (sim/dp_overlap.md).
// The default where no probe of the collectives overlap really runs was made
// (OverlapSlowdowns below).
inline constexpr double kCommComputeSlowdown = 1.035;

// The compute stretch beside each kind of overlapped collective: the backward's
// gradient reductions (fp32 reduce-scatters or all-reduces) and the weight gathers
// (16-bit all-gathers). Each is 1 + (compute time added) / (the collectives' time
// alone) for compute that runs while the collectives do (overlap_slowdown_s), as
// scripts/gpu_overlap_probe.sh measures it on the GPUs the profiles were taken on,
// at the bucket sizes replay uses (sim/dp_overlap.md, "SM sharing").
// `ring`: beside context parallelism's ring exchange (a bf16 send to the next rank and receive from the one
// before, NCCL's send/receive kernel; the probe's optional --ring-bytes case); 0 where the probe did not
// run it: the gather figure stands for it (the same copy traffic, no arithmetic) -- ring_stretch().
struct OverlapSlowdowns {
  double reduce = kCommComputeSlowdown;
  double gather = kCommComputeSlowdown;
  double ring = 0;
  double ring_stretch() const { return ring > 0 ? ring : gather; }
};

// The file of a profile folder that holds the probe's result; absent: the defaults.
inline constexpr const char* kOverlapProbeFile = "comm_overlap.json";

// Reads scripts/gpu_overlap_probe.py's JSON: its "compute_slowdown" object's "reduce"
// and "gather", each a number in [1, 10], and "ring" where present (the same range).
// Throws InputError naming the file and key otherwise.
OverlapSlowdowns read_overlap_probe(const std::string& path);

// Megatron-LM's default bucket: max(40M, 1M x dp) parameters
// (megatron/core/distributed/distributed_data_parallel.py).
double megatron_default_bucket_params(int dp);

struct CommOverlap {
  bool grad_reduce = false;        // gradients reduced bucket by bucket during the last backward
                                   // (ZeRO-2: every micro-batch's backward; ZeRO-3: with the weight re-gather)
  bool param_gather = false;       // ZeRO-1/3 weights gathered bucket by bucket during the forward
  double grad_bucket_params = 0;   // parameters per gradient bucket; 0: megatron_default_bucket_params(dp)
  double param_bucket_params = 0;  // parameters per all-gather bucket; 0: as the gradient bucket
  // Compute stretch while a collective runs beside it: > 0, this factor for every collective (a run's
  // --comm-slowdown); 0, the profiles' measurement (ProfileSet::overlap_slowdowns: the profile folder's
  // comm_overlap.json, else kCommComputeSlowdown for both kinds).
  double compute_slowdown = 0;
  bool any() const { return grad_reduce || param_gather; }
};

// Buckets of `params` parameters at `bucket_params` per bucket (0: Megatron's default at dp): at least 1.
int bucket_count(double params, double bucket_params, int dp);

// A chain of `buckets` collectives of `per_bucket_s` each, bucket i ready at (i + 1) / buckets of a
// compute window of `window_s` (or, for gathers, needed at i / buckets of it): the time the last
// collective ends after the window ends, max(per_bucket, buckets x per_bucket - window x (buckets - 1)
// / buckets). REQUIRES: buckets >= 1, per_bucket_s >= 0, window_s >= 0.
double exposed_after_window(double per_bucket_s, int buckets, double window_s);

// The compute stretch of a window of `window_s` while `comm_s` of collectives run beside it:
// (slowdown - 1) x min(window, comm).
double overlap_slowdown_s(double comm_s, double window_s, double slowdown);

}  // namespace hetplan
