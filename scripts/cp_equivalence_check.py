"""Compares the per-iteration losses of a context-parallel replay with its dp twin's (the same plan without
context_parallel: same global batch, same weights, same data), for scripts/gpu_cp_equivalence.sh.

  python3 scripts/cp_equivalence_check.py CP.replay.json DP.replay.json [--control BROKEN.replay.json]

Exit 0: every iteration's loss agrees within the tolerance below (and, with --control, the control run,
replayed with a mechanism taken out, differs by more than it at some iteration: the check can tell);
1: a loss differs by more (the cp replay trains a different model); 3: the control stayed within the
tolerance (the check cannot tell a broken cp from a working one at this length: inconclusive).

Tolerance (bf16, derived, not fitted): both replays store activations in bf16 (unit roundoff
u = 2^-8); the two attention paths (per-chunk flash under cp, one SDPA call at dp) round differently, so
each token's cross-entropy carries an independent error of order u x loss, and the iteration's loss,
an fp32 mean over N = gbs x seq_len tokens, one of order u x loss / sqrt(N). The weights then follow
slightly different updates: the loss difference grows about linearly over the first iterations. So the
bound at iteration k (1-based, counted from the first iteration replayed, warmup included):
    |loss_cp - loss_dp| <= k x u x loss / sqrt(N)
For the suite's GPT (gbs 8 x 2048 tokens, loss ~11.3): 3.4e-4 per iteration. Suite 34 run 2's Kineto
traces (2 x H100, the previous cp implementation) differ by 3e-5, 5e-5, 1.9e-4 at iterations 3-5
(GPT) and 4e-5, 2e-4, 2e-4 (Llama): inside it.
"""
import argparse
import json
import math
import sys

U_BF16 = 2.0 ** -8


def losses_and_tokens(path):
    d = json.load(open(path))
    plan = d["plan"]
    return d["losses"], int(d.get("warmup", 0)), plan["gbs"] * plan["model"]["sequence_length"]


def deviations(a, b):
    la, warm_a, n = losses_and_tokens(a)
    lb, warm_b, _ = losses_and_tokens(b)
    if warm_a != warm_b or len(la) != len(lb) or not la:
        raise SystemExit(f"{a} and {b}: different warmup or iteration counts ({warm_a}/{len(la)}, {warm_b}/{len(lb)})")
    rows = []
    for i, (x, y) in enumerate(zip(la, lb)):
        k = warm_a + i + 1
        tol = k * U_BF16 * abs(y) / math.sqrt(n)
        rows.append((k, x, y, abs(x - y), tol))
    return rows


def table(title, rows):
    print(f"\n{title}\n")
    print("| iteration | loss (cp) | loss (dp twin) | abs difference | tolerance | within |")
    print("|---|---|---|---|---|---|")
    for k, x, y, diff, tol in rows:
        print(f"| {k} | {x:.6f} | {y:.6f} | {diff:.2e} | {tol:.2e} | {'yes' if diff <= tol else 'NO'} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cp")
    ap.add_argument("dp")
    ap.add_argument("--control", help="the cp plan replayed with a mechanism taken out")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    rows = deviations(args.cp, args.dp)
    table(f"{args.label} cp against its dp twin", rows)
    ok = all(diff <= tol for _, _, _, diff, tol in rows)
    print(f"\n{args.label}: {'EQUAL within bf16 tolerance' if ok else 'DIFFERENT: cp replay trains another model'}")
    if not ok:
        return 1
    if args.control:
        crows = deviations(args.control, args.dp)
        table(f"{args.label} control (mechanism taken out) against the dp twin", crows)
        told = any(diff > tol for _, _, _, diff, tol in crows)
        print(f"\n{args.label} control: {'outside the tolerance: the check can tell' if told else 'INSIDE the tolerance: inconclusive'}")
        if not told:
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
