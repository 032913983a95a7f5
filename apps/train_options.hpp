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
  /// Ranks on other hosts: of the --trainers, this many run on `weft node --join` processes that
  /// other hosts start (docs/training.md, "Trainer groups across hosts"); the rest run locally.
  int remote_trainers = 0;
  std::string bind = "127.0.0.1";  ///< where the head and the coordinator listen
  uint16_t head_port = 0;          ///< 0: any free port (printed)
  std::string secret_file;         ///< the cluster secret the joining nodes share
  double join_timeout_s = 300.0;   ///< how long to wait for the remote ranks' nodes
  std::string ucx_net_devices;     ///< UCX devices of the local ranks' all-reduce
};

/// `weft train --trainers K` with K > 1: a local cluster of K `weft node` processes, one trainer
/// rank each, a one-for-all supervisor, gradients all-reduced over the transport.
int run_train_group(const train_options& o);

}  // namespace weft::apps
