#include "executor/pipeline_runtime.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>

#include "profiler/device_meter.h"
#include "executor/zero_optimizer.h"
#include "profiler/mixed_precision.h"
#include "sim/input_error.h"

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
  std::shared_ptr<CommGroup> world, tp, dp;
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
  // One two-rank group per pair and direction, so that activations and
  // gradients never queue behind each other (NCCL orders a pair's p2p ops).
  for (int s = 0; s + 1 < layout.num_stages(); ++s) {
    for (const Transfer& x : layout.forward_transfers(s))
      if (x.src == me || x.dst == me)
        g.fwd[{x.src, x.dst}] = profiler::make_group(
            rv, "fwd." + std::to_string(x.src) + "." + std::to_string(x.dst), x.src == me ? 0 : 1, 2, c.device, c.timeout);
    for (const Transfer& x : layout.backward_transfers(s))
      if (x.src == me || x.dst == me)
        g.bwd[{x.src, x.dst}] = profiler::make_group(
            rv, "bwd." + std::to_string(x.src) + "." + std::to_string(x.dst), x.src == me ? 0 : 1, 2, c.device, c.timeout);
  }
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

}  // namespace

RankReport run_pipeline_rank(const PipelineLayout& layout, const ReplayConfig& c, const profiler::DistEnv& env) {
  const int me = env.rank;
  if (env.world_size != layout.world())
    throw InputError("replay: WORLD_SIZE is " + std::to_string(env.world_size) + " but the plan has " +
                     std::to_string(layout.world()) + " ranks");
  const StageLayout& st = layout.stage_of(me);
  const int s = st.index, replica = layout.replica_of(me), t = layout.tp_index_of(me);
  const bool first = s == 0, last = s + 1 == layout.num_stages();
  const SampleRange mine = st.replica_samples[replica];
  const int m = layout.batches(), mb = layout.micro_batch();

  profiler::use_device(c.device);
  // Before anything is allocated: on the CPU the meter's counting allocator
  // sees only what is allocated after it is installed (CUDA counts from the start).
  profiler::DeviceMeter meter(c.device);
  RankGroups groups = make_groups(layout, me, c, env);
  profiler::TensorParallelGroup tp_group;
  if (st.tp > 1) tp_group = profiler::TensorParallelGroup(t, st.tp, groups.tp);
  profiler::GPT stage_model(c.model, tp_group, st.first_layer, st.last_layer);
  stage_model.to(c.device, c.dtype);
  std::vector<torch::Tensor> params = stage_model.parameters();
  // bf16 weights: fp32 main gradients, master weights and Adam state (Megatron's mixed precision).
  // ZeRO-1: MixedPrecisionAdam with sharded masters; ZeRO-2/3: ZeroOptimizer over layer units.
  const torch::Tensor tied = stage_model.tied_embedding_to_sync();
  const bool zero = c.zero_stage == 1 && st.dp > 1;
  std::unique_ptr<profiler::MixedPrecisionAdam> mp_adam;
  std::unique_ptr<ZeroOptimizer> zopt;
  auto& layers = stage_model.layers();
  std::vector<std::vector<int>> layer_units(layers.size());
  if (c.zero_stage >= 2) {
    // Units: each layer's parameters; a tied embedding alone (it is synced
    // between pipeline ends, and a GPT holding both ends uses it in two layers).
    torch::Tensor solo = tied;
    const bool shared = c.model.shape.tied_embeddings && st.first_layer == 0 && stage_model.has_head();
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
          layer_units[li].push_back(solo_unit);
        } else {
          own.push_back(p);
        }
      }
      if (!own.empty()) {
        layer_units[li].push_back(static_cast<int>(units.size()));
        units.push_back(std::move(own));
      }
    }
    if (shared && solo_unit >= 0) layer_units.back().push_back(solo_unit);  // the head's use of the embedding
    zopt = std::make_unique<ZeroOptimizer>(c.zero_stage, std::move(units), c.lr, st.dp > 1 ? groups.dp : nullptr);
  } else {
    mp_adam = std::make_unique<profiler::MixedPrecisionAdam>(params, c.lr, zero ? replica : 0, zero ? st.dp : 1,
                                                             /*in_backward=*/true);
  }
  const int64_t hidden = c.model.shape.hidden_size;
  const bool tokens_in = st.first_layer == 0;                 // this stage's input is token ids
  const auto act_opts = torch::TensorOptions().dtype(c.dtype).device(c.device);
  const auto id_opts = torch::TensorOptions().dtype(torch::kLong).device(c.device);

  // Device memory in use (CUDA context and NCCL included), sampled at the end
  // of each iteration (nothing pending; the caching allocator keeps what the
  // iteration reserved, so this is the iteration's high-water mark of the
  // device, cuBLAS and NCCL workspaces included); its maximum is reported.
  int64_t device_used_peak = -1;
  auto sample_memory = [&] { device_used_peak = std::max(device_used_peak, meter.device_used()); };
  RankReport report;
  report.rank = me;
  report.stage = s;
  report.replica = replica;
  report.tp_index = t;

  // Incoming and outgoing pieces of this rank, in sample order.
  std::vector<Transfer> recv_fwd, send_fwd, recv_bwd, send_bwd;
  if (!first)
    for (const Transfer& x : layout.forward_transfers(s - 1)) if (x.dst == me) recv_fwd.push_back(x);
  if (!last)
    for (const Transfer& x : layout.forward_transfers(s)) if (x.src == me) send_fwd.push_back(x);
  if (!last)
    for (const Transfer& x : layout.backward_transfers(s)) if (x.dst == me) recv_bwd.push_back(x);
  if (!first)
    for (const Transfer& x : layout.backward_transfers(s - 1)) if (x.src == me) send_bwd.push_back(x);

  std::vector<CommGroup::Waiter> pending;
  struct Mark {
    std::string name;
    int a, b, micro_batch;
  };
  std::vector<Mark> marks;
  auto timed = [&](const std::string& name, int j, const std::function<void()>& f) {
    const int a = meter.mark();
    f();
    marks.push_back({name, a, meter.mark(), j});
  };
  const torch::Tensor one = torch::ones({1}, torch::TensorOptions().dtype(torch::kFloat32).device(c.device));
  auto world_barrier = [&] {
    torch::Tensor x = one.clone();
    groups.world->all_reduce(x);
  };

  for (int step = 0; step < c.warmup + c.iters; ++step) {
    const bool record = step >= c.warmup;
    const auto [ids_cpu, targets_cpu] = global_batch(c, step);
    // One copy per iteration: a pageable host-to-device copy per micro-batch
    // would make the host wait for the GPU each time and stall the pipeline.
    const torch::Tensor ids_full = first ? ids_cpu.to(c.device) : ids_cpu;
    const torch::Tensor targets_full = last ? targets_cpu.to(c.device) : targets_cpu;
    std::vector<MicroBatchState> mbs(m);
    torch::Tensor loss_share = torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat64).device(c.device));
    marks.clear();
    meter.clear_marks();
    world_barrier();
    meter.sync();
    // Memory is the steady state's: from the first measured iteration on,
    // split into the forward/backward phase and the optimizer step.
    if (record) meter.reset_peak();
    const auto t0 = std::chrono::steady_clock::now();
    const int origin = meter.mark();
    if (zopt) zopt->zero_grad();
    else mp_adam->zero_grad();

    auto forward = [&](int j) {
      torch::Tensor x;
      const int row = j * mb + mine.begin;
      if (first) {
        x = ids_full.narrow(0, row, mine.size());
      } else {
        std::vector<torch::Tensor> pieces;
        for (const Transfer& in : recv_fwd) {
          torch::Tensor buf = tokens_in ? torch::empty({in.samples.size(), c.model.seq_len}, id_opts)
                                        : torch::empty({in.samples.size(), c.model.seq_len, hidden}, act_opts);
          timed("recv", j, [&] { groups.fwd.at({in.src, in.dst})->recv(buf, 0, j); });
          pieces.push_back(buf);
        }
        x = pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 0);
        if (!tokens_in) x.requires_grad_(true);
      }
      torch::Tensor y = x;
      timed("forward", j, [&] {
        if (last) stage_model.head().set_targets(targets_full.narrow(0, row, mine.size()));
        for (std::size_t li = 0; li < layers.size(); ++li) {
          if (zopt)
            for (int u : layer_units[li]) zopt->gather(u);  // ZeRO-3: just in time
          y = layers[li]->forward(y);
          if (zopt) {
            for (int u : layer_units[li]) zopt->release(u);
            zopt->register_backward_gather(y, layer_units[li]);
          }
        }
        // The loss of this replica's samples, weighted by its share of the global batch.
        if (last) y = y * (static_cast<double>(mine.size()) / c.gbs);
      });
      if (last && t == 0) loss_share += y.detach().to(torch::kFloat64);
      for (const Transfer& out : send_fwd) {
        timed("send", j, [&] {
          pending.push_back(groups.fwd.at({out.src, out.dst})->send(
              y.detach().narrow(0, out.samples.begin - mine.begin, out.samples.size()), 1, j));
        });
      }
      mbs[j] = {x, y};
    };
    auto backward = [&](int j) {
      MicroBatchState& mbst = mbs[j];
      torch::Tensor grad;
      if (!last) {
        std::vector<torch::Tensor> pieces;
        for (const Transfer& in : recv_bwd) {
          torch::Tensor buf = torch::empty({in.samples.size(), c.model.seq_len, hidden}, act_opts);
          timed("recv", j, [&] { groups.bwd.at({in.src, in.dst})->recv(buf, 0, j); });
          pieces.push_back(buf);
        }
        if (!pieces.empty()) grad = pieces.size() == 1 ? pieces[0] : torch::cat(pieces, 0);
      }
      timed("backward", j, [&] {
        if (zopt)
          for (int u : layer_units.back()) zopt->gather(u);  // the root's layer (its output hook may not fire)
        if (last) {
          mbst.output.backward();
        } else if (mbst.output.requires_grad() && grad.defined()) {
          mbst.output.backward(grad);
        }
        // Nothing left: the backward hooks added each gradient into its fp32
        // main gradient (ZeRO-2/3: reduce-scattered into this rank's chunk).
        if (zopt) zopt->finish_backward();
        else mp_adam->accumulate_grads();
      });
      if (!first && !tokens_in) {
        const torch::Tensor g = mbst.input.grad();
        for (const Transfer& out : send_bwd) {
          timed("send", j, [&] {
            pending.push_back(groups.bwd.at({out.src, out.dst})->send(
                g.narrow(0, out.samples.begin - mine.begin, out.samples.size()), 1, j));
          });
        }
      }
      mbst = {};
    };

    if (c.schedule == PipelineSchedule::kGPipe) {
      for (int j = 0; j < m; ++j) forward(j);
      for (int j = 0; j < m; ++j) backward(j);
    } else {
      const int warm = std::min(layout.num_stages() - s - 1, m);
      for (int j = 0; j < warm; ++j) forward(j);
      for (int j = warm; j < m; ++j) {
        forward(j);
        backward(j - warm);
      }
      for (int j = m - warm; j < m; ++j) backward(j);
    }
    for (auto& w : pending) w();
    pending.clear();

    // ZeRO-1 reduce-scatters the main gradients in its step (Megatron's distributed optimizer), after the
    // tied embedding's pairs have summed theirs (sums commute); a tied embedding summed over stages of
    // different (dp, tp) needs every replica's gradient reduced first, so there it all-reduces here.
    const bool reduce_in_step = zero && !groups.emb_full;
    if (groups.dp && !zopt && !reduce_in_step) {
      timed("allreduce", -1, [&] {
        groups.dp->all_reduce(mp_adam->flat_main_grads());  // one flat fp32 buffer
      });
    }
    if (groups.emb && tied.defined()) {
      timed("allreduce", -1, [&] {
        // ZeRO-2/3: the stage's summed gradient of the tied unit, gathered from the dp chunks.
        const int tied_unit = zopt ? zopt->unit_of(tied) : -1;
        torch::Tensor g = zopt ? zopt->full_gradient(tied_unit, tied) : mp_adam->main_grad_of(tied);
        if (!groups.emb_full) {
          groups.emb->all_reduce(g);
        } else {
          // Each stage's replica 0 writes its tp slice; the sum is first + last stage.
          const int64_t rows = g.size(0);
          torch::Tensor full = torch::zeros({c.model.shape.vocab_size, hidden}, g.options());
          if (replica == 0) full.narrow(0, t * rows, rows).copy_(g);
          groups.emb->all_reduce(full);
          g.copy_(full.narrow(0, t * rows, rows));
        }
        if (zopt) zopt->set_unit_gradient(tied_unit, tied, g);
      });
    }
    if (record && meter.has_memory_stats()) {
      meter.sync();
      report.peak_forward_backward_mb = std::max(report.peak_forward_backward_mb, meter.peak() / (1024.0 * 1024.0));
      meter.reset_peak();
    }
    timed("optimizer", -1, [&] {
      if (zopt) {
        zopt->step();
      } else if (zero) {
        profiler::MixedPrecisionAdam::Collective rs;
        if (reduce_in_step) rs = [&](torch::Tensor& out, torch::Tensor& in) { groups.dp->reduce_scatter(out, in); };
        mp_adam->step_sharded(rs, [&](torch::Tensor& out, torch::Tensor& in) { groups.dp->all_gather_flat(out, in); });
      } else {
        mp_adam->step();
      }
    });
    meter.sync();
    if (record && meter.has_memory_stats())
      report.peak_optimizer_mb = std::max(report.peak_optimizer_mb, meter.peak() / (1024.0 * 1024.0));
    world_barrier();
    meter.sync();
    sample_memory();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!record) continue;
    report.iteration_ms.push_back(ms);
    report.losses.push_back(loss_share.item<double>());
    report.trace.clear();
    for (const Mark& mk : marks)
      report.trace.push_back({mk.name, meter.elapsed_ms(origin, mk.a), meter.elapsed_ms(origin, mk.b), mk.micro_batch});
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  report.peak_memory_mb = std::max(report.peak_forward_backward_mb, report.peak_optimizer_mb);
  if (meter.has_memory_stats()) report.peak_allocated_mb = report.peak_memory_mb;
  if (c.device.is_cuda()) {
    if (meter.peak_reserved() >= 0) report.peak_reserved_mb = meter.peak_reserved() / kMiB;
    if (device_used_peak >= 0) report.device_used_mb = device_used_peak / kMiB;
  } else {
    report.memory_note = meter.has_memory_stats()
                             ? "CPU run: peak_allocated_mb counts LibTorch's CPU allocations; there is no caching "
                               "allocator (reserved) and no device memory"
                             : "CPU run: this LibTorch cannot count CPU allocations; there is no device memory";
  }

  if (!c.dump_dir.empty()) {
    fs::create_directories(c.dump_dir);
    std::vector<torch::Tensor> cpu;
    ordered_json index = ordered_json::array();
    int64_t layer = st.first_layer;
    if (zopt) zopt->gather_all();  // ZeRO-3 keeps only chunks between steps
    for (auto& l : stage_model.layers()) {
      for (const auto& p : l->named_parameters()) {
        cpu.push_back(p.value().detach().to(torch::kCPU, torch::kFloat32).contiguous());
        index.push_back({{"layer", layer}, {"name", p.key()}});
      }
      ++layer;
    }
    const std::string base = (fs::path(c.dump_dir) / ("rank" + std::to_string(me))).string();
    torch::save(cpu, base + ".pt");
    ordered_json meta = {{"rank", me}, {"stage", s}, {"replica", replica}, {"tp_index", t}, {"tp", st.tp},
                         {"params", index}};
    write_json_file(base + ".json", meta);
  }
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
  for (const Span& s : r.trace) spans.push_back({s.name, s.start_ms, s.end_ms, s.micro_batch});
  return {{"rank", r.rank},       {"stage", r.stage},   {"replica", r.replica},
          {"tp_index", r.tp_index}, {"iteration_ms", r.iteration_ms}, {"losses", r.losses},
          {"peak_memory_mb", r.peak_memory_mb}, {"peak_forward_backward_mb", r.peak_forward_backward_mb},
          {"peak_optimizer_mb", r.peak_optimizer_mb}, {"peak_allocated_mb", opt(r.peak_allocated_mb)},
          {"peak_reserved_mb", opt(r.peak_reserved_mb)}, {"device_used_mb", opt(r.device_used_mb)},
          {"memory_note", r.memory_note.empty() ? ordered_json(nullptr) : ordered_json(r.memory_note)},
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
  for (const auto& s : j["trace"])
    r.trace.push_back({s[0].get<std::string>(), s[1].get<double>(), s[2].get<double>(), s[3].get<int>()});
  return r;
}

}  // namespace hetplan::executor
