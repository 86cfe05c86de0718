#include "sim/device_memory.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "base/input_error.h"

namespace hetplan {

RankCommunicators rank_communicators(const RankPlacement& p) {
  RankCommunicators c;
  if (p.world <= 1) return c;
  const bool end_stage = p.pp > 1 && (p.stage == 0 || p.stage == p.pp - 1);
  c.collective = 1 + (p.tp > 1) + (p.dp > 1) + (p.tied && end_stage);
  c.p2p = 2 * ((p.stage > 0) + (p.stage + 1 < p.pp));
  if (p.virtual_stages > 1 && end_stage) c.p2p += 2;  // the wrap-around forward and backward pairs
  if (p.context_parallel > 1) c.p2p += 1;             // the cp ring's group
  return c;
}

double nccl_bytes(const RankCommunicators& c, const DeviceMemoryOptions& o) {
  if (!o.enabled || c.collective + c.p2p == 0) return 0;
  return o.nccl_library_bytes + c.collective * o.collective_communicator_bytes() +
         c.p2p * o.nccl_p2p_communicator_bytes;
}

void parse_memory_headroom(const std::string& text, const std::string& flag, DeviceMemoryOptions* o) {
  const auto bad = [&] {
    return InputError(flag + ": expected a share of each GPU's memory (\"3%\", 0 to 50) or an amount (\"2GiB\", " +
                      "\"512MiB\"), got '" + excerpt(text) + "'");
  };
  const char* s = text.c_str();
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || !std::isfinite(v) || v < 0) throw bad();
  std::string unit(end);
  while (!unit.empty() && std::isspace(static_cast<unsigned char>(unit.front()))) unit.erase(0, 1);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (unit == "%") {
    if (v > 50) throw bad();
    o->headroom_fraction = v / 100;
    o->headroom_bytes = 0;
  } else if (unit == "gib" || unit == "gb" || unit == "mib" || unit == "mb") {
    const double bytes = v * (unit[0] == 'g' ? 1024.0 * 1024 * 1024 : 1024.0 * 1024);
    if (bytes > 1e15) throw bad();
    o->headroom_fraction = 0;
    o->headroom_bytes = bytes;
  } else {
    throw bad();
  }
}

}  // namespace hetplan
