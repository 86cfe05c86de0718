"""The host cores and CPU threads of a validation process (issue 32, item 6; sim/runtime_overheads.md).

The host-bound rows of the whatif validation are predicted from a host probe (scripts/gpu_host_probe.py) and
measured by scripts/gpu_whatif_validate.py. Both pin themselves here, so that the probe and the workload it
predicts run on the same cores with the same thread settings:

  share  the cores of this process's GPU: the host's CPUs (as this process may use them at its start) cut into
         as many contiguous slices as the machine has GPUs, slice `gpu` (the rank's LOCAL_RANK, else 0); the
         intra-op threads (torch.set_num_threads, OMP_NUM_THREADS, MKL_NUM_THREADS) one per core of it.
         Every process that drives one GPU: the probe's tiny steps, single, DDP, FSDP2, decode, the census.
  all    every CPU, one thread per CPU: the processes whose CPU work is the host's (ZeRO-Offload's CPU AdamW
         and cast, and the probe's measurement of them), as a one-rank job has the host to itself.
  none   leave the process as it is.

Every thread of the process (those already started included: /proc/self/task) gets the new mask; threads
started later inherit it. What was set is returned, for the results.
"""
import os

KINDS = ("share", "all", "none")


def _initial_cpus():
    # Remembered from the first call: a process that narrows itself to its share later ("all", then "share")
    # still cuts the same CPUs.
    if not hasattr(_initial_cpus, "cpus"):
        _initial_cpus.cpus = sorted(os.sched_getaffinity(0))
    return _initial_cpus.cpus


def gpus_on_machine():
    """The GPUs of this machine: CUDA_VISIBLE_DEVICES' count where set, else nvidia-smi -L's lines, else 1."""
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis:
        return len([v for v in vis.split(",") if v.strip()])
    try:
        import subprocess
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
        n = len([line for line in out.splitlines() if line.startswith("GPU ")])
        return max(n, 1)
    except Exception:  # noqa: BLE001
        return 1


def cores_for(kind, gpu=0, gpus=None):
    cpus = _initial_cpus()
    if kind == "all":
        return list(cpus)
    gpus = gpus or gpus_on_machine()
    per = max(1, len(cpus) // gpus)
    g = gpu % gpus
    return list(cpus[g * per:(g + 1) * per]) or list(cpus)


def pin(kind, gpu=None, gpus=None, torch=None):
    """Pins this process (every thread) to `kind`'s cores and sets the CPU thread counts to match (see the module
    docstring); `torch` (if already imported) gets set_num_threads too. Returns {"kind", "cpus", "threads"}."""
    if kind not in KINDS:
        raise ValueError(f"--pin: '{kind}': expected one of {', '.join(KINDS)}")
    if kind == "none":
        n = torch.get_num_threads() if torch is not None else None
        return {"kind": "none", "cpus": sorted(os.sched_getaffinity(0)), "threads": n}
    if gpu is None:
        gpu = int(os.environ.get("LOCAL_RANK", "0"))
    cores = cores_for(kind, gpu, gpus)
    tids = [int(t) for t in os.listdir("/proc/self/task")] if os.path.isdir("/proc/self/task") else [0]
    for tid in tids:
        try:
            os.sched_setaffinity(tid, cores)
        except OSError:  # a thread that ended meanwhile
            pass
    os.sched_setaffinity(0, cores)
    n = len(cores)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    if torch is not None:
        torch.set_num_threads(n)
    return {"kind": kind, "cpus": cores, "threads": n}


def add_pin_arg(parser, default="share"):
    parser.add_argument("--pin", default=default, choices=KINDS,
                        help="the host cores of this process (scripts/host_pinning.py): its GPU's share, all, none")
