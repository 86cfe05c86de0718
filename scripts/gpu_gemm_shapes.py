#!/usr/bin/env python3
"""Issue 34, "At scale, on paper": time the GEMMs of every published row (scripts/published_configs.py) at
their own per-rank shapes, each in its three passes as a Megatron linear runs them, on this machine's GPU.

Why: the layer time model prices a GEMM by its cube size (m k n)^(1/3) only (DeviceRates::gemm_flops_per_s,
sim/layer_time_model.cc). The GPT 1.7B row (tokens 32768, hidden 2304, tp 1) and the GPT 1T rows (tokens 2048,
hidden 25600, tp 8) have GEMMs of the same cube sizes (QKV about 8000 in both), so no size-only curve can price
them differently, yet hetplan is +7% on one and -11% on the other. This measures whether GEMMs of the same size
but different aspect (reduction length k, output tile count) run at different rates, pass by pass:
  forward  Y = X W^T      (tokens x k) (k x n): reduction over k
  dgrad    dX = dY W      (tokens x n) (n x k): reduction over n
  wgrad    dW = dY^T X    (n x tokens) (tokens x k): reduction over the tokens
(torch.nn.functional.linear and its autograd, as Megatron's ColumnParallelLinear / RowParallelLinear run them).

  python3 scripts/gpu_gemm_shapes.py OUT.json [--dtypes fp16,bf16] [--iters 20]
Writes OUT.json: the device, and per row and GEMM and pass the median ms over --iters back-to-back runs (after
warm-up), TFLOP/s and the fraction of the dense peak given by --peak-tflops (default: from the device name).
"""
import argparse, json, os, statistics, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import published_configs as pc  # noqa: E402  (the rows' shapes: one home)

PEAKS = {"A100": 312.0, "H100": 989.0, "H200": 989.0}  # dense fp16/bf16 tensor-core peak, TFLOP/s (datasheets)


def row_shapes(r):
    """The per-rank GEMMs (name, tokens, k, n) of row r's transformer block and head, as layer_gemms
    (sim/layer_work.cc) lists them: fused QKV, attention output, MLP up, MLP down; the head's logits."""
    h, a, tp, mbs = r["hidden"], r["heads"], r["tp"], r["micro_batch"]
    t = mbs * pc.SEQ
    vocab = r.get("vocab", pc.VOCAB)
    return [("qkv", t, h, 3 * h // tp), ("attn_out", t, h // tp, h), ("mlp_up", t, h, 4 * h // tp),
            ("mlp_down", t, 4 * h // tp, h), ("head", t, h, vocab // tp)]


def all_rows():
    rows = [pc.narayanan_row(x) for x in pc.ROWS] + [r for x in pc.K_ROWS for r in pc.korthikanti_rows(x)]
    rows.append(pc.bloom_row())
    seen, out = set(), []
    for r in rows:  # full and seqsel share their GEMMs
        key = (r["hidden"], r["tp"], r["micro_batch"], r.get("vocab", pc.VOCAB))
        if key not in seen:
            seen.add(key)
            out.append(r)
    return out


def time_ms(torch, fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--peak-tflops", type=float, default=0)
    ap.add_argument("--dry-run", action="store_true", help="list the shapes only (no GPU needed)")
    args = ap.parse_args()
    rows = all_rows()
    if args.dry_run:
        for r in rows:
            print(r["name"], [s for s in row_shapes(r)])
        return
    import torch
    dev = torch.cuda.get_device_name()
    peak = args.peak_tflops or next((v for k, v in PEAKS.items() if k in dev), 0)
    result = {"device": dev, "torch": torch.__version__, "cuda": torch.version.cuda, "peak_tflops": peak,
              "how": "median of back-to-back timed runs after 3 warm-ups; F.linear forward, dgrad dY @ W, "
                     "wgrad dY^T @ X", "rows": []}
    dt = {"fp16": torch.float16, "bf16": torch.bfloat16}
    for r in rows:
        entry = {"name": r["name"], "source": r["source"], "gemms": []}
        for name, t, k, n in row_shapes(r):
            for d in args.dtypes.split(","):
                x = torch.randn(t, k, device="cuda", dtype=dt[d])
                w = torch.randn(n, k, device="cuda", dtype=dt[d])
                dy = torch.randn(t, n, device="cuda", dtype=dt[d])
                flops = 2.0 * t * k * n
                passes = {"forward": lambda: torch.nn.functional.linear(x, w),
                          "dgrad": lambda: torch.matmul(dy, w),
                          "wgrad": lambda: torch.matmul(dy.t(), x)}
                for p, fn in passes.items():
                    ms = time_ms(torch, fn, args.iters)
                    tf = flops / (ms * 1e-3) / 1e12
                    entry["gemms"].append({"gemm": name, "dtype": d, "pass": p, "tokens": t, "k": k, "n": n,
                                           "ms": ms, "tflops": tf, "fraction_of_peak": tf / peak if peak else None})
                del x, w, dy
                torch.cuda.empty_cache()
        result["rows"].append(entry)
        print(entry["name"], " ".join(f"{g['gemm']}/{g['dtype']}/{g['pass']}={g['tflops']:.0f}"
                                      for g in entry["gemms"]), flush=True)
    json.dump(result, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
