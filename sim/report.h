// The HTML report: one self-contained page (no external resources: inline
// CSS, SVG and a few lines of script; opens offline in any browser) that
// explains one simulated plan:
// - the plan: its stages, each with its GPUs, (dp, tp), layers and hosts;
// - an SVG timeline of one iteration with one lane per rank (a rank shows its
//   stage's forwards, backwards, sends/receives, gradient all-reduce and
//   optimizer step; the lane's uncovered background is its bubble);
// - per-rank memory as stacked bars (weights, gradients, optimizer,
//   activations, framework) against the GPU's capacity;
// - with a replay's JSON (`hetplan replay --out`), predicted against measured
//   iteration time and per-rank peak memory.
// Every user string (paths, labels, device and host names) is HTML-escaped.
//
// The page carries machine-readable marks for tests: each lane is an SVG
// <g class="lane" data-rank="R">, each memory bar a <g class="membar"
// data-rank="R"> of <rect class="mem-weights"> (mem-gradients, mem-optimizer,
// mem-activations, mem-reserve, mem-framework, mem-nccl), and the script sets
// <body data-lanes="N"> to the lanes it counts once the page has loaded.
//
// Explaining path: allocates freely. Thread-safety: plain functions of their
// arguments. ReportInput's pointers are borrowed for the call.
#pragma once

#include <string>
#include <vector>

#include "sim/cluster.h"
#include "sim/plan.h"
#include "sim/plan_simulator.h"

namespace hetplan {

// What a replay measured (the JSON `hetplan replay --out` writes).
struct MeasuredRun {
  std::string path;
  double iteration_ms = -1;  // iteration_ms.median
  double predicted_ms = -1;  // predicted_ms, the plan's cost as the search recorded it; -1 if absent
  // peak_memory_mb per rank (ranks[].rank / ranks[].peak_memory_mb); -1 where the replay has none.
  std::vector<double> rank_peak_mb;
};

// Reads a replay JSON. Throws InputError naming the file and key.
MeasuredRun read_replay_json(const std::string& path);

struct ReportInput {
  std::string title;     // shown as the page's heading (e.g. the plan file's path)
  std::string schedule;  // "1f1b", "gpipe"
  const PlanSimulation* sim = nullptr;
  std::vector<std::string> rank_hosts;  // per rank: its node's address ("" if unknown)
  const MeasuredRun* measured = nullptr;  // nullptr: no replay
};

// The address of the node each rank of `plan` runs on (RankLayout's order).
// Throws InputError if the plan names a device type the cluster lacks.
std::vector<std::string> rank_hosts(const Cluster& cluster, const PlanResult& plan);

// Characters of `s` that HTML gives a meaning (& < > " ') as entities.
std::string html_escape(const std::string& s);

// The page. REQUIRES: in.sim != nullptr.
std::string report_html(const ReportInput& in);

// Writes report_html(in) to `path`; throws InputError if the file cannot be written.
void write_report_html(const std::string& path, const ReportInput& in);

}  // namespace hetplan
