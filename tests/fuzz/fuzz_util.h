// Helpers shared by the libFuzzer targets in tests/fuzz/.
//
// The readers take file paths, so each target writes its input to files in a
// scratch folder of its own process (under /dev/shm when it is writable) and
// calls the real loader. The one expected outcome of bad input is InputError
// (base/input_error.h); run_reader() swallows it and nothing else, so any other
// exception leaves LLVMFuzzerTestOneInput, std::terminate aborts, and
// libFuzzer records the input as a crash.
// Not thread-safe: libFuzzer calls a target from one thread.
#pragma once

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "base/input_error.h"

namespace hetplan::fuzz {

namespace fs = std::filesystem;

// This process's scratch folder, created on first use and removed at exit.
inline const fs::path& scratch() {
  static const fs::path dir = [] {
    std::error_code ec;
    fs::path base = "/dev/shm";
    if (::access(base.c_str(), W_OK) != 0) base = fs::temp_directory_path();
    fs::path d = base / ("hetplan-fuzz-" + std::to_string(::getpid()));
    fs::create_directories(d, ec);
    std::atexit([] {
      std::error_code e;
      fs::remove_all(scratch(), e);
    });
    return d;
  }();
  return dir;
}

inline void write_file(const fs::path& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The input split at each NUL byte, into at most `max_parts` parts (the last
// part keeps any further NULs).
inline std::vector<std::string_view> split_nul(const uint8_t* data, std::size_t size, std::size_t max_parts) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<std::string_view> parts;
  while (parts.size() + 1 < max_parts) {
    const std::size_t nul = rest.find('\0');
    if (nul == std::string_view::npos) break;
    parts.push_back(rest.substr(0, nul));
    rest.remove_prefix(nul + 1);
  }
  parts.push_back(rest);
  return parts;
}

// Runs a reader; InputError is the expected outcome of bad input.
template <class F>
void run_reader(F&& read) {
  try {
    read();
  } catch (const InputError&) {
  }
}

}  // namespace hetplan::fuzz
