#!/usr/bin/env python3
"""Calibration and checks for `hetplan whatif` on a lent GPU machine (issue 10).

Measures, on this machine:
  host      pinned host->device and device->host GB/s per GPU (all local GPUs copying at once),
            CPU Adam parameters/s (torch's fused CPU Adam, all cores);
  gemm      the dense bf16 GEMM efficiency at the replayed model's shapes;
  qlora     QLoRA/LoRA step-time ratio on Llama-3.2-3B-shaped blocks (bitsandbytes' NF4 dequantisation when
            it is importable; else a torch-op emulation, recorded but not used by whatif);
  decode    a decode loop of a Llama-3.2-3B-shaped model with random weights at bf16 and INT4
            (torch's tinygemm int4 kernel, group 128), batch 1 and 8, prompt 512, 128 new tokens (CUDA graph
            per step): ms/token and peak allocated memory;
  offload   a replayed training step of a ~1B Llama-shaped model on one GPU: no offload (GPU Adam),
            ZeRO-2-style optimizer offload (gradients copied to pinned host memory during the backward, CPU
            Adam, 16-bit weights copied back), and ZeRO-3-style parameter offload (each layer's weights fetched
            before its forward and its backward, one layer prefetched ahead, gradients to the host).
Mechanism constants come from micro-benchmarks, never from the end-to-end checks above:
  host      + the fp32 -> bf16 cast on the host (all cores) that follows CPU Adam;
  kernels   the per-kernel floor: a CUDA graph of small decode-sized kernels (norm, add, silu, mul, KV write);
  decode    + per format and batch, a CUDA graph of the projections' GEMVs and the LM head alone (the HBM
            efficiency of the streamed weights, and the int4 kernel's per-row cost from batch 1 vs 8), the
            kernel count of one decode step (torch.profiler), and the attention part alone (a diagnostic);
  offload   + a per-phase breakdown of one instrumented step (a diagnostic).
Writes OUT/whatif_calibration.json (the keys `hetplan whatif --profiles OUT` reads) and OUT/measurements.json.
The FLOP and byte counts and the roofline constants the efficiencies divide by are the binary's, read from
`hetplan whatif --print-constants` (hetplan_constants; $HETPLAN_BIN, default build-gpu/hetplan), never
re-derived here.
Each section is independent: a failure is recorded in measurements.json and the rest goes on.

Fixes after the first H200 run (notes in the report of branch whatif2):
  - sections leaked GPU memory into later ones (the QLoRA section's autograd.Function class is a reference
    cycle holding its quantised weights until a gc pass): every section now starts after gc.collect() and
    empty_cache(), and decode memory is measured from the allocation before its weights;
  - decode's peak included the construction transients (bf16 weights and int32 codes before int4 packing):
    the peak is reset once the weights are built;
  - the offload emulation converted the bf16 gradients to fp32 on the CPU, a pass DeepSpeed does not make
    (it copies into its fp32 host buffer with Tensor.copy_, which converts on the GPU and moves 4 bytes per
    element): gradients now cross as fp32 into the pinned fp32 gradient buffers;
  - the no-offload step kept its fp32 master gradients alive into the next step's backward (4 bytes per
    parameter that a training loop's zero_grad(set_to_none=True) frees): they are now freed after the step;
  - ZeRO-3 emulation cast the updated weights into a staging buffer and then copied them again into the
    host weights: the cast now writes the host weights directly (one pass, as DeepSpeed's
    fp16_partitioned_groups_flat.copy_(fp32 partition)).
"""
import argparse
import gc
import json
import math
import os
import subprocess
import sys
import threading
import time
import traceback

import torch
import torch.nn.functional as F

DEV = torch.device("cuda")
BF16 = torch.bfloat16


def timed(fn, reps, warmup=2):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


# ----------------------------------------------------------------------------------------------- host
def measure_host():
    n = torch.cuda.device_count()
    nbytes = 1 << 30
    res = {}
    for direction in ("h2d", "d2h"):
        bufs = []
        for d in range(n):
            host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            dev = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{d}")
            bufs.append((host, dev))
        times = [0.0] * n
        barrier = threading.Barrier(n)

        def run(d):
            torch.cuda.set_device(d)
            host, dev = bufs[d]
            s = torch.cuda.Stream(d)
            with torch.cuda.stream(s):
                for _ in range(2):
                    (dev.copy_(host, non_blocking=True) if direction == "h2d" else host.copy_(dev, non_blocking=True))
                s.synchronize()
                barrier.wait()
                t0 = time.perf_counter()
                for _ in range(5):
                    (dev.copy_(host, non_blocking=True) if direction == "h2d" else host.copy_(dev, non_blocking=True))
                s.synchronize()
                times[d] = (time.perf_counter() - t0) / 5

        threads = [threading.Thread(target=run, args=(d,)) for d in range(n)]
        [t.start() for t in threads]
        [t.join() for t in threads]
        res[direction + "_gbs_per_gpu"] = [nbytes / t / 1e9 for t in times]
        res[direction + "_gbs"] = min(res[direction + "_gbs_per_gpu"])
        del bufs
    torch.cuda.set_device(0)
    res["gpus_copying_at_once"] = n
    # CPU Adam: torch's fused Adam on fp32 CPU tensors, all cores.
    torch.set_num_threads(os.cpu_count())
    p = torch.zeros(200_000_000, dtype=torch.float32, requires_grad=True)
    p.grad = torch.randn_like(p)
    best = 0.0
    for fused in (True, False):
        try:
            opt = torch.optim.Adam([p], lr=1e-4, fused=fused) if fused else torch.optim.Adam([p], lr=1e-4, foreach=True)
            opt.step()
            t0 = time.perf_counter()
            for _ in range(3):
                opt.step()
            rate = p.numel() * 3 / (time.perf_counter() - t0)
            res["cpu_adam_params_per_s_" + ("fused" if fused else "foreach")] = rate
            best = max(best, rate)
        except Exception as e:  # fused CPU Adam needs torch >= 2.4
            res["cpu_adam_error_" + str(fused)] = repr(e)
    res["cpu_adam_params_per_s"] = best
    # The fp32 -> bf16 cast of the updated weights on the host (what follows CPU Adam in ZeRO-Offload),
    # into pinned memory, all cores.
    del opt
    dst = torch.empty(p.numel(), dtype=BF16).pin_memory()
    with torch.no_grad():
        dst.copy_(p.detach())
        t0 = time.perf_counter()
        for _ in range(3):
            dst.copy_(p.detach())
    res["cpu_cast_params_per_s"] = p.numel() * 3 / (time.perf_counter() - t0)
    res["cpu_threads"] = torch.get_num_threads()
    return res


# ------------------------------------------------------------------------------------------- kernels
def capture_graph(fn):
    """fn captured in a CUDA graph, after one warm-up run on a side stream (as capture requires)."""
    s_ = torch.cuda.Stream()
    s_.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s_):
        fn()
    torch.cuda.current_stream().wait_stream(s_)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def graph_time(fn, reps=50):
    """Seconds per replay of fn captured in a CUDA graph."""
    g = capture_graph(fn)
    t = timed(g.replay, reps)
    del g
    return t


def measure_kernel_floor(s, batch=1, n=100):
    """Per-kernel time of the small kernels of a decode step, in a CUDA graph (as the decode loop runs)."""
    x = torch.randn(batch, 1, s.h, dtype=BF16, device=DEV)
    w = torch.ones(s.h, dtype=BF16, device=DEV)
    u = torch.randn(batch, 1, s.f, dtype=BF16, device=DEV)
    kc = torch.zeros(batch, s.kv, 640, s.d, dtype=BF16, device=DEV)
    kv = torch.randn(batch, s.kv, 1, s.d, dtype=BF16, device=DEV)
    pos = torch.zeros(1, dtype=torch.long, device=DEV)

    def body():  # 5 kernels: norm, residual add, silu, mul, KV write
        for _ in range(n):
            y = rms(x, w)
            x.add_(y)
            g = F.silu(u)
            u.mul_(g)
            kc.index_copy_(2, pos, kv)
    per_iter = 5

    t_graph = graph_time(body, 20)
    t_eager = timed(body, 5)
    # Count the kernels the body actually launched (rms_norm may be one kernel or several).
    count = None
    try:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            body()
            torch.cuda.synchronize()
        count = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:
        pass
    kernels = count if count else per_iter * n
    return {"kernels": kernels, "kernels_counted": count is not None,
            "graph_us_per_kernel": t_graph / kernels * 1e6, "eager_us_per_kernel": t_eager / kernels * 1e6}


# ----------------------------------------------------------------------------------------- the model
class Shape:
    def __init__(self, hidden, layers, heads, kv_heads, ffn, vocab, tied):
        self.h, self.L, self.a, self.kv, self.f, self.V, self.tied = hidden, layers, heads, kv_heads, ffn, vocab, tied
        self.d = hidden // heads

    def flags(self):
        return (f"--family llama --hidden-size {self.h} --layers {self.L} --heads {self.a} --kv-heads {self.kv} "
                f"--ffn-size {self.f} --vocab-size {self.V}" + (" --tied-embeddings" if self.tied else ""))


LLAMA_3B = Shape(3072, 28, 24, 8, 8192, 128256, True)
REPLAY_1B = Shape(2048, 20, 16, 16, 5632, 512, False)
BLOCK_SEQ = 1024  # the block micro-benchmark's sequence length


def block_weights(s, dtype=BF16, device=DEV):
    g = lambda *shape: (torch.randn(*shape, dtype=dtype, device=device) * 0.02)
    return {"wq": g(s.a * s.d, s.h), "wk": g(s.kv * s.d, s.h), "wv": g(s.kv * s.d, s.h), "wo": g(s.h, s.a * s.d),
            "wg": g(s.f, s.h), "wu": g(s.f, s.h), "wd": g(s.h, s.f),
            "n1": torch.ones(s.h, dtype=dtype, device=device), "n2": torch.ones(s.h, dtype=dtype, device=device)}


def rms(x, w):
    return F.rms_norm(x, (x.shape[-1],), w, 1e-5) if hasattr(F, "rms_norm") else x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(x.dtype) * w


def block_forward(s, w, x, lin=F.linear):
    b, t, _ = x.shape
    y = rms(x, w["n1"])
    q = lin(y, w["wq"]).view(b, t, s.a, s.d).transpose(1, 2)
    k = lin(y, w["wk"]).view(b, t, s.kv, s.d).transpose(1, 2)
    v = lin(y, w["wv"]).view(b, t, s.kv, s.d).transpose(1, 2)
    if s.kv != s.a:
        k = k.repeat_interleave(s.a // s.kv, 1)
        v = v.repeat_interleave(s.a // s.kv, 1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, s.a * s.d)
    x = x + lin(o, w["wo"])
    y = rms(x, w["n2"])
    return x + lin(F.silu(lin(y, w["wg"])) * lin(y, w["wu"]), w["wd"])


def hetplan_constants(shape, seq, het=None, gpu=None, run=subprocess.run):
    """The binary's model, FLOP and roofline constants for `shape` at sequence length `seq`
    (`hetplan whatif --print-constants`, sim/roofline.h and sim/model_shape.h): a dict with keys
    model (FLOPs and bytes per token of this shape), flops, roofline, whatif and gpu."""
    het = het or os.environ.get("HETPLAN_BIN", "build-gpu/hetplan")
    gpu = gpu or os.environ.get("HETPLAN_GPU", "")
    cmd = [het, "whatif", "--print-constants", "--seq", str(seq)] + shape.flags().split()
    if gpu:
        cmd += ["--gpu", gpu]
    return json.loads(run(cmd, check=True, capture_output=True, text=True).stdout)


# ------------------------------------------------------------------------------------------------ gemm
def measure_gemm(s, tokens):
    eff = []
    peak = None
    for (n, k) in ((s.a * s.d, s.h), (s.f, s.h), (s.h, s.f)):
        x = torch.randn(tokens, k, dtype=BF16, device=DEV)
        w = torch.randn(n, k, dtype=BF16, device=DEV)
        t = timed(lambda: F.linear(x, w), 20)
        eff.append(2 * tokens * n * k / t)
    return {"gemm_tflops": [e / 1e12 for e in eff], "gemm_flops_mean": sum(eff) / len(eff)}


# ----------------------------------------------------------------------------------------------- block
def measure_block(s, batch, seq):
    """One block's forward + backward at the replayed shape, and its fused causal attention alone."""
    q, k, v = (torch.randn(batch, s.a, seq, s.d, dtype=BF16, device=DEV, requires_grad=True) for _ in range(3))
    go = torch.randn(batch, s.a, seq, s.d, dtype=BF16, device=DEV)

    def attn():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)
        q.grad = k.grad = v.grad = None

    w = block_weights(s)
    for t in w.values():
        t.requires_grad_()
    x = torch.randn(batch, seq, s.h, dtype=BF16, device=DEV, requires_grad=True)
    gy = torch.randn(batch, seq, s.h, dtype=BF16, device=DEV)

    def block():
        block_forward(s, w, x).backward(gy)
        for t in list(w.values()) + [x]:
            t.grad = None

    # The no-offload trainer's optimizer step on a slice, as the replayed step runs it (fp32 gradients from the
    # 16-bit ones, torch's fused Adam, the 16-bit weights written back).
    n = 100_000_000
    p16 = torch.zeros(n, dtype=BF16, device=DEV)
    g16 = torch.randn(n, dtype=BF16, device=DEV)
    m32 = p16.float().requires_grad_()
    opt = torch.optim.Adam([m32], lr=1e-5, fused=True)

    def opt_step():
        m32.grad = g16.float()
        opt.step()
        with torch.no_grad():
            p16.copy_(m32)
        m32.grad = None

    t_opt = timed(opt_step, 10)
    del p16, g16, m32, opt
    return {"batch": batch, "seq": seq, "attention_fwd_bwd_ms": timed(attn, 10) * 1e3,
            "block_fwd_bwd_ms": timed(block, 10) * 1e3, "optimizer_params": n, "optimizer_ms": t_opt * 1e3}


# ----------------------------------------------------------------------------------------------- qlora
NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
                    -0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725,
                    0.24611230194568634, 0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0])


def measure_qlora(s, layers, batch, seq, rank=8):
    try:
        import bitsandbytes.functional as bnbf
        have_bnb = True
    except Exception:
        have_bnb = False
    ws = [block_weights(s) for _ in range(layers)]
    names = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")
    targets = ("wq", "wk", "wv", "wo")
    lora = [{n: (torch.zeros(rank, w[n].shape[1], device=DEV, requires_grad=True),
                 torch.zeros(w[n].shape[0], rank, device=DEV, requires_grad=True)) for n in targets} for w in ws]
    quant = []
    for w in ws:
        q = {}
        for n in names:
            if have_bnb:
                q[n] = bnbf.quantize_4bit(w[n], blocksize=64, quant_type="nf4", compress_statistics=True)
            else:
                flat = w[n].float().view(-1, 64)
                absmax = flat.abs().amax(1)
                codes = ((flat / absmax[:, None]).unsqueeze(-1) - NF4.to(DEV)).abs().argmin(-1).to(torch.uint8)
                packed = (codes.view(-1, 2)[:, 0] << 4) | codes.view(-1, 2)[:, 1]
                q[n] = (packed, absmax, w[n].shape)
        quant.append(q)
    table = NF4.to(DEV, BF16)

    def deq(qq):
        if have_bnb:
            return bnbf.dequantize_4bit(qq[0], qq[1]).to(BF16)
        packed, absmax, shape = qq
        codes = torch.stack([packed >> 4, packed & 15], -1).view(-1).long()
        return (table[codes].view(-1, 64) * absmax[:, None].to(BF16)).view(shape)

    class Deq(torch.autograd.Function):  # dequantise before the forward GEMM and again before the backward's
        @staticmethod
        def forward(ctx, x, qq_index, layer):
            ctx.idx = (qq_index, layer)
            return F.linear(x, deq(quant[layer][qq_index]))

        @staticmethod
        def backward(ctx, g):
            n, layer = ctx.idx
            return g @ deq(quant[layer][n]), None, None

    x0 = torch.randn(batch, seq, s.h, dtype=BF16, device=DEV, requires_grad=True)

    def step(quantised):
        x = x0
        for i, w in enumerate(ws):
            def lin(y, weight, i=i, w=w):
                n = next(k for k in names if w[k] is weight)
                base = Deq.apply(y, n, i) if quantised else F.linear(y, weight)
                if n in targets:
                    a, b = lora[i][n]
                    base = base + F.linear(F.linear(y.float(), a), b).to(BF16)
                return base
            x = block_forward(s, w, x, lin)
        x.float().pow(2).mean().backward()

    t_lora = timed(lambda: step(False), 5)
    t_qlora = timed(lambda: step(True), 5)
    return {"bitsandbytes": have_bnb, "layers": layers, "batch": batch, "seq": seq, "lora_ms": t_lora * 1e3,
            "qlora_ms": t_qlora * 1e3, "factor": t_qlora / t_lora}


# ---------------------------------------------------------------------------------------------- decode
def int4_linear_factory():
    group = 128

    def make(w):
        n, k = w.shape
        codes = torch.randint(0, 16, (n, k), dtype=torch.int32, device=DEV)
        packed = None
        for attempt in ("uint8", "int32"):
            try:
                src = ((codes[:, ::2] << 4) | codes[:, 1::2]).to(torch.uint8) if attempt == "uint8" else codes
                packed = torch.ops.aten._convert_weight_to_int4pack(src, 8)
                sz = torch.randn(k // group, n, 2, dtype=BF16, device=DEV) * 0.01
                torch.ops.aten._weight_int4pack_mm(torch.randn(1, k, dtype=BF16, device=DEV), packed, group, sz)
                return (packed, sz)
            except Exception as e:
                err = e
        raise RuntimeError("int4 kernel unavailable: " + repr(err))

    def lin(x, q):
        packed, sz = q
        shp = x.shape
        y = torch.ops.aten._weight_int4pack_mm(x.reshape(-1, shp[-1]), packed, group, sz)
        return y.view(*shp[:-1], -1)

    return make, lin


def count_kernels(fn):
    """CUDA kernels (and copies/memsets) one call of fn launches, by torch.profiler; None if unavailable."""
    try:
        from torch.profiler import profile, ProfilerActivity
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
    except Exception:
        return None



def measure_decode(s, fmt, batch, prompt=512, output=128):
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()  # what earlier sections still hold (should be ~0)
    names = ("wq", "wk", "wv", "wo", "wg", "wu", "wd")
    emb = torch.randn(s.V, s.h, dtype=BF16, device=DEV) * 0.02
    layers = []
    if fmt == "int4":
        make, lin4 = int4_linear_factory()
    for _ in range(s.L):
        w = block_weights(s)
        if fmt == "int4":
            for n in names:
                w[n] = make(w[n])
        layers.append(w)
    gc.collect()
    torch.cuda.synchronize()
    weights_bytes = torch.cuda.memory_allocated() - base
    torch.cuda.reset_peak_memory_stats()  # the construction transients (bf16 weights, int32 codes) are not decode's
    lin = (lambda x, q: lin4(x, q)) if fmt == "int4" else F.linear
    T = prompt + output
    kc = [torch.zeros(batch, s.kv, T, s.d, dtype=BF16, device=DEV) for _ in range(s.L)]
    vc = [torch.zeros(batch, s.kv, T, s.d, dtype=BF16, device=DEV) for _ in range(s.L)]
    pos = torch.zeros((), dtype=torch.long, device=DEV)
    mask = torch.zeros(batch, 1, 1, T, dtype=torch.bool, device=DEV)
    tok = torch.zeros(batch, 1, dtype=torch.long, device=DEV)

    def step():
        x = emb[tok]
        for i, w in enumerate(layers):
            y = rms(x, w["n1"])
            q = lin(y, w["wq"]).view(batch, 1, s.a, s.d).transpose(1, 2)
            k = lin(y, w["wk"]).view(batch, 1, s.kv, s.d).transpose(1, 2)
            v = lin(y, w["wv"]).view(batch, 1, s.kv, s.d).transpose(1, 2)
            kc[i].index_copy_(2, pos.view(1), k)
            vc[i].index_copy_(2, pos.view(1), v)
            kk, vv = kc[i], vc[i]
            if s.kv != s.a:
                kk = kk.repeat_interleave(s.a // s.kv, 1)
                vv = vv.repeat_interleave(s.a // s.kv, 1)
            o = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask).transpose(1, 2).reshape(batch, 1, -1)
            x = x + lin(o, w["wo"])
            y = rms(x, w["n2"])
            x = x + lin(F.silu(lin(y, w["wg"])) * lin(y, w["wu"]), w["wd"])
        logits = F.linear(rms(x, layers[0]["n2"]), emb).float()
        tok.copy_(logits.argmax(-1))
        mask.index_fill_(3, pos.view(1), True)
        pos.add_(1)

    # Prefill is not timed here (the KV cache is filled as if by a prompt): decode from position `prompt`.
    mask[..., :prompt] = True
    pos.fill_(prompt)
    graph = None
    try:
        graph = capture_graph(step)
    except Exception:
        graph = None
    kernels = count_kernels(step)  # one eager step (its writes are undone below)
    mask.zero_()
    mask[..., :prompt] = True
    pos.fill_(prompt)
    run = graph.replay if graph is not None else step
    run()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(output - 1):
        run()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - t0) / (output - 1) * 1e3
    peak = torch.cuda.max_memory_allocated() - base

    # Micro-benchmarks on the same weights, each in a CUDA graph: the projections' GEMVs and the LM head alone
    # (streamed weight bytes), and the attention part alone (KV write, GQA repeat, SDPA over the static cache).
    xs = {"h": torch.randn(batch, 1, s.h, dtype=BF16, device=DEV), "a": torch.randn(batch, 1, s.a * s.d, dtype=BF16, device=DEV),
          "f": torch.randn(batch, 1, s.f, dtype=BF16, device=DEV)}
    src = {"wq": "h", "wk": "h", "wv": "h", "wo": "a", "wg": "h", "wu": "h", "wd": "f"}

    def linears():
        for w in layers:
            for n in names:
                lin(xs[src[n]], w[n])
        F.linear(xs["h"], emb)

    def linears_only_blocks():
        for w in layers:
            for n in names:
                lin(xs[src[n]], w[n])

    pos.fill_(prompt)  # (the loop left it at prompt + output, one past the cache)
    qx = torch.randn(batch, s.a, 1, s.d, dtype=BF16, device=DEV)
    kx = torch.randn(batch, s.kv, 1, s.d, dtype=BF16, device=DEV)

    def attention():
        for i in range(s.L):
            kc[i].index_copy_(2, pos.view(1), kx)
            vc[i].index_copy_(2, pos.view(1), kx)
            kk, vv = kc[i], vc[i]
            if s.kv != s.a:
                kk = kk.repeat_interleave(s.a // s.kv, 1)
                vv = vv.repeat_interleave(s.a // s.kv, 1)
            F.scaled_dot_product_attention(qx, kk, vv, attn_mask=mask)

    micro = {}
    for name, fn in (("linears", linears), ("block_linears", linears_only_blocks), ("attention", attention)):
        try:
            micro[name + "_ms"] = graph_time(fn) * 1e3
        except Exception as e:
            micro[name + "_error"] = repr(e)
    micro["attention_kernels"] = count_kernels(attention)
    micro["linears_kernels"] = count_kernels(linears)
    out = {"format": fmt, "batch": batch, "prompt": prompt, "output": output, "ms_per_token": ms,
           "cuda_graph": graph is not None, "weights_allocated_bytes": weights_bytes,
           "peak_allocated_bytes": peak, "allocated_before_bytes": base, "kernels_per_step": kernels,
           "lm_head_bytes": emb.numel() * emb.element_size(), "micro": micro}
    del layers, kc, vc, graph
    torch.cuda.empty_cache()
    return out


# --------------------------------------------------------------------------------------------- offload
def measure_offload(s, batch, seq, mode):
    """One replayed step; mode: none (GPU Adam), zero2_offload, zero3_offload."""
    gc.collect()
    torch.cuda.empty_cache()
    names = ("wq", "wk", "wv", "wo", "wg", "wu", "wd", "n1", "n2")
    emb = (torch.randn(s.V, s.h, dtype=BF16, device=DEV) * 0.02).requires_grad_()
    head = (torch.randn(s.V, s.h, dtype=BF16, device=DEV) * 0.02).requires_grad_()
    ws = [block_weights(s) for _ in range(s.L)]
    for w in ws:
        for n in names:
            w[n].requires_grad_()
    final_norm = torch.ones(s.h, dtype=BF16, device=DEV)
    params = [emb, head] + [w[n] for w in ws for n in names]
    copy = torch.cuda.Stream()
    tokens = torch.randint(0, s.V, (batch, seq), device=DEV)
    if mode == "none":
        master = [p.detach().float().requires_grad_() for p in params]
        opt = torch.optim.Adam(master, lr=1e-5, fused=True)
    else:
        master = [p.detach().float().cpu().pin_memory().requires_grad_() for p in params]
        for m in master:  # DeepSpeed's fp32 host gradient buffer (pinned): gradients arrive in it as fp32
            m.grad = torch.zeros_like(m).pin_memory()
        # 16-bit pinned staging on the host: updated weights leave from it.
        stage16 = [torch.empty(p.shape, dtype=BF16).pin_memory() for p in params]
        try:
            opt = torch.optim.Adam(master, lr=1e-5, fused=True)
        except Exception:
            opt = torch.optim.Adam(master, lr=1e-5, foreach=True)
    host16 = None
    if mode == "zero3_offload":  # the 16-bit weights live on the host; GPU storage only while a layer runs
        host16 = [[w[n].detach().cpu().pin_memory() for n in names] for w in ws]
    idx = {id(p): i for i, p in enumerate(params)}

    def grad_to_host(p):  # ZeRO-Offload: copy each gradient to the host as the backward produces it
        if p.grad is None:
            return
        ev = torch.cuda.Event()
        ev.record()
        with torch.cuda.stream(copy):
            copy.wait_event(ev)
            # As DeepSpeed: one copy_ of the 16-bit gradient into the fp32 host buffer; PyTorch converts on
            # the GPU (the source) and moves 4 bytes per element.
            master[idx[id(p)]].grad.copy_(p.grad, non_blocking=True)
        p.grad.record_stream(copy)
        p.grad = None

    fetched = {}

    def fetch(i):  # host -> GPU into the layer's own storage, on the copy stream
        if i < 0 or i >= s.L or i in fetched:
            return
        ev = torch.cuda.Event()
        ev.record()
        with torch.cuda.stream(copy):
            copy.wait_event(ev)
            for n, h in zip(names, host16[i]):
                t = ws[i][n]
                t.untyped_storage().resize_(h.numel() * h.element_size())
                t.data.copy_(h, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        fetched[i] = done

    def wait(i):
        torch.cuda.current_stream().wait_event(fetched.pop(i))

    def free(i):
        for n in names:
            ws[i][n].untyped_storage().resize_(0)

    if mode == "zero3_offload":
        for i in range(s.L):
            free(i)

    host16_of = {}  # parameter index -> its host 16-bit tensor (ZeRO-3 parameter offload)
    if mode == "zero3_offload":
        for i in range(s.L):
            for n, h in zip(names, host16[i]):
                host16_of[idx[id(ws[i][n])]] = h
    phases = None  # set to a dict by the instrumented step: synchronised wall time per phase

    def mark(name):
        nonlocal last
        if phases is None:
            return
        torch.cuda.synchronize()
        now = time.perf_counter()
        phases[name] = (now - last) * 1e3
        last = now

    last = 0.0

    def step():
        x = emb[tokens]
        acts = []
        for i, w in enumerate(ws):
            if mode == "zero3_offload":
                fetch(i)
                wait(i)
                fetch(i + 1)
            xi = x.detach().requires_grad_()
            y = block_forward(s, w, xi)
            acts.append((xi, y))
            if mode == "zero3_offload":
                free(i)
            x = y
        mark("forward")
        xl = x.detach().requires_grad_()
        loss = F.cross_entropy(F.linear(rms(xl, final_norm), head).float().view(-1, s.V), tokens.view(-1))
        loss.backward()
        g = xl.grad
        if mode != "none":
            grad_to_host(head)
        for i in reversed(range(s.L)):
            if mode == "zero3_offload":
                fetch(i)
                wait(i)
                fetch(i - 1)
            xi, y = acts[i]
            y.backward(g)
            g = xi.grad
            if mode != "none":
                for n in names:
                    grad_to_host(ws[i][n])
            if mode == "zero3_offload":
                free(i)
        x0 = emb[tokens]
        x0.backward(g)
        mark("backward")
        if mode == "none":
            for m, p in zip(master, params):
                m.grad = p.grad.float()
                p.grad = None
            opt.step()
            with torch.no_grad():
                for m, p in zip(master, params):
                    p.copy_(m)
                    m.grad = None  # as zero_grad(set_to_none=True): no fp32 gradients held into the next step
            mark("optimizer")
        else:
            grad_to_host(emb)
            copy.synchronize()
            torch.cuda.synchronize()
            mark("d2h_tail")
            opt.step()  # CPU Adam, serial
            mark("cpu_adam")
            with torch.no_grad():
                # The updated fp32 weights cast to 16 bits on the host, once: into the host weights themselves
                # where ZeRO-3 keeps them there, else into the pinned staging the copy back reads.
                for i, m in enumerate(master):
                    dst = host16_of.get(i)
                    (dst if dst is not None else stage16[i]).copy_(m)
                mark("cpu_cast")
                for i, p in enumerate(params):
                    if i in host16_of:
                        continue  # stays on the host (fetched per layer)
                    p.copy_(stage16[i], non_blocking=True)
            torch.cuda.synchronize()
            mark("h2d")
        torch.cuda.synchronize()

    torch.cuda.reset_peak_memory_stats()
    t = timed(step, 3, warmup=1)
    peak = torch.cuda.max_memory_allocated()
    # One more step, synchronised at each phase boundary (a diagnostic: the syncs cost the overlap).
    phases = {}
    torch.cuda.synchronize()
    last = time.perf_counter()
    step()
    out = {"mode": mode, "batch": batch, "seq": seq, "step_ms": t * 1e3,
           "peak_allocated_bytes": peak, "phases_ms_synchronised": phases,
           "parameters": sum(p.numel() for p in params)}
    del ws, params, master, opt
    torch.cuda.empty_cache()
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    # The binary's constants for the replayed block's shape and the decode shape (sim/model_shape.h,
    # sim/whatif.h), read first: a missing binary fails before minutes of measuring.
    c_block = hetplan_constants(REPLAY_1B, BLOCK_SEQ)
    c_decode = hetplan_constants(LLAMA_3B, 512)
    m = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "gpus": torch.cuda.device_count()}
    sections = {
        "host": lambda: measure_host(),
        "gemm": lambda: measure_gemm(REPLAY_1B, 4 * 1024),
        "kernels": lambda: measure_kernel_floor(LLAMA_3B),
        "block": lambda: measure_block(REPLAY_1B, 4, BLOCK_SEQ),
        "qlora": lambda: measure_qlora(LLAMA_3B, 4, 4, 512),
        "decode": lambda: [measure_decode(LLAMA_3B, f, b) for f in ("bf16", "int4") for b in (1, 8)],
        "offload": lambda: [measure_offload(REPLAY_1B, 4, 1024, mode) for mode in ("none", "zero2_offload", "zero3_offload")],
    }
    for name, fn in sections.items():
        gc.collect()
        torch.cuda.empty_cache()
        t0 = time.time()
        try:
            m[name] = fn()
        except Exception:
            m[name + "_error"] = traceback.format_exc()
        print(f"{name}: {time.time() - t0:.1f} s", flush=True)
        with open(os.path.join(a.out, "measurements.json"), "w") as f:
            json.dump(m, f, indent=2)

    cal = {"about": "Measured by scripts/gpu_whatif_calibrate.py on " + m["device"] + "; read by hetplan whatif --profiles DIR"}
    if "host" in m:
        cal["host"] = {"h2d_gbs": m["host"]["h2d_gbs"], "d2h_gbs": m["host"]["d2h_gbs"],
                       "cpu_adam_params_per_s": m["host"]["cpu_adam_params_per_s"],
                       "cpu_cast_params_per_s": m["host"]["cpu_cast_params_per_s"]}
    train = {}
    if "qlora" in m and m["qlora"]["bitsandbytes"]:
        train["qlora_dequant_factor"] = m["qlora"]["factor"]
    elif "qlora" in m:
        train["qlora_dequant_factor_emulated"] = m["qlora"]["factor"]  # torch-op NF4 emulation: not read by whatif
    fwd_bwd = 1 + c_block["whatif"]["backward_per_forward"]  # forward + backward per forward
    peak = float(os.environ.get("HETPLAN_PEAK_TFLOPS", "0")) * 1e12 or c_block["gpu"]["peak_tflops"] * 1e12
    if "gemm" in m and peak > 0:
        train["gemm_efficiency"] = min(1.0, m["gemm"]["gemm_flops_mean"] / peak)
    # Attention and elementwise, from one block's micro-benchmark (never the end-to-end step): attention FLOPs
    # as whatif counts them (the binary's attention_forward_flops_per_token forward, backward_per_forward times
    # that backward) over the fused SDPA's forward + backward time; the elementwise efficiency assigns what the
    # block's forward + backward takes beyond the roofline's GEMM time (at the measured GEMM rate) and the
    # attention to the roofline's elementwise bytes (elementwise_bytes_per_token_hidden x hidden x 2 B per
    # token forward, backward_per_forward times that backward).
    hbm = float(os.environ.get("HETPLAN_HBM_GBS", "0")) * 1e9 or c_block["gpu"]["memory_bw_gbs"] * 1e9
    cm, cw = c_block["model"], c_block["whatif"]
    if "block" in m and "gemm" in m and peak > 0:
        b = m["block"]
        T = b["batch"] * b["seq"]
        t_attn = b["attention_fwd_bwd_ms"] / 1e3
        train["attention_efficiency"] = min(1.0, fwd_bwd * cm["attention_forward_flops_per_token"] * T / t_attn / peak)
        t_gemm = fwd_bwd * cm["linear_forward_flops_per_token"] * T / m["gemm"]["gemm_flops_mean"]
        t_elem = b["block_fwd_bwd_ms"] / 1e3 - t_gemm - t_attn
        if hbm > 0 and t_elem > 0:
            elem_bytes = cw["elementwise_bytes_per_token_hidden"] * cm["hidden_size"] * cw["bytes_per_16bit_value"]
            train["elementwise_efficiency"] = min(1.0, fwd_bwd * elem_bytes * T / t_elem / hbm)
    if "block" in m and hbm > 0:  # whatif's optimizer bytes per parameter over the trainer's measured step
        train["optimizer_hbm_efficiency"] = min(
            1.0, cw["optimizer_bytes_per_param"] * m["block"]["optimizer_params"] / (m["block"]["optimizer_ms"] / 1e3) / hbm)
    if train:
        cal["training"] = train
    # Decode mechanism constants, from the micro-benchmarks only (the end-to-end decode loop is the check):
    #  - HBM efficiency per format: the streamed weight bytes (projections and LM head) over the time of their
    #    GEMVs alone at batch 1, less the int4 kernel's per-row cost; the bandwidth is the catalogue's (the .sh);
    #  - int4 per-row cost: the projections' int4 GEMVs at batch 8 minus batch 1, per added row;
    #  - the per-kernel floor (graph of small kernels) and the kernel count of one bf16 batch-1 step per layer;
    #  - the implementation measured: HF-style materialised GQA repeat and a static (preallocated) KV cache.
    bw = hbm
    inf = {}
    if "decode" in m:
        rec = {(r["format"], r["batch"]): r for r in m["decode"]}
        eff = {}
        row_s = 0.0
        b1, b8 = rec.get(("int4", 1)), rec.get(("int4", 8))
        try:
            row_s = max(0.0, (b8["micro"]["block_linears_ms"] - b1["micro"]["block_linears_ms"]) / 1e3 / (b8["batch"] - b1["batch"]))
            if row_s > 0:
                # the projections' weights, as cost_inference counts them (sim/inference.cc)
                projection_params = c_decode["model"]["block_linear_weights"] * c_decode["model"]["blocks"]
                inf["int4_row_params_per_s"] = projection_params / row_s
        except Exception:
            row_s = 0.0
        # Net of the GEMV kernels' floor (whatif charges every kernel the floor, these too: sim/inference.h).
        lin_floor = m.get("kernels", {}).get("graph_us_per_kernel", 0) * 1e-6
        net = lin_floor > 0
        for fmt in ("bf16", "int4"):
            r = rec.get((fmt, 1))
            if r is None or bw <= 0 or "linears_ms" not in r.get("micro", {}):
                continue
            net = net and bool(r["micro"].get("linears_kernels"))
            t = (r["micro"]["linears_ms"] / 1e3 - (row_s * r["batch"] if fmt == "int4" else 0.0)
                 - (r["micro"].get("linears_kernels") or 0) * lin_floor)
            if t > 0:
                eff[fmt] = min(1.0, r["weights_allocated_bytes"] / t / bw)
        if eff:
            inf["decode_hbm_efficiency"] = eff
            inf["decode_hbm_efficiency_net_of_floor"] = net
        r = rec.get(("bf16", 1))
        if r is not None and r.get("kernels_per_step"):
            inf["decode_kernels_per_layer"] = r["kernels_per_step"] / c_decode["model"]["blocks"]
        # The attention's HBM efficiency: its KV bytes (the static cache read, the GQA-expanded copy written
        # and read) over the attention part's time alone at batch 8 (bf16), less its kernels' floor (the floor
        # term of whatif counts those kernels).
        r = rec.get(("bf16", 8))
        floor = m.get("kernels", {}).get("graph_us_per_kernel", 0) * 1e-6
        try:
            T = r["prompt"] + r["output"]
            heads, kv_heads = c_decode["model"]["heads"], c_decode["model"]["kv_heads"]
            kv_bytes = (c_decode["model"]["kv_cache_bytes_per_token"] * r["batch"] * T *
                        (1 + (2 * heads / kv_heads if heads != kv_heads else 0)))
            t = r["micro"]["attention_ms"] / 1e3 - (r["micro"].get("attention_kernels") or 0) * floor
            if t > 0 and bw > 0:
                inf["attention_hbm_efficiency"] = min(1.0, kv_bytes / t / bw)
        except Exception:
            pass
        inf["kv_repeat_materialised"] = True  # the decode loop above: repeat_interleave before SDPA
        inf["static_kv_cache"] = True         # preallocated to prompt + output, masked
    if "kernels" in m:
        inf["kernel_floor_us"] = m["kernels"]["graph_us_per_kernel"]
    if inf:
        cal["inference"] = inf
    with open(os.path.join(a.out, "whatif_calibration.json"), "w") as f:
        json.dump(cal, f, indent=2)
    print(json.dumps(cal, indent=2))


if __name__ == "__main__":
    main()
