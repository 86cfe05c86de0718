#!/usr/bin/env python3
"""Plain PyTorch training of the model `hetplan replay` builds, as the baseline
of scripts/gpu_throughput_check.sh.

The model is the ModelShape replay builds (profiler/gpt.h): GPT-2 blocks
(LayerNorm, biases, learned positions, tanh-GELU MLP, tied embeddings) or
Llama blocks (RMSNorm in fp32, RoPE in Hugging Face's layout, grouped-query
attention, SwiGLU, untied head); causal attention by
F.scaled_dot_product_attention; the loss is cross-entropy in fp32; no dropout
(replay has none). Training is what a PyTorch user writes: fp32 parameters,
torch.autocast(bfloat16), torch.optim.AdamW(fused=True) (weight_decay 0, so
the update is replay's Adam), gradient accumulation over the micro-batches.

  plain_pytorch_train.py --shape gpt --emit-plan plan.json [--emit-hf-config config.json]
      writes the single-GPU plan (and, for llama, the config.json) replay runs
  plain_pytorch_train.py --shape gpt --out plain.json
      trains and writes tokens/s and the median iteration time
"""
import argparse
import json
import math
import statistics
import time

SHAPES = {
    # The held-out GPT of the validation (hidden 2048, 24 blocks, sequence 2048).
    "gpt": dict(family="gpt2", vocab=50304, hidden=2048, blocks=24, heads=16, kv_heads=16, ffn=8192, seq=2048,
                tied=True, eps=1e-5),
    # A Llama-family shape: GQA 16/8, SwiGLU, RMSNorm, RoPE, untied.
    "llama": dict(family="llama", vocab=32000, hidden=2048, blocks=16, heads=16, kv_heads=8, ffn=5632, seq=2048,
                  tied=False, eps=1e-5, theta=10000.0),
}


def emit(args, s):
    plan = {
        "node_sequence": ["GPU"], "device_groups": [1], "strategies": [[1, 1]], "batches": args.accum,
        "layer_partition": [0, s["blocks"] + 2], "gbs": args.micro_batch * args.accum, "cost": 0.0,
        "model": {"model_name": args.shape, "num_layers": s["blocks"] + 2, "hidden_size": s["hidden"],
                  "sequence_length": s["seq"], "vocab_size": s["vocab"], "attention_heads": s["heads"]},
    }
    json.dump(plan, open(args.emit_plan, "w"), indent=1)
    if s["family"] == "llama":
        if not args.emit_hf_config:
            raise SystemExit("--emit-hf-config: required for a llama shape")
        cfg = {"model_type": "llama", "vocab_size": s["vocab"], "hidden_size": s["hidden"],
               "num_hidden_layers": s["blocks"], "num_attention_heads": s["heads"],
               "num_key_value_heads": s["kv_heads"], "intermediate_size": s["ffn"],
               "max_position_embeddings": s["seq"], "rms_norm_eps": s["eps"], "rope_theta": s["theta"],
               "tie_word_embeddings": s["tied"], "hidden_act": "silu"}
        json.dump(cfg, open(args.emit_hf_config, "w"), indent=1)


def train(args, s):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = torch.device("cuda")
    llama = s["family"] == "llama"
    h, nh, nkv, hd = s["hidden"], s["heads"], s["kv_heads"], s["hidden"] // s["heads"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(h))

        def forward(self, x):
            xf = x.float()
            return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + s["eps"])).to(x.dtype)

    def norm():
        return RMSNorm() if llama else nn.LayerNorm(h, eps=s["eps"])

    def rotary(x):
        d, n = x.size(-1), x.size(-2)
        inv = 1.0 / (s["theta"] ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
        f = torch.outer(torch.arange(n, device=x.device, dtype=torch.float32), inv)
        e = torch.cat([f, f], -1)
        cos, sin = e.cos().to(x.dtype), e.sin().to(x.dtype)
        rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
        return x * cos + rot * sin

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = norm(), norm()
            bias = not llama
            self.qkv = nn.Linear(h, (nh + 2 * nkv) * hd, bias=bias)
            self.proj = nn.Linear(nh * hd, h, bias=bias)
            if llama:
                self.gate = nn.Linear(h, s["ffn"], bias=False)
            self.fc1 = nn.Linear(h, s["ffn"], bias=bias)
            self.fc2 = nn.Linear(s["ffn"], h, bias=bias)

        def forward(self, x):
            b, n, _ = x.shape
            g = nh // nkv
            qkv = self.qkv(self.ln1(x)).view(b, n, nkv, g + 2, hd)
            q = qkv[:, :, :, :g].reshape(b, n, nh, hd).transpose(1, 2)
            k = qkv[:, :, :, g].transpose(1, 2)
            v = qkv[:, :, :, g + 1].transpose(1, 2)
            if llama:
                q, k = rotary(q), rotary(k)
            if g > 1:
                k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, n, nh * hd)
            x = x + self.proj(y)
            z = self.ln2(x)
            if llama:
                return x + self.fc2(F.silu(self.gate(z)) * self.fc1(z))
            return x + self.fc2(F.gelu(self.fc1(z), approximate="tanh"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(s["vocab"], h)
            self.wpe = None if llama else nn.Parameter(torch.randn(s["seq"], h) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(s["blocks"]))
            self.ln_f = norm()
            self.head = None if s["tied"] else nn.Parameter(torch.randn(s["vocab"], h) * 0.02)

        def forward(self, ids, targets):
            x = self.wte(ids)
            if self.wpe is not None:
                x = x + self.wpe[: ids.size(1)]
            for blk in self.blocks:
                x = blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight if self.head is None else self.head)
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    model = Model().to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    mb, m, n = args.micro_batch, args.accum, s["seq"]
    steps = args.warmup + args.iters
    data = [(torch.randint(s["vocab"], (m, mb, n), device=dev), torch.randint(s["vocab"], (m, mb, n), device=dev))
            for _ in range(min(steps, 4))]
    times, losses = [], []
    for step in range(steps):
        ids, tgt = data[step % len(data)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        total = 0.0
        for j in range(m):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids[j], tgt[j]) / m
            loss.backward()
            total = total + loss.detach()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
            losses.append(float(total))
    med = statistics.median(times)
    tokens = mb * m * n
    out = {"shape": args.shape, "family": s["family"], "parameters": params, "micro_batch": mb, "micro_batches": m,
           "gbs": mb * m, "seq": n, "iteration_ms": {"median": med, "all": times}, "tokens_per_s": tokens / (med * 1e-3),
           "peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
           "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20, "losses": losses,
           "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "setup": "fp32 params, autocast bf16, SDPA, AdamW(fused=True, weight_decay=0), eager"}
    json.dump(out, open(args.out, "w"), indent=1)
    print(f"plain pytorch {args.shape}: {params / 1e6:.1f}M params, median {med:.1f} ms, "
          f"{out['tokens_per_s']:.0f} tokens/s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="gpt")
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--accum", type=int, default=2, help="micro-batches per step (the plan's batches)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--emit-plan")
    ap.add_argument("--emit-hf-config")
    ap.add_argument("--out", default="plain.json")
    args = ap.parse_args()
    s = SHAPES[args.shape]
    if args.emit_plan:
        emit(args, s)
    else:
        train(args, s)


if __name__ == "__main__":
    main()
