#include "sim/timeline.h"

#include <algorithm>
#include <boost/graph/adjacency_list.hpp>
#include <boost/graph/topological_sort.hpp>
#include <iterator>

#include "base/input_error.h"
#include "sim/schedule.h"

namespace hetplan {

namespace {

enum class TaskKind { kForward, kBackward, kSendForward, kSendBackward, kAllReduce, kOptimizer };

struct Task {
  TaskKind kind = TaskKind::kForward;
  int stage = 0;
  int chunk = 0;
  int microbatch = -1;
  double duration_ms = 0;
  double start_ms = 0, end_ms = 0;
};

using Graph = boost::adjacency_list<boost::vecS, boost::vecS, boost::bidirectionalS, Task>;
using Vertex = boost::graph_traits<Graph>::vertex_descriptor;

// The graph's vertices by role, per virtual stage k (= stage without interleaving): fwd[k][j], bwd[k][j],
// sendf[k][j] (k -> k+1), sendb[k][j] (k -> k-1).
struct TaskGraph {
  Graph g;
  std::vector<std::vector<Vertex>> fwd, bwd, sendf, sendb;
  std::vector<Vertex> last_compute;  // per stage: its last forward or backward in schedule order

  Vertex add(TaskKind kind, int stage, int chunk, int mb, double ms) {
    Task t;
    t.kind = kind;
    t.stage = stage;
    t.chunk = chunk;
    t.microbatch = mb;
    t.duration_ms = ms;
    return boost::add_vertex(t, g);
  }
};

int chunks_of(const TimelineInput& in) { return in.schedule == Schedule::kInterleaved1F1B ? in.virtual_stages : 1; }

// The costs of virtual stage k: its chunk's with interleaving, else stage k's.
const StageCosts& virtual_costs(const TimelineInput& in, int k) {
  return chunks_of(in) > 1 ? in.chunks[k] : in.stages[k];
}

void add_compute_and_sends(const TimelineInput& in, TaskGraph* tg) {
  const int p = static_cast<int>(in.stages.size());
  const int vs = p * chunks_of(in);
  const int m = in.microbatches;
  tg->fwd.assign(vs, std::vector<Vertex>(m));
  tg->bwd = tg->sendf = tg->sendb = tg->fwd;
  for (int k = 0; k < vs; ++k) {
    const StageCosts& c = virtual_costs(in, k);
    const int i = k % p, chunk = k / p;
    for (int j = 0; j < m; ++j) {
      tg->fwd[k][j] = tg->add(TaskKind::kForward, i, chunk, j, c.forward_ms);
      // The first backward creates the gradients; the later ones add into them.
      tg->bwd[k][j] = tg->add(TaskKind::kBackward, i, chunk, j, c.backward_ms + (j > 0 ? c.accumulation_ms : 0.0));
      if (k + 1 < vs) tg->sendf[k][j] = tg->add(TaskKind::kSendForward, i, chunk, j, c.send_forward_ms);
      if (k > 0) tg->sendb[k][j] = tg->add(TaskKind::kSendBackward, i, chunk, j, c.send_backward_ms);
    }
  }
}

void add_data_dependencies(int vs, int m, TaskGraph* tg) {
  Graph& g = tg->g;
  for (int k = 0; k < vs; ++k)
    for (int j = 0; j < m; ++j) {
      boost::add_edge(tg->fwd[k][j], tg->bwd[k][j], g);
      if (k + 1 < vs) {
        boost::add_edge(tg->fwd[k][j], tg->sendf[k][j], g);
        boost::add_edge(tg->sendf[k][j], tg->fwd[k + 1][j], g);
      }
      if (k > 0) {
        boost::add_edge(tg->bwd[k][j], tg->sendb[k][j], g);
        boost::add_edge(tg->sendb[k][j], tg->bwd[k - 1][j], g);
      }
    }
}

// Resource order: each stage's compute in schedule order (StageOps); each stage's forward sends in the
// order of its forwards, its backward sends in the order of its backwards (micro-batch order without
// interleaving).
void add_resource_order(const TimelineInput& in, TaskGraph* tg) {
  Graph& g = tg->g;
  const int p = static_cast<int>(in.stages.size());
  const int v = chunks_of(in);
  const int vs = p * v;
  tg->last_compute.assign(p, 0);
  for (int i = 0; i < p; ++i) {
    Vertex prev = 0, prev_sendf = 0, prev_sendb = 0;
    bool first = true, first_sendf = true, first_sendb = true;
    for (const PipelineOp op : StageOps(in.schedule, p, i, in.microbatches, v)) {
      const int k = virtual_stage(p, i, op.chunk);
      const Vertex u = op.forward ? tg->fwd[k][op.micro_batch] : tg->bwd[k][op.micro_batch];
      if (!first) boost::add_edge(prev, u, g);
      prev = u;
      first = false;
      if (op.forward && k + 1 < vs) {
        const Vertex send = tg->sendf[k][op.micro_batch];
        if (!first_sendf) boost::add_edge(prev_sendf, send, g);
        prev_sendf = send;
        first_sendf = false;
      }
      if (!op.forward && k > 0) {
        const Vertex send = tg->sendb[k][op.micro_batch];
        if (!first_sendb) boost::add_edge(prev_sendb, send, g);
        prev_sendb = send;
        first_sendb = false;
      }
    }
    tg->last_compute[i] = prev;
  }
}

// Gradient all-reduce after the stage's last compute (its own stream), then the optimizer step.
void add_step_tasks(const TimelineInput& in, TaskGraph* tg) {
  const int p = static_cast<int>(in.stages.size());
  for (int i = 0; i < p; ++i) {
    const Vertex allreduce = tg->add(TaskKind::kAllReduce, i, 0, -1, in.stages[i].allreduce_ms);
    const Vertex optimizer = tg->add(TaskKind::kOptimizer, i, 0, -1, in.stages[i].optimizer_ms);
    boost::add_edge(tg->last_compute[i], allreduce, tg->g);
    boost::add_edge(allreduce, optimizer, tg->g);
  }
}

// Sets every task's start and end (the longest path to it, in topological order); returns the makespan.
double schedule_longest_paths(Graph* graph) {
  Graph& g = *graph;
  std::vector<Vertex> topo;
  topo.reserve(boost::num_vertices(g));
  boost::topological_sort(g, std::back_inserter(topo));  // reverse topological order
  double makespan = 0;
  for (auto it = topo.rbegin(); it != topo.rend(); ++it) {
    Task& t = g[*it];
    double start = 0;
    for (auto [e, end] = boost::in_edges(*it, g); e != end; ++e) start = std::max(start, g[boost::source(*e, g)].end_ms);
    t.start_ms = start;
    t.end_ms = start + t.duration_ms;
    makespan = std::max(makespan, t.end_ms);
  }
  return makespan;
}

// The spans of every task (a send also as its peer's recv), sorted by start; adds up busy time per
// stage in r->busy_ms and returns the forward and backward time of all stages.
double collect_spans(const Graph& g, int p, TimelineResult* r) {
  r->busy_ms.assign(p, 0.0);
  double compute = 0;
  for (auto [v, end] = boost::vertices(g); v != end; ++v) {
    const Task& t = g[*v];
    Span s;
    s.stage = t.stage;
    s.microbatch = t.microbatch;
    s.chunk = t.chunk;
    s.start_ms = t.start_ms;
    s.end_ms = t.end_ms;
    switch (t.kind) {
      case TaskKind::kForward:
      case TaskKind::kBackward:
        s.name = t.kind == TaskKind::kForward ? "forward" : "backward";
        r->busy_ms[t.stage] += t.duration_ms;
        compute += t.duration_ms;
        r->spans.push_back(s);
        break;
      case TaskKind::kSendForward:
      case TaskKind::kSendBackward: {
        // The stage and chunk of the virtual stage after (before) this one.
        const int to = virtual_stage(p, t.stage, t.chunk) + (t.kind == TaskKind::kSendForward ? 1 : -1);
        const int peer = to % p;
        s.name = "send";
        s.peer = peer;
        r->spans.push_back(s);
        s.name = "recv";
        s.stage = peer;
        s.chunk = to / p;
        s.peer = t.stage;
        r->spans.push_back(s);
        break;
      }
      case TaskKind::kAllReduce:
        s.name = "allreduce";
        r->spans.push_back(s);
        break;
      case TaskKind::kOptimizer:
        s.name = "optimizer";
        r->busy_ms[t.stage] += t.duration_ms;
        r->spans.push_back(s);
        break;
    }
  }
  std::sort(r->spans.begin(), r->spans.end(), [](const Span& a, const Span& b) {
    if (a.start_ms != b.start_ms) return a.start_ms < b.start_ms;
    if (a.stage != b.stage) return a.stage < b.stage;
    if (a.name != b.name) return a.name < b.name;
    return a.chunk < b.chunk;
  });
  return compute;
}

// (Micro-batch, chunk) pairs held: forwards started minus backwards finished, in schedule order.
std::vector<int> peak_in_flight(Schedule schedule, int p, int m, int v) {
  std::vector<int> peak(p, 0);
  for (int i = 0; i < p; ++i) {
    int held = 0;
    for (const PipelineOp op : StageOps(schedule, p, i, m, v)) {
      held += op.forward ? 1 : -1;
      peak[i] = std::max(peak[i], held);
    }
  }
  return peak;
}

// Bubble fraction, tokens/s and MFU of r's iteration.
void add_rates(const TimelineInput& in, double compute, TimelineResult* r) {
  const int p = static_cast<int>(in.stages.size());
  r->bubble_fraction = r->iteration_ms > 0 ? 1.0 - compute / (p * r->iteration_ms) : 0.0;
  if (!(r->iteration_ms > 0)) return;
  r->tokens_per_s = in.tokens / (r->iteration_ms / 1e3);
  double peak = 0;
  bool known = true;
  for (const auto& c : in.stages) {
    peak += c.peak_flops;
    known = known && c.peak_flops > 0;
  }
  if (known && in.model_flops > 0) r->mfu = in.model_flops / (r->iteration_ms / 1e3) / peak;
}

}  // namespace

TimelineResult simulate_timeline(const TimelineInput& in) {
  const int p = static_cast<int>(in.stages.size());
  const int m = in.microbatches;
  if (p < 1) throw InputError("timeline: no stages");
  if (m < 1) throw InputError("timeline: expected at least one micro-batch");
  const int v = chunks_of(in);
  if (const std::string e = interleaving_error(in.schedule, p, m, in.virtual_stages); !e.empty())
    throw InputError("timeline: " + e);
  if (v > 1 && in.chunks.size() != static_cast<std::size_t>(p) * v)
    throw InputError("timeline: expected the costs of " + std::to_string(p * v) + " virtual stages");
  TaskGraph tg;
  add_compute_and_sends(in, &tg);
  add_data_dependencies(p * v, m, &tg);
  add_resource_order(in, &tg);
  add_step_tasks(in, &tg);
  TimelineResult r;
  r.iteration_ms = schedule_longest_paths(&tg.g);
  const double compute = collect_spans(tg.g, p, &r);
  r.peak_in_flight = peak_in_flight(in.schedule, p, m, v);
  add_rates(in, compute, &r);
  return r;
}

ordered_json chrome_trace(const TimelineResult& r, const std::vector<StageCosts>& stages) {
  ordered_json events = ordered_json::array();
  bool any_chunk = false;  // interleaved: every compute and p2p span names its chunk
  for (const Span& s : r.spans) any_chunk = any_chunk || s.chunk > 0;
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
    if (s.chunk > 0 || (s.microbatch >= 0 && s.name != "allreduce" && s.name != "optimizer" && any_chunk))
      args["chunk"] = s.chunk;
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

}  // namespace hetplan
