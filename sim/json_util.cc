#include "sim/json_util.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "sim/input_error.h"

namespace hetplan {

namespace {

std::string join_path(const std::string& where, const std::string& key) {
  return where.empty() ? key : where + "." + key;
}

// Turns nlohmann's byte offset into "line L, column C".
std::string locate(const std::string& text, std::size_t byte) {
  std::size_t line = 1, col = 1;
  for (std::size_t i = 0; i < text.size() && i + 1 < byte; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

}  // namespace

ordered_json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot open file");
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  try {
    return ordered_json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(path + ": not valid JSON at " + locate(text, e.byte) + " (expected a JSON document)");
  }
}

std::string python_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci is d[.ddd]e[+-]XX: split digits and exponent.
  const auto epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::stoi(sci.substr(epos + 1));
  std::string sign;
  if (mant[0] == '-') {
    sign = "-";
    mant = mant.substr(1);
  }
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  const int n = static_cast<int>(digits.size());
  if (exp >= -4 && exp < 16) {
    // Python's repr() is fixed-point for exponents -4..15, scientific otherwise.
    std::string out;
    if (exp < 0) {
      out = "0." + std::string(-exp - 1, '0') + digits;
    } else if (exp + 1 >= n) {
      out = digits + std::string(exp + 1 - n, '0') + ".0";
    } else {
      out = digits.substr(0, exp + 1) + "." + digits.substr(exp + 1);
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (n > 1) out += "." + digits.substr(1);
  char e[16];
  std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
  return sign + out + e;
}

namespace {

void dump_value(const ordered_json& j, int indent, int depth, std::string& out) {
  const std::string pad(static_cast<std::size_t>(indent) * (depth + 1), ' ');
  const std::string close_pad(static_cast<std::size_t>(indent) * depth, ' ');
  switch (j.type()) {
    case ordered_json::value_t::object: {
      if (j.empty()) {
        out += "{}";
        return;
      }
      out += "{\n";
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) out += ",\n";
        first = false;
        out += pad + ordered_json(it.key()).dump(-1, ' ', true) + ": ";
        dump_value(it.value(), indent, depth + 1, out);
      }
      out += "\n" + close_pad + "}";
      return;
    }
    case ordered_json::value_t::array: {
      if (j.empty()) {
        out += "[]";
        return;
      }
      out += "[\n";
      for (std::size_t i = 0; i < j.size(); ++i) {
        if (i) out += ",\n";
        out += pad;
        dump_value(j[i], indent, depth + 1, out);
      }
      out += "\n" + close_pad + "]";
      return;
    }
    case ordered_json::value_t::number_float: {
      const double v = j.get<double>();
      out += std::isnan(v) ? "NaN" : std::isinf(v) ? (v > 0 ? "Infinity" : "-Infinity") : python_float(v);
      return;
    }
    default:
      out += j.dump(-1, ' ', true);
  }
}

}  // namespace

std::string dump_python_style(const ordered_json& j, int indent) {
  std::string out;
  dump_value(j, indent, 0, out);
  return out;
}

void write_json_file(const std::string& path, const ordered_json& j) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw InputError(path + ": cannot write file");
  out << dump_python_style(j);
  if (!out) throw InputError(path + ": write failed");
}

const ordered_json& require_key(const ordered_json& j, const std::string& key, const std::string& file,
                                const std::string& where) {
  if (!j.is_object()) throw InputError(file + ": expected '" + (where.empty() ? "<root>" : where) + "' to be an object");
  auto it = j.find(key);
  if (it == j.end()) throw InputError(file + ": missing key '" + join_path(where, key) + "'");
  return *it;
}

double require_number(const ordered_json& j, const std::string& key, const std::string& file,
                      const std::string& where) {
  const ordered_json& v = require_key(j, key, file, where);
  if (!v.is_number()) throw InputError(file + ": key '" + join_path(where, key) + "' must be a number");
  return v.get<double>();
}

std::vector<double> require_number_list(const ordered_json& j, const std::string& key, const std::string& file,
                                        const std::string& where) {
  const ordered_json& v = require_key(j, key, file, where);
  if (!v.is_array()) throw InputError(file + ": key '" + join_path(where, key) + "' must be a list of numbers");
  std::vector<double> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_number())
      throw InputError(file + ": key '" + join_path(where, key) + "[" + std::to_string(i) + "]' must be a number");
    out.push_back(v[i].get<double>());
  }
  return out;
}

}  // namespace hetplan
