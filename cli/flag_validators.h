// CLI11 validators for numeric flags whose messages stay one short line:
// CLI11's own PositiveNumber and NonNegativeNumber print their range with
// std::to_string of DBL_MAX, a 300-digit number.
//
// REQUIRES: nothing. Header only; the validators are immutable (thread-safe).
#pragma once

#include <CLI/CLI.hpp>
#include <cmath>
#include <string>

#include "base/input_error.h"

namespace hetplan::cli {

// A finite number above `min` (or at least `min` when `inclusive`); the message reads "expected `what`".
inline CLI::Validator number_above(double min, bool inclusive, const std::string& what) {
  return CLI::Validator(
      [min, inclusive, what](std::string& text) -> std::string {
        double v = 0;
        const bool parsed = CLI::detail::lexical_cast(text, v);
        if (parsed && std::isfinite(v) && (inclusive ? v >= min : v > min)) return std::string();
        return "expected " + what + ", got '" + excerpt(text) + "'";
      },
      what == "a positive number" ? "POSITIVE" : "NONNEGATIVE");
}

inline const CLI::Validator kPositiveNumber = number_above(0, false, "a positive number");
inline const CLI::Validator kNonNegativeNumber = number_above(0, true, "a number >= 0");

}  // namespace hetplan::cli
