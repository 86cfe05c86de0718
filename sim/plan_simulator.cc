#include "sim/plan_simulator.h"

#include <algorithm>
#include <cmath>

#include "sim/data_load_balancer.h"
#include "sim/gpu_specs.h"
#include "sim/input_error.h"

namespace hetplan {

namespace {
constexpr double kMiB = 1024.0 * 1024.0;
}

PlanSimulator::PlanSimulator(const Cluster& cluster, const ProfileSet& profiles, ModelShape shape, int sequence_length,
                             SimulationOptions options)
    : cluster_(&cluster), profiles_(&profiles), shape_(std::move(shape)), seq_(sequence_length), opt_(options) {
  for (const auto& name : cluster.device_types()) profile_type_.push_back(profiles.type_index(name));
  if (opt_.measured_collectives && opt_.network.intra_collective_bytes_per_s.empty())
    for (int pt : profile_type_)
      opt_.network.intra_collective_bytes_per_s.push_back(pt >= 0 ? std::max(0.0, profiles.allreduce_busbw_gbs(pt)) * 1e9
                                                                  : 0.0);
  if (shape_.metis_num_layers() != profiles.num_layers())
    throw InputError(profiles.model().path + ": profiles have " + std::to_string(profiles.num_layers()) +
                     " layers, but the model has " + std::to_string(shape_.metis_num_layers()) +
                     " (embedding + " + std::to_string(shape_.num_layers) + " blocks + head)");
}

bool PlanSimulator::replica_cost(int type, int tp, int bs, int start, int end, ReplicaCost* out,
                                 std::string* why) const {
  ReplicaCost c;
  if (bs == 0) {
    *out = c;
    return true;
  }
  // A share without its own profile is costed as Metis does: the sum of its power-of-two slices.
  std::vector<const LayerProfile*> slices;
  if (const LayerProfile* p = profiles_->find(type, tp, bs)) {
    slices.push_back(p);
  } else {
    for (int bit = 30; bit >= 0; --bit) {
      const int slice = 1 << bit;
      if (!(bs & slice)) continue;
      const LayerProfile* p = slice <= opt_.max_profiled_bs ? profiles_->find(type, tp, slice) : nullptr;
      if (!p) {
        if (why) *why = profiles_->missing_message(type, tp, slice, "a replica's share of the micro-batch");
        return false;
      }
      slices.push_back(p);
    }
  }
  bool forward_known = true;
  double forward = 0;
  for (const LayerProfile* p : slices) {
    c.total_ms += p->time(start, end);
    forward_known = forward_known && p->has_forward();
    if (p->has_forward()) forward += p->forward_time(start, end);
  }
  if (forward_known) c.forward_ms = forward;
  // Accumulating gradients and the optimizer step touch the parameters
  // once, whatever the micro-batch: any slice's file tells them.
  const LayerProfile* any = slices.front();
  if (any->has_grad_accumulation()) c.accumulation_ms = any->accumulation_time(start, end);
  c.optimizer_ms = any->optimizer_ms;
  c.sustained_ratio = any->sustained_ratio();
  *out = c;
  return true;
}

bool PlanSimulator::run(const RankLayout& layout, const std::vector<int>& groups, const Strategy* strategies,
                        const int* partition, int batches, int gbs, PlanSimulation* out, std::string* why,
                        bool spans) const {
  const int p = static_cast<int>(groups.size());
  const Network net(*cluster_, layout, opt_.network);
  const TrainingSetup& setup = opt_.setup;
  const int last_layer = shape_.metis_num_layers();
  const double model_bytes = layer_bytes(0, last_layer);
  PlanSimulation sim;
  TimelineInput tin;
  tin.microbatches = batches;
  tin.schedule = opt_.schedule;
  tin.tokens = static_cast<double>(gbs) * seq_;
  tin.model_flops = shape_.training_flops(tin.tokens, seq_);

  std::vector<int> stage_begin(p + 1, 0);
  for (int i = 0; i < p; ++i) stage_begin[i + 1] = stage_begin[i] + groups[i];
  const double act_bytes_per_sample = static_cast<double>(seq_) * shape_.hidden_size * 2;  // bf16

  std::vector<int> max_share(p, 0);
  std::vector<int> node_ranks(layout.num_ranks() > 0 ? layout.node_of(layout.num_ranks() - 1) + 1 : 0, 0);
  for (int r = 0; r < layout.num_ranks(); ++r) ++node_ranks[layout.node_of(r)];
  for (int i = 0; i < p; ++i) {
    const Strategy st = strategies[i];
    const int begin = stage_begin[i], size = groups[i];
    const int start = partition[i], end = partition[i + 1];
    // Each replica's share of the micro-batch.
    std::vector<int> replica_type(st.dp), share(st.dp);
    for (int d = 0; d < st.dp; ++d) replica_type[d] = profile_type_[layout.type_of(begin + d * (size / st.dp))];
    for (int t : replica_type)
      if (t < 0) {
        if (why) *why = "no profiles for a device type of the plan";
        return false;
      }
    if (layout.homogeneous(begin, begin + size)) {
      std::fill(share.begin(), share.end(), gbs / st.dp / batches);
    } else {
      int missing = -1;
      if (!partition_data(*profiles_, replica_type.data(), st, gbs / batches, share.data(), &missing)) {
        if (why) *why = profiles_->missing_message(missing, st.tp, 1, "the data load balancer");
        return false;
      }
    }
    // The stage runs at its slowest replica's pace.
    const ShardParams sp = shard_params(shape_, start, end, p, setup);
    const double full_on_rank = sp.on_rank(st.tp);
    const double trainable = setup.finetune == Finetune::kFull ? full_on_rank : sp.lora / st.tp;
    const double grad_bytes = trainable * (setup.precision == Precision::kFp32 ? 4 : 2);
    const double param_share = layer_bytes(start, end) / model_bytes;
    double slowest = 0, slowest_forward = -1, accumulation = 0, optimizer = 0, sustained = 1;
    for (int d = 0; d < st.dp; ++d) {
      ReplicaCost rc;
      if (!replica_cost(replica_type[d], st.tp, share[d], start, end, &rc, why)) return false;
      if (rc.total_ms >= slowest) {
        slowest = rc.total_ms;
        slowest_forward = rc.forward_ms;
        sustained = rc.sustained_ratio;
      }
      max_share[i] = std::max(max_share[i], share[d]);
      // Measured accumulation covers every parameter; LoRA accumulates only its adapters.
      double acc = rc.accumulation_ms >= 0 ? rc.accumulation_ms * trainable / full_on_rank : -1;
      if (acc < 0) {
        // Not measured: read the new and the old gradient and write the sum, at the datasheet's HBM bandwidth.
        const GpuSpec* g = find_gpu_spec(profiles_->device_types()[replica_type[d]]);
        acc = g ? 3 * grad_bytes / (g->memory_bw_gbs * 1e9) * 1e3 : 0;
      }
      accumulation = std::max(accumulation, acc);
      // The file's optimizer step is this tp's shard of the whole model; the stage steps its share of it.
      double opt = rc.optimizer_ms >= 0 ? rc.optimizer_ms * param_share
                                        : profiles_->model().optimizer_ms / 2 / st.tp * param_share;
      optimizer = std::max(optimizer, opt * trainable / full_on_rank);
    }
    StageCosts c;
    const std::string type = cluster_->device_types()[layout.type_of(begin)];
    c.label = "stage " + std::to_string(i) + ": " + (layout.homogeneous(begin, begin + size) ? type : "mixed") + " x" +
              std::to_string(size) + " (dp " + std::to_string(st.dp) + ", tp " + std::to_string(st.tp) +
              "), layers [" + std::to_string(start) + ", " + std::to_string(end) + ")";
    double extra = 0;
    if (i == p - 1) {
      const LayerProfile* lp = profiles_->find(replica_type[0], st.tp, std::max(1, max_share[i]));
      if (lp) extra += std::max(0.0, lp->fb_sync_ms);
    }
    if (i == 0) extra += profiles_->model().batch_generator_ms;
    const double forward = slowest_forward >= 0 ? slowest_forward : slowest * (1 - opt_.backward_share);
    c.forward_ms = forward + extra * (1 - opt_.backward_share);
    c.backward_ms = slowest - forward + extra * opt_.backward_share +
                    forward * recomputed_forward_fraction(shape_, setup.recompute, seq_);
    c.accumulation_ms = accumulation;
    c.sustained_factor = sustained;
    // p2p over the boundary link, bf16 activations split over tp.
    const double p2p_bytes = act_bytes_per_sample * max_share[i] / st.tp;
    if (i + 1 < p) c.send_forward_ms = net.p2p_seconds(stage_begin[i + 1] - 1, stage_begin[i + 1], p2p_bytes) * 1e3;
    if (i > 0) c.send_backward_ms = net.p2p_seconds(begin, begin - 1, p2p_bytes) * 1e3;
    // Data-parallel gradient all-reduce of each tp slice; replica d holds ranks begin + t * dp + d.
    double ar = 0;
    for (int t = 0; t < st.tp; ++t) {
      std::vector<int> ranks;
      for (int d = 0; d < st.dp; ++d) ranks.push_back(begin + t * st.dp + d);
      ar = std::max(ar, net.all_reduce_seconds(ranks, grad_bytes));
    }
    c.allreduce_ms = ar * 1e3 * (setup.zero_stage >= 3 ? 1.5 : 1.0);
    c.optimizer_ms = optimizer / (setup.zero_stage >= 1 ? st.dp : 1);
    bool known = true;
    for (int r = begin; r < begin + size; ++r) {
      const GpuSpec* g = find_gpu_spec(cluster_->device_types()[layout.type_of(r)]);
      known = known && g != nullptr;
      if (g) c.peak_flops += g->peak_tflops * 1e12;
    }
    if (!known) c.peak_flops = 0;  // one GPU without a datasheet entry: no MFU
    tin.stages.push_back(c);

    // Memory of each rank of the stage.
    for (int r = begin; r < begin + size; ++r) {
      RankShard shard;
      shard.first_layer = start;
      shard.end_layer = end;
      shard.tp = st.tp;
      shard.dp = st.dp;
      shard.pp = p;
      shard.stage = i;
      const int d = (r - begin) % st.dp;
      shard.micro_batch = std::max(1, share[d]);
      shard.seq = seq_;
      shard.in_flight = in_flight_microbatches(opt_.schedule, p, i, batches);
      shard.gpus_per_node = node_ranks[layout.node_of(r)];
      RankMemory m;
      m.rank = r;
      m.stage = i;
      m.device = cluster_->device_types()[layout.type_of(r)];
      // A negative framework constant means "as the profiles measured it".
      TrainingSetup rank_setup = setup;
      if (rank_setup.framework_bytes < 0) {
        const int pt = profile_type_[layout.type_of(r)];
        const double mb = pt >= 0 ? profiles_->framework_mb(pt) : -1;
        rank_setup.framework_bytes = mb > 0 ? mb * kMiB : 0;
      }
      m.breakdown = rank_memory(shape_, rank_setup, shard);
      m.capacity_bytes = cluster_->memory_mb(layout.type_of(r)) * kMiB;
      if (!m.fits() && sim.fits) {
        sim.fits = false;
        sim.first_oom_rank = r;
      }
      sim.ranks.push_back(m);
    }
  }
  if (opt_.sustained_clocks) {
    // The stage with the most compute never waits: stretch its forward and
    // backward (not the memory-bound accumulation) to the sustained pace.
    int pace = 0;
    auto compute = [&](const StageCosts& c) {
      return batches * (c.forward_ms + c.backward_ms) + (batches - 1) * c.accumulation_ms;
    };
    for (int i = 1; i < p; ++i)
      if (compute(tin.stages[i]) > compute(tin.stages[pace])) pace = i;
    StageCosts& c = tin.stages[pace];
    if (c.sustained_factor > 1) {
      c.forward_ms *= c.sustained_factor;
      c.backward_ms *= c.sustained_factor;
      c.power_limited = true;
    }
  }
  sim.timeline = simulate_timeline(tin);
  if (!spans) sim.timeline.spans.clear();
  sim.stages = std::move(tin.stages);
  *out = std::move(sim);
  return true;
}

std::vector<std::string> PlanSimulator::collective_sources() const {
  std::vector<std::string> out;
  const auto& types = cluster_->device_types();
  const auto& measured = opt_.network.intra_collective_bytes_per_s;
  for (std::size_t t = 0; t < types.size(); ++t) {
    const bool m = t < measured.size() && measured[t] > 0;
    out.push_back(types[t] + ": intra-node all-reduce at " +
                  (m ? std::to_string(static_cast<int>(std::lround(measured[t] / 1e9))) + " GB/s bus bandwidth measured by the profiler"
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

PlanSimulation PlanSimulator::simulate(const PlanResult& plan, int gbs) const {
  std::vector<int> ns;
  for (const auto& name : plan.node_sequence) {
    const int t = cluster_->type_index(name);
    if (t < 0) throw InputError("plan: node_sequence names '" + excerpt(name) + "', which the cluster does not have");
    if (profile_type_[t] < 0)
      throw InputError(profiles_->dir() + ": no profiles DeviceType." + name + "_tp<T>_bs<B>.json for the plan's " + name);
    ns.push_back(t);
  }
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
                     {"total", b.gpu_total()},
                     {"capacity", r.capacity_bytes},
                     {"fits", r.fits()}});
  }
  j["ranks"] = ranks;
  return j;
}

bool parse_collectives(const std::string& s) {
  if (s == "measured") return true;
  if (s == "clusterfile") return false;
  throw InputError("--collectives: '" + excerpt(s) + "': expected measured or clusterfile");
}

}  // namespace hetplan
