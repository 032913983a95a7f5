#pragma once
// weft's own tests use weft::testing's local cluster (testing/local_cluster.hpp) with the binary
// under test: WEFT_BIN, set per test target (weft_test, or weft), becomes the default binary.

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "actors/cluster_client.hpp"
#include "actors/runtime.hpp"
#include "testing/local_cluster.hpp"

namespace weft::testing {

inline const bool weft_bin_is_the_default = (::setenv("WEFT_BINARY", WEFT_BIN, 1), true);

}  // namespace weft::testing
