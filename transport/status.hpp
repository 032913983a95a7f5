#pragma once
/// Status codes of the data plane and a small value-or-status type.
///
/// transport/ sits beside schema/ in the target DAG and does not depend on it, so it carries its
/// own status type. Data-path functions never throw: they return a `status` or a `result<T>`, and
/// asynchronous operations report a `status` through their completion callback.

#include <string>
#include <utility>
#include <variant>

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

/// A value of type T or a non-ok status (std::expected is C++23).
template <class T>
class result {
 public:
  result(T value) : v_(std::move(value)) {}       // NOLINT(google-explicit-constructor)
  result(status error) : v_(std::move(error)) {}  // NOLINT(google-explicit-constructor)

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
  const status& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, status> v_;
};

}  // namespace weft::transport
