// Reading JSON files at the edge, with errors that name the file, the key
// path and what was expected. Everything past these helpers works on typed
// structures, never on JSON.
//
// Every number a reader takes from a file (or a flag) goes through one
// check, check_number(), against a NumberRule: finite, in range, integral
// where a count is expected. A reader never lets an nlohmann exception
// (parse_error, type_error, out_of_range) escape: read_json_file reports
// syntax errors and numbers too large for a double with the file, the line
// and column and the key path; the require_* helpers check each value's type
// before reading it. Thread-safe (no shared state).
#pragma once

#include <cstddef>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "base/limits.h"

namespace hetplan {

using ordered_json = nlohmann::ordered_json;

// The largest JSON file hetplan reads: kMaxJsonFileBytes (base/limits.h).

// Parses `path` as JSON. Throws InputError naming the file and the line and
// column of a syntax error, or the line, column and key path of a number too
// large for a double; and for a file over kMaxJsonFileBytes.
ordered_json read_json_file(const std::string& path);

// What a number read from the user must be: finite, within [min, max] (min
// excluded when min_exclusive), and integral when `integer`.
struct NumberRule {
  double min = -std::numeric_limits<double>::max();
  double max = std::numeric_limits<double>::max();
  bool min_exclusive = false;
  bool integer = false;
};
namespace rules {
inline constexpr NumberRule kAny{};
inline constexpr NumberRule kPositive{0, std::numeric_limits<double>::max(), true, false};
inline constexpr NumberRule kNonNegative{0, std::numeric_limits<double>::max(), false, false};
// A number in (0, max] / [0, max].
constexpr NumberRule positive_up_to(double max) { return {0, max, true, false}; }
constexpr NumberRule non_negative_up_to(double max) { return {0, max, false, false}; }
// An integer in [lo, hi].
constexpr NumberRule int_in(double lo, double hi) { return {lo, hi, false, true}; }
}  // namespace rules

// "a number > 0", "an integer from 1 to 1024", ... for messages.
std::string describe(const NumberRule& rule);
// A number for a message: integers without a fraction, others in %.6g.
std::string format_number(double v);

// format_number's text where it reads back as `v`, else the shortest text that does (5.0000001, not 5):
// how a value the user gave is quoted in a message.
std::string number_as_given(double v);
// Returns v if it satisfies `rule`; else throws InputError
// "<where>: expected <describe(rule)>, got <v>". `where` names the source,
// e.g. "plan.json: key 'gbs'" or "--gbs".
double check_number(double v, const NumberRule& rule, const std::string& where);
// check_number for an integer rule, converted to long long.
long long check_integer(double v, const NumberRule& rule, const std::string& where);

// "<file>: key '<path>'" with the path quoted through excerpt().
std::string key_where(const std::string& file, const std::string& path);

// Writes `j` exactly as Python's json.dump(j, f, indent=2) would: the same
// layout, and floats in repr() form (shortest round-trip digits, ties to the
// closer decimal), so generated files compare byte for byte with Python's.
void write_json_file(const std::string& path, const ordered_json& j);

// write_json_file's text as the file `name` of the output folder `dir`, written as write_file_in does
// (base/file_access.h): never through a symlink, never outside `dir`.
void write_json_file_in(const std::string& dir, const std::string& name, const ordered_json& j);

std::string dump_python_style(const ordered_json& j, int indent = 2);

// Python's repr() of a float.
std::string python_float(double v);

// j[key] for an object j; throws InputError "<file>: missing key '<where>.<key>'".
const ordered_json& require_key(const ordered_json& j, const std::string& key, const std::string& file,
                                const std::string& where);

// The number j[key], checked against `rule`. Throws InputError naming the
// file and key path when it is missing, not a number, or outside the rule.
double require_number(const ordered_json& j, const std::string& key, const std::string& file,
                      const std::string& where, const NumberRule& rule = rules::kAny);
// The same for an integer rule (rule.integer is implied), as long long.
long long require_integer(const ordered_json& j, const std::string& key, const std::string& file,
                          const std::string& where, NumberRule rule);
// `v` (found at `path` in `file`) as a number satisfying `rule`.
double number_value(const ordered_json& v, const std::string& file, const std::string& path,
                    const NumberRule& rule = rules::kAny);

// The list j[key] of numbers, each checked against `rule`, with at most
// max_size entries.
std::vector<double> require_number_list(const ordered_json& j, const std::string& key, const std::string& file,
                                        const std::string& where, const NumberRule& rule = rules::kAny,
                                        std::size_t max_size = std::numeric_limits<std::size_t>::max());
// j[key] when it is an array; else InputError "... must be a list".
const ordered_json& require_array(const ordered_json& j, const std::string& key, const std::string& file,
                                  const std::string& where);

}  // namespace hetplan
