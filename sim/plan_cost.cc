#include "sim/plan_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "sim/data_load_balancer.h"
#include "sim/gpu_specs.h"
#include "sim/layer_time_model.h"
#include "sim/roofline.h"
#include "sim/schedule.h"
#include "sim/sequence_parallel.h"

namespace hetplan {

namespace {

// Adding a micro-batch's gradients into the ones already there, where the profile did not measure it:
// read the new and the old gradient and write the sum, at the datasheet's HBM bandwidth (0 if unknown).
double datasheet_accumulation_ms(double grad_bytes, double hbm_bytes_per_s) {
  return hbm_bytes_per_s > 0 ? 3 * grad_bytes / hbm_bytes_per_s * 1e3 : 0;
}

constexpr double kMiB = 1024.0 * 1024.0;

// A pipeline send with the receiver's scatter/gather all-gather (PlanCostModel::scatter_gather_ms), which a
// setup with sequence parallelism does not run: its boundary tensor is already split by tp.
double send_with_gather_ms(const TrainingSetup& setup, double send_ms, double gather_ms) {
  return send_ms + (setup.sequence_parallel ? 0.0 : gather_ms);
}

// What one data-parallel replica's profiles say about layers [start, end).
struct ReplicaCost {
  double total_ms = 0;          // forward + backward of its share of the micro-batch
  double forward_ms = -1;       // of total_ms; -1 if the profile does not split it
  double block_forward_ms = -1; // of forward_ms, the transformer blocks' (what recomputation runs again)
  double accumulation_ms = -1;  // adding a micro-batch's gradients into the iteration's; -1 if not measured
  double optimizer_ms = -1;     // the file's whole-model optimizer step at this tp; -1 if absent
  double sustained_ratio = 1;   // LayerProfile::sustained_ratio
};

// For `bs` samples on profile type `type` at tp; false (with `why`) if a profile is missing.
// A share without its own profile is costed as Metis does: the sum of its power-of-two slices.
bool replica_cost(const ProfileSet& profiles, int max_profiled_bs, int type, int tp, int bs, int start, int end,
                  ReplicaCost* out, std::string* why) {
  ReplicaCost c;
  if (bs == 0) {
    *out = c;
    return true;
  }
  const LayerProfile* slices[32];
  int missing = 0;
  const int n = profiles.share_files(type, tp, bs, max_profiled_bs, slices, &missing);
  if (n < 0) {
    if (why) *why = profiles.missing_message(type, tp, missing, "a replica's share of the micro-batch");
    return false;
  }
  bool forward_known = true;
  double forward = 0, block_forward = 0;
  for (int i = 0; i < n; ++i) {
    const LayerProfile* p = slices[i];
    c.total_ms += p->time(start, end);
    forward_known = forward_known && p->has_forward();
    if (p->has_forward()) {
      forward += p->forward_time(start, end);
      // Blocks are Metis layers 1 .. L-2 (0 is the embedding, L-1 the head).
      block_forward += p->forward_time(std::max(start, 1), std::min(end, static_cast<int>(p->layer_ms.size()) - 1));
    }
  }
  if (forward_known) {
    c.forward_ms = forward;
    c.block_forward_ms = block_forward;
  }
  // Accumulating gradients and the optimizer step touch the parameters
  // once, whatever the micro-batch: any slice's file tells them.
  const LayerProfile* any = slices[0];
  if (any->has_grad_accumulation()) c.accumulation_ms = any->accumulation_time(start, end);
  c.optimizer_ms = any->optimizer_ms;
  c.sustained_ratio = any->sustained_ratio();
  *out = c;
  return true;
}

bool same_params_setup(const TrainingSetup& a, const TrainingSetup& b) {
  return a.finetune == b.finetune && a.lora_rank == b.lora_rank && a.lora_targets == b.lora_targets &&
         a.precision == b.precision;
}

}  // namespace

PlanCostModel::PlanCostModel(const PlanSimulator& sim, const RankLayout& layout, std::vector<TrainingSetup> setups)
    : sim_(&sim),
      layout_(&layout),
      setups_(std::move(setups)),
      net_(*sim.cluster_, layout, sim.opt_.network),
      grid_(*sim.cluster_, layout) {
  if (setups_.empty()) throw std::invalid_argument("PlanCostModel: no training setups");
  model_bytes_ = sim.layer_bytes(0, sim.shape_.metis_num_layers());
  act_bytes_per_sample_ = static_cast<double>(sim.seq_) * sim.shape_.hidden_size * 2;  // bf16
  const int n = layout.num_ranks();
  rank_ptype_.resize(n);
  rank_capacity_.resize(n);
  for (int r = 0; r < n; ++r) {
    rank_ptype_[r] = sim.profile_type_[layout.type_of(r)];
    rank_capacity_[r] = sim.opt_.device_memory.usable_bytes(sim.cluster_->memory_mb(layout.type_of(r)) * kMiB);
  }
  framework_tps_ = std::max(1, sim.profiles_->max_tp() + 1);
  const DeviceMemoryOptions& dm = sim.opt_.device_memory;
  for (int pt = 0; pt < static_cast<int>(sim.profiles_->device_types().size()); ++pt) {
    for (int t = 0; t < framework_tps_; ++t) {
      // With the device-memory model, the constant measured at tp 1 (a process without communicators:
      // at tp > 1 the measurement also holds the tp group's NCCL buffers, which nccl_bytes prices), else
      // its documented default; without it, as measured at that tp, else 0.
      const double mb = t == 0 ? -1 : dm.enabled ? sim.profiles_->framework_mb(pt) : sim.profiles_->framework_mb(pt, t);
      ptype_framework_.push_back(mb > 0 ? mb * kMiB : dm.enabled ? dm.default_framework_bytes : 0);
    }
    const GpuSpec* g = find_gpu_spec(sim.profiles_->device_types()[pt]);
    ptype_hbm_bytes_per_s_.push_back(g ? g->memory_bw_gbs * 1e9 : 0);
  }
  for (const TrainingSetup& s : setups_)
    recompute_fraction_.push_back(recomputed_forward_fraction(sim.shape_, s.recompute, sim.seq_) /
                                  (s.recompute == Recompute::kFull ? std::max(1, s.recompute_every) : 1));
}

Schedule PlanCostModel::schedule() const { return sim_->opt_.schedule; }

double PlanCostModel::tied_copy_bytes(int begin, int end) const { return sim_->tied_copy_bytes(begin, end); }

bool PlanCostModel::stage(const StageChoice& s, int index, int num_stages, int batches, int micro_batch,
                          FastStageCost* out, std::string* why) const {
  return stage_impl(s, index, num_stages, batches, micro_batch, 0, num_setups(), out, nullptr, why);
}

bool PlanCostModel::explain_stage(const StageChoice& s, int index, int num_stages, int batches, int micro_batch,
                                  int k, FastStageCost* out, StageDetail* detail, std::string* why) const {
  return stage_impl(s, index, num_stages, batches, micro_batch, k, 1, out, detail, why);
}

// What stage_impl shares between the setups it costs for one stage: each replica's profile type, share
// of the micro-batch and measured accumulation and step, and the slowest replica's setup-independent
// times. Its arrays are left uninitialized (filled for the stage's dp replicas only).
struct PlanCostModel::StageBasis {
  int rtype[kMaxReplicas], share[kMaxReplicas];
  double acc_raw[kMaxReplicas], opt_raw[kMaxReplicas];  // -1: not measured
  int blocks = 0;            // transformer blocks among the stage's Metis layers
  double param_share = 0;    // the stage's share of the model's parameter bytes
  double slowest_base = 0;   // the slowest replica's profiled forward + backward
  double forward = 0;        // of slowest_base, the forward
  double block_forward = 0;  // of forward, the blocks' (what recomputation runs again)
  double extra = 0;          // outside the layers (and the batch generator on stage 0), per micro-batch
  double sustained = 1, tpx_fwd = 0, tpx_bwd = 0;
  double send_forward = 0, send_backward = 0;
  // Megatron's scatter/gather of the sends: the receiving stage's all-gather of the pieces over tp (ms),
  // added to the sends by the setups without sequence parallelism (scatter_gather_ms).
  double gather_forward = 0, gather_backward = 0;
  int max_share = 0, in_flight = 1;
  int batches = 1;                 // micro-batches per iteration (the memory model walks the stage's op order)
  int cp = 1;                      // context-parallel ranks per replica group (every replica d of a group
                                   // d / cp shares its samples; each computes 1/cp of them)
  double cpx_fwd = 0, cpx_bwd = 0;  // exposed ring-attention exchange per micro-batch (ms)
  double cpm_fwd = 0, cpm_bwd = 0;  // the ring's merging of partial results per micro-batch (ms)
  double spx_fwd = 0, spx_bwd = 0;  // sequence parallelism's collectives beyond the profile's all-reduces (ms)
};

// The all-reduce times stage_impl carries from one setup to the next (recomputed only when their bytes
// change), and the shard parameters (recomputed when the setup's parameters change).
struct PlanCostModel::SetupReuse {
  ShardParams sp;
  double grad_bytes = -1, grad_ar = 0, weight_bytes = -1, weight_ar = 0;
  // One bucket's all-reduce of the gradients and of the weights (overlapped communication), by bytes.
  double grad_bucket_bytes = -1, grad_bucket_ar = 0, weight_bucket_bytes = -1, weight_bucket_ar = 0;
  // The all-reduce of the gradient reduced last (the first stage's embedding), by bytes.
  double last_grad_bytes = -1, last_grad_ar = 0;
  int stage_begin = 0;
};

bool PlanCostModel::stage_impl(const StageChoice& s, int index, int p, int batches, int micro_batch, int k0, int nk,
                               FastStageCost* out, StageDetail* detail, std::string* why) const {
  const int dp = s.st.dp;
  if (dp > kMaxReplicas) {  // base/limits.h: plan files beyond it are refused; the search skips such stages
    if (why) *why = "dp " + std::to_string(dp) + " is more than the " + std::to_string(kMaxReplicas) +
                    " data-parallel replicas a stage may have";
    return false;
  }
  StageBasis b;
  if (!stage_basis(s, index, p, batches, micro_batch, setups_[k0].context_parallel, &b, detail, why)) return false;

  SetupReuse reuse;
  for (int k = k0; k < k0 + nk; ++k) {
    const TrainingSetup& setup = setups_[k];
    FastStageCost& c = out[k - k0];
    c = FastStageCost();
    // Context parallelism changes the shares and the compute: a setting of another cp rebuilds the basis.
    if (setup.context_parallel != b.cp &&
        !stage_basis(s, index, p, batches, micro_batch, setup.context_parallel, &b, detail, why))
      return false;
    if (k == k0 || !same_params_setup(setup, setups_[k - 1]))
      reuse.sp = shard_params(sim_->shape_, s.layer_begin, s.layer_end, p, setup);
    setup_times(s, index, p, b, k, &reuse, &c);
    stage_memory(s, index, p, b, setup, reuse.sp, &c, detail);
  }
  return true;
}

// Everything of the stage that does not depend on the setup but its context-parallel size `cp`.
bool PlanCostModel::stage_basis(const StageChoice& s, int index, int p, int batches, int micro_batch, int cp,
                                StageBasis* b, StageDetail* detail, std::string* why) const {
  // The scalar fields afresh (the arrays are written for the stage's replicas below).
  b->blocks = 0;
  b->param_share = b->slowest_base = b->forward = b->block_forward = b->extra = 0;
  b->sustained = 1;
  b->tpx_fwd = b->tpx_bwd = b->send_forward = b->send_backward = b->cpx_fwd = b->cpx_bwd = 0;
  b->gather_forward = b->gather_backward = 0;
  b->cpm_fwd = b->cpm_bwd = b->spx_fwd = b->spx_bwd = 0;
  b->max_share = 0;
  b->in_flight = 1;
  b->batches = batches;
  b->cp = cp;
  const int dp = s.st.dp;
  if (cp < 1 || dp % cp != 0) {
    if (why) *why = "dp " + std::to_string(dp) + " is not a multiple of the context-parallel size " + std::to_string(cp);
    return false;
  }
  if (!replica_shares(s, micro_batch, b, why)) return false;
  if (detail) {
    detail->replica_types.assign(b->rtype, b->rtype + dp);
    detail->shares.assign(b->share, b->share + dp);
  }
  if (!slowest_replica(s, index, b, why)) return false;
  if (s.st.tp > 1 && b->max_share > 0) {  // used by the setups with sequence parallelism (sim/sequence_parallel.h)
    const int node = layout_->node_of(s.begin), tp = s.st.tp;
    const double bytes = act_bytes_per_sample_ * b->max_share / cp;
    const SpCollectiveExtra e = sp_collective_extra_s(
        net_.intra_node_all_reduce_seconds(node, tp, bytes), net_.intra_node_gather_seconds(node, tp, bytes),
        b->blocks, s.layer_begin == 0, s.layer_end == sim_->shape_.metis_num_layers());
    b->spx_fwd = e.forward_s * 1e3;
    b->spx_bwd = e.backward_s * 1e3;
  }
  if (detail) {
    detail->cp_exchange_forward_ms = b->cpx_fwd;
    detail->cp_exchange_backward_ms = b->cpx_bwd;
    detail->cp_merge_forward_ms = b->cpm_fwd;
    detail->cp_merge_backward_ms = b->cpm_bwd;
  }
  // p2p over the boundary link, bf16 activations split over tp (and cp: each rank sends its chunk).
  // (A stage with no rank beyond it on that side has no link to cost.)
  const int begin = s.begin, size = s.size, tp = s.st.tp;
  const bool next_rank = begin + size < layout_->num_ranks(), prev_rank = begin > 0;
  auto send_ms = [&](int from, int to) { return p2p_ms(from, to, b->max_share, tp, cp); };
  b->send_forward = index + 1 < p && next_rank ? send_ms(begin + size - 1, begin + size) : 0.0;
  b->send_backward = index > 0 && prev_rank ? send_ms(begin, begin - 1) : 0.0;
  if (b->send_forward > 0) b->gather_forward = scatter_gather_ms(begin + size, b->max_share, tp, cp);
  if (b->send_backward > 0) b->gather_backward = scatter_gather_ms(begin - 1, b->max_share, tp, cp);
  b->in_flight = in_flight_microbatches(sim_->opt_.schedule, p, index, batches, virtual_stages());
  return true;
}

double PlanCostModel::p2p_ms_of(const StageChoice& s, int from, int to, int micro_batch, double* gather_ms) const {
  if (gather_ms) *gather_ms = 0;
  StageBasis b;
  if (!replica_shares(s, micro_batch, &b, nullptr)) return 0;
  int max_share = 0;
  for (int d = 0; d < s.st.dp; ++d) max_share = std::max(max_share, b.share[d]);
  if (gather_ms) *gather_ms = scatter_gather_ms(to, max_share, s.st.tp, 1);
  return p2p_ms(from, to, max_share, s.st.tp);
}

double PlanCostModel::scatter_gather_ms(int to, int max_share, int tp, int cp) const {
  if (tp <= 1 || max_share <= 0) return 0.0;
  // A ring all-gather moves half a ring all-reduce's bytes in half its steps.
  return 0.5 * net_.intra_node_all_reduce_seconds(layout_->node_of(to), tp, act_bytes_per_sample_ * max_share / cp) * 1e3;
}

bool PlanCostModel::chunk_costs(const StageChoice* stages, int p, int batches, int micro_batch, int v,
                                FastStageCost* out, std::string* why) const {
  const int n = num_setups();
  const int last_rank = stages[p - 1].begin + stages[p - 1].size - 1;
  for (int i = 0; i < p; ++i)
    for (int c = 0; c < v; ++c) {
      const int k = virtual_stage(p, i, c);
      StageChoice piece = stages[i];
      chunk_layers(stages[i].layer_begin, stages[i].layer_end, sim_->shape_.metis_num_layers(), v, c, &piece.layer_begin,
                   &piece.layer_end);
      FastStageCost* o = out + static_cast<std::size_t>(k) * n;
      if (!stage(piece, k, p * v, batches, micro_batch, o, why)) return false;
      // The link between the pipeline's ends (stage() costs only the neighbours in rank order).
      if (i == p - 1 && c + 1 < v) {
        double gather = 0;
        const double ms = p2p_ms_of(piece, last_rank, stages[0].begin, micro_batch, &gather);
        for (int q = 0; q < n; ++q) o[q].send_forward_ms = send_with_gather_ms(setups_[q], ms, gather);
      }
      if (i == 0 && c > 0) {
        double gather = 0;
        const double ms = p2p_ms_of(piece, stages[0].begin, last_rank, micro_batch, &gather);
        for (int q = 0; q < n; ++q) o[q].send_backward_ms = send_with_gather_ms(setups_[q], ms, gather);
      }
    }
  return true;
}

int PlanCostModel::virtual_stages() const {
  return sim_->opt_.schedule == Schedule::kInterleaved1F1B ? sim_->opt_.virtual_stages : 1;
}

// Each replica's type (its first rank's) and share of the micro-batch. With context parallelism the
// micro-batch is split over the dp / cp groups, and every rank of a group takes its group's share.
bool PlanCostModel::replica_shares(const StageChoice& s, int micro_batch, StageBasis* b, std::string* why) const {
  const ProfileSet& profiles = *sim_->profiles_;
  const Strategy st = s.st;
  const int begin = s.begin, dp = st.dp, tp = st.tp, cp = b->cp;
  const StageGrid grid(begin, st);
  for (int d = 0; d < dp; ++d) {
    b->rtype[d] = rank_ptype_[grid.rank(d, 0)];
    if (b->rtype[d] < 0) {
      if (why) *why = "no profiles for a device type of the plan";
      return false;
    }
  }
  const bool homogeneous = layout_->homogeneous(begin, begin + s.size);
  const int groups = dp / cp;
  if (homogeneous) {
    split_micro_batch(micro_batch, groups, b->share);
  } else {
    int group_type[kMaxReplicas];
    for (int g = 0; g < groups; ++g) group_type[g] = b->rtype[g * cp];
    int missing = -1;
    if (!partition_data(profiles, group_type, Strategy{groups, tp}, micro_batch, b->share, &missing)) {
      if (why) *why = profiles.missing_message(missing, tp, 1, "the data load balancer");
      return false;
    }
  }
  // Spread each group's share over its cp ranks (from the last group down: share[g] is read before written).
  for (int d = dp - 1; d >= 0 && cp > 1; --d) b->share[d] = b->share[d / cp];
  return true;
}

// The setup-independent per-replica costs; the stage runs at its slowest replica's pace.
bool PlanCostModel::slowest_replica(const StageChoice& s, int index, StageBasis* b, std::string* why) const {
  const PlanSimulator& sim = *sim_;
  const ProfileSet& profiles = *sim.profiles_;
  const SimulationOptions& opt = sim.opt_;
  const Strategy st = s.st;
  const int begin = s.begin, start = s.layer_begin, end = s.layer_end, dp = st.dp, tp = st.tp;
  const int* rtype = b->rtype;
  const int* share = b->share;
  // Transformer blocks among Metis layers [start, end) (layer 0 is the embedding, the last the head).
  const int blocks = std::max(0, std::min(end, sim.shape_.metis_num_layers() - 1) - std::max(start, 1));

  // Outside the layers, per micro-batch: what the profiled whole-model pass took beyond its layers
  // (fb_sync: adding the new gradients into the fp32 main gradients, a pass over every parameter, and
  // the pass's own overhead) falls on each replica by its stage's share of the parameters, a tied
  // embedding's copy on the head's stage included (it is accumulated and stepped there too).
  const double param_share = sim.piece_param_bytes(start, end) / model_bytes_;
  double slowest_outside = 0;
  double slowest = -1, slowest_base = 0, slowest_forward = -1, slowest_block_forward = -1;
  // A replica's profile costs depend only on its type and share: replicas like the one before reuse them
  // (a stage's replicas come in runs of one type and share; hundreds of them in a large stage).
  ReplicaCost c;
  double outside = 0;
  for (int d = 0; d < dp; ++d) {
    // Context parallelism: the profile a rank of a cp group costs (cp_rank_work), for its layers and for the
    // pass outside them.
    const CpRankWork work = cp_rank_work(share[d], b->cp);
    const double cp_divisor = work.divisor;
    if (d == 0 || rtype[d] != rtype[d - 1] || share[d] != share[d - 1]) {
      if (!replica_cost(profiles, opt.max_profiled_bs, rtype[d], tp, work.samples, start, end, &c, why)) return false;
      const LayerProfile* lp = profiles.find(rtype[d], tp, std::max(1, work.samples));
      outside = lp ? std::max(0.0, lp->fb_sync_ms) * param_share : 0.0;
    }
    const double extra = cross_node_tp_ms(begin, st, d, share[d], blocks) / b->cp;
    const double total = c.total_ms / cp_divisor + 2 * extra + outside;
    if (total >= slowest) {
      slowest = total;
      slowest_outside = outside;
      slowest_base = c.total_ms / cp_divisor;
      slowest_forward = c.forward_ms >= 0 ? c.forward_ms / cp_divisor : -1;
      slowest_block_forward = c.block_forward_ms >= 0 ? c.block_forward_ms / cp_divisor : -1;
      b->sustained = c.sustained_ratio;
      b->tpx_fwd = extra;
      b->tpx_bwd = extra;
    }
    b->max_share = std::max(b->max_share, share[d]);
    b->acc_raw[d] = c.accumulation_ms;
    b->opt_raw[d] = c.optimizer_ms;
  }
  b->extra = slowest_outside;  // and the batch generator on the first stage
  if (index == 0) b->extra += profiles.model().batch_generator_ms;
  const double forward = slowest_forward >= 0 ? slowest_forward : slowest_base * (1 - opt.backward_share);
  // Recomputation runs the blocks' forward again, never the embedding's or the head's.
  b->block_forward =
      slowest_block_forward >= 0 ? slowest_block_forward : (end > start ? forward * blocks / (end - start) : 0.0);
  b->forward = forward;
  b->slowest_base = slowest_base;
  b->blocks = blocks;
  b->param_share = param_share;
  if (b->cp > 1) ring_attention_ms(s, b);
  return true;
}

// Context parallelism: each block's K/V ring exchange over the cp group of replica 0's tp index 0 (the
// slowest link of the ring), against the rank's attention time (its share of the blocks' profiled forward),
// the attention steps' stretch beside it (ring_*_stretch_s, at the profiles' measured stretch beside the ring's
// send/receive, else beside a 16-bit all-gather), and the ring's merging and copies (ring_merge_bytes,
// ring_copy_bytes) through the roofline at the layer time model's achieved fraction of the stage's GPU's HBM
// bandwidth. sim/sequence_parallel.md.
void PlanCostModel::ring_attention_ms(const StageChoice& s, StageBasis* b) const {
  const int cp = b->cp, tp = s.st.tp;
  if (b->blocks <= 0 || b->max_share <= 0) return;
  const StageGrid grid(s.begin, s.st);
  const double bytes = cp_kv_step_bytes(sim_->shape_, sim_->seq_, cp, tp, b->max_share);
  double step = 0;
  for (int i = 0; i < cp; ++i)
    step = std::max(step, net_.ring_step_seconds(grid.rank(i, 0), grid.rank((i + 1) % cp, 0), bytes));
  const double attention = b->block_forward / b->blocks * attention_flop_share(sim_->shape_, sim_->seq_) / 1e3;
  const double stretch = sim_->profiles_->overlap_slowdowns().ring_stretch();  // NCCL beside the steps
  b->cpx_fwd =
      b->blocks * (ring_exposed_s(cp, step, attention) + ring_forward_stretch_s(cp, step, attention, stretch)) * 1e3;
  b->cpx_bwd = b->blocks *
               (ring_backward_exposed_s(cp, step, attention) + ring_backward_stretch_s(cp, step, attention, stretch)) *
               1e3;
  const double rate = achieved_bytes_per_s(ptype_hbm_bytes_per_s_[b->rtype[0]] / 1e9, RateDefaults{}.memory_efficiency);
  b->cpm_fwd = b->cpm_bwd = 0;
  if (rate > 0) {
    const RingMergeBytes merge = ring_merge_bytes(sim_->shape_, sim_->seq_, cp, tp, b->max_share);
    const RingMergeBytes copies = ring_copy_bytes(sim_->shape_, sim_->seq_, cp, tp, b->max_share);
    const Roofline stream{0, rate};
    b->cpm_fwd = b->blocks * stream.memory_s(merge.forward + copies.forward) * 1e3;
    b->cpm_bwd = b->blocks * stream.memory_s(merge.backward + copies.backward) * 1e3;
  }
}

// A tp group across nodes: Megatron's 2 forward and 2 backward all-reduces per block over the
// inter-node link instead of the intra-node one the profile measured; the time each of the forward and
// the backward adds for replica d (0 when its tp group stays in one node).
double PlanCostModel::cross_node_tp_ms(int begin, Strategy st, int d, int share, int blocks) const {
  const int tp = st.tp;
  const StageGrid grid(begin, st);
  const int first = grid.rank(d, 0), last = grid.rank(d, tp - 1);
  if (!(tp > 1 && blocks > 0 && share > 0 && layout_->node_of(first) != layout_->node_of(last))) return 0;
  const double bytes = act_bytes_per_sample_ * share;
  const double delta = net_.ring_all_reduce_seconds_strided(grid.tp_group(d), bytes) -
                       net_.intra_node_all_reduce_seconds(layout_->node_of(first), tp, bytes);
  return 2.0 * blocks * std::max(0.0, delta) * 1e3;
}

// The timing fields of c for setups_[k] (reuse.sp is its shard).
void PlanCostModel::setup_times(const StageChoice& s, int index, int p, const StageBasis& b, int k,
                                SetupReuse* reuse, FastStageCost* c) const {
  const TrainingSetup& setup = setups_[k];
  const SimulationOptions& opt = sim_->opt_;
  const int tp = s.st.tp;
  const double full_on_rank = reuse->sp.on_rank(tp);
  const double trainable = setup.finetune == Finetune::kFull ? full_on_rank : reuse->sp.lora / tp;
  const double grad_bytes = trainable * reduced_gradient_bytes(setup);
  double accumulation = 0, optimizer = 0;
  replica_step_ms(s.st, b, trainable, full_on_rank, grad_bytes, &accumulation, &optimizer);
  c->forward_ms = b.forward + b.extra * (1 - opt.backward_share) + b.tpx_fwd + b.cpx_fwd + b.cpm_fwd;
  c->backward_ms = b.slowest_base - b.forward + b.extra * opt.backward_share +
                   b.block_forward * recompute_fraction_[k] + b.tpx_bwd + b.cpx_bwd + b.cpm_bwd;
  if (setup.sequence_parallel) {
    c->forward_ms += b.spx_fwd;
    c->backward_ms += b.spx_bwd;
  }
  c->accumulation_ms = accumulation;
  c->sustained_factor = b.sustained;
  c->send_forward_ms = send_with_gather_ms(setup, b.send_forward, b.gather_forward);
  c->send_backward_ms = send_with_gather_ms(setup, b.send_backward, b.gather_backward);
  // ZeRO-2/3 reduce-scatter every micro-batch's gradients, packed first into the flat fp32 buckets the
  // collectives read: a memory-bound pass on the backward's path, before any overlap is costed (it is
  // compute the collectives run beside). sim/dp_overlap.md, "The pack".
  if (s.st.dp > 1 && setup.zero_stage >= 2) c->backward_ms += gradient_pack_ms(setup, trainable, b.rtype[0]);
  add_gradient_sync(s, index, p, setup, trainable, grad_bytes, ptype_hbm_bytes_per_s_[b.rtype[0]], reuse, c);
  c->optimizer_ms = optimizer / (setup.zero_stage >= 1 ? s.st.dp : 1);
  if (setup.offload_optimizer || (setup.offload_params && setup.zero_stage >= 3))
    add_offload(s, setup, b.rtype[0], trainable, full_on_rank, c);
}

// One micro-batch's copy of its gradients (the compute precision's, as the backward leaves them) into the
// buckets the data-parallel reduction reads (reduced_gradient_bytes each): read once and written once, through
// the roofline at the layer time model's achieved fraction (RateDefaults::memory_efficiency) of profile type
// `ptype`'s datasheet HBM bandwidth (0 where the GPU is not in the catalogue).
double PlanCostModel::gradient_pack_ms(const TrainingSetup& setup, double trainable, int ptype) const {
  const double rate = achieved_bytes_per_s(ptype_hbm_bytes_per_s_[ptype] / 1e9, RateDefaults{}.memory_efficiency);
  if (!(rate > 0)) return 0;
  const double produced = setup.precision == Precision::kFp32 ? 4 : 2;
  const Roofline stream{0, rate};
  return stream.memory_s(trainable * (produced + reduced_gradient_bytes(setup))) * 1e3;
}

// The slowest replica's gradient accumulation per micro-batch and optimizer step for one setup.
void PlanCostModel::replica_step_ms(Strategy st, const StageBasis& b, double trainable, double full_on_rank,
                                    double grad_bytes, double* accumulation, double* optimizer) const {
  const ProfileSet& profiles = *sim_->profiles_;
  const int* rtype = b.rtype;
  const double* acc_raw = b.acc_raw;
  const double* opt_raw = b.opt_raw;
  for (int d = 0; d < st.dp; ++d) {
    // A replica like the one before (type, measured accumulation and step) adds nothing to the maxima.
    if (d > 0 && rtype[d] == rtype[d - 1] && acc_raw[d] == acc_raw[d - 1] && opt_raw[d] == opt_raw[d - 1]) continue;
    // Measured accumulation covers every parameter; LoRA accumulates only its adapters.
    double acc = acc_raw[d] >= 0 ? acc_raw[d] * trainable / full_on_rank : -1;
    if (acc < 0) {
      acc = datasheet_accumulation_ms(grad_bytes, ptype_hbm_bytes_per_s_[rtype[d]]);
    }
    *accumulation = std::max(*accumulation, acc);
    // The file's optimizer step is this tp's shard of the whole model; the stage steps its share of it.
    const double o =
        opt_raw[d] >= 0 ? opt_raw[d] * b.param_share : profiles.model().optimizer_ms / 2 / st.tp * b.param_share;
    *optimizer = std::max(*optimizer, o * trainable / full_on_rank);
  }
}

// The slowest, over the stage's tp slices, of an all-reduce of `bytes` over tp index t's dp group (s).
double PlanCostModel::slowest_dp_all_reduce(int begin, Strategy st, double bytes) const {
  const StageGrid grid(begin, st);
  double ar = 0;
  for (int t = 0; t < st.tp; ++t) ar = std::max(ar, net_.all_reduce_seconds_strided(grid.dp_group(t), bytes));
  return ar;
}

// The data-parallel gradient synchronisation as the setup's ZeRO stage splits it between the backward,
// the forward and the all-reduce before the step, and the tied embedding's all-reduce between the
// pipeline's ends.
void PlanCostModel::add_gradient_sync(const StageChoice& s, int index, int p, const TrainingSetup& setup,
                                      double trainable, double grad_bytes, double hbm_bytes_per_s,
                                      SetupReuse* reuse, FastStageCost* c) const {
  const int begin = s.begin, dp = s.st.dp, tp = s.st.tp;
  // Data-parallel gradient all-reduce of each tp slice over tp index t's dp group
  // (each the slowest over the slices; recomputed only when its bytes change between settings.)
  auto slowest_all_reduce = [&](double bytes) { return slowest_dp_all_reduce(begin, s.st, bytes); };
  reuse->stage_begin = begin;
  if (grad_bytes != reuse->grad_bytes) {
    reuse->grad_bytes = grad_bytes;
    reuse->grad_ar = slowest_all_reduce(grad_bytes);
  }
  // The 16-bit weights ZeRO gathers: only a setting with ZeRO over more than one replica moves them.
  const bool zero_sharded = dp > 1 && setup.zero_stage >= 1;
  const double weight_bytes = trainable * 2;
  if (zero_sharded && weight_bytes != reuse->weight_bytes) {
    reuse->weight_bytes = weight_bytes;
    reuse->weight_ar = slowest_all_reduce(weight_bytes);
  }
  // A ring reduce-scatter or all-gather moves half an all-reduce's bytes. ZeRO-1 (Megatron's distributed
  // optimizer): reduce-scatter the gradients and all-gather the updated weights once per iteration.
  // ZeRO-2 (DeepSpeed stage 2): each micro-batch's backward reduce-scatters its gradients; the step
  // all-gathers the weights. ZeRO-3 (FSDP): each micro-batch gathers the weights before its forward and
  // again before its backward, which reduce-scatters the gradients; nothing is left for the step.
  const double rs = reuse->grad_ar * 1e3 / 2, ag = zero_sharded ? reuse->weight_ar * 1e3 / 2 : 0.0;
  const Zero3Gathers z3 = zero3_gathers(s, reuse->sp.on_rank(tp), weight_bytes);
  c->allreduce_ms = 0;
  // DeepSpeed's ZeRO-3 gathers module by module even on one rank (with offload_param, from the host).
  const bool ds_zero3 = setup.deepspeed.model && setup.zero_stage >= 3;
  if (dp > 1 && setup.overlap.any() && !ds_zero3 && !setup.ddp.model) {
    // Megatron-style overlapped data-parallel communication (sim/dp_overlap.h).
    // The first stage's last gradient is the embedding's: buckets never split a parameter, so its reduction
    // starts only when the backward ends, and is exposed whole.
    const double last_grad_bytes =
        s.layer_begin == 0 && setup.finetune == Finetune::kFull
            ? static_cast<double>(sim_->shape_.embedding_params()) / tp * grad_bytes / std::max(trainable, 1.0)
            : 0.0;
    add_overlapped_sync(s.st, setup.zero_stage, trainable, grad_bytes, weight_bytes, last_grad_bytes, setup.overlap,
                        rs, ag, z3, reuse, c);
  } else {
  switch (ds_zero3 ? 3 : dp > 1 ? setup.zero_stage : 0) {
    case 0:
      if (setup.ddp.model) {
        // PyTorch DDP: bucketed all-reduces overlapped with the backward (sim/runtime_overheads.h). The first
        // layer's gradients (the embedding's) are complete only when the backward ends.
        const double last = s.layer_begin == 0 ? static_cast<double>(sim_->shape_.embedding_params()) / tp *
                                                          grad_bytes / std::max(trainable, 1.0)
                                                    : 0.0;
        // The copies through the roofline at the layer time model's achieved HBM fraction (as the ZeRO pack);
        // the compute stretch beside the chain: the run's factor, else the profiles' measurement (dp_overlap.h).
        const double rate = achieved_bytes_per_s(hbm_bytes_per_s / 1e9, RateDefaults{}.memory_efficiency);
        const double stretch = setup.overlap.compute_slowdown > 0 ? setup.overlap.compute_slowdown
                                                                  : sim_->profiles_->overlap_slowdowns().reduce;
        const DdpSyncTime t = ddp_sync(
            setup.ddp, grad_bytes, last, c->backward_ms, stretch,
            [&](double bytes) { return slowest_all_reduce(bytes) * 1e3; },
            [&](double bytes) { return rate > 0 ? 2 * bytes / rate * 1e3 : 0.0; });
        // The copy into the buckets runs in the last micro-batch's backward only (no_sync before it).
        c->allreduce_ms = t.step_added_ms();
      } else {
        c->allreduce_ms = reuse->grad_ar * 1e3;
      }
      break;
    case 1: c->allreduce_ms = rs + ag; break;
    case 2:
      c->backward_ms += rs;
      c->allreduce_ms = ag;
      break;
    default:
      if (ds_zero3) {
        add_zero3_gathers(s, setup, hbm_bytes_per_s, c);
        c->backward_ms += rs;
        break;
      }
      c->forward_ms += ag * z3.forward_share;
      c->backward_ms += ag * z3.backward_share + rs;
      break;
    }
  }
  // Tied embeddings over a pipeline: the first and the last stage each hold the embedding and
  // all-reduce its gradient between them after the backward (Megatron's embedding-group all-reduce),
  // before the step. The partner stage is at the other end of the layout's rank order.
  const ModelShape& shape = sim_->shape_;
  if (p > 1 && shape.tied_embeddings && (index == 0 || index == p - 1)) {
    const double vh = static_cast<double>(shape.vocab_size) * shape.hidden_size;
    const int partner = index == 0 ? layout_->num_ranks() - 1 : 0;
    const double bytes = vh / tp * reduced_gradient_bytes(setup);
    const RankStride ends{std::min(begin, partner), std::max(1, std::abs(partner - begin)), 2};
    c->allreduce_ms += net_.all_reduce_seconds_strided(ends, bytes) * 1e3;
  }
}

// DeepSpeed ZeRO-3's per-module gathers in the forward and the backward (sim/offload.h, zero3_pass_ms):
// each module's all-gather over the stage's data-parallel group (the slowest tp slice's), after the
// coordinator's host work, and with offload_param after the host-to-device copy of the rank's partition.
void PlanCostModel::add_zero3_gathers(const StageChoice& s, const TrainingSetup& setup, double /*hbm*/,
                                      FastStageCost* c) const {
  const DeepSpeedBuffers& d = setup.deepspeed;
  const int dp = s.st.dp, tp = s.st.tp;
  const StageGrid grid(s.begin, s.st);
  const std::vector<double> modules =
      zero3_gathered_modules(sim_->shape_, s.layer_begin, s.layer_end, tp, d.param_persistence_threshold);
  const double e = setup.precision == Precision::kFp32 ? 4 : 2;
  const HostSpec host = host_for(s.begin);
  const double h2d = host.h2d_bytes_per_s * (d.pin_memory ? 1 : kPageableCopyFactor);
  auto gather_ms = [&](double elements) {
    double ms = kDeepSpeedGatherHostOps * d.host_op_us * 1e-3;
    if (dp > 1) {
      double ar = 0;
      for (int t = 0; t < tp; ++t) ar = std::max(ar, net_.all_reduce_seconds_strided(grid.dp_group(t), elements * e));
      ms += ar * 1e3 / 2;  // an all-gather moves half an all-reduce's bytes
    }
    if (setup.offload_params && h2d > 0) ms += elements * e / dp / h2d * 1e3;
    return ms;
  };
  c->forward_ms = zero3_pass_ms(d, modules, false, c->forward_ms, gather_ms);
  c->backward_ms = zero3_pass_ms(d, modules, true, c->backward_ms, gather_ms);
}

// The host of rank `rank`: measured, or the stated defaults for its GPU.
HostSpec PlanCostModel::host_for(int rank) const {
  HostSpec host = sim_->opt_.host;
  if (host.d2h_bytes_per_s <= 0 || host.h2d_bytes_per_s <= 0 || host.cpu_adam_params_per_s <= 0) {
    const int ptype = rank_ptype_[static_cast<std::size_t>(rank)];
    const GpuSpec* g = ptype >= 0 ? find_gpu_spec(sim_->profiles_->device_types()[ptype]) : nullptr;
    const HostSpec d = default_host_spec(g ? g->host_link_gbs : 16.0);
    if (host.d2h_bytes_per_s <= 0) host.d2h_bytes_per_s = d.d2h_bytes_per_s;
    if (host.h2d_bytes_per_s <= 0) host.h2d_bytes_per_s = d.h2d_bytes_per_s;
    if (host.cpu_adam_params_per_s <= 0) host.cpu_adam_params_per_s = d.cpu_adam_params_per_s;
  }
  return host;
}

// ZeRO-3's gather shares of a stage (Zero3Gathers, sim/plan_cost.h).
PlanCostModel::Zero3Gathers PlanCostModel::zero3_gathers(const StageChoice& s, double full_on_rank,
                                                         double weight_bytes) const {
  Zero3Gathers z;
  if (full_on_rank <= 0 || weight_bytes <= 0) return z;
  const ModelShape& shape = sim_->shape_;
  const double vh = static_cast<double>(shape.vocab_size) * shape.hidden_size / s.st.tp;
  double kept = 0, twice = 0;  // parameters on this rank
  if (s.layer_end == shape.metis_num_layers()) {  // the loss's stage: the head's weights stay gathered
    kept = static_cast<double>(shape.norm_params()) + vh;  // final norm and LM head (tied or its own)
    if (shape.tied_embeddings && s.layer_begin == 0 && s.layer_end - s.layer_begin > 1) twice = vh;
  }
  z.forward_share = (full_on_rank + twice) / full_on_rank;
  z.backward_share = std::max(0.0, full_on_rank - kept) / full_on_rank;
  return z;
}

// Overlapped data-parallel communication (sim/dp_overlap.h): the gradient reduction runs bucket by bucket
// during the backward it follows (the last micro-batch's, or every one's at ZeRO-2/3), the weight gather
// bucket by bucket during the forward that needs it (ZeRO-1's after the step: the next iteration's first
// forward, charged at the iteration's end); each leaves exposed the tail exposed_after_window gives, and
// stretches the compute it shares the GPU with by the measured slowdown. `rs` and `ag` are the whole
// reduce-scatter and all-gather (ms); a ZeRO-0 reduction is the whole all-reduce.
void PlanCostModel::add_overlapped_sync(Strategy st, int zero, double trainable, double grad_bytes,
                                        double weight_bytes, double last_grad_bytes, const CommOverlap& ov,
                                        double rs, double ag, const Zero3Gathers& z3, SetupReuse* reuse,
                                        FastStageCost* c) const {
  const int ng = bucket_count(trainable, ov.grad_bucket_params, st.dp);
  const int nw = bucket_count(trainable, ov.param_bucket_params > 0 ? ov.param_bucket_params : ov.grad_bucket_params,
                              st.dp);
  if (grad_bytes / ng != reuse->grad_bucket_bytes) {
    reuse->grad_bucket_bytes = grad_bytes / ng;
    reuse->grad_bucket_ar = slowest_dp_all_reduce(reuse->stage_begin, st, grad_bytes / ng);
  }
  if (zero >= 1 && weight_bytes / nw != reuse->weight_bucket_bytes) {
    reuse->weight_bucket_bytes = weight_bytes / nw;
    reuse->weight_bucket_ar = slowest_dp_all_reduce(reuse->stage_begin, st, weight_bytes / nw);
  }
  if (last_grad_bytes != reuse->last_grad_bytes) {
    reuse->last_grad_bytes = last_grad_bytes;
    reuse->last_grad_ar = last_grad_bytes > 0 ? slowest_dp_all_reduce(reuse->stage_begin, st, last_grad_bytes) : 0.0;
  }
  // The compute stretch beside reductions and beside gathers: the run's factor, else the profiles' measurement.
  const OverlapSlowdowns& measured = sim_->profiles_->overlap_slowdowns();
  const double fr = ov.compute_slowdown > 0 ? ov.compute_slowdown : measured.reduce;
  const double fg = ov.compute_slowdown > 0 ? ov.compute_slowdown : measured.gather;
  const double window_b = c->backward_ms, window_f = c->forward_ms;
  // One bucket's reduction (ms): the all-reduce at ZeRO-0, half of it (a reduce-scatter) with ZeRO.
  const double red_b = reuse->grad_bucket_ar * 1e3 / (zero == 0 ? 1 : 2);
  const double red = zero == 0 ? reuse->grad_ar * 1e3 : rs;
  const double gat_b = zero >= 1 ? reuse->weight_bucket_ar * 1e3 / 2 : 0.0;
  auto hidden = [&](double per_bucket, int n, double total, double window) {  // gathers
    return exposed_after_window(per_bucket, n, window) + overlap_slowdown_s(total, window, fg);
  };
  // A reduction chain's tail is at least the last gradient's reduction (the embedding's, on the first stage).
  const double red_last = reuse->last_grad_ar * 1e3 / (zero == 0 ? 1 : 2);
  auto hidden_reduce = [&](double per_bucket, int n, double total, double window) {
    return std::max(exposed_after_window(per_bucket, n, window), red_last) + overlap_slowdown_s(total, window, fr);
  };
  const double reduce = ov.grad_reduce ? hidden_reduce(red_b, ng, red, window_b) : red;
  switch (zero) {
    case 0: c->allreduce_ms = reduce; break;
    case 1: c->allreduce_ms = reduce + (ov.param_gather ? hidden(gat_b, nw, ag, window_f) : ag); break;
    case 2:
      c->backward_ms += reduce;
      c->allreduce_ms = ov.param_gather ? hidden(gat_b, nw, ag, window_f) : ag;
      break;
    default: {
      // ZeRO-3: the forward gathers the weights (zero3_gathers: the tied embedding twice), the backward
      // gathers them again (less the last layer's, kept since its forward) and reduce-scatters the
      // gradients. A gather runs beside compute only when prefetched (param_gather); otherwise each
      // layer's gather is waited for before its compute is issued, forward and backward alike. The gathers
      // and the reduce-scatters share one communicator, so their kernels run one after another: without
      // prefetch, the gather a layer's backward waits for is queued behind the reduce-scatter of the layer
      // after it, and every reduce-scatter is on the backward's path too (exposed whole, beside no compute).
      const double ag_f = ag * z3.forward_share, ag_b = ag * z3.backward_share;
      const double gat_f = gat_b * z3.forward_share, gat_bw = gat_b * z3.backward_share;
      c->forward_ms += ov.param_gather ? hidden(gat_f, nw, ag_f, window_f) : ag_f;
      if (ov.grad_reduce && ov.param_gather)
        c->backward_ms += std::max(exposed_after_window(red_b + gat_bw, std::max(ng, nw), window_b), red_last) +
                          overlap_slowdown_s(red, window_b, fr) +
                          overlap_slowdown_s(ag_b, std::max(0.0, window_b - red), fg);
      else if (ov.param_gather)
        c->backward_ms += hidden(gat_bw, nw, ag_b, window_b) + reduce;
      else
        c->backward_ms += ag_b + red;
      break;
    }
  }
}

// ZeRO-Offload / ZeRO-Infinity by DeepSpeed's overlap rules (sim/offload.h): the host measured, or the
// stated defaults for the stage's GPU (profile type `ptype`).
void PlanCostModel::add_offload(const StageChoice& s, const TrainingSetup& setup, int ptype, double trainable,
                                double full_on_rank, FastStageCost* c) const {
  HostSpec host = sim_->opt_.host;
  if (host.d2h_bytes_per_s <= 0 || host.h2d_bytes_per_s <= 0 || host.cpu_adam_params_per_s <= 0) {
    const GpuSpec* g = find_gpu_spec(sim_->profiles_->device_types()[ptype]);
    // A GPU outside the catalogue: PCIe 3.0 x16 (16 GB/s per direction), the oldest link in it.
    const HostSpec d = default_host_spec(g ? g->host_link_gbs : 16.0);
    if (host.d2h_bytes_per_s <= 0) host.d2h_bytes_per_s = d.d2h_bytes_per_s;
    if (host.h2d_bytes_per_s <= 0) host.h2d_bytes_per_s = d.h2d_bytes_per_s;
    if (host.cpu_adam_params_per_s <= 0) host.cpu_adam_params_per_s = d.cpu_adam_params_per_s;
  }
  if (host.cpu_cast_params_per_s <= 0)  // measured separately (calibration's host.cpu_cast_params_per_s)
    host.cpu_cast_params_per_s = default_host_spec(16.0).cpu_cast_params_per_s;
  const int ranks_per_host = layout_->node_size(layout_->node_of(s.begin));
  const OffloadTime ot = offload_time(setup, host, trainable, full_on_rank * 2, s.st.dp, ranks_per_host,
                                      c->forward_ms, c->backward_ms);
  c->forward_ms += ot.forward_exposed_ms;
  c->backward_ms += ot.backward_exposed_ms;
  if (setup.offload_optimizer) c->optimizer_ms = ot.step_ms;  // the step runs on the CPU instead
}

// Memory of each rank, with its own replica's share; ranks alike in (type, share, node size) agree.
// The fast path takes them a run at a time (the ranks of one node whose replicas have one share:
// the same type, share, node size and capacity); explaining lists every rank.
void PlanCostModel::stage_memory(const StageChoice& s, int index, int p, const StageBasis& b,
                                 const TrainingSetup& setup, const ShardParams& sp, FastStageCost* c,
                                 StageDetail* detail) const {
  const Strategy st = s.st;
  const int begin = s.begin, size = s.size;
  const StageGrid grid(begin, st);
  const int* share = b.share;
  c->peak_memory_bytes = 0;
  c->min_headroom_bytes = std::numeric_limits<double>::infinity();
  int memo_type = -2, memo_share = -1, memo_gpn = -1;
  double memo_total = 0;
  MemoryBreakdown memo_breakdown;
  for (int r = begin, run_end; r < begin + size; r = run_end) {
    const int d = grid.replica(r);
    const int type = layout_->type_of(r);
    const int mb = std::max(1, share[d]);
    const int node = layout_->node_of(r);
    const int gpn = layout_->node_size(node);
    run_end = r + 1;
    if (!detail) {
      run_end = std::min(begin + size, layout_->node_end(node));
      for (int e = d + 1; grid.rank(e, 0) < run_end; ++e)
        if (std::max(1, share[e]) != mb) {
          run_end = grid.rank(e, 0);
          break;
        }
    }
    if (detail || type != memo_type || mb != memo_share || gpn != memo_gpn) {
      memo_breakdown = rank_breakdown(s, index, p, b.in_flight, b.batches, r, mb, gpn, setup, sp);
      memo_total = memo_breakdown.gpu_total();
      memo_type = type;
      memo_share = mb;
      memo_gpn = gpn;
    }
    const double capacity = rank_capacity_[r];
    c->peak_memory_bytes = std::max(c->peak_memory_bytes, memo_total);
    c->min_headroom_bytes = std::min(c->min_headroom_bytes, capacity - memo_total);
    if (!(memo_total <= capacity) && c->fits) {
      c->fits = false;
      c->first_oom_rank = r;
      c->first_oom_total_bytes = memo_total;
    }
    if (detail) {
      RankMemory m;
      m.rank = r;
      m.stage = index;
      m.device = sim_->cluster_->device_types()[type];
      m.breakdown = memo_breakdown;
      m.capacity_bytes = sim_->cluster_->memory_mb(type) * kMiB;
      m.usable_bytes = capacity;
      detail->ranks.push_back(m);
    }
  }
}

// The memory of rank r of stage `index` (of p) whose replica takes `mb` samples of each micro-batch, on a
// node of `gpn` ranks, for one setup.
MemoryBreakdown PlanCostModel::rank_breakdown(const StageChoice& s, int index, int p, int in_flight, int batches, int r, int mb,
                                              int gpn, const TrainingSetup& setup, const ShardParams& sp) const {
  const int start = s.layer_begin, tp = s.st.tp;
  RankShard shard;
  shard.first_layer = start;
  shard.end_layer = s.layer_end;
  shard.tp = tp;
  shard.dp = s.st.dp;
  shard.pp = p;
  shard.stage = index;
  shard.micro_batch = mb;
  shard.seq = sim_->seq_ / std::max(1, setup.context_parallel);  // each cp rank holds its chunk of every sequence
  shard.in_flight = in_flight;
  shard.virtual_stages = virtual_stages();
  shard.schedule = sim_->opt_.schedule;
  shard.microbatches = batches;
  shard.gpus_per_node = gpn;
  // A negative framework constant means "as the profiles measured it".
  TrainingSetup rank_setup = setup;
  if (rank_setup.framework_bytes < 0) {
    const int pt = rank_ptype_[r];
    rank_setup.framework_bytes =
        pt >= 0 ? ptype_framework_[static_cast<std::size_t>(pt) * framework_tps_ + std::min(tp, framework_tps_ - 1)]
                : 0;
  }
  // Activations as the profiler measured them on this rank's GPU type, tp and micro-batch, when it did.
  MeasuredActivations measured;
  // A share no file measured (the data balancer's uneven splits) scales the nearest measured
  // micro-batch size, the largest below it if any: activations are linear in the batch.
  const LayerProfile* mp =
      rank_ptype_[r] >= 0 && setup.finetune == Finetune::kFull && setup.precision != Precision::kFp32
          ? sim_->profiles_->activation_profile(rank_ptype_[r], tp, mb)
          : nullptr;
  const bool use_measured = mp != nullptr;
  if (use_measured) {
    measured.activation_mb = mp->activation_mb.data() + start;
    measured.working_mb = mp->working_mb.data() + start;
    measured.scale = static_cast<double>(mb) / mp->bs / std::max(1, setup.context_parallel);
    measured.recompute = mp->recompute;
  }
  MemoryBreakdown m = rank_memory(sim_->shape_, rank_setup, shard, sp, use_measured ? &measured : nullptr);
  const DeviceMemoryOptions& dm = sim_->opt_.device_memory;
  if (dm.enabled) {
    // The largest transient with caching-allocator segments of its own (sim/device_memory.h): the head's fp32
    // logits on the head's rank; overlapped ZeRO-2/3's gradient buckets of all the rank's units.
    const bool head = s.layer_end == sim_->shape_.metis_num_layers();
    const double logits =
        head ? static_cast<double>(mb) * shard.seq * static_cast<double>(sim_->shape_.vocab_size) / tp : 0;
    const bool held_buckets = setup.zero_stage >= 2 && setup.overlap.grad_reduce && s.st.dp > 1;
    const double trainable = setup.finetune == Finetune::kFull ? sp.on_rank(tp) : sp.lora / tp;  // as rank_memory
    const double buckets = held_buckets ? trainable * reduced_gradient_bytes(setup) : 0;
    m.allocator_reserve = allocator_reserve_bytes(m.allocated_peak(), own_segment_bytes(logits, buckets), dm);
    RankPlacement where;
    where.world = layout_->num_ranks();
    where.tp = tp;
    where.dp = s.st.dp;
    where.pp = p;
    where.stage = index;
    where.virtual_stages = virtual_stages();
    where.context_parallel = std::max(1, setup.context_parallel);
    where.tied = sim_->shape_.tied_embeddings;
    m.nccl = nccl_bytes(rank_communicators(where), dm);
  }
  return m;
}

double PlanCostModel::state_bytes_lower_bound(int tp, int dp, int start, int end) const {
  double least = std::numeric_limits<double>::infinity();
  for (const TrainingSetup& setup : setups_) {
    RankShard shard;  // as stage() builds it, but for one micro-batch of one sample: the states do not depend on it
    shard.first_layer = start;
    shard.end_layer = end;
    shard.tp = tp;
    shard.dp = dp;
    shard.pp = start > 0 ? 2 : 1;  // as unmeasured_accumulation_ms
    shard.stage = start > 0 ? 1 : 0;
    shard.seq = sim_->seq_;
    const ShardParams sp = shard_params(sim_->shape_, start, end, shard.pp, setup);
    // Not states.transient: with measured activations, ZeRO-2/3's gathered units are priced layer by layer
    // instead, and can come to less than the analytic transient.
    const ModelStateBytes st = rank_memory(sim_->shape_, setup, shard, sp).states;
    least = std::min(least, st.weights + st.gradients + st.optimizer);
  }
  return least;
}

double PlanCostModel::unmeasured_accumulation_ms(int ptype, int tp, int start, int end) const {
  const double hbm = ptype_hbm_bytes_per_s_[ptype];
  if (!(hbm > 0)) return 0;
  double least = std::numeric_limits<double>::infinity();
  for (const TrainingSetup& setup : setups_) {
    // As stage_impl: a stage whose first layer is not 0 is never alone (pp > 1).
    const ShardParams sp = shard_params(sim_->shape_, start, end, start > 0 ? 2 : 1, setup);
    const double full_on_rank = sp.on_rank(tp);
    const double trainable = setup.finetune == Finetune::kFull ? full_on_rank : sp.lora / tp;
    const double grad_bytes = trainable * reduced_gradient_bytes(setup);
    least = std::min(least, datasheet_accumulation_ms(grad_bytes, hbm));
  }
  return least;
}

int PlanCostModel::pace_stage(const FastStageCost* c, int p, int batches) const {
  if (!sim_->opt_.sustained_clocks || p < 1) return -1;
  // The stage with the most compute never waits: its forward and backward (not the memory-bound
  // accumulation) run at the sustained pace.
  int pace = 0;
  for (int i = 1; i < p; ++i)
    if (c[i].busy_ms(batches) > c[pace].busy_ms(batches)) pace = i;
  return c[pace].sustained_factor > 1 ? pace : -1;
}

double PlanCostModel::iteration_ms(const FastStageCost* c, int p, int m, Schedule schedule, PipelineScratch* scratch,
                                   const FastStageCost* chunks, int virtual_stages) const {
  if (p < 1 || m < 1) throw std::invalid_argument("iteration_ms: expected at least one stage and one micro-batch");
  const int v = schedule == Schedule::kInterleaved1F1B ? virtual_stages : 1;
  if (v > 1 && chunks == nullptr) throw std::invalid_argument("iteration_ms: interleaving without chunk costs");
  const int vs = p * v;  // virtual stages; virtual stage k is chunk k / p of stage k % p
  const int pace = pace_stage(c, p, m);
  const std::size_t pm = static_cast<std::size_t>(vs) * m;
  PipelineScratch& s = *scratch;
  if (s.a.size() < pm) s.a.resize(pm);
  if (s.b.size() < pm) s.b.resize(pm);
  if (s.c.size() < static_cast<std::size_t>(p)) s.c.resize(p);
  if (s.d.size() < static_cast<std::size_t>(2 * p)) s.d.resize(2 * p);
  if (s.pos.size() < static_cast<std::size_t>(p + 2 * vs)) s.pos.resize(p + 2 * vs);
  double* sendf = s.a.data();     // [k * m + j]: end of virtual stage k's send of micro-batch j's activations to k + 1
  double* sendb = s.b.data();     // [k * m + j]: end of virtual stage k's send of micro-batch j's gradients to k - 1
  double* last_end = s.c.data();  // end of stage i's latest compute
  double* last_sendf = s.d.data();      // end of stage i's latest forward send (0: none yet)
  double* last_sendb = s.d.data() + p;  // end of stage i's latest backward send
  int* pos = s.pos.data();        // next op of stage i in its StageOps
  int* nf = pos + p;              // forwards virtual stage k has done (in micro-batch order)
  int* nb = pos + p + vs;         // backwards done
  for (int i = 0; i < p; ++i) {
    last_end[i] = last_sendf[i] = last_sendb[i] = 0;
    pos[i] = 0;
  }
  for (int k = 0; k < vs; ++k) nf[k] = nb[k] = 0;
  double iteration = 0;
  int remaining = p;
  bool down = true;
  while (remaining > 0) {
    bool progress = false;
    for (int step = 0; step < p; ++step) {
      const int i = down ? step : p - 1 - step;
      const StageOps ops(schedule, p, i, m, v);
      if (pos[i] == ops.size()) continue;
      const FastStageCost& st = c[i];
      const double factor = st.sustained_factor;
      while (pos[i] < ops.size()) {
        const PipelineOp op = ops[pos[i]];
        const bool forward = op.forward;
        const int j = op.micro_batch;
        const int k = virtual_stage(p, i, op.chunk);
        const FastStageCost& ck = v > 1 ? chunks[k] : st;
        // The stretch simulate_timeline sees: PlanSimulator multiplies the pace-setter's times.
        double start = last_end[i], finish;
        if (forward) {
          if (k > 0 && nf[k - 1] <= j) break;
          if (k > 0) start = std::max(start, sendf[(k - 1) * m + j]);
          finish = start + (i == pace ? ck.forward_ms * factor : ck.forward_ms);
          if (k + 1 < vs) {
            const double send_start = std::max(finish, last_sendf[i]);
            sendf[k * m + j] = last_sendf[i] = send_start + ck.send_forward_ms;
            iteration = std::max(iteration, sendf[k * m + j]);
          }
          ++nf[k];
        } else {
          if (k + 1 < vs && nb[k + 1] <= j) break;
          if (k + 1 < vs) start = std::max(start, sendb[(k + 1) * m + j]);
          finish = start + ((i == pace ? ck.backward_ms * factor : ck.backward_ms) + (j > 0 ? ck.accumulation_ms : 0.0));
          if (k > 0) {
            const double send_start = std::max(finish, last_sendb[i]);
            sendb[k * m + j] = last_sendb[i] = send_start + ck.send_backward_ms;
            iteration = std::max(iteration, sendb[k * m + j]);
          }
          ++nb[k];
        }
        last_end[i] = finish;
        iteration = std::max(iteration, finish);
        ++pos[i];
        progress = true;
      }
      if (pos[i] == ops.size()) {
        // Gradient all-reduce after the stage's last compute, then the optimizer step.
        const double ar_end = last_end[i] + st.allreduce_ms;
        iteration = std::max(iteration, ar_end);
        iteration = std::max(iteration, ar_end + st.optimizer_ms);
        --remaining;
      }
    }
    if (!progress && remaining > 0) throw std::logic_error("iteration_ms: pipeline dependencies do not resolve");
    down = !down;
  }
  return iteration;
}

namespace {

// Every duration iteration_ms reads of `a` is <= that of `b`.
bool times_le(const FastStageCost& a, const FastStageCost& b) {
  return a.forward_ms <= b.forward_ms && a.backward_ms <= b.backward_ms && a.accumulation_ms <= b.accumulation_ms &&
         a.send_forward_ms <= b.send_forward_ms && a.send_backward_ms <= b.send_backward_ms &&
         a.allreduce_ms <= b.allreduce_ms && a.optimizer_ms <= b.optimizer_ms &&
         a.sustained_factor <= b.sustained_factor;
}

}  // namespace

int PlanCostModel::best_setup(const FastStageCost* all, int p, int batches, Schedule schedule,
                              PipelineScratch* scratch, double* ms) const {
  const int n = num_setups();
  PipelineScratch& s = *scratch;
  if (s.order.size() < static_cast<std::size_t>(2 * n)) s.order.resize(2 * n);
  if (s.done.size() < static_cast<std::size_t>(n)) s.done.resize(n);
  if (s.one.size() < static_cast<std::size_t>(p)) s.one.resize(p);
  int* order = s.order.data();
  int* pace = order + n;
  // Fitting setups, cheapest-looking first (sum of busy, all-reduce and optimizer time).
  int fitting = 0;
  double key[64];
  const bool keyed = n <= 64;
  for (int k = 0; k < n; ++k) {
    bool fits = true;
    double sum = 0;
    for (int i = 0; i < p && fits; ++i) {
      const FastStageCost& c = all[i * n + k];
      fits = c.fits;
      sum += c.busy_ms(batches) + c.allreduce_ms + c.optimizer_ms;
    }
    if (!fits) continue;
    int j = fitting++;
    if (keyed) {
      while (j > 0 && key[j - 1] > sum) {
        key[j] = key[j - 1];
        order[j] = order[j - 1];
        --j;
      }
      key[j] = sum;
    }
    order[j] = k;
  }
  int best = -1, computed = 0;
  for (int f = 0; f < fitting; ++f) {
    const int k = order[f];
    for (int i = 0; i < p; ++i) s.one[i] = all[i * n + k];
    const int pk = pace_stage(s.one.data(), p, batches);
    bool dominated = false;
    for (int d = 0; d < computed && !dominated; ++d) {
      const int j = s.done[d];
      if (pace[j] != pk) continue;
      bool le = true;
      for (int i = 0; i < p && le; ++i) le = times_le(all[i * n + j], all[i * n + k]);
      dominated = le;
    }
    if (dominated) continue;
    const double t = iteration_ms(s.one.data(), p, batches, schedule, scratch);
    pace[k] = pk;
    s.done[computed++] = k;
    if (best < 0 || t < *ms) {
      best = k;
      *ms = t;
    }
  }
  return best;
}

}  // namespace hetplan
