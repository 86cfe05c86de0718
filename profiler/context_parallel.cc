#include "profiler/context_parallel.h"

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <limits>
#include <tuple>

#include "profiler/torch_version.h"

namespace hetplan::profiler {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

enum class Kernel : int64_t { kMath = 0, kFlash = 1, kCudnn = 2 };

// HETPLAN_CP_ATTENTION (read once): "flash" or "math" caps the kernel (see the header).
Kernel kernel_cap() {
  static const Kernel cap = [] {
    const char* e = std::getenv("HETPLAN_CP_ATTENTION");
    if (e && std::strcmp(e, "math") == 0) return Kernel::kMath;
    if (e && std::strcmp(e, "flash") == 0) return Kernel::kFlash;
    return Kernel::kCudnn;
  }();
  return cap;
}

std::atomic<bool> cudnn_refused{false};  // cuDNN's attention threw once in this process: flash from then on

Kernel pick_kernel(const torch::Tensor& q) {
  const bool half = q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf;
  const int64_t d = q.size(-1);
  Kernel k = Kernel::kMath;
  if (q.is_cuda() && half && d % 8 == 0) {
#if HETPLAN_TORCH_AT_LEAST(2, 3)
    if (d <= 256) k = Kernel::kFlash;
#endif
#if HETPLAN_TORCH_AT_LEAST(2, 6)
    if (d <= 128 && !cudnn_refused.load()) k = Kernel::kCudnn;
#endif
  }
  return std::min(k, kernel_cap());
}

// Which rows and keys step `step` of the ring attends (see the header); the keys are the first kv_len of
// the source's 2c.
struct StepShape {
  int64_t q_begin, q_len, kv_len;
  bool causal;
};

StepShape step_shape(int64_t step, int64_t r, int64_t n, int64_t c) {
  const int64_t src = (r - step + n) % n;
  if (step == 0) return {0, 2 * c, 2 * c, true};
  if (src < r) return {0, 2 * c, c, false};
  return {c, c, 2 * c, false};
}

// K or V [b, kv, s, d] with each head repeated `group` times in place: [b, kv x group, s, d].
torch::Tensor expand_heads(const torch::Tensor& t, int64_t group) {
  if (group == 1) return t;
  const int64_t b = t.size(0), kv = t.size(1), s = t.size(2), d = t.size(3);
  return t.unsqueeze(2).expand({b, kv, group, s, d}).reshape({b, kv * group, s, d});
}

// The gradient of expand_heads: each key/value head's expanded heads summed.
torch::Tensor sum_heads(const torch::Tensor& g, int64_t group) {
  if (group == 1) return g;
  const int64_t b = g.size(0), h = g.size(1), s = g.size(2), d = g.size(3);
  return g.reshape({b, h / group, group, s, d}).sum(2);
}

// One step's attention: its output [b, heads, rows, d], its rows' log-sum-exp [b, heads, rows] (fp32,
// natural log of the sum of exp(scaled scores)), and what the kernel's backward takes besides (sequence
// offsets and dropout RNG state: unused at dropout 0, passed back as the kernel returned them).
struct Partial {
  torch::Tensor out, lse, cum_q, cum_k, seed, offset;
  Kernel kernel = Kernel::kMath;
  bool lse_trailing_one = false;  // the kernel's log-sum-exp is [b, heads, rows, 1] (cuDNN)
};

// Scaled scores q k^T / sqrt(d) in fp32, the upper triangle -inf where causal (square: s_q = s_k).
torch::Tensor scores(const torch::Tensor& q, const torch::Tensor& k, bool causal) {
  torch::Tensor s = torch::matmul(q.to(torch::kFloat32), k.to(torch::kFloat32).transpose(-2, -1)) /
                    std::sqrt(static_cast<double>(q.size(-1)));
  if (causal)
    s.masked_fill_(torch::ones({q.size(2), k.size(2)}, torch::TensorOptions().dtype(torch::kBool).device(q.device()))
                       .triu(1),
                   -std::numeric_limits<float>::infinity());
  return s;
}

Partial math_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
  const torch::Tensor s = scores(q, k, causal);
  torch::Tensor lse = torch::logsumexp(s, -1);
  torch::Tensor out = torch::matmul(torch::exp(s - lse.unsqueeze(-1)), v.to(torch::kFloat32)).to(q.scalar_type());
  Partial p;
  p.out = out;
  p.lse = lse;
  return p;
}

// What the fused kernels compute in their backward, from the (merged) output and log-sum-exp:
// P = exp(S - lse), dV = P^T dO, dS = P (dO V^T - rowsum(dO O)), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> math_backward(const torch::Tensor& dout, const torch::Tensor& q,
                                                                    const torch::Tensor& k, const torch::Tensor& v,
                                                                    const torch::Tensor& out, const torch::Tensor& lse,
                                                                    bool causal) {
  const torch::Tensor p = torch::exp(scores(q, k, causal) - lse.unsqueeze(-1));
  const torch::Tensor g = dout.to(torch::kFloat32);
  const torch::Tensor dv = torch::matmul(p.transpose(-2, -1), g);
  const torch::Tensor rowsum = (g * out.to(torch::kFloat32)).sum(-1, /*keepdim=*/true);
  const torch::Tensor ds =
      p * (torch::matmul(g, v.to(torch::kFloat32).transpose(-2, -1)) - rowsum) / std::sqrt(static_cast<double>(q.size(-1)));
  const torch::Tensor dq = torch::matmul(ds, k.to(torch::kFloat32)), dk = torch::matmul(ds.transpose(-2, -1), q.to(torch::kFloat32));
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

Partial attend(Kernel kernel, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal) {
#if HETPLAN_TORCH_AT_LEAST(2, 6)
  if (kernel == Kernel::kCudnn) {
    try {
      auto r = at::_scaled_dot_product_cudnn_attention(q, k, v, std::optional<at::Tensor>(), /*compute_log_sumexp=*/true,
                                                       0.0, causal, /*return_debug_mask=*/false);
      Partial p{std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r),
                Kernel::kCudnn};
      p.lse_trailing_one = p.lse.dim() == 4;
      if (p.lse_trailing_one) p.lse = p.lse.squeeze(-1);
      return p;
    } catch (const c10::Error& e) {
      cudnn_refused = true;
      std::cerr << "replay: cuDNN attention refused the context-parallel step (" << e.what_without_backtrace()
                << "); the flash kernel from now on\n";
      kernel = Kernel::kFlash;
    }
  }
#endif
#if HETPLAN_TORCH_AT_LEAST(2, 3)
  if (kernel == Kernel::kFlash) {
    auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, /*return_debug_mask=*/false);
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r),
            Kernel::kFlash};
  }
#endif
  (void)kernel;
  return math_forward(q, k, v, causal);
}

// dQ, dK, dV of one step from the merged output and log-sum-exp of its rows (lse: [b, heads, rows], contiguous).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> attend_backward(const Partial& p, const torch::Tensor& dout,
                                                                      const torch::Tensor& q, const torch::Tensor& k,
                                                                      const torch::Tensor& v, const torch::Tensor& out,
                                                                      const torch::Tensor& lse, bool causal) {
  Kernel kernel = p.kernel;
#if HETPLAN_TORCH_AT_LEAST(2, 6)
  if (kernel == Kernel::kCudnn) {
    try {
      return at::_scaled_dot_product_cudnn_attention_backward(dout, q, k, v, out,
                                                              p.lse_trailing_one ? lse.unsqueeze(-1) : lse, p.seed,
                                                              p.offset, at::Tensor(), p.cum_q, p.cum_k, q.size(2),
                                                              k.size(2), 0.0, causal);
    } catch (const c10::Error& e) {
      // The flash kernel's backward reads the same statistics (natural-log log-sum-exp per row).
      cudnn_refused = true;
      std::cerr << "replay: cuDNN attention's backward refused a context-parallel step ("
                << e.what_without_backtrace() << "); the flash kernel from now on\n";
      kernel = Kernel::kFlash;
    }
  }
#endif
#if HETPLAN_TORCH_AT_LEAST(2, 3)
  if (kernel == Kernel::kFlash)
    return at::_scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse, p.cum_q, p.cum_k, q.size(2), k.size(2),
                                                            0.0, causal, p.seed, p.offset);
#endif
  (void)kernel;
  return math_backward(dout, q, k, v, out, lse, causal);
}

// Merges one more step (o, l) into the rows so far (out, lse), in place: lse' = logaddexp(lse, l),
// out' = out exp(lse - lse') + o exp(l - lse') (weights in fp32, out kept in its dtype).
void merge(torch::Tensor out, torch::Tensor lse, const torch::Tensor& o, const torch::Tensor& l) {
  const torch::Tensor merged = torch::logaddexp(lse, l);
  out.mul_(torch::exp(lse - merged).unsqueeze(-1)).add_(o * torch::exp(l - merged).unsqueeze(-1));
  lse.copy_(merged);
}

// Forward and backward: see ring_attention and the header.
struct RingAttention : torch::autograd::Function<RingAttention> {
  static constexpr size_t kPerStep = 4;  // saved per step: cum_q, cum_k, seed, offset

  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor k, torch::Tensor v, int64_t group,
                               const TensorParallelGroup* cp) {
    const int64_t n = cp->size(), r = cp->rank(), c = q.size(2) / 2;
    const Kernel kernel = pick_kernel(q);
    const torch::Tensor kv = torch::stack({k, v});  // [2, b, kv, 2c, d]: what goes round the ring
    std::vector<torch::Tensor> saved{q, kv};
    std::vector<int64_t> kernels;
    bool trailing_one = false;
    torch::Tensor out, lse, held = kv;
    for (int64_t i = 0; i < n; ++i) {
      torch::Tensor next;
      std::function<void()> arrived;
      if (i + 1 < n) {
        next = torch::empty_like(kv);
        arrived = cp->ring_shift_async(next, held);  // beside this step's attention
      }
      const StepShape st = step_shape(i, r, n, c);
      const Partial p = attend(kernel, q.narrow(2, st.q_begin, st.q_len),
                               expand_heads(held.select(0, 0).narrow(2, 0, st.kv_len), group),
                               expand_heads(held.select(0, 1).narrow(2, 0, st.kv_len), group), st.causal);
      if (i == 0) {
        out = p.out;
        lse = p.lse;
      } else {
        merge(out.narrow(2, st.q_begin, st.q_len), lse.narrow(2, st.q_begin, st.q_len), p.out, p.lse);
      }
      kernels.push_back(static_cast<int64_t>(p.kernel));
      trailing_one = trailing_one || p.lse_trailing_one;
      for (const torch::Tensor* t : {&p.cum_q, &p.cum_k, &p.seed, &p.offset}) saved.push_back(*t);
      if (arrived) {
        arrived();
        held = next;
      }
    }
    saved.push_back(out);
    saved.push_back(lse);
    ctx->save_for_backward(saved);
    ctx->saved_data["cp"] = reinterpret_cast<int64_t>(cp);
    ctx->saved_data["group"] = group;
    ctx->saved_data["kernels"] = kernels;
    ctx->saved_data["trailing_one"] = trailing_one;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto* cp = reinterpret_cast<const TensorParallelGroup*>(ctx->saved_data["cp"].toInt());
    const int64_t group = ctx->saved_data["group"].toInt();
    const std::vector<int64_t> kernels = ctx->saved_data["kernels"].toIntVector();
    const bool trailing_one = ctx->saved_data["trailing_one"].toBool();
    const variable_list saved = ctx->get_saved_variables();
    const int64_t n = cp->size(), r = cp->rank();
    const torch::Tensor &q = saved[0], &kv = saved[1], &out = saved[2 + kPerStep * n], &lse = saved[3 + kPerStep * n];
    const torch::Tensor& dout = grad[0];
    const int64_t c = q.size(2) / 2;
    torch::Tensor dq, held = kv, carried;  // carried: the dK/dV of the source held, summed so far
    std::function<void()> carried_arrived;
    for (int64_t i = 0; i < n; ++i) {
      torch::Tensor next;
      std::function<void()> arrived;
      if (i + 1 < n) {
        next = torch::empty_like(kv);
        arrived = cp->ring_shift_async(next, held);
      }
      const StepShape st = step_shape(i, r, n, c);
      Partial p;
      p.kernel = static_cast<Kernel>(kernels[i]);
      p.lse_trailing_one = trailing_one;
      const size_t at = 2 + kPerStep * i;
      p.cum_q = saved[at];
      p.cum_k = saved[at + 1];
      p.seed = saved[at + 2];
      p.offset = saved[at + 3];
      auto rows = [&](const torch::Tensor& t) { return t.narrow(2, st.q_begin, st.q_len); };
      const auto [dqi, dki, dvi] =
          attend_backward(p, rows(dout), rows(q), expand_heads(held.select(0, 0).narrow(2, 0, st.kv_len), group),
                          expand_heads(held.select(0, 1).narrow(2, 0, st.kv_len), group), rows(out),
                          rows(lse).contiguous(), st.causal);
      if (i == 0) {
        dq = dqi;
      } else {
        rows(dq).add_(dqi);
      }
      const torch::Tensor dk = sum_heads(dki, group), dv = sum_heads(dvi, group);
      torch::Tensor sum;
      if (i == 0) {
        sum = torch::stack({dk, dv});
      } else {
        carried_arrived();  // the source's dK/dV from the ranks before this one
        sum = carried;
        sum.select(0, 0).narrow(2, 0, st.kv_len).add_(dk);
        sum.select(0, 1).narrow(2, 0, st.kv_len).add_(dv);
      }
      carried = torch::empty_like(kv);
      carried_arrived = cp->ring_shift_async(carried, sum);  // beside the next step; the last one home
      if (arrived) {
        arrived();
        held = next;
      }
    }
    carried_arrived();
    return {dq, carried.select(0, 0), carried.select(0, 1), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor ring_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t group,
                             const TensorParallelGroup& cp) {
  return RingAttention::apply(q, k, v, group, &cp);
}

}  // namespace hetplan::profiler
