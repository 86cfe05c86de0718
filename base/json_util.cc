#include "base/json_util.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/file_access.h"
#include "base/input_error.h"

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

// nlohmann's DOM builder, never throwing, that also tracks the key path of
// the value being read and keeps the first error with its position.
class TrackingParser : public nlohmann::detail::json_sax_dom_parser<ordered_json> {
  using Base = nlohmann::detail::json_sax_dom_parser<ordered_json>;

 public:
  explicit TrackingParser(ordered_json& result) : Base(result, /*allow_exceptions=*/false) {}

  bool null() { return Base::null() && value_done(); }
  bool boolean(bool v) { return Base::boolean(v) && value_done(); }
  bool number_integer(ordered_json::number_integer_t v) { return Base::number_integer(v) && value_done(); }
  bool number_unsigned(ordered_json::number_unsigned_t v) { return Base::number_unsigned(v) && value_done(); }
  bool number_float(ordered_json::number_float_t v, const std::string& s) {
    return Base::number_float(v, s) && value_done();
  }
  bool string(std::string& v) { return Base::string(v) && value_done(); }
  bool binary(ordered_json::binary_t& v) { return Base::binary(v) && value_done(); }
  bool start_object(std::size_t n) {
    if (too_deep()) return false;
    frames_.push_back({false, "", 0});
    return Base::start_object(n);
  }
  bool key(std::string& k) {
    frames_.back().key.assign(k);  // quoted (excerpt) only in an error's path: this runs for every key
    return Base::key(k);
  }
  bool end_object() {
    frames_.pop_back();
    return Base::end_object() && value_done();
  }
  bool start_array(std::size_t n) {
    if (too_deep()) return false;
    frames_.push_back({true, "", 0});
    return Base::start_array(n);
  }
  bool end_array() {
    frames_.pop_back();
    return Base::end_array() && value_done();
  }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& ex) {
    failed_ = true;
    position_ = position;
    token_ = token;
    id_ = ex.id;
    path_ = path();
    return false;
  }

  // Nesting deeper than this is refused (no input of ours nests past 5 levels).
  static constexpr std::size_t kMaxDepth = 256;
  bool too_deep() {
    if (frames_.size() < kMaxDepth) return false;
    failed_ = deep_ = true;
    path_ = path();
    return true;
  }
  bool deep() const { return deep_; }
  bool failed() const { return failed_; }
  std::size_t position() const { return position_; }
  const std::string& token() const { return token_; }
  int id() const { return id_; }
  const std::string& error_path() const { return path_; }

 private:
  struct Frame {
    bool array;
    std::string key;
    long long index;
  };
  bool value_done() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  std::string path() const {
    std::string p;
    for (const Frame& f : frames_) {
      if (p.size() > 200) break;  // deep nesting: the message quotes the start
      if (f.array) {
        p += '[';
        p += std::to_string(f.index);
        p += ']';
      } else {
        if (!p.empty()) p += '.';
        p += excerpt(f.key, 40);
      }
    }
    return p;
  }

  std::vector<Frame> frames_;
  bool failed_ = false, deep_ = false;
  std::size_t position_ = 0;
  std::string token_, path_;
  int id_ = 0;
};

}  // namespace

ordered_json read_json_file(const std::string& path) {
  const std::string text = read_regular_file(path, kMaxJsonFileBytes, "JSON file");
  ordered_json result;
  TrackingParser sax(result);
  ordered_json::sax_parse(text, &sax);
  if (!sax.failed()) return result;
  if (sax.deep())
    throw InputError(path + ": JSON nested deeper than " + std::to_string(TrackingParser::kMaxDepth) + " levels at key '" +
                     excerpt(sax.error_path()) + "' (expected a shallow document)");
  const std::string at = locate(text, sax.position());
  const std::string key = sax.error_path().empty() ? "" : ", key '" + excerpt(sax.error_path()) + "'";
  if (sax.id() == 406)  // out_of_range: a number that overflows a double
    throw InputError(path + ": number '" + excerpt(sax.token()) + "' at " + at + key +
                     " is too large for a double (expected a finite number)");
  throw InputError(path + ": not valid JSON at " + at + key + " (expected a JSON document)");
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

void write_json_file_in(const std::string& dir, const std::string& name, const ordered_json& j) {
  write_file_in(dir, name, dump_python_style(j));
}

std::string format_number(double v) {
  char buf[64];
  if (std::isfinite(v) && v == std::trunc(v) && std::fabs(v) < 1e15) std::snprintf(buf, sizeof buf, "%.0f", v);
  else std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

std::string number_as_given(double v) {
  std::string text = format_number(v);
  if (!std::isfinite(v) || std::strtod(text.c_str(), nullptr) == v) return text;
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

std::string describe(const NumberRule& r) {
  constexpr double kHuge = std::numeric_limits<double>::max();
  const std::string kind = r.integer ? "an integer" : "a number";
  const bool has_min = r.min > -kHuge, has_max = r.max < kHuge;
  if (r.integer && has_min && has_max && !r.min_exclusive)
    return kind + " from " + format_number(r.min) + " to " + format_number(r.max);
  std::string out = kind;
  if (has_min) out += (r.min_exclusive ? " > " : " >= ") + format_number(r.min);
  if (has_max) out += std::string(has_min ? " and" : "") + " <= " + format_number(r.max);
  if (!has_min && !has_max) out = "a finite " + out.substr(2);
  return out;
}

namespace {

bool satisfies(double v, const NumberRule& r) {
  return std::isfinite(v) && (r.min_exclusive ? v > r.min : v >= r.min) && v <= r.max &&
         (!r.integer || v == std::trunc(v));
}

}  // namespace

double check_number(double v, const NumberRule& r, const std::string& where) {
  if (!satisfies(v, r)) throw InputError(where + ": expected " + describe(r) + ", got " + number_as_given(v));
  return v;
}

long long check_integer(double v, const NumberRule& rule, const std::string& where) {
  NumberRule r = rule;
  r.integer = true;
  // Integers beyond 2^53 are not exact doubles; no count we read is that large.
  r.min = std::max(r.min, -9007199254740992.0);
  r.max = std::min(r.max, 9007199254740992.0);
  return static_cast<long long>(check_number(v, r, where));
}

std::string key_where(const std::string& file, const std::string& path) {
  return file + ": key '" + excerpt(path) + "'";
}

namespace {

const char* type_name(const ordered_json& v) {
  switch (v.type()) {
    case ordered_json::value_t::null: return "null";
    case ordered_json::value_t::object: return "an object";
    case ordered_json::value_t::array: return "a list";
    case ordered_json::value_t::string: return "a string";
    case ordered_json::value_t::boolean: return "a boolean";
    case ordered_json::value_t::binary: return "binary data";
    case ordered_json::value_t::discarded: return "nothing";
    default: return "a number";
  }
}

}  // namespace

const ordered_json& require_key(const ordered_json& j, const std::string& key, const std::string& file,
                                const std::string& where) {
  if (!j.is_object())
    throw InputError(file + ": expected '" + (where.empty() ? "<root>" : excerpt(where)) + "' to be an object, got " +
                     type_name(j));
  auto it = j.find(key);
  if (it == j.end()) throw InputError(file + ": missing key '" + excerpt(join_path(where, key)) + "'");
  return *it;
}

double number_value(const ordered_json& v, const std::string& file, const std::string& path, const NumberRule& rule) {
  if (!v.is_number())
    throw InputError(key_where(file, path) + " must be a number (expected " + describe(rule) + "), got " +
                     type_name(v));
  const double d = v.get<double>();
  // The key path is spelled out only for the message: profiles hold thousands of numbers.
  return satisfies(d, rule) ? d : check_number(d, rule, key_where(file, path));
}

double require_number(const ordered_json& j, const std::string& key, const std::string& file,
                      const std::string& where, const NumberRule& rule) {
  return number_value(require_key(j, key, file, where), file, join_path(where, key), rule);
}

long long require_integer(const ordered_json& j, const std::string& key, const std::string& file,
                          const std::string& where, NumberRule rule) {
  rule.integer = true;
  const double v = require_number(j, key, file, where, rule);
  return check_integer(v, rule, key_where(file, join_path(where, key)));
}

const ordered_json& require_array(const ordered_json& j, const std::string& key, const std::string& file,
                                  const std::string& where) {
  const ordered_json& v = require_key(j, key, file, where);
  if (!v.is_array())
    throw InputError(key_where(file, join_path(where, key)) + " must be a list, got " + type_name(v));
  return v;
}

std::vector<double> require_number_list(const ordered_json& j, const std::string& key, const std::string& file,
                                        const std::string& where, const NumberRule& rule, std::size_t max_size) {
  const ordered_json& v = require_key(j, key, file, where);
  const std::string path = join_path(where, key);
  if (!v.is_array())
    throw InputError(key_where(file, path) + " must be a list of numbers (" + describe(rule) + " each), got " +
                     type_name(v));
  if (v.size() > max_size)
    throw InputError(key_where(file, path) + " has " + std::to_string(v.size()) + " entries; expected at most " +
                     std::to_string(max_size));
  std::vector<double> out;
  out.reserve(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const ordered_json& e = v[i];
    if (e.is_number() && satisfies(e.get<double>(), rule)) {
      out.push_back(e.get<double>());
    } else {
      number_value(e, file, path + "[" + std::to_string(i) + "]", rule);  // throws, naming the entry
    }
  }
  return out;
}

}  // namespace hetplan
