#include "sim/schedule.h"

#include "base/input_error.h"

namespace hetplan {

const char* to_string(Schedule s) { return s == Schedule::kGpipe ? "gpipe" : "1f1b"; }

Schedule parse_schedule(const std::string& s, const std::string& where) {
  if (s == "gpipe" || s == "GPipe") return Schedule::kGpipe;
  if (s == "1f1b" || s == "1F1B") return Schedule::k1F1B;
  throw InputError(where + ": '" + excerpt(s) + "': expected gpipe or 1f1b");
}

}  // namespace hetplan
