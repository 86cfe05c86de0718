#!/usr/bin/env python3
"""Writes `hetplan whatif`'s predictions for scripts/gpu_whatif_validate.sh's cases, BEFORE anything is measured.

  scripts/whatif_validate_predict.py --bin build-nt/hetplan --gpu H100 --out scripts/validation/whatif/predictions_H100.json
      [--profiles DIR]   (a profile folder whose whatif_calibration.json the predictions use)
      [--host-probe FILE] (scripts/gpu_host_probe.py's host_probe_micro.json, a host_probe_dist.json beside it:
                           the host-time model's costs measured on this machine; whatif --host-probe)

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


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default="build-nt/hetplan")
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--profiles", default="")
    ap.add_argument("--host-probe", default="")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    try:  # the device machine's copy of the tree may have no git
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = ""
    commit = commit or os.environ.get("HETPLAN_COMMIT", "unknown")
    result = {"gpu": a.gpu, "commit": commit, "profiles": a.profiles, "host_probe": a.host_probe,
              "written_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if a.host_probe:  # what the predictions rest on, by content
        dist = os.path.join(os.path.dirname(a.host_probe), "host_probe_dist.json")
        result["host_probe_sha256"] = {f: hashlib.sha256(open(f, "rb").read()).hexdigest()
                                       for f in (a.host_probe, dist) if os.path.exists(f)}
    result["cases"] = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in cases():
            args = [a.bin, "whatif", "--gpu", a.gpu] + c["args"]
            if a.profiles:
                args += ["--profiles", a.profiles]
            if a.host_probe:
                args += ["--host-probe", a.host_probe]
            j = os.path.join(tmp, "w.json")
            p = subprocess.run(args + ["--json", j], capture_output=True, text=True)
            if p.returncode != 0:
                sys.exit(f"{' '.join(args)}: {p.stderr.strip()}")
            w = json.load(open(j))
            rows = w["rows"]
            if c["key"].startswith("decode"):
                r = rows[0]
                time_ms = r["decode_ms_per_token"]
                alloc = r["total_bytes"] - r["framework_bytes"]
            else:
                r = rows[0]
                if not r.get("offered", True):
                    sys.exit(f"{c['key']}: row not offered: {r.get('not_offered')}")
                time_ms = r["step_ms"]
                alloc = r["memory_per_gpu_bytes"] - r["framework_bytes"]
            result["cases"].append({"key": c["key"], "row": c["row"], "runtime": "graphs" if c["key"] == "decode-graphs"
                                    else "eager", "time_ms": time_ms, "allocated_bytes": alloc,
                                    "command": " ".join(["hetplan"] + args[1:]), "whatif_row": r})
            print(f"{c['key']:22s} {c['row']:16s} {time_ms:9.2f} ms  {alloc / 2**30:7.2f} GiB")
    json.dump(result, open(a.out, "w"), indent=1)


if __name__ == "__main__":
    main()
