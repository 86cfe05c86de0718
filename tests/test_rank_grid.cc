// The rank grid (sim/parallel_layout.h): StageGrid answers Megatron-LM's
// order (tp fastest, then dp, then pp), its groups, and PipelineGrid's stages.
#include <catch2/catch.hpp>

#include <vector>

#include "sim/cluster.h"
#include "sim/data_load_balancer.h"
#include "sim/parallel_layout.h"
#include "sim/rank_layout.h"

namespace hetplan {
namespace {

// Megatron-LM's RankGenerator for pp x dp x tp (order "tp-dp-pp"), written out
// as its nested loops: the ranks of every tp group and every dp group.
struct MegatronGroups {
  std::vector<std::vector<int>> tp, dp;  // [stage * dp + d], [stage * tp + t]
};
MegatronGroups megatron_groups(int pp, int dp, int tp) {
  MegatronGroups g;
  for (int p = 0; p < pp; ++p) {
    for (int d = 0; d < dp; ++d) {
      std::vector<int> ranks;
      for (int t = 0; t < tp; ++t) ranks.push_back(p * dp * tp + d * tp + t);
      g.tp.push_back(ranks);
    }
    for (int t = 0; t < tp; ++t) {
      std::vector<int> ranks;
      for (int d = 0; d < dp; ++d) ranks.push_back(p * dp * tp + d * tp + t);
      g.dp.push_back(ranks);
    }
  }
  return g;
}

}  // namespace

TEST_CASE("rank grid: a stage's ranks are tp fastest, then dp", "[grid]") {
  const StageGrid g(6, Strategy{3, 2});  // ranks 6..11
  CHECK(g.size() == 6);
  CHECK(g.end() == 12);
  CHECK(g.rank(0, 0) == 6);
  CHECK(g.rank(0, 1) == 7);
  CHECK(g.rank(1, 0) == 8);
  CHECK(g.rank(2, 1) == 11);
  for (int d = 0; d < g.dp; ++d)
    for (int t = 0; t < g.tp; ++t) {
      const int r = g.rank(d, t);
      CHECK(g.contains(r));
      CHECK(g.replica(r) == d);
      CHECK(g.tp_index(r) == t);
    }
  CHECK_FALSE(g.contains(5));
  CHECK_FALSE(g.contains(12));
}

TEST_CASE("rank grid: tp and dp groups match Megatron-LM's generator", "[grid]") {
  for (int pp : {1, 2, 3})
    for (int dp : {1, 2, 4})
      for (int tp : {1, 2, 8}) {
        INFO("pp " << pp << ", dp " << dp << ", tp " << tp);
        const MegatronGroups want = megatron_groups(pp, dp, tp);
        const PipelineGrid pipe(std::vector<Strategy>(pp, Strategy{dp, tp}));
        REQUIRE(pipe.num_stages() == pp);
        CHECK(pipe.num_ranks() == pp * dp * tp);
        for (int s = 0; s < pp; ++s) {
          const StageGrid& g = pipe.stage(s);
          CHECK(g.begin == s * dp * tp);
          for (int d = 0; d < dp; ++d) CHECK(g.tp_group(d).ranks() == want.tp[s * dp + d]);
          for (int t = 0; t < tp; ++t) CHECK(g.dp_group(t).ranks() == want.dp[s * tp + t]);
        }
      }
}

TEST_CASE("rank grid: a rank's position in its groups is its tp index and its replica", "[grid]") {
  const StageGrid g(4, Strategy{3, 4});  // ranks 4..15
  for (int r = g.begin; r < g.end(); ++r) {
    const RankStride tp = g.tp_group(g.replica(r)), dp = g.dp_group(g.tp_index(r));
    CHECK(tp.position_of(r) == g.tp_index(r));
    CHECK(dp.position_of(r) == g.replica(r));
    CHECK(tp[tp.position_of(r)] == r);
    CHECK(dp[dp.position_of(r)] == r);
  }
  const RankStride dp1 = g.dp_group(1);  // 5, 9, 13
  CHECK(dp1.position_of(5) == 0);
  CHECK(dp1.position_of(13) == 2);
  CHECK(dp1.position_of(6) == -1);   // another tp index
  CHECK(dp1.position_of(1) == -1);   // before the stage
  CHECK(dp1.position_of(17) == -1);  // past the group
}

TEST_CASE("rank grid: replicas starting in a range of ranks", "[grid]") {
  const StageGrid g(10, Strategy{4, 3});  // replicas start at 10, 13, 16, 19; ranks 10..21
  CHECK(g.replicas_starting_in(10, 22) == 4);
  CHECK(g.replicas_starting_in(10, 13) == 1);
  CHECK(g.replicas_starting_in(11, 13) == 0);
  CHECK(g.replicas_starting_in(11, 17) == 2);  // 13 and 16
  CHECK(g.replicas_starting_in(19, 22) == 1);
  for (int lo = g.begin; lo <= g.end(); ++lo)
    for (int hi = lo; hi <= g.end(); ++hi) {
      int count = 0;
      for (int d = 0; d < g.dp; ++d) count += g.rank(d, 0) >= lo && g.rank(d, 0) < hi;
      CHECK(g.replicas_starting_in(lo, hi) == count);
    }
}

TEST_CASE("rank grid: a pipeline of unequal stages and stage_of", "[grid]") {
  const PipelineGrid pipe({Strategy{2, 1}, Strategy{1, 4}, Strategy{3, 2}});
  CHECK(pipe.num_ranks() == 2 + 4 + 6);
  CHECK(pipe.stage(1).begin == 2);
  CHECK(pipe.stage(2).begin == 6);
  const int want[12] = {0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2};
  for (int r = 0; r < 12; ++r) CHECK(pipe.stage_of(r) == want[r]);
  CHECK(pipe.stage_of(-1) == -1);
  CHECK(pipe.stage_of(12) == -1);
}

TEST_CASE("rank grid: the data load balancer's replica types are each replica's first rank's", "[grid]") {
  const int rank_types[12] = {0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2};
  int got[4];
  replica_types_of(rank_types, 2, 8, 4, got);  // ranks 2..9 at dp 4: replicas start at 2, 4, 6, 8
  CHECK(std::vector<int>(got, got + 4) == std::vector<int>{0, 1, 1, 1});
  const StageGrid g(2, Strategy{4, 2});
  for (int d = 0; d < 4; ++d) CHECK(got[d] == rank_types[g.rank(d, 0)]);
}

TEST_CASE("a plan's node sequence as the cluster's type indices, which RankLayout lays its nodes out by", "[grid]") {
  const Cluster c = Cluster::from_parts({{"10.0.0.1", 2}, {"10.0.0.2", 1}},
                                        {{"10.0.0.1", "V100", 10, 50, 32}, {"10.0.0.2", "A100", 25, 300, 80}}, "hosts",
                                        "clusterfile");
  REQUIRE(c.device_types() == std::vector<std::string>{"A100", "V100"});
  CHECK(c.type_indices({"V100", "A100"}) == std::vector<int>{1, 0});
  CHECK(c.type_indices({"A100", "H100", "V100"}) == std::vector<int>{0, -1, 1});  // -1: not in the cluster
  CHECK(c.type_indices({}).empty());
  CHECK(RankLayout(c, c.type_indices({"V100", "A100"})).rank_types() == std::vector<int>{1, 1, 0});
}

}  // namespace hetplan
