// Central finite differences for the trainer's gradient tests (train_test, train_ops_test).
#pragma once

#include <functional>

namespace weft::gpu::train::testing {

/// Central difference of f with respect to x (changed in place and restored).
inline double numeric(const std::function<double()>& f, double& x, double h = 1e-6) {
  const double old = x;
  x = old + h;
  const double a = f();
  x = old - h;
  const double b = f();
  x = old;
  return (a - b) / (2 * h);
}

}  // namespace weft::gpu::train::testing
