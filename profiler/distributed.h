// Process groups and local launching, with c10d only (no home-made transport).
//
// A worker learns its place from the torchrun environment (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT,
// TORCHELASTIC_USE_AGENT_STORE) and meets the others through a c10d TCPStore
// served by the launcher's rank 0 or by torchrun's agent. Collectives run on NCCL for CUDA tensors and on
// Gloo for CPU tensors. On one host, launch_local_ranks() starts the ranks
// itself: copies of this executable with that environment set. If one rank
// fails, the others are stopped after a grace period, so nothing hangs.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "profiler/tensor_parallel.h"

namespace hetplan::profiler {

// Whether this LibTorch can run collectives on CPU tensors (Gloo). PyPI's
// wheels ship no Gloo headers: there, ranks on the CPU cannot talk, and only
// CUDA ranks (NCCL) run several to a plan.
bool cpu_collectives_available();

struct DistEnv {
  // The rank in the plan's grid: RANK, unless the caller re-maps it (under
  // torchrun on several hosts, replay finds it from the host and LOCAL_RANK).
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // RANK as the launcher set it: rank 0 serves the rendezvous store, unless
  // torchrun's agent does (TORCHELASTIC_USE_AGENT_STORE=True); then every
  // rank is a client, under the prefix of TORCHELASTIC_RESTART_COUNT.
  int launcher_rank = 0;
  int local_world_size = 1;
  int group_rank = -1;  // GROUP_RANK (torchrun), else NODE_RANK; -1 if neither is set
  bool agent_store = false;
  int restart_count = 0;
  // HETPLAN_HOST: this host's name in the hostfile (set by the scripts of
  // `hetplan export --to torchrun`); empty if unset. Gloo binds to it.
  std::string host;
  // From the torchrun variables; nullopt when RANK or WORLD_SIZE is unset.
  static std::optional<DistEnv> from_env();
};

// Liveness of the ranks of a run, for naming the rank that died when a
// collective fails: each rank beats a counter in the rendezvous store (its
// own client connection, from a background thread) every `period`.
// Thread-safety: one owner thread; the beat thread is internal.
class Liveness {
 public:
  Liveness(const DistEnv& env, std::chrono::milliseconds period, std::chrono::milliseconds timeout);
  ~Liveness();
  Liveness(const Liveness&) = delete;
  Liveness& operator=(const Liveness&) = delete;
  struct Report {
    bool store_reachable = false;
    std::vector<int> stopped;  // ranks whose counter did not advance over the window
    std::vector<int> never;    // of those, ranks that never beat (never joined)
  };
  // Stops this rank's beats, then watches the others' for `window`.
  Report check(std::chrono::milliseconds window);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// A process group of some ranks of the world: collectives for tensor
// parallelism plus point-to-point sends (asynchronous: wait() on the
// returned handle) and blocking receives. Ranks are positions in the group.
class CommGroup : public TensorParallelGroup::Collectives {
 public:
  using Waiter = std::function<void()>;
  virtual Waiter send(const torch::Tensor& t, int dst, int tag) = 0;
  virtual void recv(torch::Tensor& t, int src, int tag) = 0;
  // Flat collectives of the distributed optimizers (executor/zero_optimizer.h).
  // reduce_scatter: `in` holds size() equal chunks of out.numel() elements;
  // `out` receives this rank's chunk of their sum over the group. NCCL runs a
  // reduce-scatter; Gloo (which lacks one in LibTorch 1.13) all-reduces `in`
  // in place and copies this rank's chunk, so `in` is clobbered either way.
  virtual void reduce_scatter(torch::Tensor& out, torch::Tensor& in) = 0;
  // The same, started and left running: the returned Waiter blocks until `out` holds the result. `in`
  // and `out` must stay alive and untouched until then (overlapped reduction, executor/zero_optimizer.h).
  virtual Waiter reduce_scatter_async(torch::Tensor& out, torch::Tensor& in) = 0;
  // all_gather_flat: `out` (size() * in.numel() elements, contiguous) gets
  // every rank's `in`, in rank order. NCCL: one flat all-gather; Gloo: per
  // chunk, through fp32 for 16-bit floats (Gloo gathers no bf16).
  virtual void all_gather_flat(torch::Tensor& out, const torch::Tensor& in) = 0;
  // The same, started and left running (ZeRO-3's prefetch, executor/zero_optimizer.h): `out` holds the
  // result once the returned Waiter has run, and neither `out` nor `in` may be freed or changed before.
  // NCCL: the collective waits for the work issued so far on the calling thread's current stream, runs on
  // NCCL's stream, and the Waiter makes the then-current stream wait for it (no host sync). Gloo: the
  // chunks land in temporaries and the Waiter copies them into `out` (so `out` is untouched until then).
  virtual Waiter all_gather_flat_async(torch::Tensor& out, const torch::Tensor& in) = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
};

// The world's rendezvous: a TCPStore on MASTER_ADDR:MASTER_PORT (rank 0 serves it).
struct Rendezvous;
std::shared_ptr<Rendezvous> connect_world(const DistEnv& env, std::chrono::milliseconds timeout);

// A group named `name` of `size` ranks in which this rank is `rank`; every
// member must call this with the same name, and every rank must create its
// groups in one global order. NCCL for CUDA, Gloo for the CPU.
std::shared_ptr<CommGroup> make_group(const std::shared_ptr<Rendezvous>& world, const std::string& name, int rank,
                                      int size, torch::Device device, std::chrono::milliseconds timeout);

// Collectives for a group of all world_size ranks: Gloo if `device` is the
// CPU, NCCL if it is CUDA. `timeout` bounds every collective.
std::shared_ptr<TensorParallelGroup::Collectives> make_collectives(const DistEnv& env, torch::Device device,
                                                                   std::chrono::milliseconds timeout);

// Gloo collectives over an in-process store, for ranks that are threads of
// one process (tests). All `size` threads must call it with the same store id.
std::shared_ptr<TensorParallelGroup::Collectives> make_thread_gloo_collectives(const std::string& store_id, int rank,
                                                                               int size);

// A TCP port that was free a moment ago on 127.0.0.1.
int free_local_port();

// Makes a write to a connection whose peer has gone fail with EPIPE, which
// Gloo and the store turn into an error naming the peer, instead of killing
// this process with SIGPIPE before it can say anything. Python ignores
// SIGPIPE at start-up, so PyTorch's own ranks never meet it either. Call at
// the start of each rank process (not in commands that print to a pipe).
void ignore_broken_pipes();

struct LaunchResult {
  std::vector<int> exit_codes;  // per rank; 128 + signal if killed
  bool ok() const;
};

// Runs `args` (argv after the program name) as `world` local ranks of this
// executable. When a rank exits non-zero, the others get `grace` to finish
// and are then killed. `timeout` (0: none) bounds the whole run.
LaunchResult launch_local_ranks(const std::vector<std::string>& args, int world, int port,
                                std::chrono::seconds grace, std::chrono::seconds timeout);

}  // namespace hetplan::profiler
