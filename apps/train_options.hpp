#pragma once
// The options of `weft train` (apps/train_cmd.cpp) and the trainer-group driver behind
// `--trainers K` (apps/train_group.cpp).

#include <cstdint>
#include <string>

#include "gpu/train/sft_run.hpp"

namespace weft::apps {

struct train_options {
  std::string config_file;
  gpu::train::sft_run_options run;
  bool resume = false;
  std::string metrics_path;
  int metrics_port = 0;
  std::string plot_path;
  // --trainers K > 1: a data-parallel group of K trainer processes.
  int trainers = 1;
  uint32_t allreduce_timeout_ms = 120'000;
  int max_restarts = 5;
  uint32_t heartbeat_ms = 200;
  uint32_t connection_timeout_ms = 2000;
  std::string ucx_tls;
};

/// `weft train --trainers K` with K > 1: a local cluster of K `weft node` processes, one trainer
/// rank each, a one-for-all supervisor, gradients all-reduced over the transport.
int run_train_group(const train_options& o);

}  // namespace weft::apps
