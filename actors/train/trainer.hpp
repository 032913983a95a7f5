#pragma once
/// The trainer rank role ("trainer"): one data-parallel rank of a `weft train --trainers K` run,
/// spawned on a node by the run's one-for-all supervisor (docs/training.md, "Trainer groups").
///
/// The actor is detached; its training loop runs on a thread of its own so that the actor keeps
/// answering (a stop, the supervisor's exit) while a step computes. The rank loads the model and
/// the data, says hello to the run's coordinator with its node's transport address, waits for the
/// complete group, connects a transport::peer_group, agrees with the others on the checkpoint to
/// start from (rank 0's newest valid one), then runs sft_trainer with the group's all-reduce as the
/// gradient reducer. Rank 0 reports every step, writes the checkpoints and the export. A step that
/// fails (a peer died: the all-reduce times out or its peer fails) makes the actor exit abnormally,
/// which the supervisor answers by restarting the whole group. Errors a restart cannot fix (bad
/// data, a model that does not load, a checkpoint of another run) are reported as fatal instead.

#include <cstdint>
#include <string>

#include "gpu/train/sft_run.hpp"
#include "schema/status.hpp"

namespace weft::actors {
class role_registry;
}

namespace weft::train {

struct trainer_config {
  gpu::train::sft_run_options run;
  int rank = 0;
  int world = 1;
  std::string coordinator_host = "127.0.0.1";
  uint16_t coordinator_port = 0;
  uint32_t allreduce_timeout_ms = 120'000;

  std::string to_json() const;
  static result<trainer_config> from_json(const std::string& json);
};

/// Registers the "trainer" role, and "trainer-lead" (the same actor, for rank 0: the role that
/// only `weft train`'s own node processes accept, so rank 0 runs on the host that started the run).
void add_train_roles(actors::role_registry& roles);

}  // namespace weft::train
