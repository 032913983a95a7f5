#pragma once
/// Status and result types of the compute side of gpu/ (devices, kernels, model, engine).
///
/// No exception crosses the gpu/ boundary: fallible calls return `status` or `result<T>`.

#include <string>
#include <utility>
#include <variant>

#include "schema/result.hpp"

namespace weft::gpu {

/// What went wrong, coarse enough for a caller to branch on.
enum class status_code {
  ok,
  invalid_argument,  ///< The caller passed something malformed.
  not_found,         ///< A named thing (device, tensor, request) does not exist.
  unsupported,       ///< Valid, but this backend or build cannot do it (e.g. no GPU present).
  out_of_memory,     ///< A pool (device memory, KV blocks) is exhausted.
  bad_model,         ///< The model file is inconsistent (missing tensor, wrong shape).
  internal,          ///< A bug or an unexpected backend failure.
};

/// Short lower-case name of a status code ("ok", "out_of_memory", ...).
const char* status_code_name(status_code code);

/// The outcome of a fallible call: ok, or a code plus a human-readable message.
class status {
 public:
  status() = default;
  status(status_code code, std::string message) : code_(code), message_(std::move(message)) {}

  /// A successful status.
  static status success() { return {}; }

  bool ok() const { return code_ == status_code::ok; }
  explicit operator bool() const { return ok(); }
  status_code code() const { return code_; }
  const std::string& message() const { return message_; }
  /// "code: message" for logs.
  std::string to_string() const;

 private:
  status_code code_ = status_code::ok;
  std::string message_;
};

/// A value or a non-ok status.
template <class T>
using result = weft::basic_result<T, status>;

}  // namespace weft::gpu
