#include "planner/search_settings.h"

#include "base/input_error.h"

namespace hetplan {

std::vector<TrainingSetup> with_overlap_dimension(const std::vector<TrainingSetup>& setups,
                                                  const std::string& overlap) {
  if (overlap != "off" && overlap != "on" && overlap != "auto")
    throw InputError("--overlap: '" + excerpt(overlap) + "': expected off, on or auto");
  std::vector<TrainingSetup> out;
  for (const TrainingSetup& s : setups) {
    if (overlap != "on") out.push_back(s);
    if (overlap == "off") continue;
    TrainingSetup o = s;
    o.overlap.grad_reduce = true;
    o.overlap.param_gather = s.zero_stage >= 1;
    out.push_back(o);
  }
  return out;
}

std::string parallel_setup_suffix(const TrainingSetup& s) {
  std::string out;
  if (s.sequence_parallel) out += ", sequence parallel";
  if (s.context_parallel > 1) out += ", cp " + std::to_string(s.context_parallel);
  if (s.overlap.any()) out += ", overlapped communication";
  return out;
}

}  // namespace hetplan
