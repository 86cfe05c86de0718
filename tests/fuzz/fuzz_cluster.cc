// libFuzzer target: the hostfile and clusterfile readers (Cluster::load).
// Input: hostfile bytes, a NUL byte, clusterfile bytes (no NUL: all hostfile,
// empty clusterfile).
#include "sim/cluster.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace hetplan::fuzz;
  const auto parts = split_nul(data, size, 2);
  const auto hostfile = scratch() / "hostfile";
  const auto clusterfile = scratch() / "clusterfile.json";
  write_file(hostfile, parts[0]);
  write_file(clusterfile, parts.size() > 1 ? parts[1] : std::string_view());
  run_reader([&] { hetplan::Cluster::load(hostfile.string(), clusterfile.string()); });
  return 0;
}
