// `hetplan report`: the HTML report of a plan (sim/report.h), simulated with
// the plan file's own settings as `simulate --report` does, with a replay's
// measurements beside the prediction when --replay is given.
#include <memory>
#include <string>

#include "cli/commands.h"

namespace hetplan::cli {

namespace {

struct ReportArgs {
  std::string plan, replay, out, hf_config;
};

}  // namespace

Runner add_report_command(CLI::App& app) {
  auto a = std::make_shared<ReportArgs>();
  CLI::App* s = app.add_subcommand(
      "report",
      "Write one self-contained HTML page (no external resources; opens offline in any browser) explaining a\n"
      "plan: its stages, GPUs and hosts; an SVG timeline of one iteration with one lane per rank (forward,\n"
      "backward, communication, bubbles); each rank's memory against its GPU's capacity, split into weights,\n"
      "gradients, optimizer states, activations and framework; and, with --replay, predicted against measured.\n\n"
      "Example:\n"
      "  hetplan report --plan plan.json --replay replay.json --out report.html");
  s->add_option("--plan", a->plan, "Plan JSON: an entry of `hetplan search --json` (or the whole file: its best)")
      ->required();
  s->add_option("--replay", a->replay, "The JSON `hetplan replay --out` wrote for this plan");
  s->add_option("--out", a->out, "The HTML file to write")->required();
  s->add_option("--hf-config", a->hf_config,
                "Hugging Face config.json for the model shape (default: the plan's model.architecture; given, it "
                "must match it; a plan without one: its GPT), as for simulate");
  return [a] { return run_simulate_with_report(a->plan, a->replay, a->out, a->hf_config); };
}

}  // namespace hetplan::cli
