// DeviceMemory: what a training rank's GPU has in use, beyond the tensors
// the memory model prices (sim/memory_model.h's allocated peak). It is the
// one home of the terms that make a plan "run as-is": `search` (its memory
// check), `simulate` (its per-rank split), the HTML report and replay's
// comparison all read a rank's total from here, through MemoryBreakdown:
//
//   in use = allocated peak                       (the caching allocator's peak: states, activations, working set)
//          + allocator reserve                     (reserved minus allocated: the caching allocator's free blocks)
//          + framework constant                    (CUDA context, cuBLAS/cuDNN workspaces: `hetplan profile`'s
//                                                   execution_memory.framework_mb at tp 1, else a default)
//          + NCCL                                  (its library state once, plus buffers per communicator)
//
// and a plan fits when, on every rank, in use + headroom <= the GPU's memory.
//
// NCCL. A communicator allocates, for each channel and each peer connection
// of an algorithm it runs, one receive buffer per protocol; NCCL's defaults
// (NVIDIA/nccl src/init.cc, DEFAULT_BUFFSIZE, DEFAULT_LL_BUFFSIZE,
// DEFAULT_LL128_BUFFSIZE): Simple 4 MiB, LL 8 lines x 512 threads x 8 steps x
// 16 B = 512 KiB, LL128 120 x 640 x 8 steps x 8 B = 4,915,200 B; 9.19 MiB a
// connection. A collective communicator on NVLink-connected GPUs opens up to
// MAXCHANNELS = 32 channels (src/include/device.h) with a ring and a tree
// connection each: 32 x 2 x 9.19 MiB = 588 MiB. A rank belongs to (as
// Megatron's and hetplan replay's groups): the world group (barriers), its tp
// group (tp > 1), its dp group (dp > 1), the tied-embedding group (first and
// last stage, pp > 1), and one two-rank p2p communicator per direction and
// neighbouring stage (replay's fwd.* and bwd.* groups, executor/pipeline_runtime.cc
// make_groups). Two more that replay creates:
//   - interleaved schedules (v > 1, pp > 1): the last stage's chunk c feeds the
//     first stage's chunk c + 1, over a forward and a backward pair of their own
//     (replay's wrap transfers): two more p2p communicators on the first and on
//     the last stage (at pp 2 these pairs are distinct from the stages' other two);
//   - context parallelism (cp > 1): the cp group, whose only traffic is the K/V
//     ring's send to the next and receive from the previous rank
//     (profiler/context_parallel.h; NCCL send/recv), priced as one p2p communicator.
// Measured on the 2-GPU suite (logs/validate/suite34-h100x2-run4): "device_used_mb" -
// "peak_reserved_mb" was 782 MiB above the earlier model on both ranks of each pp 2
// v 2 plan (2 x 420 priced), 472 MiB above it on each cp 2 rank (420 priced); on 4
// GPUs (suite34-h100x4-run1) 780 MiB on pp 4 v 2's first and last ranks and 44 MiB
// on its middle ranks, which join no extra group.
// Two constants are not NCCL's documented defaults but measured: the p2p
// communicator (its p2p channels' buffers) and the library's own state
// (kernels loaded into the context, proxy); both calibrated on replays
// (logs/validate/h200x2-round3-final: "device_used_mb" - "peak_reserved_mb"
// was 2095 MiB for every dp 2 and tp 2 plan and 2935 MiB for every pp 2 plan,
// with the framework constant 767 MiB).
//
// Allocator reserve: PyTorch's caching allocator keeps freed blocks and
// rounds requests up (2 MiB segments, 20 MiB for 1-10 MiB requests), so it
// reserves more than the peak it allocates; measured 0.6-18% of the
// allocated peak on those replays (mean 6%), priced as that fraction, or,
// where larger, the largest transient that takes segments of its own
// (own_segment_bytes). A request above 10 MiB that no cached free block can
// hold gets a new segment of its own size (cudaMalloc), and free blocks merge
// only inside their segment: a transient larger than every activation tensor
// freed before it cannot be carved from them. Its segment stays cached, free
// while the allocated peak is reached by other tensors, so it adds to the
// reserve, not the allocated peak; later transients of equal or smaller size
// reuse it (hence the largest, not the sum). Two such transients:
//   - the head's fp32 logits (the loss's input, [micro-batch, s / cp, vocab / tp]
//     x 4 B) on the rank that holds the head;
//   - overlapped ZeRO-2/3 (replay's ZeroOptimizer with --overlap-grad-reduce):
//     each unit's full fp32 gradient bucket is reduce-scattered asynchronously
//     and held until the micro-batch's backward ends, so the buckets of all the
//     rank's units (its trainable parameters x the reduced gradient's bytes) are
//     live at once while the activations are being freed. (Megatron's
//     distributed optimizer keeps one persistent gradient buffer instead.)
// On logits-heavy last stages and overlapped ZeRO-2/3 plans the measured reserve
// was 1-4.8 GiB against 0.3-1.1 GiB for 6% (logs/validate/suite34-h100x2-run4,
// suite34-h100x4-run1, device-memory/run-20261126-034858).
//
// Thread-safety: plain data and pure functions.
#pragma once

#include <algorithm>
#include <string>

namespace hetplan {

// The constants of the device-memory model (bytes); defaults documented above.
struct DeviceMemoryOptions {
  bool enabled = true;  // false: in use = allocated peak + framework constant (before issue 33)
  // When the profiles measured no framework constant: 767 MiB, `hetplan profile` on H200 with PyTorch 2.11
  // (profiles/H200-*/DeviceType.H200_tp1_bs1.json, execution_memory.framework_mb 767.1).
  double default_framework_bytes = 767.0 * 1024 * 1024;
  double nccl_connection_bytes = (1 << 22) + (1 << 19) + 4915200.0;  // Simple + LL + LL128 receive buffers
  int nccl_channels = 32;                                           // MAXCHANNELS
  int nccl_connections_per_channel = 2;                             // ring + tree
  double nccl_p2p_communicator_bytes = 420.0 * 1024 * 1024;         // calibrated (see above)
  double nccl_library_bytes = 152.0 * 1024 * 1024;                  // calibrated (see above)
  double allocator_reserve_fraction = 0.06;                          // calibrated (see above)
  // Margin kept free on every GPU: a fraction of its memory plus bytes (--memory-headroom).
  double headroom_fraction = 0.03;
  double headroom_bytes = 0;

  double collective_communicator_bytes() const {
    return nccl_channels * nccl_connections_per_channel * nccl_connection_bytes;
  }
  // The memory a plan may use on a GPU of `capacity_bytes`.
  double usable_bytes(double capacity_bytes) const {
    return capacity_bytes * (1 - headroom_fraction) - headroom_bytes;
  }
};

// The NCCL communicators one rank belongs to.
struct RankCommunicators {
  int collective = 0;  // world, tp, dp, tied embedding
  int p2p = 0;         // one per direction and neighbouring stage (interleaved: also the wrap-around
                       // pairs of the first and last stage), and the cp ring's group
};

// Where a rank sits, as far as its communicators go.
struct RankPlacement {
  int world = 1;             // ranks of the job
  int tp = 1, dp = 1;        // its stage's (dp counts the cp ranks, as the plan's strategies do)
  int pp = 1, stage = 0;     // stage `stage` of `pp`
  int virtual_stages = 1;    // model chunks per stage (interleaved 1F1B: v > 1)
  int context_parallel = 1;  // cp (1: none)
  bool tied = false;         // the model ties its input embedding to its head (an embedding group joins
                             // the first and the last stage)
};

RankCommunicators rank_communicators(const RankPlacement& p);

// NCCL's device memory for those communicators (0 for none).
double nccl_bytes(const RankCommunicators& c, const DeviceMemoryOptions& o);

// The largest transient a rank's caching allocator gives segments of its own (bytes; see above):
// `head_logits_elements`, the head's logits on this rank per micro-batch (0 off the head's rank), held as
// fp32; `held_bucket_bytes`, overlapped ZeRO-2/3's gradient buckets of all the rank's units (0 otherwise).
inline double own_segment_bytes(double head_logits_elements, double held_bucket_bytes) {
  return std::max(4 * head_logits_elements, held_bucket_bytes);
}

// The caching allocator's reserve over an allocated peak: the fraction of it, or the largest transient
// with segments of its own (own_segment_bytes) where that is more.
inline double allocator_reserve_bytes(double allocated_peak, double own_segment_bytes, const DeviceMemoryOptions& o) {
  return o.enabled ? std::max(allocated_peak * o.allocator_reserve_fraction, own_segment_bytes) : 0;
}

// Parses --memory-headroom: "N%" (of each GPU's memory, 0 to 50) or "N GiB"/"NGiB"/"N MiB" (bytes),
// into `o`'s headroom_fraction and headroom_bytes. Throws InputError naming `flag`.
void parse_memory_headroom(const std::string& text, const std::string& flag, DeviceMemoryOptions* o);

}  // namespace hetplan
