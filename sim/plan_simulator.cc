#include "sim/plan_simulator.h"

#include <algorithm>
#include <cmath>

#include "sim/gpu_specs.h"
#include "base/input_error.h"
#include "sim/plan_cost.h"

namespace hetplan {

PlanSimulator::PlanSimulator(const Cluster& cluster, const ProfileSet& profiles, ModelShape shape, int sequence_length,
                             SimulationOptions options)
    : cluster_(&cluster), profiles_(&profiles), shape_(std::move(shape)), seq_(sequence_length), opt_(options) {
  for (const auto& name : cluster.device_types()) profile_type_.push_back(profiles.type_index(name));
  if (opt_.measured_collectives && opt_.network.intra_collective_bytes_per_s.empty())
    for (int pt : profile_type_)
      // Net of the profile's per-call latency: the network charges latency per collective itself.
      opt_.network.intra_collective_bytes_per_s.push_back(
          pt >= 0 ? std::max(0.0, profiles.allreduce_busbw_gbs(pt, opt_.network.intra_latency_s)) * 1e9 : 0.0);
  if (shape_.metis_num_layers() != profiles.num_layers())
    throw InputError(profiles.model().path + ": profiles have " + std::to_string(profiles.num_layers()) +
                     " layers, but the model has " + std::to_string(shape_.metis_num_layers()) +
                     " (embedding + " + std::to_string(shape_.num_layers) + " blocks + head)");
}

bool PlanSimulator::run(const RankLayout& layout, const std::vector<int>& groups, const Strategy* strategies,
                        const int* partition, int batches, int gbs, PlanSimulation* out, std::string* why,
                        bool spans) const {
  const int p = static_cast<int>(groups.size());
  if (batches < 1 || gbs % batches != 0) {
    if (why) *why = "batches = " + std::to_string(batches) + " does not divide the global batch " + std::to_string(gbs);
    return false;
  }
  const int micro_batch = gbs / batches;
  if (const std::string e = interleaving_error(opt_.schedule, p, batches, opt_.virtual_stages); !e.empty()) {
    if (why) *why = e;
    return false;
  }
  // The stage costs come from the fast path's one definition of them.
  const PlanCostModel model(*this, layout, {opt_.setup});
  PlanSimulation sim;
  TimelineInput tin;
  tin.microbatches = batches;
  tin.schedule = opt_.schedule;
  tin.virtual_stages = opt_.virtual_stages;
  tin.tokens = static_cast<double>(gbs) * seq_;
  tin.model_flops = shape_.training_flops(tin.tokens, seq_);

  std::vector<FastStageCost> fast(p);
  int begin = 0;
  for (int i = 0; i < p; ++i) {
    const Strategy st = strategies[i];
    const int size = groups[i];
    const StageChoice choice{begin, size, st, partition[i], partition[i + 1]};
    StageDetail detail;
    if (!model.explain_stage(choice, i, p, batches, micro_batch, 0, &fast[i], &detail, why)) return false;
    const FastStageCost& f = fast[i];
    StageCosts c = timeline_stage_times(f);
    const std::string type = cluster_->device_types()[layout.type_of(begin)];
    c.label = "stage " + std::to_string(i) + ": " + (layout.homogeneous(begin, begin + size) ? type : "mixed") + " x" +
              std::to_string(size) + " (dp " + std::to_string(st.dp) + ", tp " + std::to_string(st.tp) +
              "), layers [" + std::to_string(choice.layer_begin) + ", " + std::to_string(choice.layer_end) + ")";
    c.sustained_factor = f.sustained_factor;
    bool known = true;
    for (int r = begin; r < begin + size; ++r) {
      const GpuSpec* g = find_gpu_spec(cluster_->device_types()[layout.type_of(r)]);
      known = known && g != nullptr;
      if (g) c.peak_flops += g->peak_tflops * 1e12;
    }
    if (!known) c.peak_flops = 0;  // one GPU without a datasheet entry: no MFU
    tin.stages.push_back(c);
    if (!f.fits && sim.fits) {
      sim.fits = false;
      sim.first_oom_rank = f.first_oom_rank;
    }
    for (RankMemory& m : detail.ranks) sim.ranks.push_back(std::move(m));
    begin += size;
  }
  // The stage with the most compute never waits: its forward and backward
  // (not the memory-bound accumulation) run at the sustained pace.
  const int pace = model.pace_stage(fast.data(), p, batches);
  if (pace >= 0) {
    StageCosts& c = tin.stages[pace];
    c.forward_ms *= c.sustained_factor;
    c.backward_ms *= c.sustained_factor;
    c.power_limited = true;
  }
  if (model.virtual_stages() > 1) {
    if (!add_chunk_costs(model, groups, strategies, partition, batches, micro_batch, &tin, why)) return false;
    if (pace >= 0)
      for (int c = 0; c < tin.virtual_stages; ++c) {
        StageCosts& k = tin.chunks[virtual_stage(p, pace, c)];
        k.forward_ms *= tin.stages[pace].sustained_factor;
        k.backward_ms *= tin.stages[pace].sustained_factor;
        k.power_limited = true;
      }
  }
  sim.timeline = simulate_timeline(tin);
  if (!spans) sim.timeline.spans.clear();
  sim.stages = std::move(tin.stages);
  *out = std::move(sim);
  return true;
}

// Interleaved: the costs of each stage's chunks (PlanCostModel::chunk_costs), labelled, in model order.
bool PlanSimulator::add_chunk_costs(const PlanCostModel& model, const std::vector<int>& groups,
                                    const Strategy* strategies, const int* partition, int batches, int micro_batch,
                                    TimelineInput* tin, std::string* why) const {
  const int p = static_cast<int>(groups.size());
  const int v = tin->virtual_stages;
  std::vector<StageChoice> choices;
  int begin = 0;
  for (int i = 0; i < p; ++i) {
    if (stage_blocks(partition[i], partition[i + 1], partition[p]) < v) {
      if (why)
        *why = "stage " + std::to_string(i) + " has " +
               std::to_string(stage_blocks(partition[i], partition[i + 1], partition[p])) +
               " transformer blocks, fewer than its " + std::to_string(v) + " virtual stages";
      return false;
    }
    choices.push_back(StageChoice{begin, groups[i], strategies[i], partition[i], partition[i + 1]});
    begin += groups[i];
  }
  std::vector<FastStageCost> fast(static_cast<std::size_t>(p) * v);
  if (!model.chunk_costs(choices.data(), p, batches, micro_batch, v, fast.data(), why)) return false;
  tin->chunks.assign(fast.size(), StageCosts());
  for (int k = 0; k < p * v; ++k) {
    const FastStageCost& f = fast[k];
    StageCosts& out = tin->chunks[k];
    int first = 0, last = 0;
    chunk_model_layers(partition, p, v, k % p, k / p, &first, &last);
    out.label = "stage " + std::to_string(k % p) + " chunk " + std::to_string(k / p) + " (virtual stage " +
                std::to_string(k) + "): model layers [" + std::to_string(first) + ", " + std::to_string(last) + ")";
    out.forward_ms = f.forward_ms;
    out.backward_ms = f.backward_ms;
    out.accumulation_ms = f.accumulation_ms;
    out.send_forward_ms = f.send_forward_ms;
    out.send_backward_ms = f.send_backward_ms;
    out.sustained_factor = tin->stages[k % p].sustained_factor;
  }
  return true;
}

std::vector<std::string> PlanSimulator::collective_sources() const {
  std::vector<std::string> out;
  const auto& types = cluster_->device_types();
  const auto& measured = opt_.network.intra_collective_bytes_per_s;
  for (std::size_t t = 0; t < types.size(); ++t) {
    const bool m = t < measured.size() && measured[t] > 0;
    out.push_back(types[t] + ": intra-node all-reduce at " +
                  (m ? std::to_string(static_cast<int>(std::lround(measured[t] / 1e9))) + " GB/s bus bandwidth measured by the profiler (net of its calls' latency)"
                     : std::string("the clusterfile's intra_bandwidth")));
  }
  return out;
}

double PlanSimulator::layer_bytes(int start, int end) const {
  const std::vector<double>& b = profiles_->model().parameters_per_layer_bytes;
  double sum = 0;
  for (int l = start; l < end && l < static_cast<int>(b.size()); ++l) sum += b[l];
  return sum;
}

double PlanSimulator::tied_copy_bytes(int start, int end) const {
  const std::vector<double>& b = profiles_->model().parameters_per_layer_bytes;
  if (!shape_.tied_embeddings || start <= 0 || end < shape_.metis_num_layers() || b.empty() ||
      shape_.embedding_params() <= 0)
    return 0;
  // The word table's part of layer 0 (learned positions stay with the embedding).
  const double table = static_cast<double>(shape_.vocab_size) * shape_.hidden_size;
  return b[0] * table / static_cast<double>(shape_.embedding_params());
}

PlanSimulation PlanSimulator::simulate(const PlanResult& plan, int gbs) const {
  std::vector<int> ns;
  for (const auto& name : plan.node_sequence) {
    const int t = cluster_->type_index(name);
    if (t < 0) throw InputError("plan: node_sequence names '" + excerpt(name) + "', which the cluster does not have");
    if (profile_type_[t] < 0)
      throw InputError(profiles_->dir() + ": no profiles DeviceType." + name + "_tp<T>_bs<B>.json for the plan's " + name);
    ns.push_back(t);
  }
  if (plan.batches < 1 || gbs % plan.batches != 0)
    throw InputError("plan: batches = " + std::to_string(plan.batches) + " does not divide the global batch size " +
                     std::to_string(gbs) + " (every micro-batch has gbs / batches samples)");
  const RankLayout layout(*cluster_, ns);
  int total = 0;
  for (int g : plan.device_groups) total += g;
  if (total != layout.num_ranks())
    throw InputError("plan: device_groups use " + std::to_string(total) + " GPUs, but the cluster's node sequence has " +
                     std::to_string(layout.num_ranks()));
  if (plan.layer_partition.back() > shape_.metis_num_layers())
    throw InputError("plan: layer_partition ends at " + std::to_string(plan.layer_partition.back()) +
                     ", past the model's " + std::to_string(shape_.metis_num_layers()) + " layers");
  PlanSimulation out;
  std::string why;
  if (!run(layout, plan.device_groups, plan.strategies.data(), plan.layer_partition.data(), plan.batches, gbs, &out,
           &why))
    throw InputError(why);
  return out;
}

ordered_json simulation_to_json(const PlanSimulation& s) {
  ordered_json j;
  const TimelineResult& t = s.timeline;
  j["iteration_ms"] = t.iteration_ms;
  j["bubble_fraction"] = t.bubble_fraction;
  j["tokens_per_s"] = t.tokens_per_s;
  if (t.mfu >= 0) j["mfu"] = t.mfu;
  else j["mfu"] = nullptr;
  j["fits"] = s.fits;
  ordered_json stages = ordered_json::array();
  for (std::size_t i = 0; i < s.stages.size(); ++i) {
    const StageCosts& c = s.stages[i];
    double peak = 0;
    for (const auto& r : s.ranks)
      if (r.stage == static_cast<int>(i)) peak = std::max(peak, r.breakdown.gpu_total());
    stages.push_back({{"label", c.label},
                      {"forward_ms", c.forward_ms},
                      {"backward_ms", c.backward_ms},
                      {"accumulation_ms", c.accumulation_ms},
                      {"sustained_factor", c.sustained_factor},
                      {"power_limited", c.power_limited},
                      {"send_forward_ms", c.send_forward_ms},
                      {"send_backward_ms", c.send_backward_ms},
                      {"allreduce_ms", c.allreduce_ms},
                      {"optimizer_ms", c.optimizer_ms},
                      {"busy_ms", t.busy_ms[i]},
                      {"peak_in_flight", t.peak_in_flight[i]},
                      {"peak_memory_bytes", peak}});
  }
  j["stages"] = stages;
  ordered_json ranks = ordered_json::array();
  for (const auto& r : s.ranks) {
    const MemoryBreakdown& b = r.breakdown;
    ranks.push_back({{"rank", r.rank},
                     {"stage", r.stage},
                     {"device", r.device},
                     {"weights", b.states.weights},
                     {"gradients", b.states.gradients},
                     {"optimizer", b.states.optimizer},
                     {"transient", b.states.transient + b.recompute_workspace},
                     {"activations", b.activations},
                     {"framework", b.framework},
                     {"allocated_peak", b.allocated_peak()},
                     {"allocator_reserve", b.allocator_reserve},
                     {"nccl", b.nccl},
                     {"total", b.gpu_total()},
                     {"capacity", r.capacity_bytes},
                     {"usable", r.usable_bytes},
                     {"fits", r.fits()}});
  }
  j["ranks"] = ranks;
  return j;
}

TrainingSetup as_profiled(TrainingSetup s, const ProfileSet& profiles, bool keep_accounting, bool keep_attention) {
  std::string attention;
  double state_bytes = 0;
  bool attention_agrees = true, bytes_agree = true;
  for (const LayerProfile& p : profiles.entries()) {
    if (!p.attention.empty()) {
      attention_agrees &= attention.empty() || attention == p.attention;
      attention = p.attention;
    }
    if (p.state_bytes_per_parameter > 0) {
      bytes_agree &= state_bytes == 0 || state_bytes == p.state_bytes_per_parameter;
      state_bytes = p.state_bytes_per_parameter;
    }
  }
  if (!keep_attention && attention_agrees && !attention.empty()) s.flash_attention = attention == "fused";
  if (!keep_accounting && bytes_agree && state_bytes == 18 && s.precision != Precision::kFp32)
    s.accounting = ZeroAccounting::kMegatron;
  return s;
}

bool parse_collectives(const std::string& s) {
  if (s == "measured") return true;
  if (s == "clusterfile") return false;
  throw InputError("--collectives: '" + excerpt(s) + "': expected measured or clusterfile");
}

}  // namespace hetplan
