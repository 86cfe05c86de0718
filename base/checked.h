// Checked integer arithmetic for counts and products that come from user
// input (GPU totals, dp * tp, a batch times a GPU count): the result, or
// std::nullopt where the exact value does not fit the type. Callers turn
// std::nullopt into an InputError that names the input and the limit.
//
// Also the one conversion from a double read from a file or flag to an
// integer type: only integral values inside the type's range convert.
// Thread-safe (pure functions).
#pragma once

#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

namespace hetplan {

template <class T>
[[nodiscard]] std::optional<T> checked_add(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T out;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

template <class T>
[[nodiscard]] std::optional<T> checked_mul(T a, T b) {
  static_assert(std::is_integral_v<T>);
  T out;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

// v as a T when v is finite, integral and inside T's range; else std::nullopt.
template <class T>
[[nodiscard]] std::optional<T> exact_integer(double v) {
  static_assert(std::is_integral_v<T>);
  if (!std::isfinite(v) || v != std::trunc(v)) return std::nullopt;
  // Compare in double: both limits of 32-bit types are exact; for 64-bit types
  // 2^63 is exact and max() rounds up to it, hence the strict upper bound.
  const double lo = static_cast<double>(std::numeric_limits<T>::min());
  const double hi = static_cast<double>(std::numeric_limits<T>::max());
  if (v < lo || v >= hi + (sizeof(T) < 8 ? 1.0 : 0.0)) return std::nullopt;
  return static_cast<T>(v);
}

}  // namespace hetplan
