// `hetplan gen-hostfile` and `hetplan gen-profiles`: inputs for the search.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "cli/commands.h"
#include "cli/flag_validators.h"
#include "sim/gpu_specs.h"
#include "sim/analytic_profiles.h"
#include "sim/cluster.h"
#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/profile.h"
#include "sim/profile_transfer.h"
#include "sim/synthetic_profiles.h"

namespace hetplan::cli {

namespace {

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

struct HostfileArgs {
  int n = 0;
  std::string out = "hostfile";
  std::string types = "V100,A100";
  std::string clusterfile;
  int slots = 4;
};

int run_gen_hostfile(const HostfileArgs& a) {
  check_integer(a.n, rules::int_in(1, kMaxClusterGpus), "gen-hostfile: N");
  check_integer(a.slots, rules::int_in(1, kMaxSlotsPerNode), "--slots");
  if (a.n < a.slots)
    throw InputError("gen-hostfile: N must be at least --slots (" + std::to_string(a.slots) + "), got " +
                     std::to_string(a.n));
  if (a.n % a.slots != 0)
    std::cerr << "hetplan: note: N=" << a.n << " is not a multiple of --slots=" << a.slots << "; writing "
              << a.n / a.slots * a.slots << " GPUs per type\n";
  // Device type -> ip: from the clusterfile if given, else Metis's sample clusterfile layout.
  std::vector<ClusterfileEntry> entries;
  if (!a.clusterfile.empty()) {
    entries = parse_clusterfile(a.clusterfile);
  } else {
    entries = {{"0.0.0.1", "V100", 10, 50, 16}, {"0.0.0.2", "P100", 10, 50, 15}, {"0.0.0.3", "T4", 10, 50, 15},
               {"0.0.0.4", "A100", 10, 46, 80}, {"0.0.0.5", "H100", 50, 450, 80}, {"0.0.0.6", "H200", 50, 450, 141}};
  }
  std::vector<std::string> ips;
  for (const std::string& type : split_list(a.types)) {
    std::string ip;
    for (const auto& e : entries)
      if (e.instance_type == type) {
        ip = e.ip;
        break;
      }
    if (ip.empty()) {
      std::string known;
      for (const auto& e : entries) known += (known.empty() ? "" : ", ") + e.instance_type;
      throw InputError((a.clusterfile.empty() ? std::string("gen-hostfile") : a.clusterfile) +
                       ": no node of device type '" + type + "' (known: " + known + ")");
    }
    ips.push_back(ip);
  }
  std::ofstream out(a.out, std::ios::trunc);
  if (!out) throw InputError(a.out + ": cannot write hostfile");
  out << make_hostfile(a.n, ips, a.slots);
  std::cout << "wrote " << a.out << ": " << a.n / a.slots * static_cast<int>(ips.size()) << " nodes of " << a.slots
            << " GPUs (" << a.types << ")\n";
  return 0;
}

struct ProfilesArgs {
  int layers = 0, max_bs = 0;
  std::string samples, out, from, from_type, hf_config, probes;
  bool analytic = false, no_flash_attention = false, sequence_parallel = false;
  bool no_async_tp = false, no_grad_acc_fusion = false;
  std::string main_grads = "16bit";
  AnalyticOptions analytic_options;
  std::string types = "A100,V100";
  std::vector<std::string> gpu_spec;
};

int run_gen_profiles(ProfilesArgs a) {
  for (const auto& f : a.gpu_spec) load_gpu_spec_file(f);
  if (a.out.empty()) throw InputError("gen-profiles: --out DIR is required");
  if (!a.from.empty()) {
    if (a.analytic) throw InputError("gen-profiles: --from and --analytic exclude each other");
    TransferOptions t;
    t.from_dir = a.from;
    t.from_type = a.from_type;
    t.out_dir = a.out;
    t.types = split_list(a.types);
    t.probe_dirs = split_list(a.probes);
    const auto written = transfer_profiles(t);
    std::cout << "wrote " << written.size() << " profiles to " << a.out << " (derived from " << a.from
              << " by the layer time model)\n";
    return 0;
  }
  if (a.layers == 0 || a.max_bs == 0) throw InputError("gen-profiles: LAYERS and MAX_BS are required (unless --from)");
  if (a.analytic) {
    const ModelConfig& m = a.analytic_options.model;
    check_integer(a.layers, rules::int_in(3, kMaxModelLayers), "gen-profiles --analytic: LAYERS");
    check_integer(a.max_bs, rules::int_in(1, kMaxProfileBs), "gen-profiles: MAX_BS");
    check_integer(a.analytic_options.max_tp, rules::int_in(1, kMaxProfileTp), "--max-tp");
    check_integer(m.hidden_size, rules::int_in(1, static_cast<double>(kMaxHiddenSize)), "--hidden-size");
    check_integer(m.sequence_length, rules::int_in(1, static_cast<double>(kMaxSequenceLength)), "--seq-len");
    check_integer(m.vocab_size, rules::int_in(1, static_cast<double>(kMaxVocabSize)), "--vocab-size");
    check_integer(m.attention_heads, rules::int_in(1, kMaxAttentionHeads), "--heads");
    check_number(a.analytic_options.compute_efficiency, rules::positive_up_to(1), "--compute-efficiency");
  }
  std::vector<std::string> written;
  if (a.analytic) {
    a.analytic_options.model.num_layers = a.layers;
    a.analytic_options.max_bs = a.max_bs;
    a.analytic_options.flash_attention = !a.no_flash_attention;
    a.analytic_options.sequence_parallel = a.sequence_parallel;
    a.analytic_options.async_tp_backward = !a.no_async_tp;
    a.analytic_options.gradient_accumulation_fusion = !a.no_grad_acc_fusion;
    a.analytic_options.main_grads = parse_main_grads(a.main_grads, "gen-profiles --main-grads");
    if (!a.hf_config.empty()) {
      ModelFlags f;
      f.hf_config = a.hf_config;
      f.blocks = a.layers - 2;  // LAYERS counts the embedding and the head
      f.blocks_given = true;
      a.analytic_options.shape = shape_from_flags(f, a.analytic_options.model.sequence_length);
      a.analytic_options.sequence_length = a.analytic_options.model.sequence_length;
    }
    a.analytic_options.device_types = split_list(a.types);
    written = generate_analytic_profiles(a.analytic_options, a.out);
  } else {
    if (a.samples.empty())
      throw InputError("gen-profiles: --samples DIR is required (Metis's A100 sample profiles), or use --analytic");
    written = generate_synthetic_profiles(a.samples, a.out, a.layers, a.max_bs);
  }
  std::cout << "wrote " << written.size() << " profiles to " << a.out << (a.analytic ? " (datasheet estimates: the layer time model)" : "")
            << "\n";
  return 0;
}

}  // namespace

Runner add_gen_hostfile_command(CLI::App& app) {
  auto a = std::make_shared<HostfileArgs>();
  CLI::App* s = app.add_subcommand(
      "gen-hostfile",
      "Write a hostfile of N GPUs of each device type, --slots per node (the reference's gen_hostfile.py N:\n"
      "N/4 lines of '0.0.0.1 slots=4' (V100) then N/4 of '0.0.0.4 slots=4' (A100)).");
  s->add_option("N", a->n, "GPUs per device type")->required();
  s->add_option("--out,-o", a->out, "Output path")->capture_default_str();
  s->add_option("--types", a->types, "Device types, in hostfile order")->capture_default_str();
  s->add_option("--slots", a->slots, "GPUs per node")->capture_default_str()->check(kPositiveNumber);
  s->add_option("--clusterfile", a->clusterfile,
                "Clusterfile to find each type's ip in (default: Metis's sample layout, 0.0.0.1 = V100, "
                "0.0.0.4 = A100)");
  return [a] { return run_gen_hostfile(*a); };
}

Runner add_gen_profiles_command(CLI::App& app) {
  auto a = std::make_shared<ProfilesArgs>();
  CLI::App* s = app.add_subcommand(
      "gen-profiles",
      "Make a profile set. By default: the reference's gen_synth_data.py LAYERS MAX_BS from Metis's A100\n"
      "samples (--samples), with V100 = A100 x 3.5. With --analytic: roofline estimates from GPU datasheet\n"
      "numbers (the GPU catalogue, sim/data/gpus.json: " + gpu_names() + "), needing no input data.");
  s->add_option("LAYERS", a->layers, "Layers, embedding and head included (not with --from)");
  s->add_option("MAX_BS", a->max_bs, "Largest micro-batch size (and, for synthetic sets, tp; not with --from)");
  s->add_option("--from", a->from,
                "Derive profiles for --types from this folder of measured ones (same model, same tp/bs grid):\n"
                "each layer's kernel classes (GEMMs by size, attention, elementwise, communication, launch floor)\n"
                "scaled by the GPUs' rates: probe curves (gpu_probe.<TYPE>.json, `hetplan gpu-probe --out`) where\n"
                "both GPUs' are found, else the catalogue's. Memory carries over. Targets: catalogue GPUs and\n"
                "emulated SM partitions named BASE-<N>sm (e.g. H100-66sm)");
  s->add_option("--from-type", a->from_type, "[--from] The source device type when the folder holds several");
  s->add_option("--probes", a->probes, "[--from] More folders to find gpu_probe.<TYPE>.json in (comma-separated)");
  s->add_option("--hf-config", a->hf_config,
                "[--analytic] A Hugging Face config.json (gpt2, llama, mistral): its shape, with LAYERS - 2 blocks");
  s->add_flag("--no-flash-attention", a->no_flash_attention,
              "[--analytic] Attention without a fused kernel (Megatron-LM before flash attention, eager Hugging\n"
              "Face): the b x a x s^2 scores are stored, and each layer pays their HBM traffic (batched GEMMs,\n"
              "softmax, dropout); default: fused");
  s->add_flag("--sequence-parallel", a->sequence_parallel,
              "[--analytic] Time the layers as Megatron's --sequence-parallel runs them at tp > 1: the norms,\n"
              "dropouts and residual adds on s/tp tokens per rank (without it each tp rank runs them on all s)");
  s->add_flag("--no-async-tensor-model-parallel-allreduce", a->no_async_tp,
              "[--analytic] Time the layers as Megatron-LM's flag of that name runs them (and as Megatron-LM\n"
              "before February 2022 did): a column-parallel linear's input-gradient all-reduce runs alone, on the\n"
              "critical path. Default, today's Megatron-LM: it runs beside the layer's weight-gradient GEMM, which hides it\n"
              "up to that GEMM's time (under --sequence-parallel its reduce-scatter)");
  s->add_flag("--no-gradient-accumulation-fusion", a->no_grad_acc_fusion,
              "[--analytic] Time the layers as Megatron-LM's flag of that name runs them (and as Megatron-LM\n"
              "before February 2022, or fp16 without --accumulate-allreduce-grads-in-fp32 before September 2022,\n"
              "did): every micro-batch adds each weight's gradient to its main gradient in a separate pass.\n"
              "Default, today's Megatron-LM: the weight-gradient GEMMs accumulate into the main gradient");
  s->add_option("--main-grads", a->main_grads,
                "[--analytic] Where each micro-batch's gradients accumulate, which sets the accumulation pass's bytes\n"
                "per parameter: 16bit (default; Megatron-LM in fp16 without --accumulate-allreduce-grads-in-fp32:\n"
                "6 B), fp32 (an fp32 main gradient: Megatron-LM with --accumulate-allreduce-grads-in-fp32, which bf16\n"
                "forces: 10 B), fp32-cast (DeepSpeed's BF16_Optimizer: a cast to an fp32 temporary, then the add: 18 B).\n"
                "Under gradient accumulation fusion only the parameters outside the GEMMs (biases, norms) make the pass");
  s->add_option("--samples", a->samples, "Folder with Metis's DeviceType.A100_tp{1,2,4}_bs{1,2,4}.json samples");
  s->add_option("--out,-o", a->out, "Output folder (created; existing files of the same name are overwritten)")
      ->required();
  s->add_flag("--analytic", a->analytic,
              "Estimates from datasheet numbers (the layer time model of sim/layer_time_model.h) instead of\n"
              "scaled samples");
  auto& m = a->analytic_options.model;
  s->add_option("--types", a->types,
                "[--analytic, --from] Device types of the GPU catalogue (profile names are alphanumeric: A10040GB for "
                "A100-40GB)")
      ->capture_default_str();
  s->add_option("--gpu-spec", a->gpu_spec, "[--analytic] JSON file adding or overriding catalogue entries");
  s->add_option("--max-tp", a->analytic_options.max_tp, "[--analytic] Largest tp")->capture_default_str();
  s->add_option("--hidden-size", m.hidden_size, "[--analytic] Hidden size")->capture_default_str();
  s->add_option("--seq-len", m.sequence_length, "[--analytic] Sequence length")->capture_default_str();
  s->add_option("--vocab-size", m.vocab_size, "[--analytic] Vocabulary size")->capture_default_str();
  s->add_option("--heads", m.attention_heads, "[--analytic] Attention heads")->capture_default_str();
  s->add_option("--compute-efficiency", a->analytic_options.compute_efficiency,
                "[--analytic] Achieved fraction of peak FLOP/s on large GEMMs")
      ->capture_default_str();
  return [a] { return run_gen_profiles(*a); };
}

}  // namespace hetplan::cli
