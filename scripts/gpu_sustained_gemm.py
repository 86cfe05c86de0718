#!/usr/bin/env python3
"""A bf16 GEMM's throughput over time, on the whole GPU and inside an SM partition: burst against sustained.

Issue 14 compares a 33-SM green context with the whole H200 by a short GEMM probe (792 against 265 TFLOP/s,
2.99x). A training step runs its GEMMs back to back for as long as the job lasts. This script runs one GEMM
shape back to back for --seconds, times it in windows of --window seconds (CUDA events), and samples the
GPU's power draw, SM clock and clock-event reasons (nvidia-smi) at the same time, so the two can be read
side by side: the first window is what a short probe sees, the last ones what a training step sees.

  python3 scripts/gpu_sustained_gemm.py OUT.json [--sms 0,33] [--shapes 8192x8192x8192,8192x28672x8192]
                                                 [--seconds 6] [--window 0.25] [--rest 5]

--sms: 0 is the whole GPU, N a green context of N SMs (torch.cuda.GreenContext; the driver rounds N up).
--shapes: MxNxK of each GEMM (C[M,N] = A[M,K] B[K,N]); the second default is the MLP's up projection of
a 70B-shaped block at bs 4, sequence 2048 (8192 tokens, hidden 8192, ffn 28672).
--rest: seconds idle before each run, so that each starts from a cool, unthrottled GPU.
"""
import argparse
import csv
import io
import json
import statistics
import subprocess
import threading
import time

import torch

from sm_partition import on_sms


def sampler(stop, rows):
    """nvidia-smi's power, SM clock and clock-event reasons of GPU 0, every 50 ms, until stop is set."""
    q = "timestamp,power.draw,clocks.sm,clocks_event_reasons.active,temperature.gpu"
    p = subprocess.Popen(["nvidia-smi", "-i", "0", f"--query-gpu={q}", "--format=csv,noheader,nounits", "-lms", "50"],
                         stdout=subprocess.PIPE, text=True)
    for line in p.stdout:
        if stop.is_set():
            break
        f = [x.strip() for x in next(csv.reader(io.StringIO(line)))]
        try:
            rows.append({"t": time.time(), "power_w": float(f[1]), "sm_mhz": float(f[2]), "reasons": f[3],
                         "temp_c": float(f[4])})
        except (ValueError, IndexError):
            pass
    p.terminate()


def run(sms, shape, seconds, window):
    m, n, k = shape
    where = on_sms(sms)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    flop = 2.0 * m * n * k
    with where:
        for _ in range(3):
            torch.matmul(a, b, out=c)
    torch.cuda.synchronize()
    # Iterations per window from one timed iteration.
    with where:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); torch.matmul(a, b, out=c); e.record()
    torch.cuda.synchronize()
    per = max(1, int(window * 1000 / s.elapsed_time(e)))
    windows = []
    t_start = time.time()
    while time.time() - t_start < seconds:
        with where:
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(per):
                torch.matmul(a, b, out=c)
            e.record()
        e.synchronize()
        windows.append({"t": time.time(), "tflops": flop * per / (s.elapsed_time(e) * 1e-3) / 1e12})
    return {"sms_requested": sms, "shape": [m, n, k], "iters_per_window": per, "t_start": t_start, "windows": windows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sms", default="0,33")
    ap.add_argument("--shapes", default="8192x8192x8192,8192x28672x8192")
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--window", type=float, default=0.25)
    ap.add_argument("--rest", type=float, default=5)
    a = ap.parse_args()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "args": vars(a), "runs": []}
    for shape in [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]:
        for sms in [int(x) for x in a.sms.split(",")]:
            time.sleep(a.rest)
            stop, rows = threading.Event(), []
            th = threading.Thread(target=sampler, args=(stop, rows), daemon=True)
            th.start()
            time.sleep(0.3)
            r = run(sms, shape, a.seconds, a.window)
            stop.set()
            th.join(timeout=2)
            w = r["windows"]
            for x in w:
                near = [y for y in rows if x["t"] - a.window <= y["t"] <= x["t"]]
                x["power_w"] = statistics.mean(y["power_w"] for y in near) if near else None
                x["sm_mhz"] = statistics.mean(y["sm_mhz"] for y in near) if near else None
                x["reasons"] = sorted({y["reasons"] for y in near})
            tail = w[len(w) // 2:]
            r["first_window_tflops"] = w[0]["tflops"]
            r["sustained_tflops"] = statistics.median(x["tflops"] for x in tail)
            r["sustained_power_w"] = statistics.median(x["power_w"] for x in tail if x["power_w"] is not None)
            r["sustained_sm_mhz"] = statistics.median(x["sm_mhz"] for x in tail if x["sm_mhz"] is not None)
            r["first_window_sm_mhz"] = w[0]["sm_mhz"]
            result["runs"].append(r)
            print(f"shape {shape} sms {sms or 'all'}: first window {w[0]['tflops']:.0f} TFLOP/s at {w[0]['sm_mhz']} MHz; "
                  f"second half {r['sustained_tflops']:.0f} TFLOP/s at {r['sustained_sm_mhz']:.0f} MHz, "
                  f"{r['sustained_power_w']:.0f} W; reasons {sorted({z for x in tail for z in x['reasons']})}", flush=True)
    runs = result["runs"]
    for shape in {tuple(r["shape"]) for r in runs}:
        by = {r["sms_requested"]: r for r in runs if tuple(r["shape"]) == shape}
        if 0 in by:
            for sms, r in by.items():
                if sms:
                    print(f"shape {shape}: whole GPU / {sms} SMs: first window {by[0]['first_window_tflops'] / r['first_window_tflops']:.2f}x, "
                          f"sustained {by[0]['sustained_tflops'] / r['sustained_tflops']:.2f}x")
    json.dump(result, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
