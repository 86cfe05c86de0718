#!/usr/bin/env python3
"""At scale, on paper (issue 34): hetplan's predicted throughput per GPU for published large-run
configurations, each simulated with its own parallel settings on roofline (analytic) profiles, against
the published number. Writes a markdown report (logs/published_configs.md) and a JSON of every row.

Every row uses the same constants: `hetplan gen-profiles --analytic` at its default compute and memory
efficiencies, the A100 datasheet entry of the GPU catalogue, and the cluster below (DGX A100 nodes of 8
GPUs); nothing is fitted to a row. The published number is converted to the paper's own FLOP count
(Narayanan et al. 2021, eq. 3: 96 B s l h^2 (1 + s / 6h + V / 16 l h) with full recomputation, 72 B s l h^2
(...) counting model FLOPs only) so that predicted and published are compared in the same unit.

usage: scripts/published_configs.py --bin build-nt/hetplan --out logs/published_configs.md [--work DIR]
"""
import argparse, json, os, subprocess, sys, tempfile

# Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
# SC'21, Table 1 (weak scaling, A100-80GB on Selene, seq 2048, vocab 51200, fp16, full recomputation).
# Parallel settings, micro-batch and global batch per row from the authors' launch script
# examples/sc21/run_table_1.sh of NVIDIA/Megatron-LM (commit 4d1c207). Rows that use the interleaved
# schedule (76B, 145B, 310B, 530B: --num-layers-per-virtual-pipeline-stage) are simulated with the plan
# keys "schedule": "interleaved" and "virtual_stages" (layers / pp / layers per virtual stage) where the
# binary has the interleaved schedule, else listed as not simulated.
NARAYANAN = "Narayanan et al. SC'21, Table 1"
ROWS = [
    # name, layers, hidden, heads, tp, pp, gpus, mbs, gbs, published TFLOP/s/GPU, layers per virtual stage
    # (0: plain 1F1B), ddp overlap (DDP-impl torch: PyTorch DDP's bucketed all-reduce during the backward)
    ("GPT 1.7B", 24, 2304, 24, 1, 1, 32, 16, 512, 137, 0, True),
    ("GPT 3.6B", 30, 3072, 32, 2, 1, 64, 16, 512, 138, 0, True),
    ("GPT 7.5B", 36, 4096, 32, 4, 1, 128, 16, 512, 142, 0, True),
    ("GPT 18.4B", 40, 6144, 48, 8, 1, 256, 8, 1024, 135, 0, True),
    ("GPT 39.1B", 48, 8192, 64, 8, 2, 512, 4, 1536, 138, 0, False),
    ("GPT 76.1B", 60, 10240, 80, 8, 4, 1024, 2, 1792, 140, 5, False),
    ("GPT 145.6B", 80, 12288, 96, 8, 8, 1536, 2, 2304, 148, 5, False),
    ("GPT 310.1B", 96, 16384, 128, 8, 16, 1920, 1, 2160, 155, 3, False),
    ("GPT 529.6B", 105, 20480, 128, 8, 35, 2520, 1, 2520, 163, 1, False),
    ("GPT 1008B", 128, 25600, 160, 8, 64, 3072, 1, 3072, 163, 0, False),
]
SEQ, VOCAB = 2048, 51200

# DGX A100 nodes: 8 GPUs on NVSwitch, 8 HDR InfiniBand NICs (200 Gb/s = 25 GB/s each, one per GPU).
# intra: NCCL all-reduce bus bandwidth of 8 x A100 SXM4 on NVLink 3 (230-250 GB/s published for nccl-tests;
# the midpoint). inter: one HDR rail per GPU at line rate (the hierarchical all-reduce crosses nodes one
# rail per GPU). See sim/network.md's table.
# Megatron-LM of 2021 (the SC'21 script's commit) has no fused attention: it materialises the scores (a batched
# GEMM, its fused scale-mask-softmax kernel, PyTorch dropout, a batched GEMM with V); flash attention was
# published in 2022. gen-profiles --analytic --no-flash-attention prices that score traffic.
ATTENTION_FLAGS = ["--no-flash-attention"]
CLUSTER = {"0.0.0.4": {"instance_type": "A100", "inter_bandwidth": 25, "intra_bandwidth": 240, "memory": 80}}


def narayanan_flops(batch, layers, hidden, recompute=True):
    """FLOPs per iteration, Narayanan et al. eq. 3 (96 with recomputation; 72 without)."""
    k = 96 if recompute else 72
    return k * batch * SEQ * layers * hidden ** 2 * (1 + SEQ / (6 * hidden) + VOCAB / (16 * layers * hidden))


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + p.stdout + p.stderr)
    return p.stdout


def layer_partition(blocks, pp):
    """Metis layers [0 embedding, 1..blocks, blocks+1 head] in pp stages of equal blocks (Megatron's split)."""
    per = blocks // pp
    bounds = [0]
    for s in range(1, pp):
        bounds.append(1 + s * per)
    bounds.append(blocks + 2)
    return bounds


class NoInterleaved(Exception):
    pass


def simulate_row(binary, work, row, overlap):
    name, L, h, a, tp, pp, gpus, mbs, gbs, _, per_virtual, _ = row
    dp = gpus // (tp * pp)
    d = os.path.join(work, name.replace(" ", "_"))
    os.makedirs(d, exist_ok=True)
    nodes = gpus // 8
    with open(os.path.join(d, "hostfile"), "w") as f:
        f.write("".join("0.0.0.4 slots=8\n" for _ in range(nodes)))
    with open(os.path.join(d, "clusterfile.json"), "w") as f:
        json.dump(CLUSTER, f)
    prof = os.path.join(d, "profiles")
    if not os.path.isdir(prof):
        run([binary, "gen-profiles", "--analytic", str(L + 2), str(mbs), "--types", "A100", "--max-tp", str(tp),
             "--hidden-size", str(h), "--heads", str(a), "--seq-len", str(SEQ), "--vocab-size", str(VOCAB),
             "--out", prof] + ATTENTION_FLAGS)
    plan = {"node_sequence": ["A100"], "device_groups": [dp * tp] * pp, "strategies": [[dp, tp]] * pp,
            "batches": gbs // (mbs * dp), "layer_partition": layer_partition(L, pp), "gbs": gbs, "schedule": "1f1b",
            "recompute": "full", "zero_stage": 0, "precision": "fp16",
            "model": {"num_layers": L + 2, "hidden_size": h, "sequence_length": SEQ, "vocab_size": VOCAB,
                      "attention_heads": a}}
    if overlap:
        plan["overlap"] = {"grad_reduce": True, "param_gather": False}
    if per_virtual:
        plan["schedule"] = "interleaved"
        plan["virtual_stages"] = L // pp // per_virtual
    with open(os.path.join(d, "plan.json"), "w") as f:
        json.dump(plan, f)
    out = os.path.join(d, "sim.json")
    if per_virtual:
        # A binary without the interleaved schedule refuses the plan (exit 2, naming the key).
        p = subprocess.run([binary, "simulate", "--plan", os.path.join(d, "plan.json"), "--hostfile",
                            os.path.join(d, "hostfile"), "--clusterfile", os.path.join(d, "clusterfile.json"),
                            "--profiles", prof, "--collectives", "clusterfile", "--framework-mb", "0", "--json", out],
                           capture_output=True, text=True)
        if p.returncode == 2 and "schedule" in p.stderr + p.stdout:
            raise NoInterleaved("it refuses schedule 'interleaved'")
        if p.returncode != 0:
            raise RuntimeError(p.stdout + p.stderr)
        sim = json.load(open(out))
        return sim["iteration_ms"]
    run([binary, "simulate", "--plan", os.path.join(d, "plan.json"), "--hostfile", os.path.join(d, "hostfile"),
         "--clusterfile", os.path.join(d, "clusterfile.json"), "--profiles", prof, "--collectives", "clusterfile",
         "--framework-mb", "0", "--json", out])
    sim = json.load(open(out))
    return sim["timeline"]["iteration_ms"] if "timeline" in sim else sim["iteration_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default="build-nt/hetplan")
    ap.add_argument("--out", default="logs/published_configs.md")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="published-configs-")
    results = []
    for row in ROWS:
        name, L, h, a, tp, pp, gpus, mbs, gbs, pub, per_virtual, overlap = row
        r = {"name": name, "source": NARAYANAN, "layers": L, "hidden": h, "heads": a, "tp": tp, "pp": pp,
             "dp": gpus // (tp * pp), "gpus": gpus, "micro_batch": mbs, "gbs": gbs, "published_tflops": pub,
             "ddp_overlap": overlap, "virtual_stages": L // pp // per_virtual if per_virtual else 1}
        try:
            ms = simulate_row(args.bin, work, row, overlap)
            pred = narayanan_flops(gbs, L, h) / (ms / 1e3) / gpus / 1e12
            r.update({"iteration_ms": ms, "predicted_tflops": pred, "error": pred / pub - 1})
        except NoInterleaved as e:
            r["skipped"] = f"interleaved 1F1B, v {r['virtual_stages']}: this binary has no interleaved schedule ({e})"
        results.append(r)
        print(name, r.get("predicted_tflops", r.get("skipped")), file=sys.stderr)
    lines = ["# At scale, on paper: predicted throughput per GPU against published runs", "",
             "Generated by `python3 scripts/published_configs.py --bin build-nt/hetplan` (issue 34). Each row is "
             "simulated (`hetplan simulate`, 1F1B, full recomputation, fp16) with its own tp, pp, dp, micro-batch "
             "and global batch on `gen-profiles --analytic` roofline profiles of the A100 (default efficiencies: "
             "compute 0.55, memory 0.75) and DGX A100 nodes (clusterfile: intra 240 GB/s NCCL bus bandwidth, "
             "inter 25 GB/s per GPU rail). Nothing is fitted to a row. TFLOP/s per GPU counts the paper's eq. 3 "
             "FLOPs (with recomputation) over the predicted iteration time.", "",
             "| model | source row | tp | pp | v | dp | GPUs | micro-batch | gbs | DDP overlap | predicted ms | "
             "predicted TFLOP/s/GPU | published | error |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if "skipped" in r:
            lines.append(f"| {r['name']} | {r['source']} | {r['tp']} | {r['pp']} | {r['virtual_stages']} | {r['dp']} | {r['gpus']} | "
                         f"{r['micro_batch']} | {r['gbs']} | {'yes' if r['ddp_overlap'] else 'no'} | - | - | "
                         f"{r['published_tflops']} | not simulated: {r['skipped']} |")
        else:
            lines.append(f"| {r['name']} | {r['source']} | {r['tp']} | {r['pp']} | {r['virtual_stages']} | {r['dp']} | {r['gpus']} | "
                         f"{r['micro_batch']} | {r['gbs']} | {'yes' if r['ddp_overlap'] else 'no'} | "
                         f"{r['iteration_ms']:.0f} | {r['predicted_tflops']:.1f} | {r['published_tflops']} | "
                         f"{100 * r['error']:+.1f}% |")
    sim = [r for r in results if "error" in r]
    if sim:
        worst = max(abs(r["error"]) for r in sim)
        mean = sum(abs(r["error"]) for r in sim) / len(sim)
        lines += ["", f"{len(sim)} rows simulated: mean |error| {100 * mean:.1f}%, worst {100 * worst:.1f}% "
                      f"(goal: <= 10% on every row)."]
    lines += ["", "Where the error comes from (not corrected: correcting it needs a measurement this session does not "
              "have). The error falls with the model's size, from over-predicting the small models to "
              "under-predicting the 1T one: the analytic profiles run every GEMM at one efficiency (0.55 of the "
              "A100's 312 TFLOP/s), whereas cuBLAS reaches more on the 1T model's 25600-wide GEMMs than on the "
              "1.7B model's 2304-wide ones; they take a block's element-wise bytes as overlapping its GEMMs (a "
              "roofline max, not a sum), and they count no attention-score traffic, which Megatron-LM of 2021 "
              "materialised (b x a x s^2 scores per block, no flash attention) and which weighs a s / h^2 "
              "against the GEMMs: 20x more at 1.7B than at 1T. An A100 GEMM-efficiency curve by size (not "
              "measurable on the lent H100/H200 machines) is what would correct it.",
              "", "Rows with v > 1 ran the interleaved schedule (Megatron's --num-layers-per-virtual-pipeline-stage) "
              "in the authors' script; they are simulated with it where the binary has it (plan keys schedule "
              "'interleaved' and virtual_stages), else listed as not simulated."]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    open(args.out, "w").write(text)
    json.dump(results, open(os.path.splitext(args.out)[0] + ".json", "w"), indent=1)
    print(text)


if __name__ == "__main__":
    main()
