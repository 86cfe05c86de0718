#!/usr/bin/env python3
"""Replay's ZeRO-3 step against PyTorch FSDP2 on the same model, batch and GPUs (issue 34, "Replay speed").

  gpu_zero3_race.py plan --out plan.json [--dp 2] [--micro-batch 4] [--no-overlap]
      the plan `hetplan replay` runs: the held-out GPT (hidden 2048, 24 blocks, 16 heads, ffn 8192, vocab
      50304, sequence 2048, tied embeddings, learned positions), one stage, dp ranks, one micro-batch of
      --micro-batch sequences per rank (gbs = dp x micro-batch), ZeRO-3 with overlap.grad_reduce and
      overlap.param_gather on (off with --no-overlap)
  torchrun --nproc-per-node 2 gpu_zero3_race.py fsdp2 --micro-batch 4 --warmup 3 --iters 10 --out f.json
           [--kineto-dir DIR]
      the same model as a PyTorch user writes it for FSDP2: fully_shard per block and at the root,
      MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32), fp32 sharded parameters and AdamW
      (weight_decay 0: Adam) states, SDPA; each step timed between a barrier + synchronize and a synchronize,
      as replay times its iterations; with --kineto-dir, one more step traced by torch.profiler
  gpu_zero3_race.py analyze --trace T.json [--label NAME]
      a Kineto trace of one step (replay's HETPLAN_KINETO_DIR, or fsdp2 --kineto-dir): GPU busy time split into
      compute kernels and NCCL kernels by collective, the part of each collective not under any compute
      kernel (exposed), and the time the GPU did nothing (host gaps), over the step's GPU window
  gpu_zero3_race.py summary --dir DIR --out summary.md
      the medians side by side (replay_r*.json from `hetplan replay --out`, fsdp2_r*.json from fsdp2) and the
      ratio replay / FSDP2, plus the breakdowns of DIR/kineto-*/
"""
import argparse
import glob
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

GPT = dict(vocab=50304, hidden=2048, blocks=24, heads=16, ffn=8192, seq=2048)


def cmd_plan(args):
    s = GPT
    plan = {
        "node_sequence": ["GPU"], "device_groups": [args.dp], "strategies": [[args.dp, 1]], "batches": 1,
        "layer_partition": [0, s["blocks"] + 2], "gbs": args.dp * args.micro_batch, "cost": 0.0,
        "zero_stage": 3,
        "overlap": {"grad_reduce": not args.no_overlap, "param_gather": not args.no_overlap},
        "model": {"model_name": "gpt-1.3b", "num_layers": s["blocks"] + 2, "hidden_size": s["hidden"],
                  "sequence_length": s["seq"], "vocab_size": s["vocab"], "attention_heads": s["heads"]},
    }
    json.dump(plan, open(args.out, "w"), indent=1)


def cmd_fsdp2(args):
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from gpu_whatif_validate import gpt_model  # the same module as scripts/gpu_whatif_validate.py's FSDP2 rows

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    torch.manual_seed(0)
    with torch.device(dev):
        model = gpt_model(False)
    params = sum(p.numel() for p in model.parameters())
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mp_policy=mp)
    fully_shard(model, mp_policy=mp)
    opt_kind = "AdamW(fused=True)"
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    except (RuntimeError, NotImplementedError):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, foreach=True)
        opt_kind = "AdamW(foreach=True)"
    n, mb = GPT["seq"], args.micro_batch
    g = torch.Generator(device="cpu").manual_seed(42 + rank)
    batches = [(torch.randint(GPT["vocab"], (mb, n), generator=g).to(dev),
                torch.randint(GPT["vocab"], (mb, n), generator=g).to(dev)) for _ in range(4)]

    def step(k):
        nonlocal opt, opt_kind
        ids, tgt = batches[k % len(batches)]
        loss = model(ids, tgt)
        loss.backward()
        try:
            opt.step()
        except (RuntimeError, NotImplementedError) as e:  # fused AdamW unsupported on this DTensor build
            if k > 0:
                raise
            print(f"fused AdamW failed ({e!r:.200}); foreach AdamW instead", flush=True)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, foreach=True)
            opt_kind = "AdamW(foreach=True)"
            opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, losses = [], []
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for k in range(args.warmup + args.iters):
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(k)
        torch.cuda.synchronize()
        if k >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(float(loss))
    if args.kineto_dir:
        from torch.profiler import ProfilerActivity, profile
        dist.barrier()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            step(args.warmup + args.iters)
            torch.cuda.synchronize()
        os.makedirs(args.kineto_dir, exist_ok=True)
        prof.export_chrome_trace(os.path.join(args.kineto_dir, f"rank{rank}.kineto.json"))
    res = {"mode": "fsdp2", "ranks": world, "micro_batch": mb, "parameters": params,
           "step_ms": statistics.median(times), "step_ms_all": times, "losses": losses,
           "peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
           "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20, "optimizer": opt_kind,
           "setup": "fully_shard per block + root, MixedPrecisionPolicy(bf16 params, fp32 reduce), fp32 shards, SDPA",
           "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    # Rank 0's times, as replay reports rank 0's.
    if rank == 0:
        json.dump(res, open(args.out, "w"), indent=1)
        print(f"fsdp2: {params / 1e6:.1f}M params, median {res['step_ms']:.1f} ms over {len(times)} steps, "
              f"peak allocated {res['peak_allocated_mb']:.0f} MiB", flush=True)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ trace analysis

def _union(iv):
    """Sorted, merged intervals."""
    out = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _length(iv):
    return sum(b - a for a, b in iv)


def _minus(iv, cover):
    """Parts of the merged intervals `iv` not covered by the merged intervals `cover`."""
    out, j = [], 0
    for a, b in iv:
        cur = a
        while j < len(cover) and cover[j][1] <= cur:
            j += 1
        k = j
        while k < len(cover) and cover[k][0] < b:
            if cover[k][0] > cur:
                out.append([cur, cover[k][0]])
            cur = max(cur, cover[k][1])
            k += 1
        if cur < b:
            out.append([cur, b])
    return out


def collective_kind(name):
    n = name.lower()
    if "nccl" not in n and "allgather" not in n and "reducescatter" not in n:
        return None
    for key, kind in (("allgather", "all-gather"), ("all_gather", "all-gather"), ("reducescatter", "reduce-scatter"),
                      ("reduce_scatter", "reduce-scatter"), ("allreduce", "all-reduce"), ("all_reduce", "all-reduce"),
                      ("sendrecv", "send/recv"), ("send", "send/recv"), ("recv", "send/recv"),
                      ("broadcast", "broadcast")):
        if key in n:
            return kind
    return "other nccl"


def analyze_trace(path):
    """Breakdown of one Kineto trace (one rank, one step), in ms."""
    events = json.load(open(path)).get("traceEvents", [])
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        return {"trace": path, "error": "no GPU kernels in the trace"}
    iv = lambda es: _union([[e["ts"], e["ts"] + e.get("dur", 0)] for e in es])
    comm = {}
    compute = []
    for e in kernels:
        k = collective_kind(e.get("name", "")) if e.get("cat") == "kernel" else None
        (comm.setdefault(k, []) if k else compute).append(e)
    t0 = min(e["ts"] for e in kernels)
    t1 = max(e["ts"] + e.get("dur", 0) for e in kernels)
    compute_iv = iv(compute)
    busy_iv = iv(kernels)
    out = {"trace": os.path.basename(path), "gpu_window_ms": (t1 - t0) / 1e3,
           "compute_ms": _length(compute_iv) / 1e3,
           "compute_kernels": len(compute),
           "gpu_idle_ms": ((t1 - t0) - _length(busy_iv)) / 1e3,
           "collectives": {}}
    all_comm = []
    for kind, es in sorted(comm.items()):
        civ = iv(es)
        all_comm += es
        out["collectives"][kind] = {"count": len(es), "busy_ms": _length(civ) / 1e3,
                                    "exposed_ms": _length(_minus(civ, compute_iv)) / 1e3}
    out["comm_busy_ms"] = _length(iv(all_comm)) / 1e3 if all_comm else 0.0
    out["comm_exposed_ms"] = _length(_minus(iv(all_comm), compute_iv)) / 1e3 if all_comm else 0.0
    # The host's view: the longest stretches with nothing on the GPU (launch-bound or waiting on the host).
    gaps = sorted((b2[0] - b1[1] for b1, b2 in zip(busy_iv, busy_iv[1:])), reverse=True)
    out["largest_gaps_ms"] = [round(g / 1e3, 3) for g in gaps[:5]]
    # Host side: the ProfilerStep / whole trace's CPU span, and time in cudaStreamSynchronize / cudaDeviceSynchronize
    # / cudaEventSynchronize (host syncs).
    sync = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
            and "Synchronize" in e.get("name", "")]
    out["host_syncs"] = len(sync)
    out["host_sync_ms"] = sum(e.get("dur", 0) for e in sync) / 1e3
    cudamalloc = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"
                  and e.get("name", "") in ("cudaMalloc", "cudaFree")]
    out["cuda_malloc_free"] = len(cudamalloc)
    return out


def format_breakdown(label, b):
    if "error" in b:
        return f"- {label}: {b['error']}"
    parts = ", ".join(f"{k} {v['busy_ms']:.1f} ms ({v['count']} kernels, {v['exposed_ms']:.1f} exposed)"
                      for k, v in b["collectives"].items())
    return (f"- {label} ({b['trace']}): GPU window {b['gpu_window_ms']:.1f} ms = compute {b['compute_ms']:.1f} ms "
            f"+ exposed collectives {b['comm_exposed_ms']:.1f} ms + GPU idle {b['gpu_idle_ms']:.1f} ms; "
            f"collectives: {parts or 'none'}; largest idle gaps {b['largest_gaps_ms']} ms; "
            f"host syncs {b['host_syncs']} ({b['host_sync_ms']:.1f} ms); cudaMalloc/Free {b['cuda_malloc_free']}")


def cmd_analyze(args):
    b = analyze_trace(args.trace)
    print(format_breakdown(args.label or args.trace, b))
    if args.json:
        json.dump(b, open(args.json, "w"), indent=1)


# ------------------------------------------------------------------ summary

def cmd_summary(args):
    d = args.dir
    rows = []
    rep_all, fsdp_all = [], []
    results = lambda pattern: sorted(p for p in glob.glob(os.path.join(d, pattern)) if not p.endswith(".trace.json"))
    for path in results("replay_r*.json"):
        r = json.load(open(path))
        rows.append(("replay ZeRO-3 overlap", os.path.basename(path), r["iteration_ms"]["median"], len(r["iteration_ms"]["all"])))
        rep_all += r["iteration_ms"]["all"]
    for path in results("fsdp2_r*.json"):
        f = json.load(open(path))
        rows.append(("FSDP2", os.path.basename(path), f["step_ms"], len(f["step_ms_all"])))
        fsdp_all += f["step_ms_all"]
    extras = []
    for path in results("extra_*.json"):
        r = json.load(open(path))
        extras.append((os.path.basename(path)[6:-5], r["iteration_ms"]["median"], len(r["iteration_ms"]["all"])))
    machine = open(os.path.join(d, "machine.txt")).readline().strip() if os.path.exists(os.path.join(d, "machine.txt")) else "?"
    lines = ["# Replay ZeRO-3 against FSDP2 (scripts/gpu_zero3_race.sh)", "", machine, "",
             "GPT 1.3B-class (hidden 2048, 24 blocks, seq 2048, vocab 50304, tied), dp 2, 4 sequences per GPU, bf16 "
             "weights / fp32 masters and reduce; runs alternate; each row is one process launch (warm-up excluded).", "",
             "| run | file | median step ms | steps |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c:.1f} | {n} |" for a, b, c, n in rows]
    res = {"machine": machine}
    if rep_all and fsdp_all:
        mr, mf = statistics.median(rep_all), statistics.median(fsdp_all)
        res.update(replay_median_ms=mr, fsdp2_median_ms=mf, ratio=mr / mf, replay_steps=len(rep_all),
                   fsdp2_steps=len(fsdp_all))
        lines += ["", f"**All steps pooled: replay {mr:.1f} ms, FSDP2 {mf:.1f} ms, replay / FSDP2 = {mr / mf:.3f}** "
                  f"({len(rep_all)} and {len(fsdp_all)} steps; goal: <= 1.000, "
                  f"{'met' if mr <= mf else 'NOT met'})"]
    else:
        lines += ["", "**missing runs: no ratio**"]
    if extras:
        lines += ["", "Other replay settings, same plan (one launch each):", ""]
        lines += [f"- {a}: median {b:.1f} ms over {n} steps" for a, b, n in extras]
        res["extras"] = {a: b for a, b, _ in extras}
    bds = {}
    for tdir in sorted(glob.glob(os.path.join(d, "kineto-*"))):
        label = os.path.basename(tdir)[7:]
        for t in sorted(glob.glob(os.path.join(tdir, "rank*.kineto.json"))):
            bds[f"{label} {os.path.basename(t).split('.')[0]}"] = analyze_trace(t)
    if bds:
        lines += ["", "One step, from Kineto traces (the traced step runs slower: the host records every op):", ""]
        lines += [format_breakdown(k, v) for k, v in bds.items()]
        res["breakdowns"] = bds
    span = os.path.join(d, "replay_spans.txt")
    if os.path.exists(span):
        lines += ["", "Replay's own spans of its last measured step (replay_r1.trace.json):", "", open(span).read().strip()]
    text = "\n".join(lines) + "\n"
    open(args.out, "w").write(text)
    json.dump(res, open(os.path.splitext(args.out)[0] + ".json", "w"), indent=1)
    print(text)


def cmd_spans(args):
    """Replay's Chrome trace (hetplan replay --trace): per rank, the total of each span name of the step."""
    t = json.load(open(args.trace))
    ev = t["traceEvents"] if isinstance(t, dict) else t
    per = {}
    for e in ev:
        if e.get("ph") != "X":
            continue
        key = (e.get("pid"), e.get("name", "").split(" ")[0])
        per[key] = per.get(key, 0.0) + e.get("dur", 0) / 1e3
    for (pid, name), ms in sorted(per.items(), key=lambda x: (str(x[0][0]), x[0][1])):
        print(f"- pid {pid}: {name} {ms:.1f} ms")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", required=True)
    p.add_argument("--dp", type=int, default=2)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--no-overlap", action="store_true", help="overlap.grad_reduce and param_gather off")
    f = sub.add_parser("fsdp2")
    f.add_argument("--micro-batch", type=int, default=4)
    f.add_argument("--warmup", type=int, default=3)
    f.add_argument("--iters", type=int, default=10)
    f.add_argument("--out", required=True)
    f.add_argument("--kineto-dir")
    a = sub.add_parser("analyze")
    a.add_argument("--trace", required=True)
    a.add_argument("--label")
    a.add_argument("--json")
    s = sub.add_parser("summary")
    s.add_argument("--dir", required=True)
    s.add_argument("--out", required=True)
    sp = sub.add_parser("spans")
    sp.add_argument("--trace", required=True)
    args = ap.parse_args()
    {"plan": cmd_plan, "fsdp2": cmd_fsdp2, "analyze": cmd_analyze, "summary": cmd_summary, "spans": cmd_spans}[args.cmd](args)


if __name__ == "__main__":
    main()
