// Reading JSON files at the edge, with errors that name the file, the key
// path and what was expected. Everything past these helpers works on typed
// structures, never on JSON.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hetplan {

using ordered_json = nlohmann::ordered_json;

// Parses `path` as JSON. Throws InputError naming the file and the line and
// column of a syntax error.
ordered_json read_json_file(const std::string& path);

// Writes `j` exactly as Python's json.dump(j, f, indent=2) would: the same
// layout, and floats in repr() form (shortest round-trip digits, ties to the
// closer decimal), so generated files compare byte for byte with Python's.
void write_json_file(const std::string& path, const ordered_json& j);
std::string dump_python_style(const ordered_json& j, int indent = 2);

// Python's repr() of a float.
std::string python_float(double v);

// j[key] for an object j; throws InputError "<file>: missing key '<where>.<key>'".
const ordered_json& require_key(const ordered_json& j, const std::string& key, const std::string& file,
                                const std::string& where);

double require_number(const ordered_json& j, const std::string& key, const std::string& file,
                      const std::string& where);

std::vector<double> require_number_list(const ordered_json& j, const std::string& key, const std::string& file,
                                        const std::string& where);

}  // namespace hetplan
