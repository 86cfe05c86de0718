#!/usr/bin/env python3
"""Writes `hetplan whatif`'s predictions for scripts/gpu_whatif_validate.sh's cases, BEFORE anything is measured.

  scripts/whatif_validate_predict.py --bin build-nt/hetplan --gpu H100 --out scripts/validation/whatif/predictions_H100.json
      [--profiles DIR]   (a profile folder whose whatif_calibration.json the predictions use)
      [--host-probe FILE] (scripts/gpu_host_probe.py's host_probe_micro.json, a host_probe_dist.json and a
                           host_probe_offload.json beside it: the host-time model's costs and ZeRO-Offload's host
                           rates measured on this machine; whatif --host-probe)

predict_case() is also what scripts/gpu_whatif_validate.py calls right before measuring each case, with the
host's speed re-probed just then (whatif --host-speed).

Each case is one whatif command (recorded with its output row): the row that describes what
scripts/gpu_whatif_validate.py runs, nothing tuned to it. The predicted memory is whatif's per-GPU bytes
without its framework constant (the CUDA context, which torch.cuda.max_memory_allocated does not see).
"""
import argparse
import datetime
import hashlib
import json
import os
import subprocess
import sys
import tempfile

GPT = ["--hf-config", "scripts/validation/whatif/gpt-1.3b.json", "--seq", "2048"]
LLAMA3B = ["--hf-config", "tests/data/hf/llama-3.2-3b.json"]


def cases():
    out = []
    for mode, row, gpus in (("single", "single GPU", 1), ("ddp", "DDP", 2), ("fsdp2", "FSDP", 2)):
        for mb in (1, 4):
            for ckpt in (0, 1):
                args = GPT + ["--gpus", str(gpus), "--gpus-per-node", "2", "--micro-batch", str(mb), "--rows", row]
                if ckpt:
                    args += ["--recompute", "full"]
                out.append(dict(key=f"{mode}-mb{mb}-ckpt{ckpt}", row=row, args=args))
    for mb in (4,):
        args = GPT + ["--gpus", "1", "--micro-batch", str(mb), "--rows", "ZeRO-2+offload",
                      "--deepspeed-config", "scripts/validation/whatif/ds_offload_1gpu.json"]
        out.append(dict(key=f"offload-mb{mb}-ckpt0", row="ZeRO-2+offload", args=args))
    for runtime in ("eager", "graphs"):
        args = LLAMA3B + ["--inference", "--weights", "bf16", "--micro-batch", "1", "--prompt", "512",
                          "--output", "128", "--runtime", runtime, "--kv-cache", "static"]
        out.append(dict(key=f"decode-{runtime}", row="bf16", args=args))
    return out


def predict_case(binary, gpu, case, profiles="", host_probe="", host_speed=1.0, tmp=None):
    """One case's whatif command and its prediction: {key, row, runtime, time_ms, allocated_bytes, command,
    whatif_row}. `host_speed`: whatif --host-speed (a re-probe's ratio to `host_probe`'s host)."""
    args = [binary, "whatif", "--gpu", gpu] + case["args"]
    if profiles:
        args += ["--profiles", profiles]
    if host_probe:
        args += ["--host-probe", host_probe]
    if host_speed != 1.0:
        args += ["--host-speed", f"{host_speed:.6g}"]
    with tempfile.TemporaryDirectory(dir=tmp) as d:
        j = os.path.join(d, "w.json")
        p = subprocess.run(args + ["--json", j], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"{' '.join(args)}: {p.stderr.strip()}")
        r = json.load(open(j))["rows"][0]
    if case["key"].startswith("decode"):
        time_ms = r["decode_ms_per_token"]
        alloc = r["total_bytes"] - r["framework_bytes"]
    else:
        if not r.get("offered", True):
            sys.exit(f"{case['key']}: row not offered: {r.get('not_offered')}")
        time_ms = r["step_ms"]
        alloc = r["memory_per_gpu_bytes"] - r["framework_bytes"]
    return {"key": case["key"], "row": case["row"], "runtime": "graphs" if case["key"] == "decode-graphs" else "eager",
            "time_ms": time_ms, "allocated_bytes": alloc, "command": " ".join(["hetplan"] + args[1:]), "whatif_row": r}


def case_by_key(key):
    for c in cases():
        if c["key"] == key:
            return c
    sys.exit(f"no validation case {key!r}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build-nt/hetplan")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--profiles", default="")
    ap.add_argument("--host-probe", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    result = {"gpu": a.gpu, "commit": commit_id(), "profiles": a.profiles, "host_probe": a.host_probe,
              "written_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if a.host_probe:  # what the predictions rest on, by content
        dist = os.path.join(os.path.dirname(a.host_probe), "host_probe_dist.json")
        result["host_probe_sha256"] = {f: hashlib.sha256(open(f, "rb").read()).hexdigest()
                                       for f in (a.host_probe, dist) if os.path.exists(f)}
    result["cases"] = []
    for c in cases():
        p = predict_case(a.bin, a.gpu, c, a.profiles, a.host_probe)
        result["cases"].append(p)
        print(f"{c['key']:22s} {c['row']:16s} {p['time_ms']:9.2f} ms  {p['allocated_bytes'] / 2**30:7.2f} GiB")
    json.dump(result, open(a.out, "w"), indent=1)


def commit_id():
    # HETPLAN_COMMIT first: the device machine's copy of the tree may carry no git, or a stale one.
    commit = os.environ.get("HETPLAN_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        except OSError:
            commit = ""
    return commit or "unknown"


if __name__ == "__main__":
    main()
