#pragma once
// A value or an error message: the loadgen's status type (no exception leaves its functions).

#include <optional>
#include <string>
#include <utility>

namespace weft::apps::loadgen {

/// Holds either a `T` or a human-readable error message. Not thread-safe (plain value type).
template <class T>
class result {
 public:
  result(T value)
      : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor): ergonomic returns

  /// Makes a failed result carrying `message`.
  static result failure(std::string message) {
    result r;
    r.error_ = std::move(message);
    return r;
  }

  bool ok() const { return value_.has_value(); }
  explicit operator bool() const { return ok(); }
  T& value() { return *value_; }
  const T& value() const { return *value_; }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  /// The error message; empty when ok().
  const std::string& error() const { return error_; }

 private:
  result() = default;
  std::optional<T> value_;
  std::string error_;
};

}  // namespace weft::apps::loadgen
