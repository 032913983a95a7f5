#pragma once
/// The coordinator of one data-parallel training run (the `weft train --trainers K` process runs
/// it, published for the ranks): it forms trainer groups and relays what rank 0 reports.
///
/// A group forms once every rank 0..K-1 has said hello, counting only ranks that were never part
/// of an earlier group: when a member dies, the one-for-all supervisor restarts all ranks, and the
/// survivors of the broken group (still being stopped) can never be mixed with the new ranks. Each
/// group gets the next generation number, which tags its all-reduce messages; every group after
/// the first (and the first under --resume) continues from the newest valid checkpoint.
///
/// Protocol: actors/train/train_atoms.hpp. The events are called on the coordinator's thread.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <cstdint>
#include <functional>
#include <string>

#include "gpu/train/checkpoint.hpp"
#include "gpu/train/sft_trainer.hpp"

namespace weft::train {

/// How a rank ended (TrainerDone).
struct rank_done {
  int rank = 0;
  int64_t step = 0;
  int64_t first_step = 0;
  bool stopped = false;
  std::string error;  ///< empty: no error
  bool fatal = false;
};

struct coordinator_events {
  /// A complete group of `world` ranks formed (generation 1, 2, ...).
  std::function<void(uint16_t generation)> on_group;
  /// The group agreed to continue after `first_step`.
  std::function<void(int64_t first_step)> on_started;
  /// Rank 0 finished an update in `seconds`, `reduce_seconds` of them in the gradient all-reduce.
  std::function<void(const gpu::train::step_record& r, double seconds, double reduce_seconds,
                     bool checkpointed)>
      on_step;
  /// Rank 0 reported a held-out evaluation of the group (--eval-data).
  std::function<void(const gpu::train::eval_record& e)> on_eval;
  /// A rank of the current group finished, stopped or failed.
  std::function<void(const rank_done& d)> on_done;
  /// A member of the current group went down (its process died or it exited).
  std::function<void(int rank)> on_rank_lost;
};

struct coordinator_config {
  int world = 2;
  bool resume = false;  ///< the first group continues from a checkpoint too
  coordinator_events events;
};

caf::actor spawn_train_coordinator(caf::actor_system& sys, coordinator_config cfg);

}  // namespace weft::train
