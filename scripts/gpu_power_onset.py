#!/usr/bin/env python3
"""How soon after an idle gap the whole GPU's power cap slows a run of GEMMs, and how long an idle gap
brings its boost clocks back: each GEMM of a back-to-back run timed on its own (CUDA events).

  python3 scripts/gpu_power_onset.py OUT.json [--idle 0.02,0.1,0.3,1,3] [--gemms 300] [--n 8192] [--sms 0]

For each idle gap (seconds, the GPU left idle before the run): the TFLOP/s of the run's GEMMs 1, 2, 5,
10, 20, 50, 100, 200, ... and the time from the run's start at which they fall 5% below the first GEMMs'.
"""
import argparse
import json
import time

import torch

from sm_partition import on_sms


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--idle", default="0.02,0.1,0.3,1,3")
    ap.add_argument("--gemms", type=int, default=300)
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--sms", type=int, default=0)
    a = ap.parse_args()
    where = on_sms(a.sms)
    n = a.n
    x = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    z = torch.empty(n, n, device="cuda", dtype=torch.bfloat16)
    flop = 2.0 * n ** 3
    with where:
        for _ in range(20):
            torch.matmul(x, y, out=z)
    torch.cuda.synchronize()
    time.sleep(3)
    result = {"device": torch.cuda.get_device_name(0), "n": n, "sms": a.sms, "runs": []}
    for idle in [float(v) for v in a.idle.split(",")]:
        for rep in range(2):
            time.sleep(idle)
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(a.gemms + 1)]
            with where:
                ev[0].record()
                for k in range(a.gemms):
                    torch.matmul(x, y, out=z)
                    ev[k + 1].record()
            torch.cuda.synchronize()
            ms = [ev[k].elapsed_time(ev[k + 1]) for k in range(a.gemms)]
            tf = [flop / (t * 1e-3) / 1e12 for t in ms]
            start = sum(tf[:3]) / 3
            t_at, onset = 0.0, None
            for k, v in enumerate(tf):
                if v < 0.95 * start and onset is None:
                    onset = t_at
                t_at += ms[k]
            picks = {k: round(tf[k - 1]) for k in (1, 2, 5, 10, 20, 50, 100, 200, 300, 500) if k <= a.gemms}
            result["runs"].append({"idle_s": idle, "rep": rep, "tflops": tf, "gemm_ms": ms, "onset_ms": onset})
            print(f"idle {idle:5.2f} s: GEMM# -> TFLOP/s {picks}; 5% below the first at {onset if onset is None else round(onset)} ms "
                  f"of the run; last 50: {sum(tf[-50:]) / 50:.0f}", flush=True)
    json.dump(result, open(a.out, "w"))


if __name__ == "__main__":
    main()
