#!/usr/bin/env python3
"""Where a transformer block's GPU time goes: GEMMs, attention, everything else.

The block mirrors profiler/gpt.cc's TransformerBlock op for op (RMSNorm in fp32, one fused QKV
projection, rotary embedding computed per call, key/value heads repeated for GQA, PyTorch's
scaled_dot_product_attention, SwiGLU MLP), in bf16, forward and backward, on the whole GPU. The CUDA
kernels of a few timed iterations are grouped by name (torch.profiler) into GEMM, attention and
other (elementwise, reductions, copies).

Why: an SM partition slows GEMMs and attention by its compute ratio but memory-bound kernels only by
its bandwidth ratio (gpu-probe: 3.00x and 1.55x for 40 of 132 SMs on an H200), so a block's slowdown
is about (G x 3.00 + A x 3.00 + O x 1.55) / (G + A + O) with these shares. Issue 14 measured 2.42-2.56x
for this block under the 33-SM type.

  python3 scripts/gpu_block_breakdown.py OUT.json [--hidden 8192 --ffn 28672 --heads 64 --kv-heads 8
                                                   --seq 2048 --bs 1,2,4 --iters 3 --sms N --compile --idle-ms N --aten-fused]

--sms N runs every kernel on a stream of a CUDA green context of N SMs (torch.cuda.GreenContext; the
driver rounds N up to its granularity), the emulated device type's way of running.

--idle-ms N also times the forward and the backward each on its own after N ms of idle: boost clocks, where each
op is shorter than the GPU's power-cap onset (40-80 ms on an H200, logs/greenctx_h200.md round 7), against the
back-to-back timing above.

--aten-fused keeps the block eager but uses what ATen offers a C++ (LibTorch) model: F.rms_norm, the rotary tables
built once, and GQA inside scaled_dot_product_attention (enable_gqa) instead of repeated keys and values.

--compile runs the block through torch.compile (TorchInductor), which fuses the elementwise work
(norms, rotary, SwiGLU, residual adds) into a few Triton kernels and leaves the GEMMs and attention
to cuBLAS and SDPA, as a framework with fused kernels (Megatron with Transformer Engine) would: what a
block's slowdown under an SM partition becomes when its elementwise share is small.
"""
import argparse
import json
import sys
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from sm_partition import on_sms


class Block(torch.nn.Module):
    def __init__(self, h, ffn, heads, kv_heads, aten_fused=False):
        super().__init__()
        self.heads, self.kv, self.d = heads, kv_heads, h // heads
        self.aten_fused, self.tables = aten_fused, {}
        self.ln1 = torch.nn.Parameter(torch.ones(h))
        self.ln2 = torch.nn.Parameter(torch.ones(h))
        self.qkv = torch.nn.Linear(h, (heads + 2 * kv_heads) * self.d, bias=False)
        self.proj = torch.nn.Linear(heads * self.d, h, bias=False)
        self.gate = torch.nn.Linear(h, ffn, bias=False)
        self.fc1 = torch.nn.Linear(h, ffn, bias=False)
        self.fc2 = torch.nn.Linear(ffn, h, bias=False)

    def norm(self, x, w, eps=1e-5):
        if self.aten_fused:  # ATen's own RMSNorm (one kernel on CUDA in recent PyTorch)
            return F.rms_norm(x, (x.size(-1),), w, eps)
        xf = x.float()
        return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)

    @staticmethod
    def rotary_tables(s, d, dtype, device, theta=500000.0):
        inv = torch.pow(theta, torch.arange(0, d, 2, device=device, dtype=torch.float32) / d).reciprocal()
        freqs = torch.outer(torch.arange(s, device=device, dtype=torch.float32), inv)
        emb = torch.cat([freqs, freqs], -1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def rotary(self, x):
        s, d = x.size(-2), x.size(-1)
        if self.aten_fused:
            # The cos and sin tables built once per (sequence, head dim, dtype), as frameworks do.
            key = (s, d, x.dtype, x.device)
            if key not in self.tables:
                with torch.no_grad():
                    self.tables[key] = self.rotary_tables(s, d, x.dtype, x.device)
            cos, sin = self.tables[key]
        else:  # per call, as profiler/gpt.cc's block
            cos, sin = self.rotary_tables(s, d, x.dtype, x.device)
        rotated = torch.cat([-x.narrow(-1, d // 2, d // 2), x.narrow(-1, 0, d // 2)], -1)
        return x * cos + rotated * sin

    def forward(self, x):
        b, s, _ = x.shape
        group = self.heads // self.kv
        qkv = self.qkv(self.norm(x, self.ln1)).view(b, s, self.kv, group + 2, self.d)
        q = qkv.narrow(3, 0, group).reshape(b, s, self.heads, self.d).transpose(1, 2)
        k = qkv.select(3, group).transpose(1, 2)
        v = qkv.select(3, group + 1).transpose(1, 2)
        q, k = self.rotary(q), self.rotary(k)
        if self.aten_fused:  # GQA inside SDPA, no repeated keys and values
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=group > 1)
        else:
            if group > 1:
                k = k.repeat_interleave(group, 1)
                v = v.repeat_interleave(group, 1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, self.heads * self.d)
        h1 = x + self.proj(y)
        z = self.norm(h1, self.ln2)
        return h1 + self.fc2(F.silu(self.gate(z)) * self.fc1(z))


def kind(name):
    n = name.lower()
    if any(k in n for k in ("flash", "fmha", "attention", "sdpa", "cudnn")):
        return "attention"
    if any(k in n for k in ("gemm", "cutlass", "nvjet", "xmma", "cublas", "sm90_", "sm80_", "matmul")):
        return "gemm"
    return "other"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--hidden", type=int, default=8192)
    ap.add_argument("--ffn", type=int, default=28672)
    ap.add_argument("--heads", type=int, default=64)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--bs", default="1,2,4")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--sms", type=int, default=0)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--idle-ms", type=float, default=0)
    ap.add_argument("--aten-fused", action="store_true")
    a = ap.parse_args()
    dev = torch.device("cuda")
    where = on_sms(a.sms)
    torch.manual_seed(0)
    block = Block(a.hidden, a.ffn, a.heads, a.kv_heads, a.aten_fused).to(dev, torch.bfloat16)
    flops_per_token = 6 * sum(p.numel() for p in block.parameters())  # forward + backward of the matmuls
    model = torch.compile(block) if a.compile else block
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "shape": vars(a), "compiled": a.compile, "runs": []}
    for bs in [int(x) for x in a.bs.split(",")]:
        x = torch.randn(bs, a.seq, a.hidden, device=dev, dtype=torch.bfloat16, requires_grad=True)

        def step():
            with where:
                y = model(x)
                y.backward(torch.ones_like(y))

        for _ in range(3):
            step()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with where:
            start.record()
        for _ in range(a.iters):
            step()
        with where:
            end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / a.iters
        boost = None
        if a.idle_ms > 0:
            # The forward and the backward each timed alone after idle_ms of idle (boost clocks, where the
            # op is shorter than the GPU's power-cap onset): medians over the iterations.
            fwd, bwd = [], []
            for _ in range(a.iters):
                ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
                torch.cuda.synchronize()
                time.sleep(a.idle_ms / 1e3)
                with where:
                    ev[0].record()
                    y = model(x)
                    ev[1].record()
                torch.cuda.synchronize()
                time.sleep(a.idle_ms / 1e3)
                with where:
                    ev[2].record()
                    y.backward(torch.ones_like(y))
                    ev[3].record()
                torch.cuda.synchronize()
                fwd.append(ev[0].elapsed_time(ev[1]))
                bwd.append(ev[2].elapsed_time(ev[3]))
            boost = {"forward_ms": sorted(fwd)[len(fwd) // 2], "backward_ms": sorted(bwd)[len(bwd) // 2]}
            boost["block_ms"] = boost["forward_ms"] + boost["backward_ms"]
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(a.iters):
                step()
            torch.cuda.synchronize()
        shares = {"gemm": 0.0, "attention": 0.0, "other": 0.0}
        kernels = {}
        for e in prof.key_averages():
            t = getattr(e, "self_device_time_total", None)
            if t is None:
                t = getattr(e, "self_cuda_time_total", 0.0)
            if t <= 0:
                continue
            shares[kind(e.key)] += t
            kernels[e.key] = kernels.get(e.key, 0.0) + t
        total = sum(shares.values())
        frac = {k: v / total for k, v in shares.items()}
        predicted = (frac["gemm"] + frac["attention"]) * 3.00 + frac["other"] * 1.55
        top = sorted(kernels.items(), key=lambda kv: -kv[1])[:12]
        run = {"bs": bs, "sms": a.sms, "compiled": a.compile, "block_ms": ms, "kind_ms": {k: v / 1e3 / a.iters for k, v in shares.items()}, "tflops": flops_per_token * bs * a.seq / ms / 1e9,
               "kernel_ms": total / 1e3 / a.iters, "share": frac,
               "predicted_33sm_slowdown": predicted,
               "top_kernels": [{"name": k[:120], "ms": v / 1e3 / a.iters, "kind": kind(k)} for k, v in top]}
        if boost:
            run["boost"] = boost
            print(f"bs {bs}: forward and backward each after {a.idle_ms:g} ms idle: {boost['forward_ms']:.2f} + "
                  f"{boost['backward_ms']:.2f} = {boost['block_ms']:.2f} ms (back to back: {ms:.2f} ms)", flush=True)
        result["runs"].append(run)
        print(f"bs {bs}: block {ms:.2f} ms, kernels {run['kernel_ms']:.2f} ms; gemm {frac['gemm']:.1%}, "
              f"attention {frac['attention']:.1%}, other {frac['other']:.1%}; "
              f"predicted 33-SM slowdown {predicted:.2f}x", flush=True)
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
