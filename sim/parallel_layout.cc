#include "sim/parallel_layout.h"

#include <algorithm>
#include <unordered_map>

namespace hetplan {

std::vector<int> RankStride::ranks() const {
  std::vector<int> out(count);
  for (int i = 0; i < count; ++i) out[i] = (*this)[i];
  return out;
}

PipelineGrid::PipelineGrid(const std::vector<Strategy>& strategies) {
  int begin = 0;
  for (const Strategy& st : strategies) {
    stages_.emplace_back(begin, st);
    begin = stages_.back().end();
  }
}

int PipelineGrid::stage_of(int rank) const {
  for (int s = 0; s < num_stages(); ++s)
    if (stages_[s].contains(rank)) return s;
  return -1;
}

bool tp_groups_inside_nodes(const RankLayout& layout, int begin, Strategy st) {
  const StageGrid grid(begin, st);
  for (int d = 0; d < grid.dp; ++d) {
    const RankStride group = grid.tp_group(d);
    // Ranks are handed out node by node, so a run of ranks is on one node iff its ends are.
    if (layout.node_of(group[0]) != layout.node_of(group[group.size() - 1])) return false;
  }
  return true;
}

void split_micro_batch(int micro_batch, int dp, int* shares) {
  const int base = micro_batch / dp, extra = micro_batch % dp;
  for (int d = 0; d < dp; ++d) shares[d] = base + (d < extra ? 1 : 0);
}

ParallelLayout::ParallelLayout(const Cluster& cluster, const RankLayout& layout) : cluster_(&cluster), layout_(&layout) {
  // RankLayout's nodes: the node sequence's types, each type's hostfile nodes in order.
  for (int type : layout.node_sequence())
    for (std::size_t n = 0; n < cluster.nodes().size(); ++n)
      if (cluster.nodes()[n].type == type) cluster_node_.push_back(static_cast<int>(n));
  std::unordered_map<std::string, int> used;  // GPUs handed out so far per host
  local_gpu_.resize(layout.num_ranks());
  for (int r = 0; r < layout.num_ranks(); ++r) local_gpu_[r] = used[host(r)]++;
}

std::vector<std::string> ParallelLayout::hosts() const {
  std::vector<std::string> out;
  for (int r = 0; r < num_ranks(); ++r)
    if (std::find(out.begin(), out.end(), host(r)) == out.end()) out.push_back(host(r));
  return out;
}

std::vector<int> ParallelLayout::ranks_on(const std::string& h) const {
  std::vector<int> out;
  for (int r = 0; r < num_ranks(); ++r)
    if (host(r) == h) out.push_back(r);  // rank order is local GPU order
  return out;
}

int ParallelLayout::rank_at(const std::string& h, int gpu) const {
  for (int r = 0; r < num_ranks(); ++r)
    if (host(r) == h && local_gpu(r) == gpu) return r;
  return -1;
}

}  // namespace hetplan
