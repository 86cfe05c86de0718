// `hetplan export`: a plan as Megatron-LM arguments, a DeepSpeed config, or
// per-host torchrun scripts that run it with `hetplan replay`.
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "planner/export_plan.h"
#include "sim/cluster.h"
#include "base/file_access.h"
#include "base/input_error.h"
#include "sim/model_shape.h"
#include "sim/parallel_layout.h"
#include "sim/plan_file.h"
#include "sim/rank_layout.h"

namespace hetplan::cli {

namespace fs = std::filesystem;

namespace {

struct ExportArgs {
  std::string plan, to, out, hf_config, hostfile, clusterfile, profile_dir, rdzv_endpoint, replay_args;
};

// --master: HOST:PORT (a port from 1 to 65535), or empty for the default.
void check_endpoint(const std::string& endpoint) {
  if (endpoint.empty()) return;
  const std::size_t colon = endpoint.rfind(':');
  const std::string port = colon == std::string::npos ? "" : endpoint.substr(colon + 1);
  const bool digits = !port.empty() && port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos;
  if (colon == 0 || !digits || std::stoi(port) < 1 || std::stoi(port) > 65535)
    throw InputError("--master: '" + excerpt(endpoint) + "': expected HOST:PORT (a port from 1 to 65535)");
}

int run_export(const ExportArgs& a) {
  if (a.to != "megatron" && a.to != "deepspeed" && a.to != "torchrun")
    throw InputError("--to: expected megatron, deepspeed or torchrun, got '" + excerpt(a.to) + "'");
  const PlanFile pf = read_plan_file(a.plan);
  // The placement: the hostfile's hosts and GPU types for each rank.
  const std::string hostfile = a.hostfile.empty() ? pf.hostfile : a.hostfile;
  const std::string clusterfile = a.clusterfile.empty() ? pf.clusterfile : a.clusterfile;
  std::unique_ptr<Cluster> cluster;
  std::unique_ptr<RankLayout> ranks;
  std::unique_ptr<ParallelLayout> placement;
  if (!hostfile.empty() && !clusterfile.empty()) {
    cluster = std::make_unique<Cluster>(Cluster::load(hostfile, clusterfile));
    std::vector<int> ns;
    for (const auto& name : pf.plan.node_sequence) {
      const int t = cluster->type_index(name);
      if (t < 0) throw InputError(a.plan + ": node_sequence names '" + excerpt(name) + "', which " + hostfile + " lacks");
      ns.push_back(t);
    }
    ranks = std::make_unique<RankLayout>(*cluster, ns);
    int world = 0;
    for (int g : pf.plan.device_groups) world += g;
    if (ranks->num_ranks() != world)
      throw InputError(a.plan + ": the plan has " + std::to_string(world) + " ranks, but " + hostfile + " lists " +
                       std::to_string(ranks->num_ranks()) + " GPUs");
    placement = std::make_unique<ParallelLayout>(*cluster, *ranks);
  }
  if (!a.out.empty()) make_output_folder(a.out);
  // The model (Megatron and DeepSpeed; the torchrun scripts' replay reads it from the plan). Its warning is
  // printed once the export succeeds.
  std::string warning;
  const ModelShape shape = a.to == "torchrun" ? ModelShape{} : plan_shape(pf, a.hf_config, a.plan, &warning);

  if (a.to == "megatron") {
    const MegatronArgs m = export_megatron(pf, shape, placement.get(), a.plan);
    if (!warning.empty()) std::cerr << "hetplan: warning: " << warning << "\n";
    const std::string text = megatron_args_text(
        m, "# Megatron-LM (" + std::string(kMegatronRepo) + "@" + std::string(kMegatronCommit).substr(0, 12) +
               ") arguments for " + a.plan + ": " + std::to_string(m.world_size) + " GPUs\n");
    std::cout << text;
    if (!a.out.empty()) {
      write_file_in(a.out, "megatron_args.sh", text);
      std::cout << "wrote " << path_in(a.out, "megatron_args.sh") << "\n";
    }
    return 0;
  }
  if (a.to == "deepspeed") {
    const DeepSpeedConfig d = export_deepspeed(pf, shape, placement.get(), a.plan);
    if (!warning.empty()) std::cerr << "hetplan: warning: " << warning << "\n";
    std::cout << d.config.dump(2) << "\n";
    for (const auto& n : d.notes) std::cerr << "note: " << n << "\n";
    if (!a.out.empty()) {
      write_json_file_in(a.out, "ds_config.json", d.config);
      std::cout << "wrote " << path_in(a.out, "ds_config.json") << "\n";
    }
    return 0;
  }
  check_endpoint(a.rdzv_endpoint);
  if (!placement)
    throw InputError(a.plan + ": --to torchrun needs the plan's hostfile and clusterfile (the plan names none: pass "
                     "--hostfile and --clusterfile)");
  const std::string dir = a.out.empty() ? "torchrun" : a.out;
  make_output_folder(dir);
  TorchrunOptions o;
  o.rdzv_endpoint = a.rdzv_endpoint;
  o.replay_args = a.replay_args;
  const std::string profile_dir = a.profile_dir.empty() ? pf.profile_dir : a.profile_dir;
  // Paths relative to the folder, so that the checkout may sit at another path on each node.
  std::error_code ec;
  if (!profile_dir.empty() && file_kind(profile_dir) == "directory")
    o.profile_dir = fs::relative(fs::absolute(profile_dir, ec), fs::absolute(dir, ec), ec).generic_string();
  // The folder is self-contained: the plan (pointing at the copies), hostfile and clusterfile.
  PlanFile copy = pf;
  copy.hostfile = o.hostfile;
  copy.clusterfile = o.clusterfile;
  copy.profile_dir = o.profile_dir;
  // Read before anything is written: re-exporting a folder into itself copies each file onto itself.
  const std::string hostfile_text = read_regular_file(hostfile, kMaxHostfileBytes, "hostfile");
  const std::string clusterfile_text = read_regular_file(clusterfile, kMaxJsonFileBytes, "clusterfile");
  const std::vector<HostLaunch> hosts = export_torchrun(pf, *placement, o, a.plan);
  write_json_file_in(dir, o.plan_file, plan_file_to_json(copy));
  write_file_in(dir, o.hostfile, hostfile_text);
  write_file_in(dir, o.clusterfile, clusterfile_text);
  for (const auto& h : hosts) {
    write_file_in(dir, h.file_name, h.script, true);
    std::cout << "wrote " << path_in(dir, h.file_name) << ": host " << h.host << ", node " << h.node_rank
              << ", " << h.ranks.size() << " rank(s)\n";
  }
  std::cout << "run each script on its node; rendezvous at "
            << (a.rdzv_endpoint.empty() ? hosts[0].host + ":29500 (--master HOST:PORT to choose)" : a.rdzv_endpoint)
            << "\n";
  return 0;
}

}  // namespace

Runner add_export_command(CLI::App& app) {
  auto a = std::make_shared<ExportArgs>();
  CLI::App* s = app.add_subcommand(
      "export",
      "Hand a plan (an entry of `search --json`) to the framework that trains it: Megatron-LM arguments, a\n"
      "DeepSpeed ds_config.json (both for plans with one (dp, tp) in every stage, on any GPU types), or, for any\n"
      "plan, one torchrun launch script per node (hostfile line) that runs it with `hetplan replay`.");
  s->add_option("--plan", a->plan, "Plan JSON (a search --json entry, or the whole file: its best plan)")->required();
  s->add_option("--to", a->to, "megatron, deepspeed or torchrun")->required();
  s->add_option("--out", a->out,
                "Folder for megatron_args.sh / ds_config.json / the launch scripts (torchrun default: ./torchrun)");
  s->add_option("--hf-config", a->hf_config, "Hugging Face config.json for the model shape (default: the plan's model.architecture; given, it must "
                "match it; a plan without one: its GPT)");
  s->add_option("--hostfile", a->hostfile, "Hostfile (default: the plan's)");
  s->add_option("--clusterfile", a->clusterfile, "Clusterfile (default: the plan's)");
  s->add_option("--profile-dir", a->profile_dir, "torchrun: profiles for replay's data load balancer (default: the plan's)");
  s->add_option("--master,--rdzv-endpoint", a->rdzv_endpoint,
                "torchrun: HOST:PORT of the rendezvous, reachable from every node (default: rank 0's host:29500)");
  s->add_option("--replay-args", a->replay_args, "torchrun: more `hetplan replay` flags for every rank (shell words)");
  return [a] { return run_export(*a); };
}

}  // namespace hetplan::cli
