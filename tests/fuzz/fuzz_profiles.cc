// libFuzzer target: the profile reader and the profile-folder reader
// (ProfileSet::load). Input: NUL-separated name, content, name, content, ...
// pairs, written as the files of a fresh folder (names reduced to
// [A-Za-z0-9._-], at most 64 files); a first name of "@<n>" instead sets
// the layer count that load() checks, as `search --num_layers n` does.
#include <cctype>

#include "sim/profile.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

std::string file_name(std::string_view raw) {
  std::string name;
  for (char c : raw.substr(0, 100))
    name += (std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') ? c : '_';
  if (name.empty() || name == "." || name == "..") name = "_" + name;
  return name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  using namespace hetplan::fuzz;
  auto parts = split_nul(data, size, 129);
  int num_layers = 0;
  std::size_t first = 0;
  if (parts.size() >= 2 && parts[0].size() >= 2 && parts[0].size() <= 4 && parts[0][0] == '@') {
    num_layers = 0;
    for (char c : parts[0].substr(1)) num_layers = std::isdigit(static_cast<unsigned char>(c)) ? num_layers * 10 + (c - '0') : 0;
    first = 1;
  }
  const fs::path dir = scratch() / "profiles";
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir);
  for (std::size_t i = first; i < parts.size(); i += 2)
    write_file(dir / file_name(parts[i]), i + 1 < parts.size() ? parts[i + 1] : std::string_view());
  run_reader([&] { hetplan::ProfileSet::load(dir.string(), num_layers); });
  return 0;
}
