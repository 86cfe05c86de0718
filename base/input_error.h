// InputError: a problem with what the user gave us (a file, a flag, a key).
//
// Its message already names the file and the line or key, and what was
// expected, so the CLI prints it as one line and exits 2. Code that reads
// user input throws it; code past the edge may assume valid input.
//
// excerpt(): the one way a user's text (a hostfile line, a JSON key, a flag
// value) is quoted in a message: at most about 80 characters, control
// characters escaped, so that the message stays one short line.
#pragma once

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>

namespace hetplan {

class InputError : public std::runtime_error {
 public:
  explicit InputError(const std::string& message) : std::runtime_error(message) {}
};

// `text` for a message: its first `max_chars` characters, then "..." when it
// was longer; bytes below 0x20 and 0x7f are written as \xNN.
inline std::string excerpt(std::string_view text, std::size_t max_chars = 80) {
  std::string out;
  const std::size_t n = text.size() < max_chars ? text.size() : max_chars;
  out.reserve(n + 3);
  for (std::size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > max_chars) out += "...";
  return out;
}

}  // namespace hetplan
