// libFuzzer target: the plan-file reader (read_plan_file). Input: the file.
#include "sim/plan_file.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace hetplan::fuzz;
  const auto path = scratch() / "plan.json";
  write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  run_reader([&] { hetplan::read_plan_file(path.string()); });
  return 0;
}
