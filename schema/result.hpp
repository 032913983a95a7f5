#pragma once
/// A value or an error, shared by every component (std::expected is C++23; g++ 12 has C++20).
///
/// Each component names its own error type and aliases the template:
///   weft::result<T>            = basic_result<T, weft::error>              (schema/status.hpp)
///   weft::transport::result<T> = basic_result<T, weft::transport::status>  (data-path codes)
///   weft::gpu::result<T>       = basic_result<T, weft::gpu::status>

#include <utility>
#include <variant>

namespace weft {

template <class T, class E>
class basic_result {
 public:
  basic_result(T value) : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  basic_result(E err) : v_(std::move(err)) {}      // NOLINT(google-explicit-constructor)

  bool ok() const { return v_.index() == 0; }
  explicit operator bool() const { return ok(); }

  T& value() & { return std::get<0>(v_); }
  const T& value() const& { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T&& operator*() && { return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// The error; only valid when !ok().
  const E& error() const { return std::get<1>(v_); }

 private:
  std::variant<T, E> v_;
};

}  // namespace weft
