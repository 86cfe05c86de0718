#!/usr/bin/env python3
"""The GPU catalogue's entry (sim/data/gpus.json) for a device description, for the device scripts.

The match is hetplan's own (sim/gpu_specs.cc match_device_description, which the profiler uses): the
catalogue name or alias, with '-', '_' and ' ' removed and upper-cased, that the description contains,
the longest such name winning.

  python3 scripts/gpu_catalogue_entry.py [--desc TEXT] [--require] [FIELD ...]

prints the entry's FIELDs on one line, separated by spaces (default: name). A FIELD is a key of the entry,
or peak_bf16: the bf16 peak, else the fp16 one. --desc: the description (default: torch's name of CUDA
device 0). Without a match it prints "unknown", or with --require exits 1 naming the description.
Run from the repository root.
"""
import argparse
import json
import re
import sys


def normalise(s):
    return re.sub(r"[-_ ]", "", s).upper()


def match(description, catalogue="sim/data/gpus.json"):
    """The catalogue entry whose longest normalised name the description contains, or None."""
    d = normalise(description)
    best, best_len = None, 0
    for g in json.load(open(catalogue))["gpus"]:
        for n in [g["name"]] + g.get("aliases", []):
            k = normalise(n)
            if k and k in d and len(k) > best_len:
                best, best_len = g, len(k)
    return best


def field(entry, key):
    if key == "peak_bf16":
        return entry["peak_tflops"].get("bf16", entry["peak_tflops"]["fp16"])
    return entry[key]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--desc", help="device description (default: torch.cuda.get_device_name(0))")
    ap.add_argument("--require", action="store_true", help="exit 1 where the catalogue has no match")
    ap.add_argument("fields", nargs="*", default=["name"])
    a = ap.parse_args()
    desc = a.desc
    if desc is None:
        import torch
        desc = torch.cuda.get_device_name(0)
    entry = match(desc)
    if entry is None:
        if a.require:
            sys.exit("GPU '%s' is not in sim/data/gpus.json" % desc)
        print("unknown")
        return
    print(" ".join(str(field(entry, k)) for k in a.fields))


if __name__ == "__main__":
    main()
