"""Issue 34, context parallelism's attention in replay (profiler/context_parallel.cc; the per-chunk flash calls).

Checks, on the GPU, the one assumption of replay's flash path that the CPU tests cannot reach: ATen's
flash kernel (aten::_scaled_dot_product_flash_attention, which replay calls from C++) with is_causal and
fewer queries than keys masks bottom-right aligned (query i attends keys j <= i + s_k - s_q), forward and
backward, against an fp32 reference with an explicit mask. Then times, at the suite's cp 2 shapes
(gpt-cp2-m4, llama-cp2-m4: one rank's queries), the old replay attention (one SDPA over all keys with a
boolean [s/cp, s] mask; GQA through enable_gqa) against the new one (per query chunk, one flash call over
keys 0..j; K/V expanded for GQA), forward + backward, median of 20.

Run: python3 scripts/gpu_cp_attention_check.py   (prints a table; exit 1 if a check fails)
"""
import sys
import time

import torch
import torch.nn.functional as F


def flash_lower_right(q, k, v, group):
    if group > 1:
        k = k.repeat_interleave(group, 1)
        v = v.repeat_interleave(group, 1)
    return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]


def reference(q, k, v, group):
    sq, sk = q.size(-2), k.size(-2)
    k = k.float().repeat_interleave(group, 1)
    v = v.float().repeat_interleave(group, 1)
    mask = (torch.arange(sq, device=q.device) + (sk - sq))[:, None] >= torch.arange(sk, device=q.device)[None, :]
    att = (q.float() @ k.transpose(-2, -1)) / q.size(-1) ** 0.5
    return att.masked_fill(~mask, float("-inf")).softmax(-1) @ v


def positions(seq, cp, r):
    c = seq // (2 * cp)
    return torch.cat([torch.arange(r * c, (r + 1) * c), torch.arange((2 * cp - 1 - r) * c, (2 * cp - r) * c)])


def old_attention(q, kv, group, seq, cp, r):
    mask = positions(seq, cp, r)[:, None] >= torch.cat([positions(seq, cp, i) for i in range(cp)])[None, :]
    return F.scaled_dot_product_attention(q, kv[0], kv[1], attn_mask=mask.to(q.device), enable_gqa=group > 1)


def new_attention(q, kv, group, seq, cp, r):
    c = q.size(2) // 2
    chunks = []
    for j in range(2 * cp):
        owner = j if j < cp else 2 * cp - 1 - j
        chunks.append(kv.narrow(3, owner * 2 * c + (0 if j < cp else c), c))
    ordered = torch.cat(chunks, 3)

    def one(q_off, j):
        keys = ordered.narrow(3, 0, (j + 1) * c)
        return flash_lower_right(q.narrow(2, q_off, c), keys[0], keys[1], group)

    return torch.cat([one(0, r), one(c, 2 * cp - 1 - r)], 2)


def main():
    dev = "cuda"
    torch.manual_seed(0)
    ok = True
    # 1) bottom-right semantics, forward and backward, with GQA.
    for sq, sk, heads, kvh, d in [(256, 1024, 8, 2, 64), (512, 512, 4, 4, 128), (128, 384, 20, 20, 128)]:
        q = torch.randn(2, heads, sq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(2, kvh, sk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(2, kvh, sk, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
        g = torch.randn(2, heads, sq, d, device=dev)
        out = flash_lower_right(q, k, v, heads // kvh)
        grads = torch.autograd.grad(out.float().mul(g).sum(), (q, k, v))
        ref = reference(q, k, v, heads // kvh)
        ref_grads = torch.autograd.grad(ref.mul(g).sum(), (q, k, v))
        err = (out.float() - ref).abs().max().item()
        gerr = max((a.float() - b.float()).abs().max().item() / (b.float().abs().max().item() + 1e-6)
                   for a, b in zip(grads, ref_grads))
        good = err < 3e-2 and gerr < 3e-2
        ok &= good
        print(f"flash is_causal s_q {sq} s_k {sk} heads {heads}/{kvh} d {d}: max |out - ref| {err:.2e}, "
              f"max relative grad error {gerr:.2e} -> {'bottom-right OK' if good else 'MISMATCH'}")
    # 2) the whole cp attention against one process's causal attention, cp 2, both ranks.
    seq, cp = 1024, 2
    q_all = torch.randn(2, 8, seq, 64, device=dev, dtype=torch.bfloat16)
    k_all = torch.randn(2, 2, seq, 64, device=dev, dtype=torch.bfloat16)
    v_all = torch.randn(2, 2, seq, 64, device=dev, dtype=torch.bfloat16)
    whole = reference(q_all, k_all, v_all, 4)
    kv = torch.stack([torch.cat([x[:, :, positions(seq, cp, i)] for i in range(cp)], 2) for x in (k_all, v_all)])
    for r in range(cp):
        mine = new_attention(q_all[:, :, positions(seq, cp, r)], kv, 4, seq, cp, r).float()
        err = (mine - whole[:, :, positions(seq, cp, r)]).abs().max().item()
        ok &= err < 3e-2
        print(f"cp 2 rank {r}: max |context_parallel_attention - one process| {err:.2e}")
    # 3) timing at the suite's shapes (one rank, rank 0 and 1 alike in work).
    print("\n| shape | old: masked SDPA ms (fwd+bwd) | new: flash per chunk ms | speed-up |\n|---|---|---|---|")
    for name, b, heads, kvh, d in [("gpt-cp2-m4 (b 2, 20 heads, d 128)", 2, 20, 20, 128),
                                   ("llama-cp2-m4 (b 2, 32/8 heads, d 64)", 2, 32, 8, 64),
                                   ("llama-cp2-zero1-m4 (b 4)", 4, 32, 8, 64)]:
        seq = 2048
        res = []
        for fn in (old_attention, new_attention):
            times = []
            for it in range(25):
                q = torch.randn(b, heads, seq // cp, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                kv = torch.randn(2, b, kvh, seq, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
                torch.cuda.synchronize()
                t = time.perf_counter()
                out = fn(q, kv, heads // kvh, seq, cp, 0)
                out.sum().backward()
                torch.cuda.synchronize()
                if it >= 5:
                    times.append((time.perf_counter() - t) * 1e3)
            res.append(sorted(times)[len(times) // 2])
        print(f"| {name} | {res[0]:.3f} | {res[1]:.3f} | {res[0] / res[1]:.2f}x |")
    print("\nall checks passed" if ok else "\nCHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
