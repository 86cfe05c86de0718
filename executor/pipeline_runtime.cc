#include "executor/pipeline_runtime.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <set>

#include "profiler/device_meter.h"
#include "executor/zero_optimizer.h"
#include "profiler/mixed_precision.h"
#include "base/input_error.h"
#include "sim/schedule.h"

namespace hetplan::executor {

namespace fs = std::filesystem;
using profiler::CommGroup;

std::pair<torch::Tensor, torch::Tensor> global_batch(const ReplayConfig& c, int step) {
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(c.data_seed + 2 * step);
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(c.data_seed + 2 * step + 1);
  const auto opts = torch::TensorOptions().dtype(torch::kLong);
  return {at::randint(c.model.shape.vocab_size, {c.gbs, c.model.seq_len}, g1, opts),
          at::randint(c.model.shape.vocab_size, {c.gbs, c.model.seq_len}, g2, opts)};
}

namespace {

// The groups one rank belongs to, created in one global order on every rank.
struct RankGroups {
  std::shared_ptr<CommGroup> world, tp, dp, cp;
  // Tied embeddings split over the first and last stages: the group that
  // sums their gradients. Megatron's pairs (same replica and tp index) when
  // both stages have the same (dp, tp); otherwise all their ranks, summing
  // full-size [vocab, hidden] gradients (emb_full).
  std::shared_ptr<CommGroup> emb;
  bool emb_full = false;
  std::map<std::pair<int, int>, std::shared_ptr<CommGroup>> fwd, bwd;  // keyed (src, dst)
};

RankGroups make_groups(const PipelineLayout& layout, int me, const ReplayConfig& c, const profiler::DistEnv& env) {
  auto rv = profiler::connect_world(env, c.timeout);
  auto join = [&](const GroupSeat& seat) {
    return profiler::make_group(rv, seat.name, seat.position, seat.size, c.device, c.timeout);
  };
  RankGroups g;
  g.world = profiler::make_group(rv, "world", me, layout.world(), c.device, c.timeout);
  if (const GroupSeat tp = layout.tp_seat(me); tp.member()) g.tp = join(tp);
  if (const GroupSeat dp = layout.dp_seat(me); dp.member()) g.dp = join(dp);
  if (const GroupSeat cp = layout.cp_seat(me); cp.member()) g.cp = join(cp);
  // One two-rank group per pair and direction, so that activations and
  // gradients never queue behind each other (NCCL orders a pair's p2p ops).
  auto join_pairs = [&](const std::vector<Transfer>& fwd, const std::vector<Transfer>& bwd) {
    for (const Transfer& x : fwd)
      if (x.src == me || x.dst == me)
        g.fwd[{x.src, x.dst}] = profiler::make_group(
            rv, "fwd." + std::to_string(x.src) + "." + std::to_string(x.dst), x.src == me ? 0 : 1, 2, c.device, c.timeout);
    for (const Transfer& x : bwd)
      if (x.src == me || x.dst == me)
        g.bwd[{x.src, x.dst}] = profiler::make_group(
            rv, "bwd." + std::to_string(x.src) + "." + std::to_string(x.dst), x.src == me ? 0 : 1, 2, c.device, c.timeout);
  };
  for (int s = 0; s + 1 < layout.num_stages(); ++s) join_pairs(layout.forward_transfers(s), layout.backward_transfers(s));
  // Interleaved: the last stage's chunk c feeds the first stage's chunk c + 1 (pairs distinct from the above).
  join_pairs(layout.wrap_forward_transfers(), layout.wrap_backward_transfers());
  if (c.model.shape.tied_embeddings)
    if (const GroupSeat emb = layout.embedding_seat(me); emb.member()) {
      g.emb = join(emb);
      g.emb_full = layout.embedding_group_full();
    }
  return g;
}

struct MicroBatchState {
  torch::Tensor input, output;  // output: activations, or the scaled loss on the last stage
};

// The stage's model chunks: one GPT of the stage's layers, or (interleaved) one per chunk, each of its
// model layers (the same weights as one process's layers of those numbers).
// Whether the rank's optimizer is MixedPrecisionAdam, whose main gradients are whole on every rank (no
// ZeRO-2/3, no ZeRO-1 on ZeroOptimizer's units): RankRun::build_optimizer's choice.
bool main_grads_whole(const ReplayConfig& c, const StageLayout& st, int virtual_stages) {
  const bool zero1_units = c.zero_stage == 1 && st.dp > 1 && c.overlap_grad_reduce && virtual_stages == 1;
  return c.zero_stage < 2 && !zero1_units;
}

std::vector<profiler::GPT> build_chunks(const ReplayConfig& c, const profiler::TensorParallelGroup& tp,
                                        const profiler::TensorParallelGroup& cp, const StageLayout& st) {
  profiler::GPTConfig model = c.model;
  // Sequence parallelism: where the main gradients are whole, the shard-used parameters' gradients are
  // summed over tp once per step (sync_gradients), as Megatron does; under ZeRO-2/3 in every backward.
  model.sequence_parallel_grads_in_step =
      model.sequence_parallel && tp.size() > 1 && main_grads_whole(c, st, static_cast<int>(st.chunk_layers.size()));
  std::vector<profiler::GPT> chunks;
  for (const auto& [first, last] : st.chunk_layers) chunks.emplace_back(model, tp, first, last, cp);
  return chunks;
}

// One rank's run of a replayed plan: its stage's model chunks, optimizer and groups (built once), and one
// training iteration at a time. Interleaved 1F1B runs each op on its chunk (sim/schedule.h's order);
// every chunk keeps its own micro-batches' state, receives from the virtual stage before it and sends to
// the one after. REQUIRES: layout, config and meter outlive it.
class RankRun {
 public:
  RankRun(const PipelineLayout& layout, const ReplayConfig& c, const profiler::DistEnv& env,
          profiler::DeviceMeter* meter);
  void iteration(int step);
  // The report after the last iteration, with its memory summary.
  RankReport finish();
  // The stage's parameters after the last step, for checks (config.dump_dir).
  void dump_parameters();

 private:
  void build_optimizer();
  void collect_transfers();
  void timed(const std::string& name, int j, const std::function<void()>& f);
  void world_barrier();
  void run_schedule();
  torch::Tensor receive_input(int c, int j);
  void forward(int c, int j);
  void backward(int c, int j);
  // Chunk c's virtual stage, and the p2p tag of a message from virtual stage k about micro-batch j.
  int vstage(int c) const { return virtual_stage(layout_.num_stages(), s_, c); }
  int tag(int k, int j) const { return (v_ > 1 ? k * m_ : 0) + j; }
  void sync_gradients();
  void sum_sequence_parallel_grads();
  void optimizer_step();
  void record(int origin, double ms);

  const PipelineLayout& layout_;
  const ReplayConfig& c_;
  profiler::DeviceMeter& meter_;
  const int me_;
  const StageLayout& st_;
  const int s_, replica_, t_;
  const bool first_, last_;  // the first / last stage (chunk 0 / v - 1 on it: the model's ends)
  const SampleRange mine_;
  const int m_, mb_, v_;
  RankGroups groups_;
  profiler::TensorParallelGroup tp_group_;
  profiler::TensorParallelGroup cp_group_;  // context parallelism (size 1: none)
  const int64_t seq_;                       // this rank's tokens of each sequence (seq_len / cp)
  std::vector<profiler::GPT> chunks_;  // v model chunks (one without interleaving)
  profiler::GPT& stage_model_;         // chunks_[0] (ZeRO-2/3 run one chunk only)
  std::vector<torch::Tensor> params_;
  torch::Tensor tied_;
  std::vector<torch::Tensor> sp_params_;  // sequence parallelism: gradients summed over tp in sync_gradients
  bool zero_ = false;  // ZeRO-1 over more than one replica
  // bf16 weights: fp32 main gradients, master weights and Adam state (Megatron's mixed precision).
  // ZeRO-1: MixedPrecisionAdam with sharded masters (with overlapped reduction: ZeroOptimizer stage 1);
  // ZeRO-2/3: ZeroOptimizer over layer units.
  std::unique_ptr<profiler::MixedPrecisionAdam> mp_adam_;
  std::unique_ptr<ZeroOptimizer> zopt_;
  std::vector<std::vector<int>> layer_units_;  // per layer: its ZeRO units
  int64_t hidden_ = 0;
  std::vector<char> tokens_in_;  // per chunk: its input is token ids
  torch::TensorOptions act_opts_, id_opts_;
  // Device memory in use (CUDA context and NCCL included), sampled at the end
  // of each iteration (nothing pending; the caching allocator keeps what the
  // iteration reserved, so this is the iteration's high-water mark of the
  // device, cuBLAS and NCCL workspaces included); its maximum is reported.
  int64_t device_used_peak_ = -1;
  RankReport report_;
  // Incoming and outgoing pieces of this rank per chunk, in sample order.
  std::vector<std::vector<Transfer>> recv_fwd_, send_fwd_, recv_bwd_, send_bwd_;
  std::vector<CommGroup::Waiter> pending_;
  struct Mark {
    std::string name;
    int a, b, micro_batch, chunk;
  };
  int chunk_now_ = 0;  // the chunk of the op under way (for the marks)
  std::vector<Mark> marks_;
  torch::Tensor one_;
  // The iteration under way.
  torch::Tensor ids_full_, targets_full_, loss_share_;
  std::vector<std::vector<MicroBatchState>> mbs_;  // [chunk][micro-batch]
  int backwards_done_ = 0;                         // backward ops of this iteration so far
};

RankRun::RankRun(const PipelineLayout& layout, const ReplayConfig& c, const profiler::DistEnv& env,
                 profiler::DeviceMeter* meter)
    : layout_(layout),
      c_(c),
      meter_(*meter),
      me_(env.rank),
      st_(layout.stage_of(env.rank)),
      s_(st_.index),
      replica_(layout.replica_of(env.rank)),
      t_(layout.tp_index_of(env.rank)),
      first_(s_ == 0),
      last_(s_ + 1 == layout.num_stages()),
      mine_(st_.replica_samples[replica_]),
      m_(layout.batches()),
      mb_(layout.micro_batch()),
      v_(layout.virtual_stages()),
      groups_(make_groups(layout, env.rank, c, env)),
      tp_group_(st_.tp > 1 ? profiler::TensorParallelGroup(t_, st_.tp, groups_.tp) : profiler::TensorParallelGroup()),
      cp_group_(groups_.cp ? profiler::TensorParallelGroup(groups_.cp->rank(), groups_.cp->size(), groups_.cp)
                           : profiler::TensorParallelGroup()),
      seq_(c.model.seq_len / layout.context_parallel()),
      chunks_(build_chunks(c, tp_group_, cp_group_, st_)),
      stage_model_(chunks_.front()) {
  for (profiler::GPT& chunk : chunks_) {
    chunk.to(c.device, c.dtype);
    for (const torch::Tensor& p : chunk.parameters()) params_.push_back(p);
    // The tied embedding's end on this stage: chunk 0 of the first, chunk v - 1 of the last.
    if (const torch::Tensor t = chunk.tied_embedding_to_sync(); t.defined()) tied_ = t;
    tokens_in_.push_back(chunk.first_layer() == 0);
    if (chunk.config().sequence_parallel_grads_in_step)
      for (const torch::Tensor& p : chunk.sequence_parallel_params()) sp_params_.push_back(p);
  }
  zero_ = c.zero_stage == 1 && st_.dp > 1;
  build_optimizer();
  hidden_ = c.model.shape.hidden_size;
  act_opts_ = torch::TensorOptions().dtype(c.dtype).device(c.device);
  id_opts_ = torch::TensorOptions().dtype(torch::kLong).device(c.device);
  report_.rank = me_;
  report_.stage = s_;
  report_.replica = replica_;
  report_.tp_index = t_;
  collect_transfers();
  one_ = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(c.device));
}

void RankRun::build_optimizer() {
  auto& layers = stage_model_.layers();
  layer_units_.assign(layers.size(), {});
  // ZeRO-1 with overlapped reduction runs on ZeroOptimizer's units (one model chunk: its units are layers).
  if (main_grads_whole(c_, st_, v_)) {
    mp_adam_ = std::make_unique<profiler::MixedPrecisionAdam>(params_, c_.lr, zero_ ? replica_ : 0,
                                                              zero_ ? st_.dp : 1, /*in_backward=*/true);
    return;
  }
  // Units: each layer's parameters; a tied embedding alone (it is synced
  // between pipeline ends, and a GPT holding both ends uses it in two layers).
  torch::Tensor solo = tied_;
  const bool shared = c_.model.shape.tied_embeddings && st_.first_layer == 0 && stage_model_.has_head();
  if (shared) solo = std::dynamic_pointer_cast<profiler::EmbeddingLayer>(layers.front())->word_embeddings();
  std::vector<std::vector<torch::Tensor>> units;
  int solo_unit = -1;
  for (std::size_t li = 0; li < layers.size(); ++li) {
    std::vector<torch::Tensor> own;
    for (const auto& p : layers[li]->parameters()) {
      if (solo.defined() && p.unsafeGetTensorImpl() == solo.unsafeGetTensorImpl()) {
        if (solo_unit < 0) {
          solo_unit = static_cast<int>(units.size());
          units.push_back({p});
        }
        layer_units_[li].push_back(solo_unit);
      } else {
        own.push_back(p);
      }
    }
    if (!own.empty()) {
      layer_units_[li].push_back(static_cast<int>(units.size()));
      units.push_back(std::move(own));
    }
  }
  if (shared && solo_unit >= 0) layer_units_.back().push_back(solo_unit);  // the head's use of the embedding
  zopt_ = std::make_unique<ZeroOptimizer>(c_.zero_stage, std::move(units), c_.lr, st_.dp > 1 ? groups_.dp : nullptr);
  zopt_->set_overlap(c_.overlap_grad_reduce);
  zopt_->set_prefetch(c_.overlap_param_gather);
}

// Per chunk: from the stage before (the last stage's chunk c - 1 for the first stage's chunk c), to the
// stage after (the first stage's chunk c + 1 from the last stage's chunk c).
void RankRun::collect_transfers() {
  recv_fwd_.assign(v_, {});
  send_fwd_.assign(v_, {});
  recv_bwd_.assign(v_, {});
  send_bwd_.assign(v_, {});
  auto pick = [&](const std::vector<Transfer>& all, bool mine_is_src, std::vector<Transfer>* out) {
    for (const Transfer& x : all)
      if ((mine_is_src ? x.src : x.dst) == me_) out->push_back(x);
  };
  for (int c = 0; c < v_; ++c) {
    if (!first_) {
      pick(layout_.forward_transfers(s_ - 1), false, &recv_fwd_[c]);
      pick(layout_.backward_transfers(s_ - 1), true, &send_bwd_[c]);
    } else if (c > 0) {
      pick(layout_.wrap_forward_transfers(), false, &recv_fwd_[c]);
      pick(layout_.wrap_backward_transfers(), true, &send_bwd_[c]);
    }
    if (!last_) {
      pick(layout_.forward_transfers(s_), true, &send_fwd_[c]);
      pick(layout_.backward_transfers(s_), false, &recv_bwd_[c]);
    } else if (c + 1 < v_) {
      pick(layout_.wrap_forward_transfers(), true, &send_fwd_[c]);
      pick(layout_.wrap_backward_transfers(), false, &recv_bwd_[c]);
    }
  }
}

void RankRun::timed(const std::string& name, int j, const std::function<void()>& f) {
  const int a = meter_.mark();
  f();
  marks_.push_back({name, a, meter_.mark(), j, j >= 0 ? chunk_now_ : 0});
}

void RankRun::world_barrier() {
  torch::Tensor x = one_.clone();
  groups_.world->all_reduce(x);
}

void RankRun::iteration(int step) {
  const bool recording = step >= c_.warmup;
  const auto [ids_cpu, targets_cpu] = global_batch(c_, step);
  // One copy per iteration: a pageable host-to-device copy per micro-batch
  // would make the host wait for the GPU each time and stall the pipeline.
  ids_full_ = first_ ? ids_cpu.to(c_.device) : ids_cpu;
  targets_full_ = last_ ? targets_cpu.to(c_.device) : targets_cpu;
  mbs_.assign(v_, std::vector<MicroBatchState>(m_));
  backwards_done_ = 0;
  loss_share_ = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(c_.device));
  marks_.clear();
  meter_.clear_marks();
  world_barrier();
  meter_.sync();
  // Memory is the steady state's: from the first measured iteration on,
  // split into the forward/backward phase and the optimizer step.
  if (recording) meter_.reset_peak();
  const auto t0 = std::chrono::steady_clock::now();
  const int origin = meter_.mark();
  if (zopt_) zopt_->zero_grad();
  else mp_adam_->zero_grad();
  run_schedule();
  sync_gradients();
  if (recording && meter_.has_memory_stats()) {
    meter_.sync();
    report_.peak_forward_backward_mb = std::max(report_.peak_forward_backward_mb, meter_.peak() / (1024.0 * 1024.0));
    meter_.reset_peak();
  }
  optimizer_step();
  meter_.sync();
  if (recording && meter_.has_memory_stats())
    report_.peak_optimizer_mb = std::max(report_.peak_optimizer_mb, meter_.peak() / (1024.0 * 1024.0));
  world_barrier();
  meter_.sync();
  device_used_peak_ = std::max(device_used_peak_, meter_.device_used());
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (recording) record(origin, ms);
}

// The stage's forwards and backwards in the schedule's op order, then the wait for its sends.
void RankRun::run_schedule() {
  for (const PipelineOp op : StageOps(c_.schedule, layout_.num_stages(), s_, m_, v_)) {
    chunk_now_ = op.chunk;
    if (op.forward) forward(op.chunk, op.micro_batch);
    else backward(op.chunk, op.micro_batch);
  }
  for (auto& w : pending_) w();
  pending_.clear();
}

// Micro-batch j's input to chunk c: this replica's token ids on virtual stage 0, else the pieces received.
torch::Tensor RankRun::receive_input(int c, int j) {
  const int row = j * mb_ + mine_.begin;
  if (first_ && c == 0) return profiler::context_parallel_slice(ids_full_.narrow(0, row, mine_.size()), 1, cp_group_);
  std::vector<torch::Tensor> pieces;
  for (const Transfer& in : recv_fwd_[c]) {
    torch::Tensor buf = tokens_in_[c] ? torch::empty({in.samples.size(), seq_}, id_opts_)
                                      : torch::empty({in.samples.size(), seq_, hidden_}, act_opts_);
    timed("recv", j, [&] { groups_.fwd.at({in.src, in.dst})->recv(buf, 0, tag(vstage(c) - 1, j)); });
    pieces.push_back(buf);
  }
  torch::Tensor x = pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 0);
  if (!tokens_in_[c]) x.requires_grad_(true);
  return x;
}

void RankRun::forward(int c, int j) {
  const torch::Tensor x = receive_input(c, j);
  const int row = j * mb_ + mine_.begin;
  profiler::GPT& model = chunks_[c];
  const bool loss = last_ && c == v_ - 1;  // the model's last virtual stage
  auto& layers = model.layers();
  torch::Tensor y = x;
  timed("forward", j, [&] {
    if (loss)
      model.head().set_targets(profiler::context_parallel_slice(targets_full_.narrow(0, row, mine_.size()), 1, cp_group_));
    static const std::vector<int> kNone;
    for (std::size_t li = 0; li < layers.size(); ++li) {
      if (zopt_) {
        for (int u : layer_units_[li]) zopt_->gather(u);  // ZeRO-3: just in time
        // The next layer's gathers, started before this layer's compute is issued: they run beside it.
        if (li + 1 < layers.size())
          for (int u : layer_units_[li + 1]) zopt_->prefetch(u);
      }
      y = layers[li]->forward(y);
      if (zopt_) {
        // The model's last layer keeps its weights: its backward comes next (FSDP2 keeps its root's too).
        if (!(loss && li + 1 == layers.size()))
          for (int u : layer_units_[li]) zopt_->release(u);
        zopt_->register_backward_gather(y, layer_units_[li], li > 0 ? layer_units_[li - 1] : kNone);
      }
    }
    // The loss of this replica's samples, weighted by its share of the global batch (and, under context
    // parallelism, by 1 / cp: each cp rank's loss is the mean over its part of the tokens).
    if (loss) y = y * (static_cast<double>(mine_.size()) / c_.gbs / cp_group_.size());
  });
  if (loss && t_ == 0) loss_share_ += y.detach().to(torch::kFloat64);
  for (const Transfer& out : send_fwd_[c]) {
    timed("send", j, [&] {
      pending_.push_back(groups_.fwd.at({out.src, out.dst})->send(
          y.detach().narrow(0, out.samples.begin - mine_.begin, out.samples.size()), 1, tag(vstage(c), j)));
    });
  }
  mbs_[c][j] = {x, y};
}

void RankRun::backward(int c, int j) {
  MicroBatchState& mbst = mbs_[c][j];
  const bool loss = last_ && c == v_ - 1;
  torch::Tensor grad;
  if (!loss) {
    std::vector<torch::Tensor> pieces;
    for (const Transfer& in : recv_bwd_[c]) {
      torch::Tensor buf = torch::empty({in.samples.size(), seq_, hidden_}, act_opts_);
      timed("recv", j, [&] { groups_.bwd.at({in.src, in.dst})->recv(buf, 0, tag(vstage(c) + 1, j)); });
      pieces.push_back(buf);
    }
    if (!pieces.empty()) grad = pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 0);
  }
  const bool last_backward = ++backwards_done_ == m_ * v_;
  timed("backward", j, [&] {
    if (zopt_) {
      zopt_->begin_backward(last_backward);  // ZeRO-1 reduces in the step's last backward only
      for (int u : layer_units_.back()) zopt_->gather(u);  // the root's layer (its output hook may not fire)
    }
    if (loss) {
      mbst.output.backward();
    } else if (mbst.output.requires_grad() && grad.defined()) {
      mbst.output.backward(grad);
    }
    // Nothing left: the backward hooks added each gradient into its fp32
    // main gradient (ZeRO-2/3: reduce-scattered into this rank's chunk).
    if (zopt_) zopt_->finish_backward();
    else mp_adam_->accumulate_grads();
  });
  if (!tokens_in_[c] && !send_bwd_[c].empty()) {
    const torch::Tensor g = mbst.input.grad();
    for (const Transfer& out : send_bwd_[c]) {
      timed("send", j, [&] {
        pending_.push_back(groups_.bwd.at({out.src, out.dst})->send(
            g.narrow(0, out.samples.begin - mine_.begin, out.samples.size()), 1, tag(vstage(c), j)));
      });
    }
  }
  mbst = {};
}

// The sum of the gradients over the stage's replicas and, for a tied embedding, between the pipeline's ends.
// ZeRO-1 reduce-scatters the main gradients in its step (Megatron's distributed optimizer), after the
// tied embedding's pairs have summed theirs (sums commute); a tied embedding summed over stages of
// different (dp, tp) needs every replica's gradient reduced first, so there it all-reduces here.
void RankRun::sync_gradients() {
  sum_sequence_parallel_grads();
  const bool reduce_in_step = zero_ && !groups_.emb_full;
  if (groups_.dp && !zopt_ && !reduce_in_step) {
    timed("allreduce", -1, [&] {
      groups_.dp->all_reduce(mp_adam_->flat_main_grads());  // one flat fp32 buffer
    });
  }
  if (!groups_.emb || !tied_.defined()) return;
  timed("allreduce", -1, [&] {
    // ZeRO-2/3: the stage's summed gradient of the tied unit, gathered from the dp chunks.
    const int tied_unit = zopt_ ? zopt_->unit_of(tied_) : -1;
    torch::Tensor g = zopt_ ? zopt_->full_gradient(tied_unit, tied_) : mp_adam_->main_grad_of(tied_);
    if (!groups_.emb_full) {
      groups_.emb->all_reduce(g);
    } else {
      // Each stage's replica 0 writes its tp slice; the sum is first + last stage.
      const int64_t rows = g.size(0);
      torch::Tensor full = torch::zeros({c_.model.shape.vocab_size, hidden_}, g.options());
      if (replica_ == 0) full.narrow(0, t_ * rows, rows).copy_(g);
      groups_.emb->all_reduce(full);
      g.copy_(full.narrow(0, t_ * rows, rows));
    }
    if (zopt_) zopt_->set_unit_gradient(tied_unit, tied_, g);
  });
}

// Sequence parallelism: the main gradients of the parameters used on a sequence shard summed over tp, in
// one all-reduce per step (Megatron's _allreduce_layernorm_grads); before or after the data-parallel sum,
// which commutes with it. The test hook sp-param-allreduce leaves them partial.
void RankRun::sum_sequence_parallel_grads() {
  static const bool disabled = profiler::test_disabled("sp-param-allreduce");
  if (sp_params_.empty() || !groups_.tp || disabled) return;
  timed("allreduce", -1, [&] {
    std::vector<torch::Tensor> grads;
    for (const torch::Tensor& p : sp_params_) grads.push_back(mp_adam_->main_grad_of(p).view({-1}));
    torch::Tensor flat = torch::cat(grads);
    groups_.tp->all_reduce(flat);
    int64_t at = 0;
    for (torch::Tensor& g : grads) {
      g.copy_(flat.narrow(0, at, g.numel()));
      at += g.numel();
    }
  });
}

void RankRun::optimizer_step() {
  const bool reduce_in_step = zero_ && !groups_.emb_full;
  timed("optimizer", -1, [&] {
    if (zopt_) {
      zopt_->step();
    } else if (zero_) {
      profiler::MixedPrecisionAdam::Collective rs;
      if (reduce_in_step) rs = [&](torch::Tensor& out, torch::Tensor& in) { groups_.dp->reduce_scatter(out, in); };
      mp_adam_->step_sharded(rs, [&](torch::Tensor& out, torch::Tensor& in) { groups_.dp->all_gather_flat(out, in); });
    } else {
      mp_adam_->step();
    }
  });
}

// A measured iteration: its time, loss and trace (spans relative to mark `origin`).
void RankRun::record(int origin, double ms) {
  report_.iteration_ms.push_back(ms);
  report_.losses.push_back(loss_share_.item<double>());
  report_.trace.clear();
  for (const Mark& mk : marks_)
    report_.trace.push_back(
        {mk.name, meter_.elapsed_ms(origin, mk.a), meter_.elapsed_ms(origin, mk.b), mk.micro_batch, mk.chunk});
}

RankReport RankRun::finish() {
  constexpr double kMiB = 1024.0 * 1024.0;
  RankReport& report = report_;
  report.peak_memory_mb = std::max(report.peak_forward_backward_mb, report.peak_optimizer_mb);
  if (zopt_) {
    report.overlapped_collectives = zopt_->overlapped_collectives();
    report.prefetched_gathers = zopt_->prefetched_gathers();
  }
  if (meter_.has_memory_stats()) report.peak_allocated_mb = report.peak_memory_mb;
  if (c_.device.is_cuda()) {
    if (meter_.peak_reserved() >= 0) report.peak_reserved_mb = meter_.peak_reserved() / kMiB;
    if (device_used_peak_ >= 0) report.device_used_mb = device_used_peak_ / kMiB;
  } else {
    report.memory_note = meter_.has_memory_stats()
                             ? "CPU run: peak_allocated_mb counts LibTorch's CPU allocations; there is no caching "
                               "allocator (reserved) and no device memory"
                             : "CPU run: this LibTorch cannot count CPU allocations; there is no device memory";
  }
  return report;
}

void RankRun::dump_parameters() {
  fs::create_directories(c_.dump_dir);
  std::vector<torch::Tensor> cpu;
  ordered_json index = ordered_json::array();
  if (zopt_) zopt_->gather_all();  // ZeRO-3 keeps only chunks between steps
  for (profiler::GPT& chunk : chunks_) {
    int64_t layer = chunk.first_layer();
    for (auto& l : chunk.layers()) {
      for (const auto& p : l->named_parameters()) {
        cpu.push_back(p.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());
        index.push_back({{"layer", layer}, {"name", p.key()}});
      }
      ++layer;
    }
  }
  const std::string base = (fs::path(c_.dump_dir) / ("rank" + std::to_string(me_))).string();
  torch::save(cpu, base + ".pt");
  ordered_json meta = {{"rank", me_},   {"stage", s_},       {"replica", replica_}, {"tp_index", t_},
                       {"tp", st_.tp}, {"params", index}};
  write_json_file(base + ".json", meta);
}

// HETPLAN_KINETO_DIR=DIR: a Kineto trace (torch.profiler's Chrome format: host ops, CUDA kernels, memcpys) of
// the last iteration, written to DIR/rank<r>.kineto.json, for breakdowns of compute against exposed
// collectives (scripts/gpu_zero3_race.py analyze). The traced iteration runs slower (the host records every
// op); time the others. A LibTorch built without Kineto (Debian's) writes none and says so once per rank.
bool start_kineto(torch::Device device) {
  namespace kp = torch::profiler::impl;
  std::set<kp::ActivityType> activities{kp::ActivityType::CPU};
  if (device.is_cuda()) activities.insert(kp::ActivityType::CUDA);
  const kp::ProfilerConfig config(kp::ProfilerState::KINETO);
  try {
    torch::autograd::profiler::prepareProfiler(config, activities);
    torch::autograd::profiler::enableProfiler(config, activities);
    return true;
  } catch (const c10::Error& e) {
    std::cerr << "hetplan: warning: HETPLAN_KINETO_DIR: no trace (" << std::string(e.what_without_backtrace()).substr(0, 160)
              << ")\n";
    return false;
  }
}

void save_kineto(const std::string& dir, int rank) {
  auto result = torch::autograd::profiler::disableProfiler();
  try {
    fs::create_directories(dir);
    result->save((fs::path(dir) / ("rank" + std::to_string(rank) + ".kineto.json")).string());
  } catch (const c10::Error& e) {
    std::cerr << "hetplan: warning: HETPLAN_KINETO_DIR: no trace (" << std::string(e.what_without_backtrace()).substr(0, 160)
              << ")\n";
  }
}

}  // namespace

RankReport run_pipeline_rank(const PipelineLayout& layout, const ReplayConfig& c, const profiler::DistEnv& env) {
  if (env.world_size != layout.world())
    throw InputError("replay: WORLD_SIZE is " + std::to_string(env.world_size) + " but the plan has " +
                     std::to_string(layout.world()) + " ranks");
  if (layout.virtual_stages() > 1 && c.schedule != Schedule::kInterleaved1F1B)
    throw InputError("replay: the plan has " + std::to_string(layout.virtual_stages()) +
                     " virtual stages per pipeline rank, which need --schedule interleaved");
  if (layout.virtual_stages() == 1 && c.schedule == Schedule::kInterleaved1F1B)
    throw InputError("replay: --schedule interleaved needs virtual stages (the plan's virtual_stages or --vp) >= 2");
  if (layout.virtual_stages() > 1 && c.zero_stage >= 2)
    throw InputError("replay: ZeRO-" + std::to_string(c.zero_stage) +
                     " with interleaving is not implemented (its layer units span one model chunk); use ZeRO-0 or 1");
  profiler::use_device(c.device);
  // Before anything is allocated: on the CPU the meter's counting allocator
  // sees only what is allocated after it is installed (CUDA counts from the start).
  profiler::DeviceMeter meter(c.device);
  RankRun run(layout, c, env, &meter);
  const char* kineto_dir = std::getenv("HETPLAN_KINETO_DIR");
  const int last = c.warmup + c.iters - 1;
  for (int step = 0; step <= last; ++step) {
    const bool traced = kineto_dir && *kineto_dir && step == last && start_kineto(c.device);
    run.iteration(step);
    if (traced) save_kineto(kineto_dir, env.rank);
  }
  RankReport report = run.finish();
  if (!c.dump_dir.empty()) run.dump_parameters();
  return report;
}

namespace {
ordered_json opt(const std::optional<double>& v) { return v ? ordered_json(*v) : ordered_json(nullptr); }
std::optional<double> opt_from(const ordered_json& j, const char* key) {
  if (!j.contains(key) || j[key].is_null()) return std::nullopt;
  return j[key].get<double>();
}
}  // namespace

ordered_json rank_report_to_json(const RankReport& r) {
  ordered_json spans = ordered_json::array();
  for (const Span& s : r.trace) spans.push_back({s.name, s.start_ms, s.end_ms, s.micro_batch, s.chunk});
  return {{"rank", r.rank},       {"stage", r.stage},   {"replica", r.replica},
          {"tp_index", r.tp_index}, {"iteration_ms", r.iteration_ms}, {"losses", r.losses},
          {"peak_memory_mb", r.peak_memory_mb}, {"peak_forward_backward_mb", r.peak_forward_backward_mb},
          {"peak_optimizer_mb", r.peak_optimizer_mb}, {"peak_allocated_mb", opt(r.peak_allocated_mb)},
          {"peak_reserved_mb", opt(r.peak_reserved_mb)}, {"device_used_mb", opt(r.device_used_mb)},
          {"memory_note", r.memory_note.empty() ? ordered_json(nullptr) : ordered_json(r.memory_note)},
          {"overlapped_collectives", r.overlapped_collectives},
          {"prefetched_gathers", r.prefetched_gathers},
          {"trace", spans}};
}

RankReport rank_report_from_json(const ordered_json& j) {
  RankReport r;
  r.rank = j["rank"];
  r.stage = j["stage"];
  r.replica = j["replica"];
  r.tp_index = j["tp_index"];
  r.iteration_ms = j["iteration_ms"].get<std::vector<double>>();
  r.losses = j["losses"].get<std::vector<double>>();
  r.peak_memory_mb = j["peak_memory_mb"];
  r.peak_forward_backward_mb = j.value("peak_forward_backward_mb", 0.0);
  r.peak_optimizer_mb = j.value("peak_optimizer_mb", 0.0);
  r.peak_allocated_mb = opt_from(j, "peak_allocated_mb");
  r.peak_reserved_mb = opt_from(j, "peak_reserved_mb");
  r.device_used_mb = opt_from(j, "device_used_mb");
  if (j.contains("memory_note") && j["memory_note"].is_string()) r.memory_note = j["memory_note"];
  r.overlapped_collectives = j.value("overlapped_collectives", 0LL);
  r.prefetched_gathers = j.value("prefetched_gathers", 0LL);
  for (const auto& s : j["trace"])
    r.trace.push_back({s[0].get<std::string>(), s[1].get<double>(), s[2].get<double>(), s[3].get<int>(),
                       s.size() > 4 ? s[4].get<int>() : 0});
  return r;
}

}  // namespace hetplan::executor
