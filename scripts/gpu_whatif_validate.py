#!/usr/bin/env python3
"""`hetplan whatif` against plain PyTorch, measured side by side on one machine (issue 32, item 6).

The predictions are written and committed BEFORE anything is measured
(scripts/whatif_validate_predict.sh -> scripts/validation/whatif/predictions_<GPU>.json);
this script only measures, and `summary` compares.

  gpu_whatif_validate.py train --mode single|offload --cases mb1-ckpt0,mb4-ckpt1 --out DIR
  torchrun --nproc-per-node 2 gpu_whatif_validate.py train --mode ddp|fsdp2 --cases ... --out DIR
  gpu_whatif_validate.py decode --runtimes eager,graphs --out DIR
  torchrun --nproc-per-node 2 gpu_whatif_validate.py memory-census --out DIR   (DDP's, FSDP2's memory by phase)
  gpu_whatif_validate.py kernels --cases mb1-ckpt0,mb4-ckpt0 --out DIR   (one profiled single-GPU step per case)
  gpu_whatif_validate.py summary --pred scripts/validation/whatif/predictions_H100.json --meas DIR --out summary.md
  gpu_whatif_validate.py summary --pred-dir DIR/reprobe --meas DIR --out summary_reprobe.md
  train/decode --reprobe-dir DIR/reprobe --reprobe-probe host_probe_micro.json --reprobe-gpu H100 --reprobe-log LOG:
      around each case a short host probe (class Reprobe), the case's prediction written first with the host's
      speed then (whatif --host-speed), and the probe again after it (the host's drift over the case)

Training: the held-out GPT of scripts/plain_pytorch_train.py (GPT-2 blocks, hidden 2048, 24 blocks,
16 heads, ffn 8192, vocab 50304, sequence 2048, tied embeddings, learned positions; ~1.3B parameters),
written as a PyTorch user writes it: fp32 parameters, torch.autocast(bfloat16), SDPA (fused attention),
AdamW(fused=True), no dropout. Modes:
  single  one GPU;
  ddp     DistributedDataParallel over the ranks (bucket_cap_mb 25, gradient_as_bucket_view False: defaults);
  fsdp2   torch.distributed.fsdp.fully_shard per block and at the root, MixedPrecisionPolicy(bf16 params,
          fp32 reduce), fp32 sharded parameters and AdamW states;
  offload CPU-offloaded Adam on one GPU, the way ZeRO-Offload (DeepSpeed ZeRO-2, offload_optimizer cpu,
          pin_memory, one rank) does it: 16-bit (bf16) parameters on the GPU; during the backward each
          gradient is copied into a flat 16-bit bucket of reduce_bucket_size elements (5e8, DeepSpeed's
          default) which, when full and at the end, is copied non-blocking to a pinned fp32 host buffer
          (converted on the GPU); after the backward the fp32 master weights and Adam states on the host are
          updated by torch's CPU AdamW (fused where this torch has it, else foreach), cast to bf16 on the
          host and copied to the GPU.
Checkpointing (ckpt1): torch.utils.checkpoint around every block (use_reentrant=False).
Recorded per case: median time per iteration (after warm-up) and torch.cuda.max_memory_allocated of
rank 0 (the caching allocator's peak over the run, without the CUDA context), and max_memory_reserved.
Diagnoses besides (they change neither figure): the time at which the host had issued each step
(host_issue_ms), and the allocator's peak of each step (peak_allocated_bytes_per_step: DDP's bucket rebuild
happens in the second step; its max is the run's peak).

Decode: a Llama-3.2-3B-shaped decoder (tests/data/hf/llama-3.2-3b.json: hidden 3072, 28 blocks, 24 heads,
8 KV heads, ffn 8192, vocab 128256, tied), bf16 weights (random), batch 1, prompt 512, 128 new tokens,
greedy; each block written op for op as Hugging Face transformers' eager LlamaDecoderLayer (fp32 RMSNorm,
rotate_half RoPE, repeat_kv, SDPA with a mask over a static KV cache of prompt + output). "eager" runs
the decode step as Python issues it; "graphs" captures the same step once in a CUDA graph and replays it
per token. Recorded: ms per generated token (decode only: the 128 steps after the prefill) and the peak
allocated bytes.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import host_pinning  # noqa: E402

# The CPU dry run (scripts/gpu_whatif_validate_dryrun.sh): a folder of recorded train_<mode>.json/decode.json that
# `train` and `decode` return instead of measuring, with the re-probe (class Reprobe) and its predictions real.
DRYRUN = os.environ.get("WHATIF_VALIDATE_DRYRUN", "")
PINNED = {}  # what scripts/host_pinning.py set for this process (main)

GPT = dict(vocab=50304, hidden=2048, blocks=24, heads=16, ffn=8192, seq=2048, eps=1e-5)
LLAMA3B = dict(vocab=128256, hidden=3072, blocks=28, heads=24, kv_heads=8, head_dim=128, ffn=8192, eps=1e-5,
               theta=500000.0)


def parse_cases(s):
    out = []
    for c in s.split(","):
        mb, ck = c.split("-")
        out.append((c, int(mb[2:]), ck == "ckpt1"))
    return out


# ------------------------------------------------------------------ training

def gpt_model(ckpt):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint

    s = GPT
    h, nh = s["hidden"], s["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h, eps=s["eps"]), nn.LayerNorm(h, eps=s["eps"])
            self.qkv = nn.Linear(h, 3 * h)
            self.proj = nn.Linear(h, h)
            self.fc1 = nn.Linear(h, s["ffn"])
            self.fc2 = nn.Linear(s["ffn"], h)

        def forward(self, x):
            b, n, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, nh, h // nh).unbind(2)
            y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, n, h))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(s["vocab"], h)
            self.wpe = nn.Parameter(torch.randn(s["seq"], h) * 0.02)
            self.blocks = nn.ModuleList(Block() for _ in range(s["blocks"]))
            self.ln_f = nn.LayerNorm(h, eps=s["eps"])

        def forward(self, ids, targets):
            x = self.wte(ids) + self.wpe[: ids.size(1)]
            for blk in self.blocks:
                x = checkpoint(blk, x, use_reentrant=False) if ckpt else blk(x)
            logits = F.linear(self.ln_f(x), self.wte.weight)
            return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.view(-1))

    return Model()


class OffloadAdam:
    """ZeRO-Offload's optimizer path on one rank (see the module docstring)."""

    def __init__(self, model, bucket_elems=int(5e8)):
        import torch
        self.torch = torch
        self.params = [p for p in model.parameters() if p.requires_grad]
        n = sum(p.numel() for p in self.params)
        self.master = torch.empty(n, dtype=torch.float32, pin_memory=True)
        self.grad = torch.zeros(n, dtype=torch.float32, pin_memory=True)
        self.offsets, off = {}, 0
        for p in self.params:
            self.master[off:off + p.numel()].copy_(p.detach().float().view(-1).cpu())
            self.offsets[p] = off
            off += p.numel()
        self.master_p = torch.nn.Parameter(self.master, requires_grad=False)
        self.master_p.grad = self.grad
        try:
            self.opt = torch.optim.AdamW([self.master_p], lr=1e-4, weight_decay=0.0, fused=True)
            self.opt_kind = "AdamW(fused=True) on CPU"
        except Exception:
            self.opt = torch.optim.AdamW([self.master_p], lr=1e-4, weight_decay=0.0, foreach=True)
            self.opt_kind = "AdamW(foreach=True) on CPU"
        self.bucket = torch.empty(min(bucket_elems, n), dtype=torch.bfloat16, device="cuda")
        self.bucket_elems = self.bucket.numel()
        self.fill, self.pending = 0, []  # (bucket offset, host offset, numel)
        # Diagnosis only (host clocks around what the step does anyway; no synchronisation added): the host's
        # waits for the gradient copies during the backward, and the step's phases (offload_phases_ms).
        self.wait_in_backward_ms, self.last_phases = 0.0, {}
        self.bf16_host = torch.empty(n, dtype=torch.bfloat16, pin_memory=True)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self._hook)

    def _flush(self):
        for b_off, h_off, numel in self.pending:
            # non_blocking cross-device copy with a dtype change: converted on the GPU (ATen Copy.cu).
            self.grad[h_off:h_off + numel].copy_(self.bucket[b_off:b_off + numel], non_blocking=True)
        self.pending, self.fill = [], 0
        t0 = time.perf_counter()
        self.torch.cuda.current_stream().synchronize()  # the bucket is reused
        self.wait_in_backward_ms += (time.perf_counter() - t0) * 1e3

    def _hook(self, p):
        numel = p.numel()
        if self.fill + numel > self.bucket_elems:
            self._flush()
        g = p.grad.detach().view(-1)
        if numel > self.bucket_elems:  # larger than a bucket: straight from the gradient
            self.grad[self.offsets[p]:self.offsets[p] + numel].copy_(g, non_blocking=True)
            t0 = time.perf_counter()
            self.torch.cuda.current_stream().synchronize()
            self.wait_in_backward_ms += (time.perf_counter() - t0) * 1e3
        else:
            self.bucket[self.fill:self.fill + numel].copy_(g)
            self.pending.append((self.fill, self.offsets[p], numel))
            self.fill += numel
        p.grad = None

    def step(self):
        in_backward = self.wait_in_backward_ms
        t0 = time.perf_counter()
        self._flush()  # the last bucket: the host waits for the backward's end and this bucket's copy
        t1 = time.perf_counter()
        try:
            self.opt.step()
        except RuntimeError:  # a torch without the fused CPU kernel for this case
            self.opt = self.torch.optim.AdamW([self.master_p], lr=1e-4, weight_decay=0.0, foreach=True)
            self.opt_kind = "AdamW(foreach=True) on CPU"
            self.opt.step()
        t2 = time.perf_counter()
        self.bf16_host.copy_(self.master)  # the cast on the host
        t3 = time.perf_counter()
        with self.torch.no_grad():  # the updated 16-bit weights back, parameter by parameter (no GPU temporary)
            for p in self.params:
                o = self.offsets[p]
                p.copy_(self.bf16_host[o:o + p.numel()].view_as(p), non_blocking=True)
        t4 = time.perf_counter()
        self.last_phases = {"wait_in_backward_ms": in_backward, "last_flush_ms": (t1 - t0) * 1e3,
                            "cpu_adam_ms": (t2 - t1) * 1e3, "cpu_cast_ms": (t3 - t2) * 1e3,
                            "h2d_issue_ms": (t4 - t3) * 1e3}
        self.wait_in_backward_ms = 0.0


# ------------------------------------------------------------------ the host's speed, re-probed around each case

TINY_GPT = dict(vocab=512, hidden=64, blocks=24, heads=2, ffn=256, seq=64)  # scripts/gpu_host_probe.py's tiny GPT
TINY_LLAMA = dict(LLAMA3B, vocab=512, hidden=64, blocks=28, heads=4, kv_heads=2, head_dim=16, ffn=128)


def host_speed_index(kind):
    """A short host probe (about 1 s; 3 s for decode) measuring exactly a figure of the full probe
    (scripts/gpu_host_probe.py micro) with the same code, so that their ratio is the host's speed now against then.
    "train": the tiny GPT's whole step (the validation's GPT code at width 64, 24 blocks, autocast, fused AdamW,
    zero_grad), host ms per step issued, median of 3 loops of 5 steps after 2 (the probe's
    tiny_gpt_step.blocks24_ckpt0.step_host_ms). "decode": the tiny eager decode (hf_llama_decoder, 28 layers),
    ms per token over 32 tokens, median of 2 after 1 (the probe's decode.layers28.token_wall_us / 1000)."""
    import torch
    import torch.nn.functional as F
    dev = torch.device("cuda")
    torch.manual_seed(0)
    if kind == "decode":
        step, _ = hf_llama_decoder(torch, F, dev, TINY_LLAMA, 96)
        tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
        pos = torch.full((1,), 32, dtype=torch.long, device=dev)
        per = []
        with torch.no_grad():
            for rep in range(3):
                pos.fill_(32)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(32):
                    step(tok, pos)
                torch.cuda.synchronize()
                if rep > 0:
                    per.append((time.perf_counter() - t0) * 1e3 / 32)
        del step
        return statistics.median(per)
    saved = dict(GPT)
    GPT.update(TINY_GPT)
    try:
        with torch.device(dev):
            model = gpt_model(False)
    finally:
        GPT.clear()
        GPT.update(saved)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
    ids = torch.randint(TINY_GPT["vocab"], (1, TINY_GPT["seq"]), device=dev)
    tgt = torch.randint(TINY_GPT["vocab"], (1, TINY_GPT["seq"]), device=dev)

    def whole():
        amp_train_step(torch, model, opt, ids, tgt)
    for _ in range(2):
        whole()
    per = []
    for _ in range(3):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(5):
            whole()
        per.append((time.perf_counter() - t0) * 1e3 / 5)
        torch.cuda.synchronize()
    del model, opt
    return statistics.median(per)


def amp_train_step(torch, model, opt, ids, tgt):
    """One training step under bf16 autocast: forward, backward, optimizer step, gradients set to None."""
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(ids, tgt)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def release_previous_case(torch):
    """Free what an earlier case in this process left behind, before the next case's set-up and peak window.
    `del model, opt` is not enough: FSDP2's modules (and DDP's reducer, the offload optimizer's grad hooks) sit in
    reference cycles that only the cycle collector frees, so without gc.collect() their parameters, gradients and
    optimizer states stay allocated into the next case and raise its allocator peak (run 6: every FSDP2 case after
    the first started ~2.45 GiB higher). empty_cache() then returns the freed blocks, so each case starts as a fresh
    process would (the CUDA context and the NCCL communicators, kept outside the allocator, stay)."""
    import gc
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def utc_now():
    import datetime
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="milliseconds")


class Reprobe:
    """Around each case (--reprobe-dir): rank 0 re-probes the host's speed (host_speed_index), writes the case's
    prediction with whatif --host-speed <now / the full probe's> into DIR/<case>.json and appends its UTC time and
    sha256 to the predictions log, all BEFORE the case is built or measured; after the case, the same short probe
    again. The after/before ratio shows a host whose speed moved during the case."""

    def __init__(self, args, rank):
        self.args, self.rank = args, rank
        self.ref = {}
        self.calls = 0
        if rank == 0:
            micro = json.load(open(args.reprobe_probe))
            self.ref = {"train": micro["tiny_gpt_step"]["blocks24_ckpt0"]["step_host_ms"],
                        "decode": micro["decode"]["layers28"]["token_wall_us"] / 1e3}
            os.makedirs(args.reprobe_dir, exist_ok=True)

    def _barrier(self):
        if DRYRUN:
            return
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.barrier()

    def _index(self, kind):
        self.calls += 1
        if DRYRUN:  # the CPU dry run (scripts/gpu_whatif_validate_dryrun.sh): the host 5% slower, then 10%
            return self.ref[kind] * (1.05 if self.calls % 2 else 1.10)
        return host_speed_index(kind)

    def before(self, key, kind):
        rec = {}
        if self.rank == 0:
            import hashlib
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import whatif_validate_predict as wp
            idx = self._index(kind)
            speed = idx / self.ref[kind]
            pred = wp.predict_case(self.args.reprobe_bin, self.args.reprobe_gpu, wp.case_by_key(key),
                                   profiles=self.args.reprobe_profiles, host_probe=self.args.reprobe_probe,
                                   host_speed=speed)
            rec = {"key": key, "written_utc": utc_now(), "probe_kind": kind, "probe_ms": idx,
                   "probe_ms_full_probe": self.ref[kind], "host_speed": speed, "commit": wp.commit_id(),
                   "host_probe": self.args.reprobe_probe, "prediction": pred}
            path = os.path.join(self.args.reprobe_dir, f"{key}.json")
            json.dump(rec, open(path, "w"), indent=1)
            sha = hashlib.sha256(open(path, "rb").read()).hexdigest()
            line = (f"{rec['written_utc']} {key}: host re-probed x{speed:.3f} of the full probe ({kind} {idx:.2f} ms), "
                    f"prediction {pred['time_ms']:.2f} ms {pred['allocated_bytes'] / 2**30:.2f} GiB written before "
                    f"measuring: sha256 {sha}  {path}")
            with open(self.args.reprobe_log, "a") as f:
                f.write(line + "\n")
            print(line, flush=True)
        self._barrier()
        return rec

    def after(self, kind, res, rec):
        self._barrier()
        if self.rank == 0:
            idx = self._index(kind)
            res.update({"reprobe_written_utc": rec["written_utc"], "host_speed_before": rec["host_speed"],
                        "host_speed_after": idx / self.ref[kind], "host_drift": idx / rec["probe_ms"]})
            print(f"  host drift over the case: x{res['host_drift']:.3f} (after/before)", flush=True)
        self._barrier()


def dry_run(args, recorded, keys):
    """DRYRUN: the recorded results of `keys` in order, each between its re-probe's before and after."""
    rp = Reprobe(args, 0) if args.reprobe_dir else None
    by_key = {result_key(r): r for r in json.load(open(os.path.join(DRYRUN, recorded)))}
    out = []
    for key in keys:
        rec = rp.before(key, "decode" if key.startswith("decode") else "train") if rp else {}
        res = dict(by_key[key], measure_start_utc=utc_now(), host_pin=PINNED)
        if rp:
            rp.after("decode" if key.startswith("decode") else "train", res, rec)
        out.append(res)
    write_merged(os.path.join(args.out, recorded), out)


def result_key(r):
    return f"decode-{r['runtime']}" if "runtime" in r else f"{r['mode']}-{r['case']}"


def write_merged(path, results):
    """Writes `results` into the JSON list at `path`, replacing the entries of the same cases: gpu_whatif_validate.sh
    runs each training case in its own process (as a user's job is), and each adds its entry to its mode's file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    done = {result_key(r) for r in results}
    earlier = json.load(open(path)) if os.path.exists(path) else []
    json.dump([r for r in earlier if result_key(r) not in done] + results, open(path, "w"), indent=1)


def train(args):
    if DRYRUN:
        return dry_run(args, f"train_{args.mode}.json", [f"{args.mode}-{c[0]}" for c in parse_cases(args.cases)])
    import torch
    import torch.distributed as dist

    rank, world = 0, 1
    if args.mode in ("ddp", "fsdp2"):
        dist.init_process_group("nccl")
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    else:
        torch.cuda.set_device(0)
    dev = torch.device("cuda")
    results = []
    rp = Reprobe(args, rank) if args.reprobe_dir else None
    for name, mb, ckpt in parse_cases(args.cases):
        rec = rp.before(f"{args.mode}-{name}", "train") if rp else {}
        torch.manual_seed(0)
        release_previous_case(torch)
        with torch.device(dev):
            model = gpt_model(ckpt)
        params = sum(p.numel() for p in model.parameters())
        # Diagnosis only (a host-side read of the allocator's counter, no sync): the bytes allocated when the host
        # enters the first block of each step's forward -- after DDP's pre-forward, where it rebuilds its buckets
        # in the second step -- and when the forward and the backward have been issued: whether DDP's old buckets
        # are still allocated at each (sim/runtime_overheads.md, DDP).
        at_first_block = []

        def first_block_mark(mod, a):
            if len(at_first_block) == len(step_peaks):  # once a step: not the checkpointed block's recompute
                at_first_block.append(torch.cuda.memory_allocated())
        mark_hook = model.blocks[0].register_forward_pre_hook(first_block_mark)
        after_forward, after_backward = [], []
        autocast = True
        if args.mode == "offload":
            model = model.to(dtype=torch.bfloat16)
            opt = OffloadAdam(model)
            autocast = False
        elif args.mode == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP
            model = DDP(model, device_ids=[torch.cuda.current_device()])
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
        elif args.mode == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for blk in model.blocks:
                fully_shard(blk, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
            autocast = False  # FSDP2's mixed precision casts the parameters
        else:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
        n = GPT["seq"]
        ids = torch.randint(GPT["vocab"], (mb, n), device=dev)
        tgt = torch.randint(GPT["vocab"], (mb, n), device=dev)
        times, issue, step_peaks, step_reserved, phases = [], [], [], [], []
        opt_kind = "AdamW(fused=True)"
        steps = args.warmup + args.iters
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()  # after the set-up: the training's peak, not the initialisation's
        measure_start = utc_now()
        for step in range(steps):
            if world > 1:
                dist.barrier()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            if autocast:
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    loss = model(ids, tgt)
            else:
                loss = model(ids, tgt)
            after_forward.append(torch.cuda.memory_allocated())
            loss.backward()
            after_backward.append(torch.cuda.memory_allocated())
            try:
                opt.step()
            except (RuntimeError, NotImplementedError) as e:  # fused AdamW unsupported here (DTensor, ...)
                if args.mode == "offload" or step > 0:
                    raise
                print(f"fused AdamW failed ({e!r:.200}); foreach AdamW instead", flush=True)
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, foreach=True)
                opt_kind = "AdamW(foreach=True)"
                opt.step()
            if args.mode != "offload":
                opt.zero_grad(set_to_none=True)
            t_issued = time.perf_counter()  # the host has issued the step (the GPU may still be working)
            torch.cuda.synchronize()
            if step >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
                issue.append((t_issued - t0) * 1e3)
                if args.mode == "offload":  # the host-to-device copies still running after the host issued them
                    phases.append(dict(opt.last_phases, h2d_after_issue_ms=times[-1] - issue[-1]))
            # Diagnosis only (outside the timed span): this step's allocator peak, then a fresh window; the run's
            # peak, which the summary compares, is the largest of them (the same figure as one window over the run).
            step_peaks.append(torch.cuda.max_memory_allocated())
            step_reserved.append(torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()
        res = {"mode": args.mode, "case": name, "micro_batch": mb, "ckpt": ckpt, "ranks": world,
               "parameters": params, "step_ms": statistics.median(times), "step_ms_all": times,
               # When the host finished issuing each timed step: near step_ms where the host is the bottleneck
               # (or the launch queue is full), well below it where the GPU is.
               "host_issue_ms": statistics.median(issue), "host_issue_ms_all": issue,
               "peak_allocated_bytes": max(step_peaks),
               "peak_allocated_bytes_per_step": step_peaks,
               # host-time reads (no sync): entering the first block, the forward issued, the backward issued
               "allocated_bytes_at_first_block_per_step": at_first_block,
               "allocated_bytes_after_forward_per_step": after_forward,
               "allocated_bytes_after_backward_per_step": after_backward,
               "peak_reserved_bytes": max(step_reserved),
               "device": torch.cuda.get_device_name(), "torch": torch.__version__, "measure_start_utc": measure_start}
        res["optimizer"] = opt.opt_kind if args.mode == "offload" else opt_kind
        res["host_pin"] = PINNED
        if args.mode == "offload":
            res["cpu_threads"] = torch.get_num_threads()
            # Diagnosis only: the median of each phase over the timed steps (host clocks, OffloadAdam.step).
            if phases:
                res["offload_phases_ms"] = {k: statistics.median(ph[k] for ph in phases) for k in phases[0]}
                res["offload_phases_ms_all"] = phases
        if rank == 0:
            print(f"{args.mode} {name}: {res['step_ms']:.1f} ms, peak allocated "
                  f"{res['peak_allocated_bytes'] / 2**30:.2f} GiB", flush=True)
            results.append(res)
        mark_hook.remove()
        del model, opt, loss, ids, tgt
        release_previous_case(torch)
        if rp:
            rp.after("train", res, rec)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        write_merged(os.path.join(args.out, f"train_{args.mode}.json"), results)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


# ------------------------------------------------------------------ DDP memory census

def kernels(args):
    """Diagnosis only, in its own process after every timed case (a profiler session can leave CUPTI's callbacks
    behind and slow the launches of what follows in its process): per single-GPU case, 3 steps, then one step under
    gpu_kernel_profile -> DIR/gpu_kernels_single.json (kernels by class, their summed GPU time against the wall:
    whether the step is short of kernel time or waits on the host)."""
    if DRYRUN:
        return
    import torch
    torch.cuda.set_device(0)
    dev = torch.device("cuda")
    out = {}
    for name, mb, ckpt in parse_cases(args.cases):
        torch.manual_seed(0)
        with torch.device(dev):
            model = gpt_model(ckpt)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
        ids = torch.randint(GPT["vocab"], (mb, GPT["seq"]), device=dev)
        tgt = torch.randint(GPT["vocab"], (mb, GPT["seq"]), device=dev)

        def one_step():
            amp_train_step(torch, model, opt, ids, tgt)
        for _ in range(3):
            one_step()
        out[f"single-{name}"] = gpu_kernel_profile(torch, one_step, 1)
        print(f"kernels single-{name}: {json.dumps(out[f'single-{name}'])[:300]}", flush=True)
        del model, opt, ids, tgt, one_step
        release_previous_case(torch)
    os.makedirs(args.out, exist_ok=True)
    json.dump(out, open(os.path.join(args.out, "gpu_kernels_single.json"), "w"), indent=1)


def memory_census(args):
    """Where DDP's and FSDP2's memory goes (sim/runtime_overheads.md, DDP): the validation GPT at
    micro-batch 1 without checkpointing, three steps as `train` runs them, torch.cuda.memory_allocated (and the
    peak since the previous mark) at each phase, in units of P (the parameters' fp32 bytes). "pre_forward" is
    taken inside the forward, after DDP's own pre-forward (where it rebuilds its buckets after the first
    step) and before the first block. Wrappers: none, DDP (defaults), ddp_idle (DDP, the host idle 0.5 s before
    each forward: time for ProcessGroupNCCL's watchdog to see the last step's collectives complete and drop the
    tensors it stashed for them, among them the buckets DDP's rebuild has just let go), DDP
    gradient_as_bucket_view=True, FSDP2 (as `train --mode fsdp2`)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    out = {}
    for wrap in args.wrappers.split(","):
        release_previous_case(torch)
        base = torch.cuda.memory_allocated()
        torch.manual_seed(0)
        with torch.device(dev):
            model = gpt_model(False)
        P = sum(p.numel() for p in model.parameters()) * 4
        rows = []

        def mark(label):
            torch.cuda.synchronize()
            rows.append({"at": label, "allocated_x_P": (torch.cuda.memory_allocated() - base) / P,
                         "peak_since_last_x_P": (torch.cuda.max_memory_allocated() - base) / P})
            torch.cuda.reset_peak_memory_stats()
        it = [0]
        model.blocks[0].register_forward_pre_hook(lambda m, a: mark(f"it{it[0]}_pre_forward"))
        if wrap in ("ddp", "ddp_idle"):
            model = DDP(model, device_ids=[torch.cuda.current_device()])
        elif wrap == "ddp_view":
            model = DDP(model, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)
        elif wrap == "fsdp2":
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            for blk in model.blocks:
                fully_shard(blk, mp_policy=mp)
            fully_shard(model, mp_policy=mp)
        try:
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, fused=True)
        except (RuntimeError, NotImplementedError):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, foreach=True)
        ids = torch.randint(GPT["vocab"], (1, GPT["seq"]), device=dev)
        tgt = torch.randint(GPT["vocab"], (1, GPT["seq"]), device=dev)
        torch.cuda.reset_peak_memory_stats()
        mark("init")
        for i in range(3):
            it[0] = i
            dist.barrier()
            if wrap == "ddp_idle":
                time.sleep(0.5)
                mark(f"it{i}_after_idle")
            with torch.autocast("cuda", dtype=torch.bfloat16, enabled=wrap != "fsdp2"):
                loss = model(ids, tgt)
            mark(f"it{i}_after_forward")
            loss.backward()
            mark(f"it{i}_after_backward")
            try:
                opt.step()
            except (RuntimeError, NotImplementedError):  # fused AdamW unsupported on DTensor here: as `train` does
                opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0, foreach=True)
                opt.step()
            mark(f"it{i}_after_step")
            opt.zero_grad(set_to_none=True)
            del loss
            mark(f"it{i}_after_zero_grad")
        out[wrap] = {"P_bytes": P, "rows": rows}
        if rank == 0:
            print("census", wrap, [(r["at"], round(r["allocated_x_P"], 3), round(r["peak_since_last_x_P"], 3))
                                   for r in rows], flush=True)
        del model, opt
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        json.dump(out, open(os.path.join(args.out, "memory_census.json"), "w"), indent=1)
    dist.barrier()
    dist.destroy_process_group()


# ------------------------------------------------------------------ decode

def hf_llama_decoder(torch, F, dev, s, T):
    """A Llama decoder written op for op as Hugging Face transformers' eager LlamaDecoderLayer (fp32 RMSNorm,
    rotate_half RoPE, repeat_kv, SDPA with a mask over a static KV cache of T positions), bf16 weights (random)
    of shape `s` (LLAMA3B's keys). The one copy of the decode loop: `decode` runs it at LLAMA3B's size and
    scripts/gpu_host_probe.py at a tiny width (the host's cost per op does not depend on the width).
    Returns step(tok, pos) -- one greedy decode step: the last token's logits, the argmax into `tok` [1, 1],
    pos [1] advanced -- and forward(ids [1, n], pos [n]) (writes the cache at pos; returns the last token's
    fp32 logits)."""
    h, nh, nkv, hd, L = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["blocks"]
    dt = torch.bfloat16

    def w(*shape):
        return (torch.randn(*shape, device=dev, dtype=torch.float32) * 0.02).to(dt)

    emb = w(s["vocab"], h)
    layers = [dict(ln1=torch.ones(h, device=dev, dtype=dt), ln2=torch.ones(h, device=dev, dtype=dt),
                   q=w(nh * hd, h), k=w(nkv * hd, h), v=w(nkv * hd, h), o=w(h, nh * hd),
                   gate=w(s["ffn"], h), up=w(s["ffn"], h), down=w(h, s["ffn"])) for _ in range(L)]
    ln_f = torch.ones(h, device=dev, dtype=dt)
    # Static KV cache (HF StaticCache layout): [batch, kv_heads, T, head_dim] per layer.
    kc = [torch.zeros(1, nkv, T, hd, device=dev, dtype=dt) for _ in range(L)]
    vc = [torch.zeros(1, nkv, T, hd, device=dev, dtype=dt) for _ in range(L)]
    inv = 1.0 / (s["theta"] ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))

    def rms(x, weight):  # LlamaRMSNorm
        xf = x.to(torch.float32)
        var = xf.pow(2).mean(-1, keepdim=True)
        xf = xf * torch.rsqrt(var + s["eps"])
        return weight * xf.to(dt)

    def rotate_half(x):
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def rope(pos):  # LlamaRotaryEmbedding for positions `pos` [n]
        f = pos.to(torch.float32)[:, None] * inv[None, :]
        e = torch.cat((f, f), dim=-1)
        return e.cos().to(dt)[None, None], e.sin().to(dt)[None, None]

    def repeat_kv(x, g):
        b, k, n, d = x.shape
        return x[:, :, None].expand(b, k, g, n, d).reshape(b, k * g, n, d)

    def forward(ids, pos):
        n = ids.shape[1]
        x = F.embedding(ids, emb)
        cos, sin = rope(pos)
        # The mask over the static cache: key j visible to query i iff j <= pos[i].
        mask = torch.arange(T, device=dev)[None, :] <= pos[:, None]
        for i, lw in enumerate(layers):
            r = x
            y = rms(x, lw["ln1"])
            q = F.linear(y, lw["q"]).view(1, n, nh, hd).transpose(1, 2)
            k = F.linear(y, lw["k"]).view(1, n, nkv, hd).transpose(1, 2)
            v = F.linear(y, lw["v"]).view(1, n, nkv, hd).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            kc[i].index_copy_(2, pos, k)
            vc[i].index_copy_(2, pos, v)
            kk, vv = repeat_kv(kc[i], nh // nkv), repeat_kv(vc[i], nh // nkv)
            a = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask[None, None])
            x = r + F.linear(a.transpose(1, 2).reshape(1, n, nh * hd), lw["o"])
            r = x
            y = rms(x, lw["ln2"])
            x = r + F.linear(F.silu(F.linear(y, lw["gate"])) * F.linear(y, lw["up"]), lw["down"])
        x = rms(x[:, -1:], ln_f)
        return F.linear(x, emb).float()

    def step(tok, pos):
        logits = forward(tok, pos)
        tok.copy_(logits[:, -1].argmax(-1, keepdim=True))
        pos.add_(1)

    return step, forward


def kernel_class(name):
    """Kernel classes as whatif costs them: GEMMs/GEMVs (FLOP- or bytes-bound), attention, the fused optimizer's
    multi-tensor kernels, copies/memsets, and the rest (elementwise, norms, reductions)."""
    n = name.lower()
    if "gemv" in n or "gemm" in n or "nvjet" in n or "cutlass" in n or "xmma" in n:
        return "gemm"
    if "attention" in n or "fmha" in n or "flash" in n or "sdpa" in n:
        return "attention"
    if "multi_tensor" in n or "fused_adam" in n or "fusedadam" in n:
        return "optimizer"
    if "memcpy" in n or "memset" in n:
        return "copy"
    return "other"


def gpu_kernel_profile(torch, fn, units):
    """Diagnosis only (outside every timed span): fn() once under torch.profiler (CUDA activity only; CUPTI
    reports a replayed graph's kernels one by one), per unit (a token, a step): the kernels' count and GPU time by
    class, their summed time, and the wall time (the profiler slows the host a little, so wall - kernels, the
    GPU's idle time, is an upper bound). Tells whether a step is GPU-bound (kernels ~ wall) or waits on the host."""
    try:
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            wall_us = (time.perf_counter() - t0) * 1e6
        out = {"units": units, "wall_us": wall_us / units, "classes": {}}
        total, names = 0.0, {}
        for e in prof.events():
            if not str(getattr(e, "device_type", "")).endswith("CUDA"):
                continue
            us = e.time_range.elapsed_us()  # a kernel's own span on the GPU
            if us <= 0:
                continue
            d = out["classes"].setdefault(kernel_class(e.name), {"kernels": 0, "us": 0.0})
            d["kernels"] += 1
            d["us"] += us
            total += us
            names[e.name[:60]] = names.get(e.name[:60], 0.0) + us
        for d in out["classes"].values():
            d["kernels"] /= units
            d["us"] /= units
        out["kernel_us"] = total / units
        out["idle_us"] = out["wall_us"] - out["kernel_us"]
        out["top_kernels_us"] = {k: v / units for k, v in sorted(names.items(), key=lambda kv: -kv[1])[:12]}
        return out
    except Exception as e:  # a diagnosis must never cost the measurement
        return {"error": repr(e)[:300]}


def decode(args):
    if DRYRUN:
        return dry_run(args, "decode.json", [f"decode-{r}" for r in args.runtimes.split(",")])
    import torch
    import torch.nn.functional as F

    torch.manual_seed(0)
    dev = torch.device("cuda")
    P, O = args.prompt, args.output
    T = P + O
    results = []
    dec_step, forward = hf_llama_decoder(torch, F, dev, LLAMA3B, T)

    prompt = torch.randint(LLAMA3B["vocab"], (1, P), device=dev)
    tok = torch.zeros(1, 1, dtype=torch.long, device=dev)
    pos = torch.zeros(1, dtype=torch.long, device=dev)

    def step():
        dec_step(tok, pos)

    graph = None
    rp = Reprobe(args, 0) if args.reprobe_dir else None
    for runtime in args.runtimes.split(","):
        rec = rp.before(f"decode-{runtime}", "decode") if rp else {}
        release_previous_case(torch)  # the same decoder and cache serve every runtime; only temporaries go
        torch.cuda.reset_peak_memory_stats()  # weights and cache resident; the initialisation's temporaries gone
        if runtime == "graphs" and graph is None:
            with torch.no_grad():
                forward(prompt, torch.arange(P, device=dev))
                pos.fill_(P)
                st = torch.cuda.Stream()
                st.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(st):
                    for _ in range(3):
                        step()
                torch.cuda.current_stream().wait_stream(st)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
        per_token = []
        measure_start = utc_now()
        for rep in range(args.reps + 1):
            with torch.no_grad():
                forward(prompt, torch.arange(P, device=dev))
                tok.fill_(1)
                pos.fill_(P)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(O):
                    if runtime == "graphs":
                        graph.replay()
                    else:
                        step()
                torch.cuda.synchronize()
                if rep > 0:  # the first is warm-up
                    per_token.append((time.perf_counter() - t0) * 1e3 / O)
        res = {"runtime": runtime, "batch": 1, "prompt": P, "output": O, "ms_per_token": statistics.median(per_token),
               "ms_per_token_all": per_token, "peak_allocated_bytes": torch.cuda.max_memory_allocated(),
               "peak_reserved_bytes": torch.cuda.max_memory_reserved(), "device": torch.cuda.get_device_name(),
               "torch": torch.__version__, "measure_start_utc": measure_start, "host_pin": PINNED}
        print(f"decode {runtime}: {res['ms_per_token']:.3f} ms/token, peak allocated "
              f"{res['peak_allocated_bytes'] / 2**30:.2f} GiB", flush=True)
        if rp:
            rp.after("decode", res, rec)
        results.append(res)
    os.makedirs(args.out, exist_ok=True)
    json.dump(results, open(os.path.join(args.out, "decode.json"), "w"), indent=1)
    if graph is not None:  # diagnosis only, after the figures are written: what a replay's kernels take, by class
        pos.fill_(P)  # the cache positions again from the prompt's end (replays past P + O would overrun it)
        tok.fill_(1)

        def replays(n=8):
            for _ in range(n):
                graph.replay()
        with torch.no_grad():
            prof = gpu_kernel_profile(torch, replays, 8)
        for res in results:
            if res["runtime"] == "graphs":
                res["gpu_kernels"] = prof
        json.dump(results, open(os.path.join(args.out, "decode.json"), "w"), indent=1)


# ------------------------------------------------------------------ summary

def reprobe_predictions(d):
    """The per-case predictions Reprobe wrote (DIR/<case>.json) as one prediction set."""
    recs = [json.load(open(os.path.join(d, f))) for f in sorted(os.listdir(d)) if f.endswith(".json")]
    return {"cases": [r["prediction"] for r in recs], "reprobe": {r["key"]: r for r in recs},
            "host_probe": recs[0]["host_probe"] if recs else "", "commit": recs[0]["commit"] if recs else "?"}


def summary(args):
    pred = reprobe_predictions(args.pred_dir) if args.pred_dir else json.load(open(args.pred))
    meas = []
    for f in sorted(os.listdir(args.meas)):
        if f.startswith(("train_", "decode")) and f.endswith(".json"):
            meas += json.load(open(os.path.join(args.meas, f)))
    by_key = {c["key"]: c for c in pred["cases"]}
    if args.pred_dir:
        where = (f"Predictions: {args.pred_dir}/<case>.json, each written in this run right before its case was built "
                 f"and measured (UTC time and sha256 in predictions_probe.log; hetplan {pred.get('commit', '?')}), with "
                 f"the host's costs of whatif --host-probe {pred['host_probe']} times the host's speed re-probed just "
                 "then (whatif --host-speed; columns 'host x probe' and 'drift' below).")
    else:
        where = (f"Predictions: {args.pred} (" + (f"written {pred['written_utc']} in this run" if pred.get("host_probe")
                                                  and "written_utc" in pred else "written and committed")
                 + f" before measuring; hetplan {pred.get('commit', '?')})."
                 + (f" Host-time costs: whatif --host-probe {pred['host_probe']} (this machine's probe)."
                    if pred.get("host_probe") else ""))
    lines = [f"# whatif against plain PyTorch, {args.machine or '(machine not recorded)'}", "", where,
             "Memory: whatif's per-GPU bytes without its framework constant (CUDA context, kept outside the "
             "allocator) against torch.cuda.max_memory_allocated of rank 0.", "",
             "| case | whatif row | runtime | predicted ms | measured ms | time error | predicted GiB | measured GiB | memory error |",
             "|---|---|---|---|---|---|---|---|---|"]
    t_err, m_err = [], []
    for m in meas:
        key = (f"decode-{m['runtime']}" if "runtime" in m else f"{m['mode']}-{m['case']}")
        p = by_key.get(key)
        if p is None:
            lines.append(f"| {key} | no prediction | | | {m.get('step_ms', m.get('ms_per_token')):.2f} | | | | |")
            continue
        mt = m.get("step_ms", m.get("ms_per_token"))
        mm = m["peak_allocated_bytes"] / 2**30
        te = 100 * (p["time_ms"] - mt) / mt
        me = 100 * (p["allocated_bytes"] / 2**30 - mm) / mm
        t_err.append(abs(te))
        m_err.append(abs(me))
        lines.append(f"| {key} | {p['row']} | {p['runtime']} | {p['time_ms']:.2f} | {mt:.2f} | {te:+.1f}% | "
                     f"{p['allocated_bytes'] / 2**30:.2f} | {mm:.2f} | {me:+.1f}% |")
    missing = sorted(set(by_key) - {(f"decode-{m['runtime']}" if "runtime" in m else f"{m['mode']}-{m['case']}")
                                    for m in meas})
    lines += [""]
    if t_err:
        lines.append(f"MAPE over {len(t_err)} cases: time {statistics.mean(t_err):.1f}% (goal <= 10%), "
                     f"memory {statistics.mean(m_err):.1f}% (goal <= 5%); worst time {max(t_err):.1f}%, "
                     f"worst memory {max(m_err):.1f}%")
    if missing:
        lines.append("Not measured (predicted only): " + ", ".join(missing))
    pins = sorted({f"{m.get('mode', 'decode')}: {m['host_pin']['kind']} ({len(m['host_pin']['cpus'])} cpus, "
                   f"{m['host_pin']['threads']} threads)" for m in meas if m.get("host_pin")})
    if pins:
        lines.append("Host cores (scripts/host_pinning.py; the probe's the same): " + "; ".join(pins))
    # The host's speed around each case (where re-probed): before, against the full probe (x1.20: 20% slower),
    # and its drift over the case (after/before); whether the case's own prediction was written before it ran.
    drift = [m for m in meas if "host_drift" in m]
    if drift:
        rp = pred.get("reprobe", {})
        lines += ["", "| case | host x probe before | host x probe after | drift (after/before) | "
                  "prediction written (UTC) | measuring began (UTC) | written first |", "|---|---|---|---|---|---|---|"]
        for m in drift:
            key = f"decode-{m['runtime']}" if "runtime" in m else f"{m['mode']}-{m['case']}"
            w, b = m.get("reprobe_written_utc", ""), m.get("measure_start_utc", "")
            lines.append(f"| {key} | {m['host_speed_before']:.3f} | {m['host_speed_after']:.3f} | {m['host_drift']:.3f} | "
                         f"{w} | {b} | {'yes' if w and b and w < b else 'NO'} |")
        ds = [abs(m["host_drift"] - 1) for m in drift]
        lines.append(f"\nHost drift over a case: median {100 * statistics.median(ds):.1f}%, largest {100 * max(ds):.1f}%"
                     + (f"; {sum(1 for k in rp if k not in by_key)} re-probed predictions unmatched" if rp and
                        any(k not in by_key for k in rp) else ""))
    # Diagnosis (compared with nothing): when the host had issued each step, against the step; each step's
    # allocator peak (DDP rebuilds its buckets in the second step).
    diag = [m for m in meas if "host_issue_ms" in m]
    if diag:
        lines += ["", "| case | host issued ms (median) | step ms | allocator peak per step, GiB |", "|---|---|---|---|"]
        for m in diag:
            peaks = " ".join(f"{b / 2**30:.2f}" for b in m.get("peak_allocated_bytes_per_step", []))
            lines.append(f"| {m['mode']}-{m['case']} | {m['host_issue_ms']:.1f} | {m['step_ms']:.1f} | {peaks} |")
    # Diagnosis: a profiled step's (decode: token's) kernels by class (gpu_kernel_profile), against its wall time.
    profiled = [(f"decode-{m['runtime']}", "token", m["gpu_kernels"]) for m in meas if "gpu_kernels" in m]
    kfile = os.path.join(args.meas, "gpu_kernels_single.json")
    if os.path.exists(kfile):
        profiled += [(key, "step", gk) for key, gk in json.load(open(kfile)).items()]
    for key, unit, gk in profiled:
        if "classes" in gk:
            lines.append(f"\nGPU kernels {key}, per {unit} (one profiled pass after "
                         f"the timing): wall {gk['wall_us'] / 1e3:.2f} ms, kernels {gk['kernel_us'] / 1e3:.2f} ms, "
                         f"GPU idle {gk['idle_us'] / 1e3:.2f} ms; " +
                         ", ".join(f"{c} {d['kernels']:.0f} kernels {d['us'] / 1e3:.2f} ms" for c, d in gk["classes"].items()))
    # Diagnosis: ZeRO-Offload's step phase by phase (OffloadAdam.step's host clocks, medians of the timed steps).
    for m in meas:
        if "offload_phases_ms" in m:
            lines.append(f"\nOffload phases {m['mode']}-{m['case']} (ms, median): " +
                         ", ".join(f"{k} {v:.1f}" for k, v in m["offload_phases_ms"].items()))
    open(args.out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def add_reprobe_args(p):
    p.add_argument("--reprobe-dir", default="", help="re-probe the host around each case and write its prediction "
                   "here first (class Reprobe); off when empty")
    p.add_argument("--reprobe-bin", default="build-gpu/hetplan")
    p.add_argument("--reprobe-gpu", default="")
    p.add_argument("--reprobe-probe", default="", help="the full probe's host_probe_micro.json")
    p.add_argument("--reprobe-profiles", default="",
                   help="whatif --profiles for the re-probed predictions (the fresh comm_overlap.json's folder)")
    p.add_argument("--reprobe-log", default="", help="the predictions log the UTC time and sha256 are appended to")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--mode", choices=["single", "ddp", "fsdp2", "offload"], required=True)
    t.add_argument("--cases", default="mb1-ckpt0,mb1-ckpt1,mb4-ckpt0,mb4-ckpt1")
    # 5 + 12 (were 3 + 8): the lent hosts' first seconds of a case run slower (run 5: single mb1-ckpt0's host issued
    # its timed steps in 56, 43, 72, 75, then 31-34 ms), and the median of more steps leans less on them.
    t.add_argument("--warmup", type=int, default=5)
    t.add_argument("--iters", type=int, default=12)
    t.add_argument("--out", required=True)
    add_reprobe_args(t)
    d = sub.add_parser("decode")
    d.add_argument("--runtimes", default="eager,graphs")
    d.add_argument("--prompt", type=int, default=512)
    d.add_argument("--output", type=int, default=128)
    d.add_argument("--reps", type=int, default=3)
    d.add_argument("--out", required=True)
    add_reprobe_args(d)
    k = sub.add_parser("kernels")
    k.add_argument("--cases", default="mb1-ckpt0,mb4-ckpt0")
    k.add_argument("--out", required=True)
    c = sub.add_parser("memory-census")
    c.add_argument("--wrappers", default="none,ddp,ddp_idle,ddp_view,fsdp2")
    c.add_argument("--out", required=True)
    s = sub.add_parser("summary")
    g = s.add_mutually_exclusive_group(required=True)
    g.add_argument("--pred", help="a prediction set (scripts/whatif_validate_predict.py's JSON)")
    g.add_argument("--pred-dir", help="the per-case predictions of --reprobe-dir")
    s.add_argument("--meas", required=True)
    s.add_argument("--machine", default="")
    s.add_argument("--out", required=True)
    for q in (t, d, k, c):
        host_pinning.add_pin_arg(q)
    args = ap.parse_args()
    global PINNED
    if args.cmd != "summary":  # (the dry run pins too: the same code, no torch)
        # Before torch starts a thread: this process's GPU's share of the cores, as the host probe's (the offload
        # run's CPU AdamW has all of them, as the probe's offload figures do): scripts/host_pinning.py.
        PINNED = host_pinning.pin("all" if getattr(args, "mode", "") == "offload" and args.pin != "none"
                                  else args.pin)
        print(f"host pinning: {PINNED['kind']}, cpus {PINNED['cpus'][0]}-{PINNED['cpus'][-1]} "
              f"({len(PINNED['cpus'])}), {PINNED['threads']} threads", flush=True)
    {"train": train, "decode": decode, "kernels": kernels, "memory-census": memory_census,
     "summary": summary}[args.cmd](args)


if __name__ == "__main__":
    main()
