#!/usr/bin/env python3
"""The compute slowdown beside overlapped data-parallel collectives, as the simulator needs it (sim/dp_overlap.md,
"SM sharing"), measured on the lent GPUs. Run under torchrun on >= 2 GPUs of one node (2, 4 or 8):

  torchrun --standalone --nproc-per-node N scripts/gpu_overlap_probe.py --out comm_overlap.json \
      [--hidden 2560 --ffn 10240 --tokens 4096 --layers 10] [--reduce-params 78.6e6] [--gather-params 78.6e6]

What it times, on every rank (CUDA events; median of --reps repetitions):
  - a backward-like GEMM loop alone: for each of --layers layers, each linear of a transformer block (qkv h->3h,
    proj h->h, fc1 h->ffn, fc2 ffn->h) twice as its backward runs it: dX = dY W and dW = dY^T X, bf16, with
    --tokens rows (a micro-batch's sequences x their length); torch.mm picks the same cuBLASLt kernels as replay's
    backward;
  - a chain of k fp32 reduce-scatters of one replay unit's gradients (--reduce-params, fp32: what ZeRO-2/3 and
    the distributed optimizer reduce), alone, and the same chain beside the GEMM loop (issued on a side stream
    just before the loop, as replay's overlapped reduce-scatters run beside the backward);
  - the same for a chain of bf16 all-gathers of a unit's weights (--gather-params, 16-bit: ZeRO-3's gathers);
  - with --ring-bytes B > 0, the same for a chain of context parallelism's ring steps: each rank sends B bytes of
    bf16 to the next rank and receives B from the one before, as replay's ring_shift_async does (one
    all_to_all_single whose only non-empty parts are the neighbours': NCCL's send/receive kernel).
  k is chosen so the chain alone takes about --comm-share of the loop (default 0.35), so the chain, even slowed,
  runs beside compute from its start to its end.
What it writes (rank 0, --out): "compute_slowdown": {"reduce": 1 + (loop beside reductions - loop alone) /
(chain alone), "gather": the same for gathers} -- the factor f of the simulator's overlap_slowdown_s,
(f - 1) x min(window, collectives' time alone) -- averaged over the ranks, with every timing under "details"
(the chains' own slowdown, GEMM TFLOP/s, bytes, counts, NCCL version, the GPU's name). With --ring-bytes,
"compute_slowdown" also holds "ring" (the factor beside the ring's steps; the simulator's cp ring takes it in
place of the gather's) and details.ring.one_collective_alone_ms is one ring step's time for B bytes.
`hetplan simulate` / `search` read it as <profile folder>/comm_overlap.json (sim/profile.h).

Every rank issues the same collectives in the same order: the chain length k, which each rank used to derive from
its own timings, is agreed first (the largest over the ranks). Ranks whose k differed issued different numbers of
reduce-scatters, and then mismatched barriers: the likely cause of the hang on 2 x H100
(logs/validate/suite34-h100x2-run4/overlap_probe.txt). Each rank binds its GPU before the process group
(device_id: barriers know their device). NVLink multicast stays off. A collective that waits longer than
--nccl-timeout-s seconds aborts the process instead of hanging.
"""
import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def gemm_loop(layers, x, wides, dys):
    """One backward's GEMMs: per layer, dX = dY W and dW = dY^T X of each linear."""
    for _ in range(layers):
        for w, dy in zip(wides, dys):
            torch.mm(dy, w)      # dX: [T, out] x [out, in]
            torch.mm(dy.t(), x[w.shape[1]])  # dW: [out, T] x [T, in]


def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hidden", type=int, default=2560)
    ap.add_argument("--ffn", type=int, default=0, help="default 4 x hidden")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", type=int, default=10)
    ap.add_argument("--reduce-params", type=float, default=0, help="default 12 x hidden^2 (a GPT block)")
    ap.add_argument("--gather-params", type=float, default=0, help="default as --reduce-params")
    ap.add_argument("--ring-bytes", type=float, default=0,
                    help="bytes of one cp ring step (bf16 K/V each rank sends to the next); 0: no ring case")
    ap.add_argument("--comm-share", type=float, default=0.35)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--nccl-timeout-s", type=float, default=30,
                    help="a collective waiting longer aborts the process (NCCL watchdog)")
    a = ap.parse_args()
    t_start = time.time()
    # NVLink multicast off whatever the caller's environment (it can take a shared host's GPUs out of service).
    for key, val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"),
                     ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ[key] = val
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=a.nccl_timeout_s))
    rank, world = dist.get_rank(), dist.get_world_size()

    def step(what):
        print(f"[rank {rank}/{world} {time.time() - t_start:.1f} s] {what}", flush=True)
    h, ffn, T = a.hidden, a.ffn or 4 * a.hidden, a.tokens
    torch.manual_seed(rank)
    bf = torch.bfloat16
    # Weights [out, in] and upstream gradients [T, out] of qkv, proj, fc1, fc2; inputs [T, in] by width.
    shapes = [(3 * h, h), (h, h), (ffn, h), (h, ffn)]
    wides = [torch.randn(o, i, dtype=bf, device=dev) * 0.02 for o, i in shapes]
    dys = [torch.randn(T, o, dtype=bf, device=dev) for o, _ in shapes]
    x = {h: torch.randn(T, h, dtype=bf, device=dev), ffn: torch.randn(T, ffn, dtype=bf, device=dev)}
    flops = a.layers * sum(2 * 2 * T * o * i for o, i in shapes)
    loop = lambda: gemm_loop(a.layers, x, wides, dys)

    rp = a.reduce_params or 12 * h * h
    gp = a.gather_params or rp
    n_r = int(rp) // world * world
    n_g = int(gp) // world * world
    rs_in = torch.randn(n_r, dtype=torch.float32, device=dev)
    rs_out = torch.empty(n_r // world, dtype=torch.float32, device=dev)
    ag_in = torch.randn(n_g // world, dtype=bf, device=dev)
    ag_out = torch.empty(n_g, dtype=bf, device=dev)
    reduce_one = lambda: dist.reduce_scatter_tensor(rs_out, rs_in, async_op=True)
    gather_one = lambda: dist.all_gather_into_tensor(ag_out, ag_in, async_op=True)
    kinds = [("reduce", reduce_one, n_r, 4), ("gather", gather_one, n_g, 2)]
    if a.ring_bytes > 0:
        # One ring step: this rank's bf16 buffer to rank + 1, rank - 1's into ring_out (at 2 ranks both the other).
        n_p = max(1, int(a.ring_bytes) // 2)
        ring_in = torch.randn(n_p, dtype=bf, device=dev)
        ring_out = torch.empty_like(ring_in)
        send_split, recv_split = [0] * world, [0] * world
        send_split[(rank + 1) % world] = n_p
        recv_split[(rank - 1) % world] = n_p
        ring_one = lambda: dist.all_to_all_single(ring_out, ring_in, output_split_sizes=recv_split,
                                                  input_split_sizes=send_split, async_op=True)
        kinds.append(("ring", ring_one, n_p, 2))
    side = torch.cuda.Stream()

    def sync():
        torch.cuda.synchronize()
        dist.barrier(device_ids=[local_rank])
        torch.cuda.synchronize()

    def agreed_max(n):
        """The largest of every rank's n (a collective every rank issues here, in the same order)."""
        t = torch.tensor([n], dtype=torch.int64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def time_loop():
        sync()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        loop()
        e1.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1)

    def time_chain(one, k):
        sync()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            e0.record(side)
            works = [one() for _ in range(k)]
            for w in works:
                w.wait()
            e1.record(side)
        torch.cuda.synchronize()
        return e0.elapsed_time(e1)

    def time_both(one, k):
        """The chain issued on the side stream, then the loop on the default stream: (loop ms, chain ms)."""
        sync()
        g0, g1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        c0, c1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            c0.record(side)
            works = [one() for _ in range(k)]
        g0.record()
        loop()
        g1.record()
        with torch.cuda.stream(side):
            for w in works:
                w.wait()
            c1.record(side)
        torch.cuda.synchronize()
        return g0.elapsed_time(g1), c0.elapsed_time(c1)

    # Warm up: cuBLASLt's choices, NCCL's communicator and buffers.
    step("warm-up")
    for _ in range(2):
        loop()
        for _, one, _, _ in kinds:
            one().wait()
    torch.cuda.synchronize()
    med = statistics.median
    loop_alone = med(time_loop() for _ in range(a.reps))
    res = {"gemm_loop_alone_ms": loop_alone, "gemm_loop_tflops": flops / loop_alone / 1e9}
    factors = []
    collective_names = {"reduce": "reduce_scatter fp32", "gather": "all_gather bf16",
                        "ring": "ring step bf16 (all_to_all_single to rank + 1, from rank - 1)"}
    for kind, one, elems, elem_bytes in kinds:
        step(f"{kind}: one collective alone")
        one_ms = med(time_chain(one, 1) for _ in range(a.reps))
        k_own = max(1, int(round(a.comm_share * loop_alone / max(one_ms, 1e-3))))
        k = agreed_max(k_own)  # every rank must issue the same number of collectives
        step(f"{kind}: chains of k = {k} (this rank's own estimate {k_own})")
        chain_alone = med(time_chain(one, k) for _ in range(a.reps))
        both = [time_both(one, k) for _ in range(a.reps)]
        loop_with = med(b[0] for b in both)
        chain_with = med(b[1] for b in both)
        loop_again = med(time_loop() for _ in range(a.reps))  # drift check (clocks, heat)
        base = 0.5 * (loop_alone + loop_again)
        f = 1 + max(0.0, loop_with - base) / min(base, chain_alone)
        factors.append(f)
        res[kind] = {"collective": collective_names[kind],
                     "bucket_params": elems, "bucket_bytes": elems * elem_bytes, "chain_collectives": k,
                     "chain_collectives_own_estimate": k_own,
                     "one_collective_alone_ms": one_ms, "chain_alone_ms": chain_alone,
                     "gemm_loop_alone_ms_after": loop_again, "gemm_loop_beside_ms": loop_with,
                     "chain_beside_ms": chain_with, "chain_slowdown": chain_with / chain_alone,
                     "gemm_loop_slowdown": loop_with / base, "compute_slowdown": f,
                     "chain_outlasted_loop": chain_with > loop_with}
    # Every rank's factors, averaged (and each rank's kept).
    step("gathering the ranks' factors")
    t = torch.tensor(factors, dtype=torch.float64, device=dev)
    every = [torch.zeros_like(t) for _ in range(world)]
    dist.all_gather(every, t)
    every = [e.tolist() for e in every]
    mean = [sum(e[i] for e in every) / world for i in range(len(factors))]
    if rank == 0:
        out = {
            "kind": "hetplan collectives-overlap probe (scripts/gpu_overlap_probe.py)",
            "compute_slowdown": {k[0]: mean[i] for i, k in enumerate(kinds)},
            "per_rank_compute_slowdown": [{k[0]: e[i] for i, k in enumerate(kinds)} for e in every],
            "machine": {"gpu": torch.cuda.get_device_name(), "gpus": world, "torch": torch.__version__,
                        "cuda": torch.version.cuda, "nccl": nccl_version(),
                        "env": {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}},
            "shape": {"hidden": h, "ffn": ffn, "tokens": T, "layers": a.layers, "comm_share": a.comm_share,
                      "reps": a.reps, "ring_bytes": a.ring_bytes},
            "details": res,
            "seconds": time.time() - t_start,
        }
        with open(a.out, "w") as fh:
            json.dump(out, fh, indent=1)
        print(json.dumps(out, indent=1), flush=True)
    dist.barrier(device_ids=[local_rank])
    dist.destroy_process_group()
    step("done")


if __name__ == "__main__":
    main()
