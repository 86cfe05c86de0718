"""NCCL collective bus bandwidth against message size, and the compute slowdown when a
collective shares the SMs with a GEMM (issue 34, items 2 and 5). Run by scripts/gpu_nccl_bench.sh
under `python3 -m torch.distributed.run --nproc_per_node=N`.

Bus bandwidth follows nccl-tests' definitions (PERFORMANCE.md): all-reduce busbw = S/t x 2(n-1)/n,
all-gather and reduce-scatter busbw = S/t x (n-1)/n, S the full buffer (all ranks' data), so the
numbers compare with the published DGX tables. Each size: `warm` untimed calls, then `iters` timed
with CUDA events; the median of 3 repeats is kept. Also: the time of one small (8-byte) all-reduce
(the per-call latency the simulator's ring/tree constants take) per algorithm NCCL_ALGO chose.

Overlap: a bf16 GEMM chain (8192^3) timed alone, then while rank 0 and 1 run a back-to-back stream
of 256 MiB all-reduces on a second CUDA stream: slowdown = GEMM time with comm / alone; and the
all-reduce's own time alone and while the GEMM runs. Writes JSON to argv[1] on rank 0.
"""
import json, os, statistics, sys, time
import torch
import torch.distributed as dist


def timed(fn, iters, warm):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    reps = []
    for _ in range(3):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        torch.cuda.synchronize()
        reps.append(a.elapsed_time(b) / iters / 1e3)  # seconds per call
    return statistics.median(reps)


def main():
    out = sys.argv[1]
    dist.init_process_group("nccl")
    rank, n = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda")
    res = {"world": n, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "nccl": ".".join(map(str, torch.cuda.nccl.version())), "collectives": []}
    only_ar = os.environ.get("BENCH_ALLREDUCE_ONLY") == "1"
    sizes = [2 ** k for k in range(13, 31)]  # 8 KiB .. 1 GiB (bytes of the full buffer)
    big = torch.empty(max(sizes) // 2, dtype=torch.bfloat16, device=dev)
    for size in sizes:
        elems = size // 2
        iters = 50 if size <= 2 ** 22 else (20 if size <= 2 ** 27 else 5)
        warm = 5 if size <= 2 ** 27 else 2
        buf = big[:elems]
        t_ar = timed(lambda: dist.all_reduce(buf), iters, warm)
        shard = elems // n
        outbuf = big[:shard * n]
        inbuf = torch.empty(shard, dtype=torch.bfloat16, device=dev)
        # NCCL_ALGO=Tree has no all-gather or reduce-scatter: BENCH_ALLREDUCE_ONLY=1 skips them.
        if only_ar:
            t_ag = t_rs = float("nan")
        else:
            t_ag = timed(lambda: dist.all_gather_into_tensor(outbuf, inbuf), iters, warm)
            t_rs = timed(lambda: dist.reduce_scatter_tensor(inbuf, outbuf), iters, warm)
        row = {"bytes": size, "all_reduce_s": t_ar, "all_gather_s": t_ag, "reduce_scatter_s": t_rs,
               "all_reduce_busbw_GBps": size / t_ar * 2 * (n - 1) / n / 1e9,
               "all_gather_busbw_GBps": size / t_ag * (n - 1) / n / 1e9,
               "reduce_scatter_busbw_GBps": size / t_rs * (n - 1) / n / 1e9}
        res["collectives"].append(row)
        if rank == 0:
            print(f"{size:>11d} B  AR {t_ar*1e6:9.1f} us {row['all_reduce_busbw_GBps']:7.1f} GB/s  "
                  f"AG {row['all_gather_busbw_GBps']:7.1f}  RS {row['reduce_scatter_busbw_GBps']:7.1f}", flush=True)
    del big
    # Compute slowdown when an all-reduce stream shares the GPU with a GEMM chain.
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    w = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    gemm = lambda: torch.mm(x, w)
    t_gemm = timed(gemm, 20, 5)
    comm = torch.empty(128 * 2 ** 20, dtype=torch.bfloat16, device=dev)  # 256 MiB
    s2 = torch.cuda.Stream()
    t_comm = timed(lambda: dist.all_reduce(comm), 10, 3)
    # Overlapped: enqueue k all-reduces on s2 and j GEMMs on the default stream; both spans measured.
    k = 12
    j = max(4, int(round(k * t_comm / t_gemm)))
    results = []
    for _ in range(3):
        torch.cuda.synchronize()
        dist.barrier()
        ga, gb = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        ca, cb = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(s2):
            ca.record(s2)
            for _ in range(k):
                dist.all_reduce(comm)
            cb.record(s2)
        ga.record()
        for _ in range(j):
            gemm()
        gb.record()
        torch.cuda.synchronize()
        results.append((ga.elapsed_time(gb) / j / 1e3, ca.elapsed_time(cb) / k / 1e3))
    g_ov = statistics.median(r[0] for r in results)
    c_ov = statistics.median(r[1] for r in results)
    flops = 2 * m ** 3
    res["overlap"] = {"gemm_alone_s": t_gemm, "gemm_with_comm_s": g_ov, "gemm_slowdown": g_ov / t_gemm,
                      "gemm_alone_tflops": flops / t_gemm / 1e12, "allreduce_bytes": comm.numel() * 2,
                      "allreduce_alone_s": t_comm, "allreduce_with_gemm_s": c_ov,
                      "comm_slowdown": c_ov / t_comm, "gemms": j, "allreduces": k}
    if rank == 0:
        print(json.dumps(res["overlap"], indent=1), flush=True)
        with open(out, "w") as f:
            json.dump(res, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
