#!/usr/bin/env python3
"""The analytic GEMM rate against the stored measurements (issue 34, logs/published_configs.md, "What is left").

For each measured profile set profiles/transfer/measured-<MODEL>-<GPU>/ (hetplan profile: every GEMM of a block
and the head timed alone, forward and both gradients, as [m, k, n, passes, ms]):
  1. fits the one free constant of the layer time model's catalogue curve, the large-GEMM fraction E of the dense
     peak in  rate = peak x E x size^2 / (size^2 + 1024^2),  size = (m k n)^(1/3)  (DeviceRates::gemm_flops_per_s,
     sim/layer_time_model.cc, the curve written out again here for the check), as the median of measured over
     modelled time, and prints E with the curve's mean and worst error over the distinct GEMMs;
  2. per block profile, the measured device time over the analytic one (profiles/transfer/analytic-<MODEL>/, the
     same shapes) and what the measured block takes beyond its GEMMs and attention alone over the analytic
     elementwise class.

  3. with --shapes FILE (scripts/gpu_gemm_shapes.sh's gemm_shapes.json: every published row's GEMMs timed on a lent
     GPU), per row the measured time of its block GEMMs (forward and both gradients) over the curve's at the
     fraction fitted to the whole file, and the same by pass: rows whose GEMMs share a cube size but not an
     aspect (GPT 1.7B and GPT 1008B / 1T) at different ratios would say that the aspect sets the rate.

  python3 scripts/analytic_gemm_check.py [--profiles profiles/transfer] [--shapes gemm_shapes.json]
"""
import argparse, glob, json, os, statistics

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}  # dense bf16, the catalogue's (sim/data/gpus.json)
DEFAULT_E, HALF = 0.72, 1024.0


def curve_fraction(m, k, n, e=DEFAULT_E):
    s = (m * k * n) ** (1 / 3)
    return e * s * s / (s * s + HALF * HALF)


def shapes_report(path):
    """Item 3 of the module's docstring."""
    d = json.load(open(path))
    peak = d["peak_tflops"]
    for dtype in sorted({g["dtype"] for r in d["rows"] for g in r["gemms"]}):
        def model_ms(g):
            return 2 * g["tokens"] * g["k"] * g["n"] / (peak * 1e12 * curve_fraction(g["tokens"], g["k"], g["n"])) * 1e3
        block = [(r["name"], [g for g in r["gemms"] if g["dtype"] == dtype and g["gemm"] != "head"]) for r in d["rows"]]
        scale = statistics.median(g["ms"] / model_ms(g) for _, gs in block for g in gs)
        print(f"{d['device']} {dtype}: fitted large-GEMM fraction {DEFAULT_E / scale:.3f}; per row, block GEMMs measured "
              f"over the curve at that fraction (all passes; forward, input gradient, weight gradient):")
        for name, gs in block:
            def ratio(sel):
                m = [g for g in gs if sel(g)]
                return sum(g["ms"] for g in m) / (scale * sum(model_ms(g) for g in m)) if m else float("nan")
            print(f"  {name:16s} {ratio(lambda g: True):.3f}   " +
                  " ".join(f"{p} {ratio(lambda g, p=p: g['pass'] == p):.3f}" for p in ("forward", "dgrad", "wgrad")))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--profiles", default="profiles/transfer")
    ap.add_argument("--shapes", default=None, help="gemm_shapes.json from scripts/gpu_gemm_shapes.sh")
    args = ap.parse_args()
    if args.shapes:
        shapes_report(args.shapes)
        return
    for gpu, peak in PEAK_TFLOPS.items():
        gemms = {}
        for f in sorted(glob.glob(f"{args.profiles}/measured-*-{gpu}/DeviceType.{gpu}_tp*_bs*.json")):
            k = json.load(open(f))["execution_time"]["kernel_classes"]
            for layer in k["gemms"]:
                for m, kk, n, p, ms in layer:
                    gemms.setdefault((m, kk, n), []).append(ms / p)  # ms per pass
        if not gemms:
            continue
        ratios = {g: statistics.median(v) / (2 * g[0] * g[1] * g[2] / (peak * 1e12 * curve_fraction(*g)) * 1e3)
                  for g, v in gemms.items()}
        scale = statistics.median(ratios.values())
        errs = [abs(r / scale - 1) for r in ratios.values()]
        print(f"{gpu}: {len(gemms)} distinct GEMMs; fitted large-GEMM fraction {DEFAULT_E / scale:.3f} "
              f"(default {DEFAULT_E}); curve error mean {100 * statistics.mean(errs):.1f}%, worst {100 * max(errs):.1f}%")
        for f in sorted(glob.glob(f"{args.profiles}/measured-*-{gpu}/DeviceType.{gpu}_tp*_bs*.json")):
            model = os.path.basename(os.path.dirname(f))[len("measured-"):-len(gpu) - 1]
            a = f"{args.profiles}/analytic-{model}/{os.path.basename(f)}"
            if not os.path.exists(a):
                continue
            mk = json.load(open(f))["execution_time"]["kernel_classes"]
            ak = json.load(open(a))["execution_time"]["kernel_classes"]
            b = 1  # the first block
            analytic = sum(ak[c][b] for c in ("gemm_ms", "attention_ms", "elementwise_ms", "communication_ms"))
            beyond = mk["device_ms"][b] - mk["gemm_ms"][b] - mk["attention_ms"][b] - mk["communication_ms"][b]
            print(f"  {model} {os.path.basename(f)[len('DeviceType.'):-len('.json')]}: block device measured / analytic "
                  f"{mk['device_ms'][b] / analytic:.3f}; beyond GEMMs and attention / analytic elementwise "
                  f"{beyond / ak['elementwise_ms'][b]:.2f}")


if __name__ == "__main__":
    main()
