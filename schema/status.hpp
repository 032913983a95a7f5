#pragma once
/// Error values and a small result type shared by every weft component.
///
/// weft never lets an exception cross a component or actor boundary (STYLE rule 10): functions that
/// can fail return `result<T>` (a value or an `error`) or a `status` (an `error` that may be ok).

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

namespace weft {

/// Error categories; the numeric values equal the wire enum `ErrorCode` in schema/control.capnp.
enum class errc : uint16_t {
  ok = 0,
  malformed = 1,
  unauthorized = 2,
  not_found = 3,
  timeout = 4,
  unavailable = 5,
  invalid_argument = 6,
  internal = 7,
  already_exists = 8,
  version_mismatch = 9,
};

/// Returns a stable lower-case name for `code` ("malformed", "timeout", ...).
const char* to_string(errc code);

/// An error code plus a human-readable message that names the problem.
struct error {
  errc code = errc::ok;
  std::string message;

  bool ok() const { return code == errc::ok; }
  /// "timeout: transfer 7 missed its deadline" — for logs and user-facing messages.
  std::string to_string() const;
};

/// A status is an error that may be ok.
using status = error;

inline error make_error(errc code, std::string message) { return error{code, std::move(message)}; }

/// A value of type T or an error. Small on purpose: std::expected is C++23.
template <class T>
class result {
 public:
  result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  result(error err) : v_(std::move(err)) {}  // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; only valid when !ok().
  const error& err() const { return std::get<1>(v_); }

 private:
  std::variant<T, error> v_;
};

}  // namespace weft
