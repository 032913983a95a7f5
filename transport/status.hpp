#pragma once
/// Status codes of the data plane and a small value-or-status type.
///
/// transport/ sits beside schema/ in the target DAG and does not depend on it, so it carries its
/// own status type. Data-path functions never throw: they return a `status` or a `result<T>`, and
/// asynchronous operations report a `status` through their completion callback.

#include <string>
#include <utility>
#include <variant>

#include "schema/result.hpp"

namespace weft::transport {

/// Why a data-plane operation did not succeed.
enum class status_code {
  ok = 0,
  timeout,           ///< the deadline expired; the transfer was canceled (or dropped)
  canceled,          ///< canceled by the caller or by engine shutdown
  io_error,          ///< the backend reported a failure while moving bytes
  invalid_argument,  ///< bad region, offset, size, descriptor or address bytes
  peer_unreachable,  ///< the peer endpoint failed or was never reachable
  corrupt,           ///< a checksum or integrity check failed
  unsupported,       ///< the engine does not have this capability
  no_device,         ///< the backend's device (GPU) is absent
  no_memory,         ///< allocation or registration failed
  busy,              ///< the resource is still in use by transfers
  internal,          ///< a bug or an unexpected backend state
};

/// Returns a stable lower-case name ("timeout", "io_error", ...).
const char* to_string(status_code code);

/// A status code plus a message naming the operation and the cause.
struct status {
  status_code code = status_code::ok;
  std::string message;

  bool ok() const { return code == status_code::ok; }
  /// "timeout: put of 1048576 bytes missed its 50 ms deadline".
  std::string to_string() const;
};

inline status ok_status() {
  return status{};
}
inline status make_status(status_code code, std::string message) {
  return status{code, std::move(message)};
}

/// A value of type T or a non-ok status.
template <class T>
using result = weft::basic_result<T, status>;

}  // namespace weft::transport
