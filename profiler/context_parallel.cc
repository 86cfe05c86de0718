#include "profiler/context_parallel.h"

#include <tuple>

#include "profiler/gpt.h"
#include "profiler/torch_version.h"

namespace hetplan::profiler {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using torch::indexing::Slice;

// The flash kernel runs q [b, heads, s, d] (see the header: CUDA, half precision, head dim).
bool flash_runs(const torch::Tensor& q) {
#if HETPLAN_TORCH_AT_LEAST(2, 3)
  const bool half = q.scalar_type() == torch::kBFloat16 || q.scalar_type() == torch::kHalf;
  return q.is_cuda() && half && q.size(-1) % 8 == 0 && q.size(-1) <= 256;
#else
  (void)q;
  return false;
#endif
}

// [s_q, s_k] true where query i attends key j: j <= i + s_k - s_q (the queries are the last s_q positions).
torch::Tensor lower_right_mask(int64_t sq, int64_t sk, torch::Device device) {
  const auto opts = torch::TensorOptions().dtype(torch::kLong).device(device);
  return (torch::arange(sq, opts) + (sk - sq)).unsqueeze(1) >= torch::arange(sk, opts).unsqueeze(0);
}

// One query chunk's attention without the flash kernel (the CPU tests): the diagonal chunk alone is plain
// causal attention, a longer prefix takes the explicit mask. K and V carry the query heads already.
torch::Tensor chunk_attention_masked(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t sq = q.size(2), sk = k.size(2);
  if (sq == sk) return causal_self_attention(q, k, v, 1);
  return masked_self_attention(q, k, v, 1, lower_right_mask(sq, sk, q.device()));
}

// Forward: see gather_kv_for_context_parallel.
struct GatherKV : torch::autograd::Function<GatherKV> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor k, torch::Tensor v, int64_t group,
                               const TensorParallelGroup* cp, const ContextParallelChunks* chunks) {
    const int64_t n = cp->size(), b = k.size(0), kv = k.size(1), c = k.size(2) / 2, d = k.size(3);
    ctx->saved_data["cp"] = reinterpret_cast<int64_t>(cp);
    ctx->saved_data["chunks"] = reinterpret_cast<int64_t>(chunks);
    ctx->saved_data["group"] = group;
    torch::Tensor mine = torch::stack({k, v});  // [2, b, kv, 2 c, d]: this rank's slot r of the gather
    torch::Tensor gathered = torch::empty({n, 2, b, kv, 2, c, d}, mine.options());
    cp->all_gather_flat(gathered, mine);
    // global[:, :, :, g, chunk_of_slot[r][h]] = gathered[r, :, :, :, h] for every expanded head g.
    torch::Tensor global = torch::empty({2, b, kv, group, 2 * n, c, d}, mine.options());
    global.index_put_({Slice(), Slice(), Slice(), Slice(), chunks->chunk_of_slot},
                      gathered.permute({1, 2, 3, 0, 4, 5, 6}).unsqueeze(3).expand({2, b, kv, group, n, 2, c, d}));
    return global.view({2, b, kv * group, 2 * n * c, d});
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const auto* cp = reinterpret_cast<const TensorParallelGroup*>(ctx->saved_data["cp"].toInt());
    const auto* chunks = reinterpret_cast<const ContextParallelChunks*>(ctx->saved_data["chunks"].toInt());
    const int64_t group = ctx->saved_data["group"].toInt();
    const torch::Tensor& g = grad[0];  // [2, b, kv * group, 2 n c, d]
    const int64_t n = cp->size(), b = g.size(1), kv = g.size(2) / group, c = g.size(3) / (2 * n), d = g.size(4);
    // The expanded heads of one key/value head are adjacent: their gradients sum to its gradient.
    const torch::Tensor summed = group > 1 ? g.reshape({2, b, kv, group, 2 * n * c, d}).sum(3) : g;
    // Back into rank order: slot (rank_of_chunk[j], half_of_chunk[j]) gets global chunk j.
    torch::Tensor slots = torch::empty({n, 2, b, kv, 2, c, d}, g.options());
    slots.permute({1, 2, 3, 0, 4, 5, 6})
        .index_put_({Slice(), Slice(), Slice(), chunks->rank_of_chunk, chunks->half_of_chunk},
                    summed.reshape({2, b, kv, 2 * n, c, d}));
    torch::Tensor mine = torch::empty({2, b, kv, 2 * c, d}, g.options());
    cp->reduce_scatter_flat(mine, slots);
    return {mine.select(0, 0), mine.select(0, 1), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// What one chunk's forward leaves for its backward (flash: its output and log-sum-exp, and what ATen's
// backward takes with them; the masked path needs none of it).
struct ChunkSaved {
  torch::Tensor out, logsumexp, cum_seq_q, cum_seq_k, philox_seed, philox_offset;
  static constexpr int kCount = 6;
  void append_to(std::vector<torch::Tensor>& v) const {
    for (const torch::Tensor* t : {&out, &logsumexp, &cum_seq_q, &cum_seq_k, &philox_seed, &philox_offset})
      v.push_back(*t);
  }
  static ChunkSaved from(const variable_list& v, size_t at) {
    return {v[at], v[at + 1], v[at + 2], v[at + 3], v[at + 4], v[at + 5]};
  }
};

ChunkSaved chunk_forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool flash) {
#if HETPLAN_TORCH_AT_LEAST(2, 3)
  if (flash) {
    auto r = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, /*is_causal=*/true, /*return_debug_mask=*/false);
    return {std::get<0>(r), std::get<1>(r), std::get<2>(r), std::get<3>(r), std::get<6>(r), std::get<7>(r)};
  }
#endif
  (void)flash;
  return {chunk_attention_masked(q, k, v), {}, {}, {}, {}, {}};
}

// dq, dk, dv of one chunk given the gradient of its output.
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> chunk_backward(const torch::Tensor& grad, const torch::Tensor& q,
                                                                     const torch::Tensor& k, const torch::Tensor& v,
                                                                     const ChunkSaved& s, bool flash) {
#if HETPLAN_TORCH_AT_LEAST(2, 3)
  if (flash)
    return at::_scaled_dot_product_flash_attention_backward(grad, q, k, v, s.out, s.logsumexp, s.cum_seq_q, s.cum_seq_k,
                                                            /*max_q=*/q.size(2), /*max_k=*/k.size(2), 0.0,
                                                            /*is_causal=*/true, s.philox_seed, s.philox_offset);
#endif
  (void)flash;
  (void)s;
  torch::AutoGradMode enable(true);
  const torch::Tensor qd = q.detach().requires_grad_(true), kd = k.detach().requires_grad_(true),
                      vd = v.detach().requires_grad_(true);
  const variable_list g = torch::autograd::grad({chunk_attention_masked(qd, kd, vd)}, {qd, kd, vd}, {grad});
  return {g[0], g[1], g[2]};
}

// Forward and backward: see context_parallel_attention and the header.
struct ChunkedAttention : torch::autograd::Function<ChunkedAttention> {
  static torch::Tensor forward(AutogradContext* ctx, torch::Tensor q, torch::Tensor kv, int64_t first_chunk,
                               int64_t second_chunk) {
    const int64_t b = q.size(0), heads = q.size(1), c = q.size(2) / 2, d = q.size(3);
    const bool flash = flash_runs(q);
    ctx->saved_data["chunks"] = std::vector<int64_t>{first_chunk, second_chunk};
    ctx->saved_data["flash"] = flash;
    // The output in [b, s, heads, d] order, so that the block's transpose(1, 2).reshape to [b, s, h] is a view.
    torch::Tensor out = torch::empty({b, 2 * c, heads, d}, q.options());
    std::vector<torch::Tensor> saved{q, kv};
    const int64_t chunk[2] = {first_chunk, second_chunk};
    for (int64_t i = 0; i < 2; ++i) {
      const int64_t keys = (chunk[i] + 1) * c;
      const ChunkSaved s = chunk_forward(q.narrow(2, i * c, c), kv.select(0, 0).narrow(2, 0, keys),
                                         kv.select(0, 1).narrow(2, 0, keys), flash);
      out.narrow(1, i * c, c).copy_(s.out.transpose(1, 2));
      s.append_to(saved);
    }
    ctx->save_for_backward(saved);
    return out.transpose(1, 2);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const std::vector<int64_t> chunk = ctx->saved_data["chunks"].toIntVector();
    const bool flash = ctx->saved_data["flash"].toBool();
    const variable_list saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &kv = saved[1];
    const int64_t b = q.size(0), heads = q.size(1), c = q.size(2) / 2, d = q.size(3), seq = kv.size(3);
    torch::Tensor dq = torch::empty({b, 2 * c, heads, d}, q.options());
    torch::Tensor dkv = torch::empty(kv.sizes(), kv.options());  // contiguous, whatever kv's strides
    // The longer key prefix first: its dK/dV fill the buffer (zeros past it), the shorter one's add into it.
    const int64_t longer = chunk[1] >= chunk[0] ? 1 : 0;
    for (const int64_t i : {longer, 1 - longer}) {
      const int64_t keys = (chunk[i] + 1) * c;
      const torch::Tensor k = kv.select(0, 0).narrow(2, 0, keys), v = kv.select(0, 1).narrow(2, 0, keys);
      const auto [dqi, dki, dvi] = chunk_backward(grad[0].narrow(2, i * c, c), q.narrow(2, i * c, c), k, v,
                                                  ChunkSaved::from(saved, 2 + i * ChunkSaved::kCount), flash);
      dq.narrow(1, i * c, c).copy_(dqi.transpose(1, 2));
      torch::Tensor dk = dkv.select(0, 0).narrow(2, 0, keys), dv = dkv.select(0, 1).narrow(2, 0, keys);
      if (i == longer) {
        dk.copy_(dki);
        dv.copy_(dvi);
        if (keys < seq) dkv.narrow(3, keys, seq - keys).zero_();
      } else {
        dk.add_(dki);
        dv.add_(dvi);
      }
    }
    return {dq.transpose(1, 2), dkv, torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

ContextParallelChunks ContextParallelChunks::build(const TensorParallelGroup& cp, torch::Device device) {
  const int64_t n = cp.size();
  std::vector<int64_t> slot(2 * n), rank(2 * n), half(2 * n);
  for (int64_t r = 0; r < n; ++r) {
    slot[2 * r] = r;              // half 0: chunk r
    slot[2 * r + 1] = 2 * n - 1 - r;  // half 1: chunk 2n - 1 - r
  }
  for (int64_t j = 0; j < 2 * n; ++j) {
    rank[j] = j < n ? j : 2 * n - 1 - j;
    half[j] = j < n ? 0 : 1;
  }
  auto on_device = [&](const std::vector<int64_t>& v) {
    return torch::tensor(v, torch::kLong).to(device);
  };
  return {on_device(slot).view({n, 2}), on_device(rank), on_device(half)};
}

torch::Tensor gather_kv_for_context_parallel(const torch::Tensor& k, const torch::Tensor& v, int64_t group,
                                             const TensorParallelGroup& cp, const ContextParallelChunks& chunks) {
  return GatherKV::apply(k, v, group, &cp, &chunks);
}

torch::Tensor context_parallel_attention(const torch::Tensor& q, const torch::Tensor& kv, const TensorParallelGroup& cp) {
  const int64_t n = cp.size(), r = cp.rank();
  return ChunkedAttention::apply(q, kv, r, 2 * n - 1 - r);
}

}  // namespace hetplan::profiler
