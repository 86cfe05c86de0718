// libFuzzer target: the Hugging Face config.json reader (read_hf_config).
// Input: the file.
#include "sim/model_shape.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace hetplan::fuzz;
  const auto path = scratch() / "config.json";
  write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  run_reader([&] { hetplan::read_hf_config(path.string()); });
  return 0;
}
