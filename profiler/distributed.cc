#include "profiler/distributed.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
// PyPI's LibTorch ships no Gloo headers; there, only NCCL (CUDA) is used.
#if __has_include(<gloo/algorithm.h>)
#define HETPLAN_HAVE_GLOO 1
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#include <unistd.h>

#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <type_traits>

#include "sim/environment_error.h"

#if defined(HETPLAN_TORCH_CUDA)
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace hetplan::profiler {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v ? std::atoi(v) : fallback;
}

template <typename PG>
class C10dCollectives : public CommGroup {
 public:
  explicit C10dCollectives(c10::intrusive_ptr<PG> pg) : pg_(std::move(pg)) {}
  Waiter send(const torch::Tensor& t, int dst, int tag) override {
    std::vector<torch::Tensor> v{t.contiguous()};
    auto work = pg_->send(v, dst, tag);
    return [work, v] { work->wait(); };
  }
  void recv(torch::Tensor& t, int src, int tag) override {
    std::vector<torch::Tensor> v{t};
    pg_->recv(v, src, tag)->wait();
  }
  void all_reduce(torch::Tensor& t) override {
    std::vector<torch::Tensor> v{t};
    pg_->allreduce(v)->wait();
  }
  void all_gather(std::vector<torch::Tensor>& out, torch::Tensor& in) override {
    std::vector<std::vector<torch::Tensor>> o{out};
    std::vector<torch::Tensor> i{in};
    pg_->allgather(o, i)->wait();
  }
  void reduce_scatter(torch::Tensor& out, torch::Tensor& in) override {
    const int64_t n = out.numel();
    TORCH_CHECK(in.numel() == n * size() && in.is_contiguous() && out.is_contiguous(), "reduce_scatter: bad shapes");
#if defined(HETPLAN_TORCH_CUDA)
    if constexpr (std::is_same_v<PG, c10d::ProcessGroupNCCL>) {
      pg_->_reduce_scatter_base(out, in)->wait();
      return;
    }
#endif
    std::vector<torch::Tensor> v{in};
    pg_->allreduce(v)->wait();
    out.copy_(in.view({-1}).narrow(0, rank() * n, n).view(out.sizes()));
  }
  Waiter reduce_scatter_async(torch::Tensor& out, torch::Tensor& in) override {
    const int64_t n = out.numel();
    TORCH_CHECK(in.numel() == n * size() && in.is_contiguous() && out.is_contiguous(), "reduce_scatter: bad shapes");
#if defined(HETPLAN_TORCH_CUDA)
    if constexpr (std::is_same_v<PG, c10d::ProcessGroupNCCL>) {
      auto work = pg_->_reduce_scatter_base(out, in);
      return [work] { work->wait(); };
    }
#endif
    std::vector<torch::Tensor> v{in};
    auto work = pg_->allreduce(v);
    const int r = rank();
    return [work, v, out, n, r]() mutable {
      work->wait();
      out.copy_(v[0].view({-1}).narrow(0, r * n, n).view(out.sizes()));
    };
  }
  void all_gather_flat(torch::Tensor& out, const torch::Tensor& in) override {
    const int64_t n = in.numel();
    TORCH_CHECK(out.numel() == n * size() && out.is_contiguous(), "all_gather_flat: bad shapes");
#if defined(HETPLAN_TORCH_CUDA)
    if constexpr (std::is_same_v<PG, c10d::ProcessGroupNCCL>) {
      torch::Tensor i = in.contiguous();
      pg_->_allgather_base(out, i)->wait();
      return;
    }
#endif
    const bool narrow_float = in.scalar_type() == torch::kBFloat16 || in.scalar_type() == torch::kHalf;
    torch::Tensor i = (narrow_float ? in.to(torch::kFloat32) : in).contiguous().view({-1});
    // Straight into `out`'s chunks where no conversion is needed (no temporary of the whole size).
    const bool direct = !narrow_float && out.scalar_type() == i.scalar_type();
    std::vector<torch::Tensor> chunks;
    for (int r = 0; r < size(); ++r)
      chunks.push_back(direct ? out.view({-1}).narrow(0, r * n, n) : torch::empty_like(i));
    std::vector<std::vector<torch::Tensor>> o{chunks};
    std::vector<torch::Tensor> iv{i};
    pg_->allgather(o, iv)->wait();
    if (!direct) out.view({-1}).copy_(torch::cat(o[0]));
  }
  Waiter all_gather_flat_async(torch::Tensor& out, const torch::Tensor& in) override {
    const int64_t n = in.numel();
    TORCH_CHECK(out.numel() == n * size() && out.is_contiguous(), "all_gather_flat_async: bad shapes");
#if defined(HETPLAN_TORCH_CUDA)
    if constexpr (std::is_same_v<PG, c10d::ProcessGroupNCCL>) {
      torch::Tensor i = in.contiguous();
      auto work = pg_->_allgather_base(out, i);
      return [work] { work->wait(); };
    }
#endif
    const bool narrow_float = in.scalar_type() == torch::kBFloat16 || in.scalar_type() == torch::kHalf;
    torch::Tensor i = (narrow_float ? in.to(torch::kFloat32) : in).contiguous().view({-1});
    std::vector<torch::Tensor> chunks;
    for (int r = 0; r < size(); ++r) chunks.push_back(torch::empty_like(i));
    std::vector<std::vector<torch::Tensor>> o{chunks};
    std::vector<torch::Tensor> iv{i};
    auto work = pg_->allgather(o, iv);
    return [work, o, iv, out]() mutable {
      work->wait();
      out.view({-1}).copy_(torch::cat(o[0]));
    };
  }
  // NCCL: one all-to-all whose only non-empty parts go to the next rank and come from the previous one
  // (NCCL sends and receives them in one group: no ordering deadlock). Gloo: none (the all-gather).
  std::function<void()> ring_shift_async(torch::Tensor& out, const torch::Tensor& in) override {
#if defined(HETPLAN_TORCH_CUDA)
    if constexpr (std::is_same_v<PG, c10d::ProcessGroupNCCL>) {
      const int n = size(), r = rank();
      const int64_t count = in.numel();
      TORCH_CHECK(out.numel() == count && out.is_contiguous(), "ring_shift_async: bad shapes");
      torch::Tensor i = in.contiguous().view({-1}), o = out.view({-1});
      std::vector<int64_t> send(n, 0), recv(n, 0);
      send[(r + 1) % n] = count;
      recv[(r + n - 1) % n] = count;
      auto work = pg_->alltoall_base(o, i, recv, send);
      return [work, i, o] { work->wait(); };
    }
#endif
    (void)out;
    (void)in;
    return {};
  }
  int rank() const override { return pg_->getRank(); }
  int size() const override { return pg_->getSize(); }

 private:
  c10::intrusive_ptr<PG> pg_;
};

#if defined(HETPLAN_HAVE_GLOO)
c10::intrusive_ptr<c10d::ProcessGroupGloo> make_gloo(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                                     std::chrono::milliseconds timeout,
                                                     const std::string& bind = "127.0.0.1") {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  // GLOO_SOCKET_IFNAME names the interface, as in PyTorch; else the address `bind`.
  const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
  opts->devices.push_back(ifname && *ifname ? c10d::ProcessGroupGloo::createDeviceForInterface(ifname)
                                            : c10d::ProcessGroupGloo::createDeviceForHostname(bind));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, opts);
}
#endif

#if !defined(HETPLAN_HAVE_GLOO)
[[noreturn]] void no_gloo() {
  throw EnvironmentError("tensor parallelism on the CPU needs LibTorch's Gloo headers (Debian: libgloo-dev)");
}
#endif

}  // namespace

bool cpu_collectives_available() {
#if defined(HETPLAN_HAVE_GLOO)
  return true;
#else
  return false;
#endif
}

std::optional<DistEnv> DistEnv::from_env() {
  if (!std::getenv("RANK") || !std::getenv("WORLD_SIZE")) return std::nullopt;
  DistEnv e;
  e.rank = env_int("RANK", 0);
  e.world_size = env_int("WORLD_SIZE", 1);
  e.local_rank = env_int("LOCAL_RANK", e.rank);
  if (const char* a = std::getenv("MASTER_ADDR")) e.master_addr = a;
  e.master_port = env_int("MASTER_PORT", 29500);
  e.launcher_rank = e.rank;
  e.local_world_size = env_int("LOCAL_WORLD_SIZE", e.world_size);
  e.group_rank = env_int("GROUP_RANK", env_int("NODE_RANK", -1));
  if (const char* a = std::getenv("TORCHELASTIC_USE_AGENT_STORE")) e.agent_store = std::string(a) == "True";
  e.restart_count = env_int("TORCHELASTIC_RESTART_COUNT", 0);
  if (const char* h = std::getenv("HETPLAN_HOST")) e.host = h;
  return e;
}

namespace {

bool loopback(const std::string& addr) { return addr.rfind("127.", 0) == 0 || addr == "localhost" || addr == "::1"; }

// Our keys' prefix in the store: torchrun's agent store is shared by restarts.
std::string store_prefix(const DistEnv& env) { return "hetplan/attempt_" + std::to_string(env.restart_count) + "/"; }

c10::intrusive_ptr<c10d::Store> connect_store(const DistEnv& env, bool serve, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions so;
  so.port = static_cast<std::uint16_t>(env.master_port);
  so.isServer = serve;
  // No start-up barrier: each group's creation waits for its members (within
  // `timeout`), and a rank that never comes is then named by Liveness.
  so.waitWorkers = false;
  so.timeout = timeout;
  auto tcp = c10::make_intrusive<c10d::TCPStore>(env.master_addr, so);
  if (serve) {
    // The server lives as long as the process, so that after a failure the
    // survivors can still read the ranks' liveness from it.
    static std::mutex mu;
    static std::vector<c10::intrusive_ptr<c10d::TCPStore>> servers;
    std::lock_guard<std::mutex> lock(mu);
    servers.push_back(tcp);
  }
  return c10::make_intrusive<c10d::PrefixStore>(store_prefix(env), tcp);
}

}  // namespace

struct Rendezvous {
  c10::intrusive_ptr<c10d::Store> store;
  std::string gloo_bind;  // the address Gloo's pairs listen on
};

std::shared_ptr<Rendezvous> connect_world(const DistEnv& env, std::chrono::milliseconds timeout) {
  auto r = std::make_shared<Rendezvous>();
  // The launcher's rank 0 serves the store, unless torchrun's agent serves it.
  r->store = connect_store(env, !env.agent_store && env.launcher_rank == 0, timeout);
  // Gloo listens on this host's hostfile address; on one host, on loopback.
  r->gloo_bind = !env.host.empty() ? env.host : loopback(env.master_addr) ? "127.0.0.1" : "";
  if (r->gloo_bind.empty()) {
    char name[256] = {0};
    gethostname(name, sizeof name - 1);
    r->gloo_bind = name;
  }
  return r;
}

struct Liveness::State {
  DistEnv env;
  std::chrono::milliseconds period, timeout;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  c10::intrusive_ptr<c10d::Store> store;  // guarded by mu once set
  std::thread beat;
  std::string key(int rank) const { return "live/" + std::to_string(rank); }
};

Liveness::Liveness(const DistEnv& env, std::chrono::milliseconds period, std::chrono::milliseconds timeout)
    : state_(std::make_shared<State>()) {
  state_->env = env;
  state_->period = period;
  state_->timeout = timeout;
  state_->beat = std::thread([s = state_] {
    try {
      // Its own client connection, so that beats never wait behind a blocking get.
      auto store = connect_store(s->env, false, s->timeout);
      std::unique_lock<std::mutex> lock(s->mu);
      s->store = store;
      while (!s->stop) {
        lock.unlock();
        store->add(s->key(s->env.rank), 1);
        lock.lock();
        s->cv.wait_for(lock, s->period, [&] { return s->stop; });
      }
    } catch (const std::exception&) {
      // The store is gone: check() reports it unreachable.
    }
  });
}

Liveness::~Liveness() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stop = true;
  }
  state_->cv.notify_all();
  // The beat thread may still be connecting (bounded by the timeout): let it finish on its own.
  state_->beat.detach();
}

Liveness::Report Liveness::check(std::chrono::milliseconds window) {
  Report r;
  c10::intrusive_ptr<c10d::Store> store;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    store = state_->store;
  }
  if (!store) return r;
  try {
    // A second connection: the beat thread keeps beating (other survivors must not blame this rank).
    auto probe = connect_store(state_->env, false, std::chrono::milliseconds(2000));
    const int world = state_->env.world_size;
    std::vector<int64_t> before(world), after(world);
    for (int k = 0; k < world; ++k) before[k] = probe->add(state_->key(k), 0);
    std::this_thread::sleep_for(window);
    for (int k = 0; k < world; ++k) after[k] = probe->add(state_->key(k), 0);
    r.store_reachable = true;
    for (int k = 0; k < world; ++k) {
      if (k == state_->env.rank || after[k] != before[k]) continue;
      r.stopped.push_back(k);
      if (after[k] == 0) r.never.push_back(k);
    }
  } catch (const std::exception&) {
    r.store_reachable = false;
  }
  return r;
}

std::shared_ptr<CommGroup> make_group(const std::shared_ptr<Rendezvous>& world, const std::string& name, int rank,
                                      int size, torch::Device device, std::chrono::milliseconds timeout) {
  auto store = c10::make_intrusive<c10d::PrefixStore>(name, world->store);
#if defined(HETPLAN_TORCH_CUDA)
  if (device.is_cuda()) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = timeout;
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, opts);
    return std::make_shared<C10dCollectives<c10d::ProcessGroupNCCL>>(pg);
  }
#endif
  if (!device.is_cpu()) throw EnvironmentError("distributed runs on this device need a CUDA build of LibTorch");
#if defined(HETPLAN_HAVE_GLOO)
  return std::make_shared<C10dCollectives<c10d::ProcessGroupGloo>>(make_gloo(store, rank, size, timeout, world->gloo_bind));
#else
  no_gloo();
#endif
}

std::shared_ptr<TensorParallelGroup::Collectives> make_collectives(const DistEnv& env, torch::Device device,
                                                                   std::chrono::milliseconds timeout) {
  return make_group(connect_world(env, timeout), "world", env.rank, env.world_size, device, timeout);
}

std::shared_ptr<TensorParallelGroup::Collectives> make_thread_gloo_collectives(const std::string& store_id, int rank,
                                                                               int size) {
  static std::mutex mu;
  static std::map<std::string, c10::intrusive_ptr<c10d::Store>> stores;
  c10::intrusive_ptr<c10d::Store> store;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& s = stores[store_id];
    if (!s) s = c10::make_intrusive<c10d::HashStore>();
    store = s;
  }
#if defined(HETPLAN_HAVE_GLOO)
  return std::make_shared<C10dCollectives<c10d::ProcessGroupGloo>>(
      make_gloo(store, rank, size, std::chrono::milliseconds(60000)));
#else
  no_gloo();
#endif
}

void ignore_broken_pipes() { ::signal(SIGPIPE, SIG_IGN); }

int free_local_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 29500;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

bool LaunchResult::ok() const {
  for (int c : exit_codes)
    if (c != 0) return false;
  return true;
}

LaunchResult launch_local_ranks(const std::vector<std::string>& args, int world, int port, std::chrono::seconds grace,
                                std::chrono::seconds timeout) {
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("launch: fork failed");
    if (pid == 0) {
      setenv("RANK", std::to_string(r).c_str(), 1);
      setenv("LOCAL_RANK", std::to_string(r).c_str(), 1);
      setenv("WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("LOCAL_WORLD_SIZE", std::to_string(world).c_str(), 1);
      setenv("MASTER_ADDR", "127.0.0.1", 1);
      setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
      std::vector<char*> argv;
      static std::string self = "hetplan";
      argv.push_back(self.data());
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv("/proc/self/exe", argv.data());
      _exit(127);
    }
    pids.push_back(pid);
  }
  LaunchResult result;
  result.exit_codes.assign(world, -1);
  int running = world;
  const auto start = std::chrono::steady_clock::now();
  std::optional<std::chrono::steady_clock::time_point> failed_at;
  while (running > 0) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0) {
      for (int r = 0; r < world; ++r) {
        if (pids[r] != pid) continue;
        result.exit_codes[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        --running;
        if (result.exit_codes[r] != 0 && !failed_at) failed_at = std::chrono::steady_clock::now();
      }
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    const bool grace_over = failed_at && now - *failed_at > grace;
    const bool timed_out = timeout.count() > 0 && now - start > timeout;
    if (grace_over || timed_out) {
      for (int r = 0; r < world; ++r)
        if (result.exit_codes[r] == -1) kill(pids[r], SIGKILL);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return result;
}

}  // namespace hetplan::profiler
