#!/usr/bin/env python3
"""Host-side micro-benchmarks of eager PyTorch (issue 32: the host-bound steps of the whatif validation).

The constants of hetplan's host-time model (sim/runtime_overheads.*): what the CPU spends per eager op, per
module call, per autograd node, per checkpointed region, per DDP parameter, per FSDP2 module, per optimizer
tensor, per decode layer, and the CUDA graph replay floor; and the op counts of the validation model's code
(scripts/gpu_whatif_validate.py's GPT, at a tiny width with the same depth and structure: the counts do not
depend on the width). Nothing here runs the validation's workload at its size.

  gpu_host_probe.py micro --out DIR                                  one GPU: per-op costs, counts
  torchrun --nproc-per-node 2 gpu_host_probe.py dist --out DIR       DDP and FSDP2 hooks, memory census

Every timing is the host's: tiny tensors, so the GPU keeps up and a loop's wall time is the time the host
takes to issue it. Each figure is the median of REPS repetitions. Results: DIR/host_probe_micro.json and
DIR/host_probe_dist.json.
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_pinning  # noqa: E402

REPS = 9  # medians over 9 (was 5): the lent hosts' speed drifts within seconds
DEV = "cuda"  # "cpu": a smoke test of the script's logic where no GPU is (counts aten ops only)
MODEL_ONLY = False  # --model-only: only the figures hetplan's host model reads (sim/runtime_overheads.cc host_costs_from_probe)


def sync():
    import torch
    if DEV == "cuda":
        torch.cuda.synchronize()


def med(xs):
    return statistics.median(xs)


def timed(torch, fn, n, warm=10, reps=REPS):
    """fn() called n times in a loop: host microseconds per call (loop until the last issue) and wall
    microseconds per call (until the GPU is done), medians over reps."""
    for _ in range(warm):
        fn()
    sync()
    host, wall = [], []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        host.append((t1 - t0) / n * 1e6)
        wall.append((t2 - t0) / n * 1e6)
    return {"host_us": med(host), "wall_us": med(wall), "n": n}


def count_phases(torch, phases):
    """Runs each (name, fn) of `phases` once, in order, under one torch.profiler session, with a device sync
    after each: per phase, the top-level aten ops issued (aten ops with no aten op above them, on any thread:
    the autograd engine's too), all aten ops, and device kernels (incl. memcpy/memset). Events are assigned
    to the phase whose interval holds their start (the sync keeps a phase's kernels inside it)."""
    from torch.profiler import ProfilerActivity, profile, record_function
    sync()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEV == "cuda" else [])
    with profile(activities=acts) as prof:
        for name, fn in phases:
            with record_function("PHASE_" + name):
                fn()
                sync()
    evs = prof.events()
    iv = {}
    for e in evs:
        if e.name.startswith("PHASE_") and not str(getattr(e, "device_type", "")).endswith("CUDA"):
            iv[e.name[6:]] = (e.time_range.start, e.time_range.end)
    out = {name: {"aten_top": 0, "aten_all": 0, "kernels": 0, "kernel_names": {}, "top_names": {}, "other_names": {}}
           for name, _ in phases}

    def phase_of(t):
        for name, (a, b) in iv.items():
            if a <= t <= b:
                return name
        return None
    for e in evs:
        if e.name.startswith("PHASE_"):
            continue
        ph = phase_of(e.time_range.start)
        if ph is None:
            continue
        o = out[ph]
        if str(getattr(e, "device_type", "")).endswith("CUDA"):
            o["kernels"] += 1
            o["kernel_names"][e.name[:60]] = o["kernel_names"].get(e.name[:60], 0) + 1
            continue
        if not e.name.startswith("aten::"):
            o["other_names"][e.name[:60]] = o["other_names"].get(e.name[:60], 0) + 1
            continue
        o["aten_all"] += 1
        p, nested = e.cpu_parent, False
        while p is not None:
            if p.name.startswith("aten::"):
                nested = True
                break
            p = p.cpu_parent
        if not nested:
            o["aten_top"] += 1
            o["top_names"][e.name] = o["top_names"].get(e.name, 0) + 1
    for o in out.values():
        for k in ("kernel_names", "top_names", "other_names"):
            o[k] = dict(sorted(o[k].items(), key=lambda kv: -kv[1])[:40])
    return out


def count_profile(torch, fn):
    return count_phases(torch, [("all", fn)])["all"]


def count_step(torch, fwd, opt):
    """Op counts of one training step by phase: forward, backward, optimizer (then zero_grad)."""
    hold = {}

    def f():
        hold["loss"] = fwd()

    def b():
        hold["loss"].backward()
    r = count_phases(torch, [("forward", f), ("backward", b), ("optimizer", opt.step)])
    opt.zero_grad(set_to_none=True)
    return r


def on_device(torch, dev):
    """torch.device as a context (torch >= 2.0); on the CPU smoke test under an older torch, CPU anyway."""
    import contextlib
    return dev if hasattr(dev, "__enter__") else contextlib.nullcontext()


def autograd_nodes(loss):
    seen, stack = set(), [loss.grad_fn]
    while stack:
        f = stack.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        stack += [g for g, _ in f.next_functions]
    return len(seen)


def tiny_gpt(blocks):
    """The validation's GPT code (scripts/gpu_whatif_validate.py) at a tiny width, `blocks` deep."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_whatif_validate as v
    v.GPT.update(vocab=512, hidden=64, blocks=blocks, heads=2, ffn=256, seq=64)
    return v


# ------------------------------------------------------------------ one GPU

def offload_probe(torch, dev, n=64 * 2**20, reps=REPS):
    """The host's side of ZeRO-Offload as scripts/gpu_whatif_validate.py's offload mode runs it (OffloadAdam), at
    this process's threads: torch's fused CPU AdamW over one pinned fp32 parameter of `n` elements (64 Mi: 256 MiB
    per tensor, far past the caches, so memory-bound as the 1.3B model's is), the fp32 -> bf16 cast into a pinned
    buffer, and pinned copies of 256 MiB each way. Medians of `reps`. hetplan reads these from
    host_probe_offload.json (read_host_probe_offload: the HostSpec of the ZeRO-Offload rows)."""
    p = torch.nn.Parameter(torch.randn(n).pin_memory() if DEV == "cuda" else torch.randn(n), requires_grad=False)
    p.grad = torch.randn(n).pin_memory() if DEV == "cuda" else torch.randn(n)
    try:
        opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.0, fused=True)
        opt.step()
        kind = "fused"
    except Exception:  # noqa: BLE001  (the validation falls back the same way)
        opt = torch.optim.AdamW([p], lr=1e-4, weight_decay=0.0, foreach=True)
        kind = "foreach"

    def secs(fn, warm=2):
        for _ in range(warm):
            fn()
        ts = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            ts.append(time.perf_counter() - t0)
        return med(ts)
    R = {"cpu_threads": torch.get_num_threads(), "elements": n}
    t = secs(opt.step)
    R["cpu_adamw_fused"] = {"params_per_s": n / t, "ms": t * 1e3, "kind": kind}
    bf = torch.empty(n, dtype=torch.bfloat16, pin_memory=(DEV == "cuda"))
    t = secs(lambda: bf.copy_(p.data))
    R["cpu_cast_fp32_bf16"] = {"params_per_s": n / t, "ms": t * 1e3}
    if DEV == "cuda":
        d = torch.empty(n, device=dev)
        R["pinned_copy"] = {"h2d_bytes_per_s": 4 * n / secs(lambda: d.copy_(p.data, non_blocking=True)),
                            "d2h_bytes_per_s": 4 * n / secs(lambda: p.grad.copy_(d, non_blocking=True))}
        del d
    del opt, p, bf
    return R


def micro(args):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    dev = torch.device(DEV)
    if not hasattr(F, "scaled_dot_product_attention"):  # torch < 2.0 (the CPU smoke test only)
        def sdpa(q, k, v, attn_mask=None, is_causal=False):
            a = q @ k.transpose(-1, -2) / q.size(-1) ** 0.5
            if is_causal:
                a = a.masked_fill(torch.ones(a.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
            if attn_mask is not None:
                a = a.masked_fill(~attn_mask, float("-inf"))
            return a.softmax(-1) @ v
        F.scaled_dot_product_attention = sdpa
    R = {"device": torch.cuda.get_device_name() if DEV == "cuda" else "cpu", "torch": torch.__version__,
         "cpu_count": os.cpu_count()}
    t_start = time.perf_counter()
    # ZeRO-Offload's host figures first, with every core (as the validation's offload run has them), then the rest
    # on GPU 0's share of the cores (as the single-GPU runs and the re-probes have them): scripts/host_pinning.py.
    off = {"host_pin": host_pinning.pin("all" if args.pin != "none" else "none", torch=torch)}
    off.update(offload_probe(torch, dev))
    if DEV == "cuda":
        os.makedirs(args.out, exist_ok=True)
        json.dump(off, open(os.path.join(args.out, "host_probe_offload.json"), "w"), indent=1)
    print("offload", json.dumps(off)[:600], flush=True)
    R["host_pin"] = host_pinning.pin(args.pin, gpu=0, torch=torch)
    R["torch_threads"] = torch.get_num_threads()
    # The loop micro-benchmarks (single ops, module calls, autograd chains): reference figures the model does not
    # read (sim/runtime_overheads.md); --model-only skips them.
    if not MODEL_ONLY:
        x = torch.randn(4, 64, device=dev)
        y = torch.randn(4, 64, device=dev)
        w = torch.randn(64, 64, device=dev)
        b = torch.randn(64, device=dev)
        q = torch.randn(1, 2, 16, 32, device=dev, dtype=torch.bfloat16)
        xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
        N = 2000

        # Forward aten ops from Python (no autograd).
        ops = {}
        with torch.no_grad():
            ops["add"] = timed(torch, lambda: torch.add(x, y), N)
            ops["mul"] = timed(torch, lambda: x * y, N)
            ops["view_only"] = timed(torch, lambda: x.view(4, 2, 32).transpose(0, 1), N)  # no kernel
            ops["transpose_reshape_copy"] = timed(torch, lambda: x.view(4, 2, 32).transpose(0, 1).reshape(2, 128), N)
            ops["gelu_tanh"] = timed(torch, lambda: F.gelu(x, approximate="tanh"), N)
            ops["layer_norm"] = timed(torch, lambda: F.layer_norm(x, (64,), w[0], b), N)
            ops["linear_fp32"] = timed(torch, lambda: F.linear(x, w, b), N)
            ops["sdpa_bf16"] = timed(torch, lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True), N)
            ops["cat"] = timed(torch, lambda: torch.cat([x, y], -1), N)
            ops["linear_bf16"] = timed(torch, lambda: F.linear(xb, wb), N)
            ops["float_cast"] = timed(torch, lambda: xb.float(), N)
            ops["slice_only"] = timed(torch, lambda: x[..., :32], N)  # no kernel
            with torch.autocast(DEV, dtype=torch.bfloat16):
                ops["linear_autocast"] = timed(torch, lambda: F.linear(x, w, b), N)  # + autocast's casts
                ops["add_autocast"] = timed(torch, lambda: torch.add(x, y), N)
        fns = {"add": lambda: torch.add(x, y), "mul": lambda: x * y,
               "view_only": lambda: x.view(4, 2, 32).transpose(0, 1),
               "transpose_reshape_copy": lambda: x.view(4, 2, 32).transpose(0, 1).reshape(2, 128),
               "gelu_tanh": lambda: F.gelu(x, approximate="tanh"), "layer_norm": lambda: F.layer_norm(x, (64,), w[0], b),
               "linear_fp32": lambda: F.linear(x, w, b),
               "sdpa_bf16": lambda: F.scaled_dot_product_attention(q, q, q, is_causal=True),
               "cat": lambda: torch.cat([x, y], -1), "linear_bf16": lambda: F.linear(xb, wb),
               "float_cast": lambda: xb.float(), "slice_only": lambda: x[..., :32]}
        with torch.no_grad():
            cnt = count_phases(torch, list(fns.items()))
            with torch.autocast(DEV, dtype=torch.bfloat16):
                cnt.update(count_phases(torch, [("linear_autocast", lambda: F.linear(x, w, b)),
                                                ("add_autocast", lambda: torch.add(x, y))]))
        for k, v in ops.items():
            v["kernels"] = cnt[k]["kernels"]
            v["aten_all"] = cnt[k]["aten_all"]
        R["aten_op"] = ops

        # Module calls (nn.Module.__call__ + forward), with autograd on (training).
        lin, ln, gelu = nn.Linear(64, 64).to(dev), nn.LayerNorm(64).to(dev), nn.GELU(approximate="tanh")

        class Sdpa(nn.Module):
            def forward(self, t):
                return F.scaled_dot_product_attention(t, t, t, is_causal=True)
        sd = Sdpa()
        xr = torch.randn(4, 64, device=dev, requires_grad=True)
        mods = {"linear": timed(torch, lambda: lin(xr), N), "layernorm": timed(torch, lambda: ln(xr), N),
                "gelu": timed(torch, lambda: gelu(xr), N), "sdpa": timed(torch, lambda: sd(q), N)}
        with torch.autocast(DEV, dtype=torch.bfloat16):
            mods["linear_autocast"] = timed(torch, lambda: lin(xr), N)
        ident = nn.Identity()
        qr = q.detach().clone().requires_grad_(True)
        mods["identity"] = timed(torch, lambda: ident(xr), N)  # a module call's own cost
        # Raw ops in grad mode (autograd records a node): the grad-mode cost of an op.
        mods["op_add_grad"] = timed(torch, lambda: xr + y, N)
        mods["op_gelu_grad"] = timed(torch, lambda: F.gelu(xr, approximate="tanh"), N)
        mods["op_view_transpose_grad"] = timed(torch, lambda: xr.view(4, 2, 32).transpose(0, 1), N)  # 2 views
        mods["op_sdpa_grad"] = timed(torch, lambda: F.scaled_dot_product_attention(qr, qr, qr, is_causal=True), N)
        R["module_call"] = mods

        # Autograd: a chain of K tiny nodes; backward's wall time per node (the engine thread issues the kernels).
        def chain_backward(K, kind):
            h = torch.randn(4, 64, device=dev, requires_grad=True)
            t = h
            for _ in range(K):
                t = t * 1.0001 if kind == "mul" else lin(t)
            loss = t.sum()
            return loss

        bw = {}
        for kind in ("mul", "linear"):
            per = []
            for K in (100, 400):
                ws = []
                for _ in range(REPS + 2):
                    loss = chain_backward(K, kind)
                    sync()
                    t0 = time.perf_counter()
                    loss.backward()
                    sync()
                    ws.append((time.perf_counter() - t0) * 1e6)
                per.append(med(ws[2:]))
            loss = chain_backward(100, kind)
            cnt = count_profile(torch, lambda: loss.backward())
            bw[kind] = {"us_per_node": (per[1] - per[0]) / 300, "wall_us_100": per[0], "wall_us_400": per[1],
                        "kernels_per_node_100": cnt["kernels"] / 100, "aten_all_per_node_100": cnt["aten_all"] / 100}
        R["autograd_backward"] = bw
        lin.zero_grad(set_to_none=True)

    # Optimizer step per parameter tensor: P tiny tensors, foreach / fused Adam(W).
    opt_res = {}
    optimizers = (("adamw_fused", dict(fused=True)), ("adamw_foreach", dict(foreach=True)),
                  ("adamw_forloop", dict(foreach=False)))
    for name, kw in optimizers[:1] if MODEL_ONLY else optimizers:
        per = {}
        for P in (50, 300):
            ps = [torch.nn.Parameter(torch.randn(64, device=dev)) for _ in range(P)]
            for p in ps:
                p.grad = torch.randn_like(p)
            try:
                o = torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.0, **kw)
                per[P] = timed(torch, o.step, 20, warm=3)
                per[P]["kernels"] = count_profile(torch, o.step)["kernels"]
            except Exception as e:  # noqa: BLE001
                per[P] = {"error": repr(e)[:200]}
        if all("host_us" in per[P] for P in per):
            opt_res[name] = {"us_per_tensor": (per[300]["wall_us"] - per[50]["wall_us"]) / 250,
                             "us_fixed": per[50]["wall_us"] - 50 * (per[300]["wall_us"] - per[50]["wall_us"]) / 250,
                             "P50": per[50], "P300": per[300]}
        else:
            opt_res[name] = per
    R["optimizer_step"] = opt_res

    def whole_step(opt, fwd):  # one training step as the validation issues it: no sync between the phases
        loss = fwd()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # The validation's GPT at a tiny width: host time per phase and the op counts, 24 and 12 blocks deep,
    # with and without torch.utils.checkpoint per block (use_reentrant=False), under autocast as it runs.
    steps, cases = {}, {}
    ids = torch.randint(512, (1, 64), device=dev)
    tgt = torch.randint(512, (1, 64), device=dev)
    for blocks in (24, 12):
        v = tiny_gpt(blocks)  # the model's depth is read when it is built
        for ckpt in (False, True):
            if MODEL_ONLY and blocks == 12 and ckpt:  # the model reads 12 blocks' op counts without checkpointing only
                continue
            torch.manual_seed(0)
            with on_device(torch, dev):
                model = v.gpt_model(ckpt)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0,
                                    **({"fused": True} if DEV == "cuda" else {"foreach": True}))

            def fwd(model=model):
                with torch.autocast(DEV, dtype=torch.bfloat16):
                    return model(ids, tgt)
            cases[f"blocks{blocks}_ckpt{int(ckpt)}"] = (model, opt, fwd)
    del model, opt, fwd

    # Phase by phase, the cases round-robin (one step of each, round after round): the checkpoint regions' costs
    # are differences of these cases, which a host drifting between two blocks of rounds would skew.
    ph = {key: {"forward": [], "backward": [], "optimizer": [], "zero_grad": []} for key in cases}
    # The re-probe's reference (gpu_whatif_validate.py host_speed_index: 5 whole steps issued back to back, host
    # ms per step) is timed in the same rounds as the phases it scales, right after them: timed once after the
    # rounds (as until run 6) it caught the host at another speed (run 6: phases 34.0 ms, whole step 42.2;
    # 12 blocks 22.8 against 18.9), and every re-probed prediction inherited that ratio.
    ref_key, ref_ms = "blocks24_ckpt0", []
    for it in range(3 + REPS):
        for key, (model, opt, fwd) in cases.items():
            sync()
            t0 = time.perf_counter()
            loss = fwd()
            t1 = time.perf_counter()
            sync()
            t1s = time.perf_counter()
            loss.backward()
            sync()
            t2 = time.perf_counter()
            opt.step()
            t3 = time.perf_counter()
            sync()
            t3s = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            t4 = time.perf_counter()
            if key == ref_key:
                sync()
                t5 = time.perf_counter()
                for _ in range(5):
                    whole_step(opt, fwd)
                t6 = time.perf_counter()
                sync()
                if it >= 3:
                    ref_ms.append((t6 - t5) * 1e3 / 5)
            if it >= 3:
                ph[key]["forward"].append((t1 - t0) * 1e3)
                ph[key]["backward"].append((t2 - t1s) * 1e3)
                ph[key]["optimizer"].append((t3 - t2) * 1e3)
                ph[key]["zero_grad"].append((t4 - t3s) * 1e3)
    del loss
    for key, (model, opt, fwd) in cases.items():
        # The whole step as the validation times it (no sync between phases).
        def whole(opt=opt, fwd=fwd):
            whole_step(opt, fwd)
        st = timed(torch, whole, 5, warm=2)
        res = {k: med(vv) for k, vv in ph[key].items() if vv}
        # blocks24_ckpt0's from the rounds (the re-probe's reference); the others' timed after them.
        res["step_host_ms"] = med(ref_ms) if key == ref_key and ref_ms else st["host_us"] / 1e3
        res["step_host_ms_after_rounds"] = st["host_us"] / 1e3
        res["step_wall_ms"] = st["wall_us"] / 1e3
        loss = fwd()
        res["autograd_nodes"] = autograd_nodes(loss)
        del loss
        saved = [0]

        def pack(t):
            saved[0] += 1
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss2 = fwd()
        res["saved_tensors"] = saved[0]
        del loss2
        res["counts"] = count_step(torch, fwd, opt)
        res["parameters"] = sum(1 for _ in model.parameters())
        steps[key] = res
    del cases, model, opt, fwd, whole
    R["tiny_gpt_step"] = steps

    # torch.utils.checkpoint per region: the same tiny block chain with and without it; the extra host time
    # beyond the recomputed forward is the region's own cost.
    R["checkpoint"] = {}
    for ck in ("ckpt0",) if MODEL_ONLY else ("ckpt0", "ckpt1"):
        r = steps[f"blocks24_{ck}"]
        r12 = steps[f"blocks12_{ck}"]
        R["checkpoint"][ck] = {k: (r[k] - r12[k]) / 12 for k in ("forward", "backward", "optimizer", "step_wall_ms")}
    R["per_block_ms"] = R.pop("checkpoint")

    # Eager decode: Hugging Face's LlamaDecoderLayer op for op (the validation's decode code) at a tiny width,
    # 28 layers and 7 layers: host time per layer per token and per token outside the layers.
    R["decode"] = decode_probe(torch, F, dev)

    # CUDA graph replay floor: a graph of 500 tiny adds (about 50 ms; kept under --model-only as a diagnosis:
    # the decode model's floor, kDefaultGraphKernelUs, comes from the H200 calibration's realistic small kernels).
    if DEV == "cuda":
        R["graph_floor"] = graph_floor(torch, dev)
    R["elapsed_s"] = time.perf_counter() - t_start
    os.makedirs(args.out, exist_ok=True)
    json.dump(R, open(os.path.join(args.out, "host_probe_micro.json"), "w"), indent=1)
    R["model_only"] = MODEL_ONLY
    print(json.dumps({k: R.get(k) for k in ("aten_op", "module_call", "autograd_backward", "graph_floor")})[:4000])
    print("optimizer", json.dumps({k: {kk: vv for kk, vv in v.items() if str(kk).startswith("us_")}
                                   for k, v in R["optimizer_step"].items()}))
    for k, r in steps.items():
        print(k, {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in r.items() if kk != "counts"},
              {ph: (c["aten_top"], c["aten_all"], c["kernels"]) for ph, c in r["counts"].items()})
    print("decode", json.dumps(R["decode"])[:1000])
    print(f"micro: {R['elapsed_s']:.1f} s")


def graph_floor(torch, dev):
    """A graph of 500 tiny adds replayed: the GPU's per-kernel floor; and the same add issued eagerly."""
    s = torch.cuda.Stream()
    z = torch.zeros(64, device=dev)
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            z.add_(1.0)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(500):
            z.add_(1.0)
    rep = timed(torch, g.replay, 20, warm=3)
    eager = timed(torch, lambda: z.add_(1.0), 2000)
    return {"graph_kernel_us": rep["wall_us"] / 500, "eager_add_us": eager["wall_us"],
            "eager_add_host_us": eager["host_us"]}


def decode_probe(torch, F, dev):
    """The validation's decode loop (gpu_whatif_validate.hf_llama_decoder, the same code) at a tiny width, 28 and 7
    layers deep: host time per layer per token and per token outside the layers."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gpu_whatif_validate as v
    out = {}
    T, P = 96, 32
    for L in (28, 7):
        shape = dict(v.LLAMA3B, vocab=512, hidden=64, blocks=L, heads=4, kv_heads=2, head_dim=16, ffn=128)
        dec_step, _ = v.hf_llama_decoder(torch, F, dev, shape, T)
        tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
        pos = torch.full((1,), P, dtype=torch.long, device=dev)

        def step():
            dec_step(tok, pos)

        with torch.no_grad():
            def run32():
                pos.fill_(P)
                for _ in range(32):
                    step()
            r = timed(torch, run32, 1, warm=2)
            c = count_profile(torch, step)
        out[f"layers{L}"] = {"token_wall_us": r["wall_us"] / 32, "token_host_us": r["host_us"] / 32,
                             "kernels_per_token": c["kernels"], "aten_top_per_token": c["aten_top"]}
    a, b = out["layers28"], out["layers7"]
    out["per_layer_us"] = (a["token_wall_us"] - b["token_wall_us"]) / 21
    out["per_token_outside_layers_us"] = a["token_wall_us"] - 28 * out["per_layer_us"]
    out["kernels_per_layer"] = (a["kernels_per_token"] - b["kernels_per_token"]) / 21
    out["kernels_outside_layers"] = a["kernels_per_token"] - 28 * out["kernels_per_layer"]
    out["us_per_kernel"] = out["per_layer_us"] / max(out["kernels_per_layer"], 1)
    return out


# ------------------------------------------------------------------ two GPUs

def dist_probe(args):
    import torch
    import torch.distributed as dist
    import torch.nn as nn

    pinned = host_pinning.pin(args.pin, torch=torch)  # this rank's GPU's share of the cores (LOCAL_RANK)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    R = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "world": world, "host_pin": pinned}
    t_start = time.perf_counter()
    from torch.nn.parallel import DistributedDataParallel as DDP
    try:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    except ImportError:
        from torch.distributed._composable.fsdp import MixedPrecisionPolicy, fully_shard

    def one_round(model, opt, fwd):
        """One step timed phase by phase (a sync after each), then one step whole (no syncs between its phases)."""
        dist.barrier()
        sync()
        t0 = time.perf_counter()
        loss = fwd()
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        t2 = time.perf_counter()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter()
        # the whole step again without syncs between the phases
        dist.barrier()
        sync()
        s0 = time.perf_counter()
        loss = fwd()
        loss.backward()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        sync()
        s1 = time.perf_counter()
        return {"forward": (t1 - t0) * 1e3, "backward": (t2 - t1) * 1e3, "optimizer": (t3 - t2) * 1e3,
                "step": (s1 - s0) * 1e3}

    def interleaved(cases, reps=REPS, warm=3):
        """{name: (model, opt, fwd)} timed round-robin -- one round of each case, then the next round -- so that a
        host whose speed drifts over the seconds of the probe slows every case alike, and a wrapper's added time
        (its case against the plain one) is not the drift between two blocks of rounds. Medians per case."""
        ph = {name: {"forward": [], "backward": [], "optimizer": [], "step": []} for name in cases}
        for it in range(warm + reps):
            for name, (model, opt, fwd) in cases.items():
                r = one_round(model, opt, fwd)
                if it >= warm:
                    for k, v in r.items():
                        ph[name][k].append(v)
        return {name: {k: med(v) for k, v in p.items()} for name, p in ph.items()}

    def phases(model, opt, fwd, reps=REPS, warm=3):
        return interleaved({"one": (model, opt, fwd)}, reps, warm)["one"]

    def chain(M, width=64):
        return nn.Sequential(*[nn.Linear(width, width) for _ in range(M)]).to(dev)

    x = torch.randn(4, 64, device=dev)

    # DDP: a chain of M Linear modules (2M parameters), plain vs DDP; the slope per parameter.
    ddp = {}
    for M in () if MODEL_ONLY else (16, 64):
        r = {}
        for wrap in ("plain", "ddp", "ddp_view"):
            torch.manual_seed(0)
            m = chain(M)
            if wrap == "ddp":
                m = DDP(m, device_ids=[torch.cuda.current_device()])
            elif wrap == "ddp_view":
                m = DDP(m, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)
            opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
            r[wrap] = phases(m, opt, lambda: m(x).sum())
        ddp[f"M{M}"] = r
    for wrap in () if MODEL_ONLY else ("ddp", "ddp_view"):
        for ph in ("forward", "backward", "optimizer", "step"):
            d16 = ddp["M16"][wrap][ph] - ddp["M16"]["plain"][ph]
            d64 = ddp["M64"][wrap][ph] - ddp["M64"]["plain"][ph]
            ddp.setdefault(f"{wrap}_added_us_per_param", {})[ph] = (d64 - d16) / (2 * 48) * 1e3
            ddp.setdefault(f"{wrap}_added_us_fixed", {})[ph] = (d16 - 32 * (d64 - d16) / 96) * 1e3
    R["ddp_chain"] = ddp

    # FSDP2: a chain of M Linear modules, each fully_shard'ed (and the root), bf16 compute, fp32 reduce.
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fs, chain_cases = {}, {}
    for M in (8, 32):
        for wrap in ("plain", "fsdp2"):
            torch.manual_seed(0)
            m = chain(M)
            if wrap == "fsdp2":
                for sub in m:
                    fully_shard(sub, mp_policy=mp)
                fully_shard(m, mp_policy=mp)
            try:
                opt = torch.optim.AdamW(m.parameters(), lr=1e-4, fused=True)
                opt.step()
            except Exception:  # noqa: BLE001
                opt = torch.optim.AdamW(m.parameters(), lr=1e-4, foreach=True)
            if wrap == "plain":
                def fwd(m=m):
                    with torch.autocast(DEV, dtype=torch.bfloat16):
                        return m(x).float().sum()
            else:
                def fwd(m=m):
                    return m(x).float().sum()
            chain_cases[(M, wrap)] = (m, opt, fwd)
    for (M, wrap), r in interleaved(chain_cases).items():  # the four round-robin
        fs.setdefault(f"M{M}", {})[wrap] = r
    del chain_cases
    for ph in ("forward", "backward", "optimizer", "step"):
        d8 = fs["M8"]["fsdp2"][ph] - fs["M8"]["plain"][ph]
        d32 = fs["M32"]["fsdp2"][ph] - fs["M32"]["plain"][ph]
        fs.setdefault("added_us_per_module", {})[ph] = (d32 - d8) / 24 * 1e3
        fs.setdefault("added_us_fixed", {})[ph] = (d8 - 8 * (d32 - d8) / 24) * 1e3
    R["fsdp2_chain"] = fs

    # The validation's GPT at a tiny width (24 blocks): single (no wrapper), DDP, FSDP2 per block + root,
    # with and without checkpointing: host time per phase, and op counts under the profiler.
    v = tiny_gpt(24)
    gpt, gpt_cases, kinds = {}, {}, {}
    ids = torch.randint(512, (1, 64), device=dev)
    tgt = torch.randint(512, (1, 64), device=dev)
    for mode in ("single", "ddp", "fsdp2"):
        for ckpt in (False,) if MODEL_ONLY else (False, True):
            torch.manual_seed(0)
            with on_device(torch, dev):
                model = v.gpt_model(ckpt)
            autocast = True
            if mode == "ddp":
                model = DDP(model, device_ids=[torch.cuda.current_device()])
            elif mode == "fsdp2":
                for blk in model.blocks:
                    fully_shard(blk, mp_policy=mp)
                fully_shard(model, mp_policy=mp)
                autocast = False
            try:
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
                opt.step()
                opt_kind = "fused"
            except Exception:  # noqa: BLE001
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, foreach=True)
                opt_kind = "foreach"

            def fwd(model=model, autocast=autocast):
                if autocast:
                    with torch.autocast(DEV, dtype=torch.bfloat16):
                        return model(ids, tgt)
                return model(ids, tgt)
            key = f"{mode}_ckpt{int(ckpt)}"
            gpt_cases[key] = (model, opt, fwd)
            kinds[key] = opt_kind
    # Timed round-robin (single, DDP, FSDP2 in turn, round after round): the wrappers' added time is read against
    # the plain step of the same seconds.
    for key, res in interleaved(gpt_cases).items():
        res["optimizer_kind"] = kinds[key]
        gpt[key] = res
    for key, (model, opt, fwd) in gpt_cases.items():
        if rank == 0:
            gpt[key]["counts"] = count_step(torch, fwd, opt)
        else:  # the collectives need both ranks in step: the same step, unprofiled
            loss = fwd()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        dist.barrier()
    del gpt_cases, model, opt, fwd
    R["tiny_gpt_step"] = gpt

    # Memory census: a model of 8 Linear(2048, 2048) (33.6M fp32 parameters), allocated bytes after each
    # phase, in units of the parameters' fp32 bytes: what DDP and FSDP2 keep besides the parameters; and a
    # model whose embedding is also its head (*_tied: the gradients' ready order differs from the parameters').
    census = {}
    class Tied(nn.Module):  # an embedding used again as the head (the validation GPT's tie), 4 linears between
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(8192, 2048)
            self.body = nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(4)])

        def forward(self, ids):
            return nn.functional.linear(self.body(self.emb(ids)), self.emb.weight)

    import gc
    for mode in ("single", "ddp", "ddp_view", "fsdp2", "single_tied", "ddp_tied"):
        # The previous mode's DDP sits in reference cycles: collected now, not in the middle of this mode's rows
        # (in logs/validate/host-probe-h200 ddp_view's rows start at 1.0 P where its buckets make 2.0).
        gc.collect()
        sync()
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.manual_seed(0)
        tied = mode.endswith("_tied")
        m = (Tied() if tied else nn.Sequential(*[nn.Linear(2048, 2048, bias=False) for _ in range(8)])).to(dev)
        pbytes = sum(p.numel() * 4 for p in m.parameters())
        if mode in ("ddp", "ddp_tied"):
            m = DDP(m, device_ids=[torch.cuda.current_device()])
        elif mode == "ddp_view":
            m = DDP(m, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)
        elif mode == "fsdp2":
            for sub in m:
                fully_shard(sub, mp_policy=mp)
            fully_shard(m, mp_policy=mp)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4, weight_decay=0.0,
                                **({"foreach": True} if mode == "fsdp2" else {"fused": True}))
        xin = torch.randint(8192, (8, 64), device=dev) if tied else torch.randn(8, 2048, device=dev)
        rows = []

        def mark(label):
            sync()
            rows.append((label, (torch.cuda.memory_allocated() - base) / pbytes,
                         (torch.cuda.max_memory_allocated() - base) / pbytes))
        torch.cuda.reset_peak_memory_stats()
        mark("init")
        for it in range(3):
            torch.cuda.reset_peak_memory_stats()
            if mode == "fsdp2":
                loss = m(xin).float().sum()
            else:
                with torch.autocast(DEV, dtype=torch.bfloat16):
                    loss = m(xin).float().sum()
            mark(f"it{it}_after_forward")
            loss.backward()
            mark(f"it{it}_after_backward")
            opt.step()
            mark(f"it{it}_after_step")
            opt.zero_grad(set_to_none=True)
            mark(f"it{it}_after_zero_grad")
            del loss
        census[mode] = {"param_fp32_bytes": pbytes, "rows": [{"at": a, "allocated_x_params": b, "peak_x_params": c}
                                                             for a, b, c in rows]}
        del m, opt
    R["memory_census"] = census
    R["elapsed_s"] = time.perf_counter() - t_start
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        json.dump(R, open(os.path.join(args.out, "host_probe_dist.json"), "w"), indent=1)
        for k in ("ddp_chain", "fsdp2_chain"):
            print(k, json.dumps({kk: vv for kk, vv in R[k].items() if not kk.startswith("M")}))
        for k, r in gpt.items():
            print(k, {kk: (round(vv, 3) if isinstance(vv, float) else vv) for kk, vv in r.items() if kk != "counts"},
                  {ph: (c["aten_top"], c["aten_all"], c["kernels"]) for ph, c in r.get("counts", {}).items()})
        for k, c in census.items():
            print("census", k, [(a, round(b, 2), round(p, 2)) for a, b, p in
                                [(r["at"], r["allocated_x_params"], r["peak_x_params"]) for r in c["rows"]]])
        print(f"dist: {R['elapsed_s']:.1f} s")
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["micro", "dist"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model-only", action="store_true",
                    help="only what hetplan's host model reads (whatif --host-probe): the tiny GPT's phases and op "
                         "counts, fused AdamW, decode; the FSDP2 chain and the tiny GPT under DDP/FSDP2 without "
                         "checkpointing; and the memory census. About half the time")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a smoke test of micro's logic without a GPU (aten counts, no kernels, no graphs)")
    host_pinning.add_pin_arg(ap)
    args = ap.parse_args()
    global DEV, MODEL_ONLY
    DEV = args.device
    MODEL_ONLY = args.model_only
    (micro if args.what == "micro" else dist_probe)(args)


if __name__ == "__main__":
    main()
