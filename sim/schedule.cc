#include "sim/schedule.h"

#include "base/input_error.h"

namespace hetplan {

const char* to_string(Schedule s) {
  switch (s) {
    case Schedule::kGpipe: return "gpipe";
    case Schedule::k1F1B: return "1f1b";
    case Schedule::kInterleaved1F1B: return "interleaved";
  }
  return "?";
}

Schedule parse_schedule(const std::string& s, const std::string& where) {
  if (s == "gpipe" || s == "GPipe") return Schedule::kGpipe;
  if (s == "1f1b" || s == "1F1B") return Schedule::k1F1B;
  if (s == "interleaved" || s == "interleaved-1f1b" || s == "interleaved-1F1B") return Schedule::kInterleaved1F1B;
  throw InputError(where + ": '" + excerpt(s) + "': expected gpipe, 1f1b or interleaved");
}

std::string interleaving_error(Schedule schedule, int pp, int microbatches, int virtual_stages) {
  if (schedule != Schedule::kInterleaved1F1B) {
    if (virtual_stages == 1) return "";
    return std::string("virtual stages ") + std::to_string(virtual_stages) + " need the interleaved schedule, not " +
           to_string(schedule);
  }
  if (virtual_stages < 2)
    return "the interleaved schedule needs at least 2 virtual stages per pipeline rank, got " +
           std::to_string(virtual_stages);
  if (microbatches % pp != 0)
    return "the interleaved schedule needs the micro-batch count (" + std::to_string(microbatches) +
           ") to be a multiple of pp (" + std::to_string(pp) + "), as Megatron-LM requires";
  return "";
}

}  // namespace hetplan
