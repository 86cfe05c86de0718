#!/usr/bin/env python3
"""Run the Python Metis reference (cost_het_cluster.py) deterministically.

The reference is NOT part of hetplan: point --ref at a checkout of
livingshade/Metis (commit 900445f) that you obtained yourself. This wrapper
changes none of its files; it patches two sources of non-determinism at
import time, the same two that hetplan fixes by design:

  1. permutations(set(device_types)) follows PYTHONHASHSEED. We feed the
     permutation generator the device types sorted by name, so node sequences
     come out in lexicographic order (A100 < T4 < V100).
  2. The model-level profile values come from whichever file os.listdir
     returns first. We make os.listdir return DeviceType.<first type>_tp1_bs1
     first and the rest sorted, so the model-level values and the layer
     balancer's normalisation come from that file.

Usage: metis_reference.py --ref DIR [cost_het_cluster.py options...]
"""
import itertools
import os
import re
import runpy
import sys


def main():
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--ref":
        sys.exit("usage: metis_reference.py --ref METIS_DIR [cost_het_cluster.py options]")
    ref = os.path.abspath(argv[1])
    script = os.path.join(ref, "cost_het_cluster.py")
    if not os.path.isfile(script):
        sys.exit(f"{script}: not found (expected a checkout of livingshade/Metis)")
    sys.argv = [script] + argv[2:]
    sys.path.insert(0, ref)

    real_listdir = os.listdir

    def ordered_listdir(path="."):
        names = sorted(real_listdir(path))
        types = sorted({m.group(1) for n in names
                        if (m := re.match(r"DeviceType\.(\w+?)_tp\d+_bs\d+\.json$", n))})
        if types:
            first = f"DeviceType.{types[0]}_tp1_bs1.json"
            if first in names:
                names.remove(first)
                names.insert(0, first)
        return names

    os.listdir = ordered_listdir

    import search_space.plan as plan  # noqa: E402  (import after sys.path is set)
    plan.permutations = lambda types: itertools.permutations(sorted(types, key=lambda t: t.name))

    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
