// libFuzzer target: a --gpu-spec catalogue (check_gpu_spec_file, the reader of
// load_gpu_spec_file on a fresh copy of the embedded catalogue, so that runs
// do not accumulate entries). Input: the file.
#include "sim/gpu_specs.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace hetplan::fuzz;
  const auto path = scratch() / "gpus.json";
  write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  run_reader([&] { hetplan::check_gpu_spec_file(path.string()); });
  return 0;
}
