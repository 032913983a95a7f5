#pragma once
/// Error values and a small result type shared by every weft component.
///
/// weft never lets an exception cross a component or actor boundary (STYLE rule 10): functions that
/// can fail return `result<T>` (a value or an `error`) or a `status` (an `error` that may be ok).

#include <cstdint>
#include <string>
#include <utility>
#include <variant>

#include "schema/result.hpp"

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
  overloaded = 10,  ///< admission refused (queue full, SLO unreachable): retry later
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

inline error make_error(errc code, std::string message) {
  return error{code, std::move(message)};
}

/// A value of type T or an error.
template <class T>
using result = basic_result<T, error>;

}  // namespace weft
