"""The SM partition the GPU scripts run their kernels in (imported by gpu_block_breakdown.py,
gpu_power_onset.py and gpu_sustained_gemm.py, which run from scripts/)."""
import contextlib

import torch


def on_sms(sms):
    """A reusable context manager under which the kernels issued run on a stream of a CUDA green context of
    `sms` SMs (torch.cuda.GreenContext; the driver rounds `sms` up to its granularity), the emulated device
    type's way of running; for sms <= 0, the whole GPU (the current stream)."""
    if sms <= 0:
        return contextlib.nullcontext()
    green = torch.cuda.GreenContext.create(sms, 0)
    where = torch.cuda.stream(green.Stream())
    where.green = green  # the green context outlives its stream
    return where
