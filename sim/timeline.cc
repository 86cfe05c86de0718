#include "sim/timeline.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/topological_sort.hpp>
#include <iterator>

#include "sim/input_error.h"

namespace hetplan {

namespace {

enum class TaskKind { kForward, kBackward, kSendForward, kSendBackward, kAllReduce, kOptimizer };

struct Task {
  TaskKind kind = TaskKind::kForward;
  int stage = 0;
  int microbatch = -1;
  double duration_ms = 0;
  double start_ms = 0, end_ms = 0;
};

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Task>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

}  // namespace

std::vector<int> stage_order(Schedule schedule, int pp, int stage, int m) {
  std::vector<int> order;
  order.reserve(2 * m);
  if (schedule == Schedule::kGpipe) {
    for (int j = 0; j < m; ++j) order.push_back(j + 1);
    for (int j = 0; j < m; ++j) order.push_back(-(j + 1));
    return order;
  }
  const int warmup = std::min(pp - stage - 1, m);
  for (int j = 0; j < warmup; ++j) order.push_back(j + 1);
  for (int k = 0; k < m - warmup; ++k) {
    order.push_back(warmup + k + 1);
    order.push_back(-(k + 1));
  }
  for (int j = m - warmup; j < m; ++j) order.push_back(-(j + 1));
  return order;
}

TimelineResult simulate_timeline(const TimelineInput& in) {
  const int p = static_cast<int>(in.stages.size());
  const int m = in.microbatches;
  if (p < 1) throw InputError("timeline: no stages");
  if (m < 1) throw InputError("timeline: expected at least one micro-batch");

  Graph g;
  auto add = [&](TaskKind kind, int stage, int mb, double ms) {
    Task t;
    t.kind = kind;
    t.stage = stage;
    t.microbatch = mb;
    t.duration_ms = ms;
    return boost::add_vertex(t, g);
  };
  // Vertex ids: fwd[i][j], bwd[i][j], sendf[i][j] (i -> i+1), sendb[i][j] (i -> i-1).
  std::vector<std::vector<Vertex>> fwd(p, std::vector<Vertex>(m)), bwd = fwd, sendf = fwd, sendb = fwd;
  for (int i = 0; i < p; ++i) {
    const StageCosts& c = in.stages[i];
    for (int j = 0; j < m; ++j) {
      fwd[i][j] = add(TaskKind::kForward, i, j, c.forward_ms);
      // The first backward creates the gradients; the later ones add into them.
      bwd[i][j] = add(TaskKind::kBackward, i, j, c.backward_ms + (j > 0 ? c.accumulation_ms : 0.0));
      if (i + 1 < p) sendf[i][j] = add(TaskKind::kSendForward, i, j, c.send_forward_ms);
      if (i > 0) sendb[i][j] = add(TaskKind::kSendBackward, i, j, c.send_backward_ms);
    }
  }
  // Data dependencies.
  for (int i = 0; i < p; ++i)
    for (int j = 0; j < m; ++j) {
      boost::add_edge(fwd[i][j], bwd[i][j], g);
      if (i + 1 < p) {
        boost::add_edge(fwd[i][j], sendf[i][j], g);
        boost::add_edge(sendf[i][j], fwd[i + 1][j], g);
      }
      if (i > 0) {
        boost::add_edge(bwd[i][j], sendb[i][j], g);
        boost::add_edge(sendb[i][j], bwd[i - 1][j], g);
      }
    }
  // Resource order: each stage's compute in schedule order; each link in micro-batch order.
  std::vector<Vertex> last_compute(p);
  for (int i = 0; i < p; ++i) {
    const std::vector<int> order = stage_order(in.schedule, p, i, m);
    Vertex prev = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const int op = order[k];
      const Vertex v = op > 0 ? fwd[i][op - 1] : bwd[i][-op - 1];
      if (k > 0) boost::add_edge(prev, v, g);
      prev = v;
    }
    last_compute[i] = prev;
    for (int j = 1; j < m; ++j) {
      if (i + 1 < p) boost::add_edge(sendf[i][j - 1], sendf[i][j], g);
      if (i > 0) boost::add_edge(sendb[i][j - 1], sendb[i][j], g);
    }
  }
  // Gradient all-reduce after the stage's last backward (its own stream), then the optimizer step.
  std::vector<Vertex> allreduce(p), optimizer(p);
  for (int i = 0; i < p; ++i) {
    allreduce[i] = add(TaskKind::kAllReduce, i, -1, in.stages[i].allreduce_ms);
    optimizer[i] = add(TaskKind::kOptimizer, i, -1, in.stages[i].optimizer_ms);
    boost::add_edge(last_compute[i], allreduce[i], g);
    boost::add_edge(allreduce[i], optimizer[i], g);
  }

  // Longest path in topological order.
  std::vector<Vertex> topo;
  topo.reserve(boost::num_vertices(g));
  boost::topological_sort(g, std::back_inserter(topo));  // reverse topological order
  TimelineResult r;
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
    Task& t = g[*it];
    double start = 0;
    for (auto [e, end] = boost::in_edges(*it, g); e != end; ++e) start = std::max(start, g[boost::source(*e, g)].end_ms);
    t.start_ms = start;
    t.end_ms = start + t.duration_ms;
    r.iteration_ms = std::max(r.iteration_ms, t.end_ms);
  }

  r.busy_ms.assign(p, 0.0);
  r.peak_in_flight.assign(p, 0);
  double compute = 0;
  for (auto [v, end] = boost::vertices(g); v != end; ++v) {
    const Task& t = g[*v];
    Span s;
    s.stage = t.stage;
    s.microbatch = t.microbatch;
    s.start_ms = t.start_ms;
    s.end_ms = t.end_ms;
    switch (t.kind) {
      case TaskKind::kForward:
      case TaskKind::kBackward:
        s.name = t.kind == TaskKind::kForward ? "forward" : "backward";
        r.busy_ms[t.stage] += t.duration_ms;
        compute += t.duration_ms;
        r.spans.push_back(s);
        break;
      case TaskKind::kSendForward:
      case TaskKind::kSendBackward: {
        const int peer = t.kind == TaskKind::kSendForward ? t.stage + 1 : t.stage - 1;
        s.name = "send";
        s.peer = peer;
        r.spans.push_back(s);
        s.name = "recv";
        s.stage = peer;
        s.peer = t.stage;
        r.spans.push_back(s);
        break;
      }
      case TaskKind::kAllReduce:
        s.name = "allreduce";
        r.spans.push_back(s);
        break;
      case TaskKind::kOptimizer:
        s.name = "optimizer";
        r.busy_ms[t.stage] += t.duration_ms;
        r.spans.push_back(s);
        break;
    }
  }
  std::sort(r.spans.begin(), r.spans.end(), [](const Span& a, const Span& b) {
    if (a.start_ms != b.start_ms) return a.start_ms < b.start_ms;
    if (a.stage != b.stage) return a.stage < b.stage;
    return a.name < b.name;
  });
  // Micro-batches held: forwards started minus backwards finished, in schedule order.
  for (int i = 0; i < p; ++i) {
    int held = 0;
    for (int op : stage_order(in.schedule, p, i, m)) {
      held += op > 0 ? 1 : -1;
      r.peak_in_flight[i] = std::max(r.peak_in_flight[i], held);
    }
  }
  r.bubble_fraction = r.iteration_ms > 0 ? 1.0 - compute / (p * r.iteration_ms) : 0.0;
  if (r.iteration_ms > 0) {
    r.tokens_per_s = in.tokens / (r.iteration_ms / 1e3);
    double peak = 0;
    bool known = true;
    for (const auto& c : in.stages) {
      peak += c.peak_flops;
      known = known && c.peak_flops > 0;
    }
    if (known && in.model_flops > 0) r.mfu = in.model_flops / (r.iteration_ms / 1e3) / peak;
  }
  return r;
}

ordered_json chrome_trace(const TimelineResult& r, const std::vector<StageCosts>& stages) {
  ordered_json events = ordered_json::array();
  for (std::size_t i = 0; i < stages.size(); ++i) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", i}, {"args", {{"name", stages[i].label}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", i}, {"tid", 0}, {"args", {{"name", "compute"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", i}, {"tid", 1}, {"args", {{"name", "p2p"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", i}, {"tid", 2}, {"args", {{"name", "collective"}}}});
  }
  for (const Span& s : r.spans) {
    int tid = 0;
    if (s.name == "send" || s.name == "recv") tid = 1;
    if (s.name == "allreduce") tid = 2;
    ordered_json args = {{"stage", s.stage}};
    if (s.microbatch >= 0) args["microbatch"] = s.microbatch;
    if (s.peer >= 0) args["peer"] = s.peer;
    events.push_back({{"name", s.name},
                      {"cat", tid == 0 ? "compute" : "comm"},
                      {"ph", "X"},
                      {"pid", s.stage},
                      {"tid", tid},
                      {"ts", s.start_ms * 1e3},
                      {"dur", (s.end_ms - s.start_ms) * 1e3},
                      {"args", args}});
  }
  ordered_json j;
  j["traceEvents"] = events;
  j["displayTimeUnit"] = "ms";
  return j;
}

const char* to_string(Schedule s) { return s == Schedule::kGpipe ? "gpipe" : "1f1b"; }

Schedule parse_schedule(const std::string& s, const std::string& where) {
  if (s == "gpipe" || s == "GPipe") return Schedule::kGpipe;
  if (s == "1f1b" || s == "1F1B") return Schedule::k1F1B;
  throw InputError(where + ": '" + excerpt(s) + "': expected gpipe or 1f1b");
}

}  // namespace hetplan
