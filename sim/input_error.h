// InputError: a problem with what the user gave us (a file, a flag, a key).
//
// Its message already names the file and the line or key, and what was
// expected, so the CLI prints it as one line and exits non-zero. Code that
// reads user input throws it; code past the edge may assume valid input.
#pragma once

#include <stdexcept>
#include <string>

namespace hetplan {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace hetplan
