// The LibTorch profiler on the CPU: Megatron tensor parallelism over Gloo
// matches the single-GPU model, profile runs write files the planner reads,
// and running out of memory skips a (tp, bs) without ending the run.

#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <filesystem>
#include <thread>

#include "metis/metis_search.h"
#include "profiler/distributed.h"
#include "profiler/gpt.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "tests/fixtures.h"

// After the LibTorch headers: glog defines a CHECK macro that Catch's must replace.
#undef CHECK
#include <catch2/catch.hpp>

namespace fs = std::filesystem;
using namespace hetplan;
using namespace hetplan::profiler;

namespace {

GPTConfig tiny() {
  GPTConfig c;
  c.shape = gpt2_shape(64, 32, 2, 4, 8);  // embedding, 2 blocks, head (tied)
  c.seq_len = 8;
  c.seed = 7;
  return c;
}

// Llama blocks: RMSNorm, SwiGLU, RoPE, grouped-query attention (4 heads, 2 key/value heads).
GPTConfig tiny_llama(bool tied) {
  GPTConfig c;
  c.shape = llama_shape(64, 32, 2, 4, 2, 48, tied, 8);
  c.seq_len = 8;
  c.seed = 11;
  return c;
}

struct LayerTrace {
  std::vector<torch::Tensor> outputs, input_grads;
  std::vector<std::vector<std::pair<std::string, torch::Tensor>>> param_grads;
};

// Runs the model layer by layer with detached boundaries, as the profiler does.
LayerTrace trace(GPT& model, const torch::Tensor& ids, const torch::Tensor& targets) {
  auto& layers = model.layers();
  model.head().set_targets(targets);
  const std::size_t L = layers.size();
  std::vector<torch::Tensor> in(L), out(L);
  for (std::size_t i = 0; i < L; ++i) {
    in[i] = i == 0 ? ids : out[i - 1].detach().requires_grad_(true);
    out[i] = layers[i]->forward(in[i]);
  }
  LayerTrace t;
  t.input_grads.resize(L);
  torch::Tensor upstream;
  for (std::size_t k = L; k-- > 0;) {
    if (k == L - 1) out[k].backward(); else out[k].backward(upstream);
    if (k > 0) upstream = t.input_grads[k] = in[k].grad();
  }
  for (std::size_t i = 0; i < L; ++i) {
    t.outputs.push_back(out[i].detach());
    std::vector<std::pair<std::string, torch::Tensor>> g;
    for (const auto& p : layers[i]->named_parameters()) g.emplace_back(p.key(), p.value().grad().clone());
    t.param_grads.push_back(g);
  }
  return t;
}

double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) { return (a - b).abs().max().item<double>(); }

}  // namespace

TEST_CASE("tp=2 on Gloo equals tp=1: per-layer outputs and gradients within 1e-5", "[profiler][tp]") {
  REQUIRE_CPU_COLLECTIVES();
  torch::manual_seed(0);
  const auto cfg = GENERATE(std::make_pair(tiny(), std::string("tp-test-gpt2")),
                                   std::make_pair(tiny_llama(false), std::string("tp-test-llama")),
                                   std::make_pair(tiny_llama(true), std::string("tp-test-llama-tied")));
  const GPTConfig c = cfg.first;
  const std::string store = cfg.second;
  INFO(store);
  const torch::Tensor ids = torch::randint(c.shape.vocab_size, {2, c.seq_len}, torch::kLong);
  const torch::Tensor targets = torch::randint(c.shape.vocab_size, {2, c.seq_len}, torch::kLong);

  GPT single(c, TensorParallelGroup());
  const LayerTrace want = trace(single, ids, targets);

  std::vector<LayerTrace> got(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      GPT model(c, TensorParallelGroup(r, 2, make_thread_gloo_collectives(store, r, 2)));
      got[r] = trace(model, ids, targets);
    });
  }
  for (auto& t : ranks) t.join();

  for (int r = 0; r < 2; ++r) {
    for (std::size_t i = 0; i < want.outputs.size(); ++i) {
      INFO("rank " << r << " layer " << i);
      CHECK(max_abs_diff(got[r].outputs[i], want.outputs[i]) <= 1e-5);
      if (i > 0) CHECK(max_abs_diff(got[r].input_grads[i], want.input_grads[i]) <= 1e-5);
      REQUIRE(got[r].param_grads[i].size() == want.param_grads[i].size());
      for (std::size_t p = 0; p < want.param_grads[i].size(); ++p) {
        const auto& [name, g] = got[r].param_grads[i][p];
        torch::Tensor full = want.param_grads[i][p].second;
        INFO("parameter " << name);
        REQUIRE(name == want.param_grads[i][p].first);
        // A sharded parameter is this rank's slice of the full one.
        for (int64_t d = 0; d < full.dim(); ++d)
          if (full.size(d) != g.size(d)) full = full.narrow(d, r * g.size(d), g.size(d));
        CHECK(max_abs_diff(g, full) <= 1e-5);
      }
    }
  }
}

TEST_CASE("a profile run writes files the planner loads", "[profiler]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("profile-run");
  fs::remove_all(dir);
  REQUIRE(test::run_hetplan("profile --device cpu --hidden-size 32 --num-layers 4 --seq-len 8 --vocab-size 64 --heads 4 "
              "--tp 1,2 --bs 1,2 --dtype fp32 --warmup 1 --iters 3 --sustained-seconds 0.2 --boost-idle-ms 1 --device-type CPU "
              "--out " +
              dir.string()).exit_code == 0);
  const ProfileSet profiles = ProfileSet::load(dir.string(), 4);
  REQUIRE(profiles.device_types() == std::vector<std::string>{"CPU"});
  for (int tp : {1, 2})
    for (int bs : {1, 2}) {
      const LayerProfile* p = profiles.find(0, tp, bs);
      REQUIRE(p != nullptr);
      CHECK(p->layer_ms.size() == 4);
      for (double ms : p->layer_ms) CHECK(ms > 0);
      for (double mb : p->memory_mb) CHECK(mb > 0);
      // hetplan's extensions: each layer's forward alone (medians of the same
      // intervals, so at most the forward+backward), its gradient accumulation,
      // and the tp group's gradient all-reduce.
      REQUIRE(p->forward_ms.size() == 4);
      REQUIRE(p->grad_accumulation_ms.size() == 4);
      for (int l = 0; l < 4; ++l) {
        CHECK(p->forward_ms[l] > 0);
        CHECK(p->grad_accumulation_ms[l] > 0);
      }
      CHECK(p->optimizer_ms > 0);
      if (tp == 1) CHECK(p->allreduce_busbw_gbs == -1);
      else CHECK(p->allreduce_busbw_gbs > 0);
    }
  CHECK(profiles.allreduce_busbw_gbs(0) == profiles.find(0, 2, 1)->allreduce_busbw_gbs);
  const ordered_json f = read_json_file((dir / "DeviceType.CPU_tp2_bs2.json").string());
  CHECK(f["profiler"]["tp"] == 2);
  CHECK(f["execution_time"]["layer_compute_spread"].size() == 4);
  CHECK(f["model"]["parameters"]["parameters_per_layer_bytes"][1] == (12 * 32 * 32 + 13 * 32) * 4);
  CHECK(f["execution_time"]["layer_host_ms"].size() == 4);
  // Each layer's forward and backward also timed on its own after idle (--boost-idle-ms).
  REQUIRE(f["execution_time"]["layer_boost_ms"].size() == 4);
  for (const auto& ms : f["execution_time"]["layer_boost_ms"]) CHECK(ms.get<double>() > 0);
  CHECK(f["execution_time"]["boost_idle_ms"] == 1.0);
  const ordered_json run = read_json_file((dir / "profile_run.json").string());
  REQUIRE(run.size() == 4);
  for (const auto& o : run) {
    CHECK(o["block_boost_ms"].get<double>() > 0);
    if (o["tp"] == 2 && o["bs"] == 2)
      CHECK(o["block_boost_ms"].get<double>() == f["execution_time"]["layer_boost_ms"][1].get<double>());
  }
  // The sustained pass count is agreed by the tp ranks (a deadline per rank would leave one in a collective).
  CHECK(f["execution_time"]["sustained_passes"].get<int>() >= 1);
  CHECK(profiles.find(0, 2, 2)->sustained_fb_ms > 0);
  CHECK(profiles.find(0, 2, 2)->sustained_ratio() >= 1);
  // The all-reduce covers every gradient tensor of one tp rank's model, once each.
  const ordered_json& comm = f["communication"];
  CHECK(comm["ranks"] == 2);
  int64_t shard_bytes = 0;
  for (const auto& b : f["model"]["parameters"]["parameters_per_layer_bytes"]) shard_bytes += b.get<int64_t>();
  CHECK(comm["gradient_bytes"].get<int64_t>() < shard_bytes);  // sharded layers hold half their parameters
  CHECK(comm["allreduce_busbw_gbs"].get<double>() ==
        Approx(comm["gradient_bytes"].get<double>() / (comm["gradient_allreduce_ms"].get<double>() * 1e-3) / 1e9));
  CHECK(read_json_file((dir / "DeviceType.CPU_tp1_bs1.json").string()).contains("communication") == false);

  // The planner searches a 2-GPU "CPU" cluster on them.
  const Cluster cluster = Cluster::from_parts({{"h", 2}}, {{"h", "CPU", 10, 50, 1}});
  SearchOptions o;
  o.model.num_layers = 4;
  o.model.hidden_size = 32;
  o.model.sequence_length = 8;
  o.model.vocab_size = 64;
  o.gbs = 4;
  o.max_profiled_tp = 2;
  o.max_profiled_bs = 2;
  const SearchResult r = MetisSearch(cluster, profiles, o).run();
  REQUIRE(!r.top.empty());
  CHECK(r.top[0].cost > 0);
}

TEST_CASE("running out of memory skips that (tp, bs) and the run goes on", "[profiler][oom]") {
  REQUIRE_CPU_COLLECTIVES();
  const auto dir = test::scratch_dir("profile-oom");
  fs::remove_all(dir);
  // 6 MB emulates a small device: bs 1 fits, bs 256 does not, for tp 1 and tp 2.
  REQUIRE(test::run_hetplan("profile --device cpu --hidden-size 32 --num-layers 4 --seq-len 8 --vocab-size 64 --heads 4 "
              "--tp 1,2 --bs 1,256 --dtype fp32 --warmup 1 --iters 2 --device-type CPU "
              "--cpu-memory-limit-mb 6 --out " + dir.string()).exit_code == 0);
  CHECK(fs::exists(dir / "DeviceType.CPU_tp1_bs1.json"));
  CHECK(fs::exists(dir / "DeviceType.CPU_tp2_bs1.json"));
  CHECK_FALSE(fs::exists(dir / "DeviceType.CPU_tp1_bs256.json"));
  CHECK_FALSE(fs::exists(dir / "DeviceType.CPU_tp2_bs256.json"));
  const ordered_json summary = read_json_file((dir / "profile_run.json").string());
  int oom = 0;
  for (const auto& s : summary) {
    if (s["bs"] == 256) {
      CHECK_FALSE(s["ok"].get<bool>());
      CHECK(s["error"].get<std::string>().rfind("out of memory", 0) == 0);
      ++oom;
    } else {
      CHECK(s["ok"].get<bool>());
    }
  }
  CHECK(oom == 2);
}

namespace {

// Parameters of a GPT summed over tp ranks, per Metis layer: a tensor whose
// shape differs from the tp = 1 one is a shard (summed over the ranks), one
// of the same shape is replicated (counted once). Meta tensors: shapes only.
std::vector<long long> counted_parameters(GPTConfig c, int tp) {
  c.meta = true;
  GPT whole(c, TensorParallelGroup());
  std::vector<GPT> ranks;
  for (int r = 0; r < tp; ++r) ranks.emplace_back(c, TensorParallelGroup(r, tp, nullptr));
  std::vector<long long> out;
  for (std::size_t l = 0; l < whole.layers().size(); ++l) {
    long long n = 0;
    const auto full = whole.layers()[l]->named_parameters();
    for (const auto& p : full) {
      for (int r = 0; r < tp; ++r) {
        const torch::Tensor mine = ranks[r].layers()[l]->named_parameters()[p.key()];
        if (r == 0 || !mine.sizes().equals(p.value().sizes())) n += mine.numel();
      }
    }
    out.push_back(n);
  }
  return out;
}

}  // namespace

TEST_CASE("ModelShape's parameter counts are the LibTorch model's numel, per layer, at tp 1 and 2", "[profiler][shape]") {
  std::vector<std::pair<std::string, ModelShape>> shapes = {
      {"gpt2 tiny", gpt2_shape(64, 32, 2, 4, 8)},
      {"llama tiny untied", llama_shape(64, 32, 2, 4, 2, 48, false, 8)},
      {"llama tiny tied", llama_shape(64, 32, 2, 4, 2, 48, true, 8)},
  };
  for (const char* f : {"gpt2-xl", "llama-2-7b", "llama-3.1-8b", "llama-3.1-70b", "llama-3.2-3b"})
    shapes.emplace_back(f, read_hf_config(std::string(HETPLAN_SOURCE_DIR) + "/tests/data/hf/" + f + ".json"));
  for (const auto& [name, shape] : shapes) {
    GPTConfig c;
    c.shape = shape;
    c.seq_len = 8;
    for (int tp : {1, 2}) {
      INFO(name << " tp " << tp);
      if (shape.num_heads % tp != 0 || shape.vocab_size % tp != 0) {  // gpt2-xl: 25 heads, vocabulary 50257
        CHECK_THROWS_AS(counted_parameters(c, tp), InputError);
        continue;
      }
      const std::vector<long long> got = counted_parameters(c, tp);
      CHECK(got == shape.metis_layer_params());
      long long total = 0;
      for (long long n : got) total += n;
      CHECK(total == shape.parameter_count());
    }
  }
  // The real (non-meta) model has the same count: the tiny Llama, untied, on one rank.
  GPTConfig c;
  c.shape = shapes[1].second;
  c.seq_len = 8;
  GPT real(c, TensorParallelGroup());
  long long n = 0;
  for (const auto& p : real.parameters()) n += p.numel();
  CHECK(n == c.shape.parameter_count());
  // Tied: the head uses the embedding's tensor, so it is counted once.
  c.shape = shapes[2].second;
  GPT tied(c, TensorParallelGroup());
  n = 0;
  for (const auto& p : tied.parameters()) n += p.numel();
  CHECK(n == c.shape.parameter_count());
}

TEST_CASE("vocab-parallel cross-entropy equals the cross-entropy of the gathered logits", "[profiler][tp]") {
  REQUIRE_CPU_COLLECTIVES();
  torch::manual_seed(3);
  const torch::Tensor logits = torch::randn({6, 16}, torch::kFloat32) * 3;
  const torch::Tensor targets = torch::randint(16, {6}, torch::kLong);
  torch::Tensor whole = logits.clone().requires_grad_(true);
  const torch::Tensor want = torch::nn::functional::cross_entropy(
      whole, targets, torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kNone));
  want.sum().backward();
  std::vector<torch::Tensor> loss(2), grad(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      const TensorParallelGroup g(r, 2, make_thread_gloo_collectives("vocab-ce", r, 2));
      torch::Tensor mine = logits.narrow(1, 8 * r, 8).clone().requires_grad_(true);
      loss[r] = vocab_parallel_cross_entropy(mine, targets, g);
      loss[r].sum().backward();
      grad[r] = mine.grad();
    });
  for (auto& t : ranks) t.join();
  for (int r = 0; r < 2; ++r) {
    CHECK(max_abs_diff(loss[r], want.detach()) <= 1e-6);
    CHECK(max_abs_diff(grad[r], whole.grad().narrow(1, 8 * r, 8)) <= 1e-6);
  }
}

TEST_CASE("recomputation (full, selective) gives bit-identical losses and gradients", "[profiler][recompute]") {
  torch::manual_seed(5);
  for (const GPTConfig& base : {tiny(), tiny_llama(false)}) {
    const torch::Tensor ids = torch::randint(base.shape.vocab_size, {2, base.seq_len}, torch::kLong);
    const torch::Tensor targets = torch::randint(base.shape.vocab_size, {2, base.seq_len}, torch::kLong);
    std::vector<std::pair<double, std::vector<torch::Tensor>>> runs;
    for (Recompute r : {Recompute::kNone, Recompute::kFull, Recompute::kSelective}) {
      GPTConfig c = base;
      c.recompute = r;
      GPT model(c, TensorParallelGroup());
      torch::Tensor loss = model.loss(ids, targets);
      loss.backward();
      std::vector<torch::Tensor> grads;
      for (const auto& p : model.parameters()) {
        REQUIRE(p.grad().defined());
        grads.push_back(p.grad());
      }
      runs.emplace_back(loss.item<double>(), grads);
    }
    for (std::size_t k = 1; k < runs.size(); ++k) {
      INFO(base.shape.name << " recompute run " << k);
      CHECK(runs[k].first == runs[0].first);
      REQUIRE(runs[k].second.size() == runs[0].second.size());
      for (std::size_t i = 0; i < runs[0].second.size(); ++i) CHECK(torch::equal(runs[k].second[i], runs[0].second[i]));
    }
  }
}

// A rank whose peer died must report it, not vanish: without
// ignore_broken_pipes() a write to the dead peer's socket kills the process
// with SIGPIPE before it prints anything (the torchrun kill test failed so,
// once in about ten runs).
TEST_CASE("a rank process survives a write to a peer that has gone (EPIPE, not SIGPIPE)", "[profiler][distributed]") {
  const auto write_to_closed_peer = [](bool ignore) {
    const pid_t pid = ::fork();
    if (pid == 0) {  // the child: only async-signal-safe calls
      if (ignore)
        ignore_broken_pipes();
      else
        ::signal(SIGPIPE, SIG_DFL);  // as in a new process; this one's parent may ignore it
      int fds[2];
      if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) ::_exit(3);
      ::close(fds[1]);
      const char byte = 1;
      const bool epipe = ::write(fds[0], &byte, 1) < 0 && errno == EPIPE;
      ::_exit(epipe ? 0 : 2);
    }
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return status;
  };
  const int ignored = write_to_closed_peer(true);
  CHECK(WIFEXITED(ignored));
  CHECK(WEXITSTATUS(ignored) == 0);
  const int by_default = write_to_closed_peer(false);
  CHECK(WIFSIGNALED(by_default));
  CHECK(WTERMSIG(by_default) == SIGPIPE);
}
