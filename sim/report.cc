#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <set>

#include "base/input_error.h"
#include "base/json_util.h"
#include "sim/rank_layout.h"

namespace hetplan {

namespace {

constexpr double kGiBytes = 1024.0 * 1024 * 1024;

// Page geometry (px): the label column, the plot and the lanes.
constexpr int kWidth = 1320, kLabelWidth = 300, kPlotRight = 20;
constexpr int kPlotWidth = kWidth - kLabelWidth - kPlotRight;
constexpr int kAxisHeight = 26;

std::string num(double v, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

const char* span_colour(const std::string& name) {
  if (name == "forward") return "#4c78a8";
  if (name == "backward") return "#59a14f";
  if (name == "allreduce") return "#b07aa1";
  if (name == "optimizer") return "#8c8c8c";
  return "#f28e2b";  // send, recv
}

bool is_compute(const std::string& name) { return name == "forward" || name == "backward" || name == "optimizer"; }

// The hosts of the ranks of `stage`, in rank order, each once.
std::string stage_hosts(const ReportInput& in, int stage) {
  std::string out;
  std::set<std::string> seen;
  for (const auto& r : in.sim->ranks) {
    if (r.stage != stage || r.rank >= static_cast<int>(in.rank_hosts.size())) continue;
    const std::string& h = in.rank_hosts[r.rank];
    if (h.empty() || !seen.insert(h).second) continue;
    out += (out.empty() ? "" : ", ") + html_escape(h);
  }
  return out.empty() ? "-" : out;
}

std::string rank_label(const ReportInput& in, const RankMemory& r) {
  std::string s = "rank " + std::to_string(r.rank) + " \u00b7 stage " + std::to_string(r.stage) + " \u00b7 " + r.device;
  if (r.rank < static_cast<int>(in.rank_hosts.size()) && !in.rank_hosts[r.rank].empty())
    s += " \u00b7 " + in.rank_hosts[r.rank];
  return html_escape(s);
}

std::string style_block() {
  return "<style>\n"
         "body{font:14px/1.45 system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;color:#222;"
         "margin:24px 32px;background:#fff}\n"
         "h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;"
         "padding-bottom:4px}\n"
         ".summary{color:#444;margin:0 0 8px}.summary b{color:#111}\n"
         "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:4px 10px;text-align:left}"
         "th{background:#f5f5f5}td.n{text-align:right;font-variant-numeric:tabular-nums}\n"
         ".legend span{display:inline-block;margin-right:16px;font-size:13px}.legend i{display:inline-block;"
         "width:12px;height:12px;margin-right:5px;vertical-align:-1px;border-radius:2px}\n"
         "svg text{font:12px system-ui,-apple-system,'Segoe UI',Roboto,Helvetica,Arial,sans-serif;fill:#333}\n"
         ".oom{color:#b00020;font-weight:600}.ok{color:#2e7d32;font-weight:600}\n"
         "</style>\n";
}

std::string legend(const std::vector<std::pair<const char*, const char*>>& items) {
  std::string s = "<div class=\"legend\">";
  for (const auto& [name, colour] : items)
    s += std::string("<span><i style=\"background:") + colour + "\"></i>" + name + "</span>";
  return s + "</div>\n";
}

std::string summary_section(const ReportInput& in) {
  const PlanSimulation& sim = *in.sim;
  const TimelineResult& t = sim.timeline;
  std::string s = "<h1>" + html_escape(in.title) + "</h1>\n<p class=\"summary\">";
  s += "iteration <b>" + num(t.iteration_ms, 3) + " ms</b> \u00b7 schedule " + html_escape(in.schedule) +
       " \u00b7 bubble " + num(100 * t.bubble_fraction, 1) + "% \u00b7 " + num(t.tokens_per_s, 0) + " tokens/s";
  if (t.mfu >= 0) s += " \u00b7 MFU " + num(100 * t.mfu, 1) + "%";
  s += " \u00b7 " + std::to_string(sim.stages.size()) + " stage(s), " + std::to_string(sim.ranks.size()) + " GPUs \u00b7 ";
  if (sim.fits) {
    s += "<span class=\"ok\">every rank fits</span>";
  } else {
    const RankMemory& r = sim.ranks[sim.first_oom_rank];
    s += "<span class=\"oom\">OUT OF MEMORY on rank " + std::to_string(r.rank) + " (" + html_escape(r.device) + "): " +
         num(r.breakdown.gpu_total() / kGiBytes, 2) + " of " + num(r.capacity_bytes / kGiBytes, 2) + " GiB</span>";
  }
  return s + "</p>\n";
}

std::string plan_section(const ReportInput& in) {
  const PlanSimulation& sim = *in.sim;
  std::string s = "<h2>Plan</h2>\n<table id=\"plan\"><tr><th>stage</th><th>ranks</th><th>hosts</th>"
                  "<th>forward ms</th><th>backward ms</th><th>all-reduce ms</th><th>in flight</th></tr>\n";
  for (std::size_t i = 0; i < sim.stages.size(); ++i) {
    int first = -1, last = -1;
    for (const auto& r : sim.ranks)
      if (r.stage == static_cast<int>(i)) {
        if (first < 0) first = r.rank;
        last = r.rank;
      }
    const StageCosts& c = sim.stages[i];
    s += "<tr><td>" + html_escape(c.label) + (c.power_limited ? " (sets the pace, sustained clocks)" : "") +
         "</td><td>" + std::to_string(first) + "\u2013" + std::to_string(last) + "</td><td>" +
         stage_hosts(in, static_cast<int>(i)) + "</td><td class=\"n\">" + num(c.forward_ms, 3) +
         "</td><td class=\"n\">" + num(c.backward_ms, 3) + "</td><td class=\"n\">" + num(c.allreduce_ms, 3) +
         "</td><td class=\"n\">" + std::to_string(sim.timeline.peak_in_flight[i]) + "</td></tr>\n";
  }
  return s + "</table>\n";
}

// Tick marks every `step` (1, 2 or 5 times a power of ten) across [0, end].
std::string time_axis(double end_ms, int height) {
  end_ms = std::max(end_ms, 1e-6);
  const double base = std::pow(10.0, std::floor(std::log10(end_ms / 8)));
  double step = base;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = base * m;
    if (end_ms / step <= 10) break;
  }
  const int digits = step >= 1 ? 0 : step >= 0.1 ? 1 : 2;
  std::string s;
  for (double t = 0; t <= end_ms * 1.0001; t += step) {
    const double x = kLabelWidth + kPlotWidth * t / end_ms;
    s += "<line x1=\"" + num(x, 1) + "\" y1=\"" + std::to_string(kAxisHeight - 6) + "\" x2=\"" + num(x, 1) +
         "\" y2=\"" + std::to_string(height) + "\" stroke=\"#e4e4e4\"/>";
    s += "<text x=\"" + num(x, 1) + "\" y=\"" + std::to_string(kAxisHeight - 10) + "\" text-anchor=\"middle\">" +
         num(t, digits) + " ms</text>\n";
  }
  return s;
}

// One rank's lane: its stage's spans over the bubble-coloured background.
std::string timeline_lane(const ReportInput& in, const RankMemory& r, int y, int lane_h) {
  const TimelineResult& t = in.sim->timeline;
  const double scale = kPlotWidth / std::max(t.iteration_ms, 1e-9);
  const int compute_h = lane_h - 6;
  std::string s = "<g class=\"lane\" data-rank=\"" + std::to_string(r.rank) + "\" transform=\"translate(0," +
                  std::to_string(y) + ")\"><text x=\"4\" y=\"" + std::to_string(compute_h - 2) + "\">" +
                  rank_label(in, r) + "</text><rect class=\"bubble\" x=\"" + std::to_string(kLabelWidth) +
                  "\" y=\"0\" width=\"" + std::to_string(kPlotWidth) + "\" height=\"" + std::to_string(compute_h) +
                  "\" fill=\"#fbe3e3\"/>";
  for (const Span& sp : t.spans) {
    if (sp.stage != r.stage) continue;
    const bool compute = is_compute(sp.name);
    const double x = kLabelWidth + sp.start_ms * scale, w = std::max(0.5, (sp.end_ms - sp.start_ms) * scale);
    s += "<rect class=\"" + sp.name + "\" x=\"" + num(x, 2) + "\" y=\"" + (compute ? "0" : std::to_string(compute_h + 1)) +
         "\" width=\"" + num(w, 2) + "\" height=\"" + (compute ? std::to_string(compute_h) : "4") + "\" fill=\"" +
         span_colour(sp.name) + "\"" + (compute ? " stroke=\"#fff\" stroke-width=\"0.4\"" : "") + "><title>" +
         sp.name + (sp.microbatch >= 0 ? " micro-batch " + std::to_string(sp.microbatch) : std::string()) + ": " +
         num(sp.start_ms, 3) + "\u2013" + num(sp.end_ms, 3) + " ms</title></rect>";
  }
  return s + "</g>\n";
}

std::string timeline_section(const ReportInput& in) {
  const PlanSimulation& sim = *in.sim;
  const int lane_h = sim.ranks.size() > 48 ? 16 : 21;
  const int height = kAxisHeight + lane_h * static_cast<int>(sim.ranks.size()) + 4;
  std::string s = "<h2>Timeline of one iteration (one lane per rank)</h2>\n" +
                  legend({{"forward", "#4c78a8"}, {"backward", "#59a14f"}, {"send / recv (thin)", "#f28e2b"},
                          {"gradient all-reduce (thin)", "#b07aa1"}, {"optimizer", "#8c8c8c"},
                          {"bubble (idle)", "#fbe3e3"}});
  s += "<svg id=\"timeline\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(kWidth) +
       "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(kWidth) + " " +
       std::to_string(height) + "\">\n" + time_axis(sim.timeline.iteration_ms, height);
  for (std::size_t i = 0; i < sim.ranks.size(); ++i)
    s += timeline_lane(in, sim.ranks[i], kAxisHeight + lane_h * static_cast<int>(i), lane_h);
  return s + "</svg>\n";
}

struct MemoryPart {
  const char* name;
  const char* colour;
  double bytes;
};

std::vector<MemoryPart> memory_parts(const MemoryBreakdown& b) {
  return {{"weights", "#4c78a8", b.states.weights + b.states.transient},
          {"gradients", "#59a14f", b.states.gradients},
          {"optimizer", "#edc948", b.states.optimizer},
          {"activations", "#e15759", b.activations + b.recompute_workspace},
          {"reserve", "#bab0ac", b.allocator_reserve},
          {"framework", "#8c8c8c", b.framework},
          {"nccl", "#76b7b2", b.nccl}};
}

double measured_peak_bytes(const ReportInput& in, int rank) {
  if (!in.measured || rank >= static_cast<int>(in.measured->rank_peak_mb.size())) return -1;
  const double mb = in.measured->rank_peak_mb[rank];
  return mb < 0 ? -1 : mb * 1024 * 1024;
}

// One rank's stacked bar, its capacity line and (with a replay) its measured peak.
std::string memory_bar(const ReportInput& in, const RankMemory& r, int y, double scale) {
  std::string s = "<g class=\"membar\" data-rank=\"" + std::to_string(r.rank) + "\" transform=\"translate(0," +
                  std::to_string(y) + ")\"><text x=\"4\" y=\"13\">" + rank_label(in, r) + "</text>";
  double x = kLabelWidth;
  for (const MemoryPart& p : memory_parts(r.breakdown)) {
    const double w = p.bytes * scale;
    s += std::string("<rect class=\"mem-") + p.name + "\" x=\"" + num(x, 2) + "\" y=\"2\" width=\"" + num(w, 2) +
         "\" height=\"14\" fill=\"" + p.colour + "\"><title>" + p.name + ": " + num(p.bytes / kGiBytes, 2) +
         " GiB</title></rect>";
    x += w;
  }
  const double cap_x = kLabelWidth + r.capacity_bytes * scale;
  s += "<line class=\"capacity\" x1=\"" + num(cap_x, 2) + "\" y1=\"0\" x2=\"" + num(cap_x, 2) +
       "\" y2=\"18\" stroke=\"#222\" stroke-width=\"2\"/>";
  const double measured = measured_peak_bytes(in, r.rank);
  if (measured >= 0)
    s += "<path class=\"measured\" d=\"M" + num(kLabelWidth + measured * scale, 2) +
         " 1 l5 8 l-5 8 l-5 -8 z\" fill=\"#111\"><title>measured peak: " + num(measured / kGiBytes, 2) +
         " GiB</title></path>";
  s += "<text x=\"" + num(std::max(x, cap_x) + 8, 1) + "\" y=\"13\">" + num(r.breakdown.gpu_total() / kGiBytes, 2) +
       " / " + num(r.capacity_bytes / kGiBytes, 1) + " GiB" + (r.fits() ? "" : " \u2014 OUT OF MEMORY") + "</text>";
  return s + "</g>\n";
}

std::string memory_section(const ReportInput& in) {
  const PlanSimulation& sim = *in.sim;
  double top = 1;
  for (const auto& r : sim.ranks)
    top = std::max({top, r.capacity_bytes, r.breakdown.gpu_total(), measured_peak_bytes(in, r.rank)});
  const double scale = (kPlotWidth - 150) / top;  // room for the value after the bar
  const int row_h = 20, height = row_h * static_cast<int>(sim.ranks.size()) + 4;
  std::string s = "<h2>Memory per rank against capacity</h2>\n" +
                  legend({{"weights", "#4c78a8"}, {"gradients", "#59a14f"}, {"optimizer states", "#edc948"},
                          {"activations", "#e15759"}, {"allocator reserve", "#bab0ac"}, {"framework", "#8c8c8c"},
                          {"NCCL", "#76b7b2"}, {"capacity (line)", "#222"}}) +
                  (in.measured ? "<div class=\"legend\"><span>\u25c6 measured peak (replay)</span></div>\n" : "");
  s += "<svg id=\"memory\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" + std::to_string(kWidth) + "\" height=\"" +
       std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(kWidth) + " " + std::to_string(height) + "\">\n";
  for (std::size_t i = 0; i < sim.ranks.size(); ++i)
    s += memory_bar(in, sim.ranks[i], 2 + row_h * static_cast<int>(i), scale);
  return s + "</svg>\n";
}

std::string error_cell(double predicted, double measured) {
  if (predicted < 0 || measured <= 0) return "-";
  return num(100 * (measured - predicted) / measured, 1) + "%";
}

std::string measured_section(const ReportInput& in) {
  if (!in.measured) return "";
  const MeasuredRun& m = *in.measured;
  const double predicted = in.sim->timeline.iteration_ms;
  std::string s = "<h2>Predicted against measured</h2>\n<p class=\"summary\">replay: " + html_escape(m.path) +
                  "</p>\n<table id=\"measured\"><tr><th>quantity</th><th>predicted</th><th>measured</th>"
                  "<th>error (measured \u2212 predicted) / measured</th></tr>\n";
  s += "<tr><td>iteration ms</td><td class=\"n\">" + num(predicted, 3) + "</td><td class=\"n\">" +
       num(m.iteration_ms, 3) + "</td><td class=\"n\">" + error_cell(predicted, m.iteration_ms) + "</td></tr>\n";
  for (const auto& r : in.sim->ranks) {
    const double measured = measured_peak_bytes(in, r.rank);
    if (measured < 0) continue;
    const double p = r.breakdown.allocated_peak() / kGiBytes;
    s += "<tr><td>rank " + std::to_string(r.rank) + " peak allocated GiB</td><td class=\"n\">" + num(p, 2) +
         "</td><td class=\"n\">" + num(measured / kGiBytes, 2) + "</td><td class=\"n\">" +
         error_cell(p, measured / kGiBytes) + "</td></tr>\n";
  }
  return s + "</table>\n";
}

}  // namespace

std::vector<std::string> rank_hosts(const Cluster& cluster, const PlanResult& plan) {
  std::vector<int> sequence;
  for (const auto& name : plan.node_sequence) {
    const int t = cluster.type_index(name);
    if (t < 0) throw InputError("plan: node_sequence names '" + excerpt(name) + "', which the cluster does not have");
    sequence.push_back(t);
  }
  const RankLayout layout(cluster, sequence);
  std::vector<std::string> out(layout.num_ranks());
  for (int r = 0; r < layout.num_ranks(); ++r) out[r] = cluster.nodes()[layout.node_of(r)].ip;
  return out;
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string report_html(const ReportInput& in) {
  std::string s = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>hetplan report: " +
                  html_escape(in.title) + "</title>\n" + style_block() + "</head>\n<body>\n";
  s += summary_section(in) + plan_section(in) + timeline_section(in) + memory_section(in) + measured_section(in);
  s += "<p class=\"summary\">Written by hetplan: the simulator's prediction (sim/plan_simulator.h); lanes counted: "
       "<span id=\"lane-count\">?</span>.</p>\n"
       "<script>(function(){var n=document.querySelectorAll('svg#timeline g.lane').length;"
       "document.body.setAttribute('data-lanes',String(n));"
       "document.getElementById('lane-count').textContent=String(n);})();</script>\n</body></html>\n";
  return s;
}

void write_report_html(const std::string& path, const ReportInput& in) {
  std::ofstream out(path, std::ios::binary);
  if (!out) throw InputError(path + ": cannot write the report");
  out << report_html(in);
  if (!out.flush()) throw InputError(path + ": cannot write the report");
}

MeasuredRun read_replay_json(const std::string& path) {
  const ordered_json j = read_json_file(path);
  MeasuredRun m;
  m.path = path;
  m.iteration_ms = require_number(require_key(j, "iteration_ms", path, ""), "median", path, "iteration_ms",
                                  rules::kPositive);
  if (j.contains("predicted_ms") && j["predicted_ms"].is_number()) m.predicted_ms = j["predicted_ms"].get<double>();
  if (!j.contains("ranks")) return m;
  const ordered_json& ranks = require_array(j, "ranks", path, "");
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    const std::string where = "ranks[" + std::to_string(i) + "]";
    const long long rank = require_integer(ranks[i], "rank", path, where, rules::int_in(0, 1 << 24));
    const double mb = require_number(ranks[i], "peak_memory_mb", path, where, rules::kNonNegative);
    if (static_cast<std::size_t>(rank) >= m.rank_peak_mb.size()) m.rank_peak_mb.resize(rank + 1, -1);
    m.rank_peak_mb[rank] = mb;
  }
  return m;
}

}  // namespace hetplan
