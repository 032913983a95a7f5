#pragma once
/// What every data-parallel trainer rank does to join its group, shared by `weft train`'s ranks
/// (actors/train/trainer.*) and `weft rl`'s (actors/rl/remote_trainers.*): the state the rank's
/// actor shares with its training thread, the hello / TrainerGroup / connect handshake, and
/// tying the thread's life to the actor's.

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "schema/envelope.hpp"
#include "schema/status.hpp"
#include "transport/engine.hpp"
#include "transport/peer_group.hpp"

namespace weft::train {

/// What a rank's actor and its training thread share.
struct rank_shared {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<schema::envelope> group;  ///< the coordinator's TrainerGroup
  bool abort = false;
  transport::peer_group* peers = nullptr;  ///< while connected; abort() cancels its transfers

  bool aborted() {
    std::lock_guard<std::mutex> lock(mu);
    return abort;
  }
  /// Keeps the first TrainerGroup of this incarnation (one group per incarnation).
  void offer_group(const schema::envelope& env);
};

/// A rank's connected group.
struct joined_group {
  std::unique_ptr<transport::peer_group> peers;
  uint16_t generation = 0;
  bool resume = false;  ///< continue from the newest checkpoint (TrainerGroup.resume)
};

/// Says hello (rank, world, the engine's address, pid) to `coordinator` as `self`, waits for the
/// TrainerGroup, connects the peer group (all-reduce deadline `timeout_ms`) and publishes it in
/// `shared` (so that an exit cancels its transfers). Empty peers: aborted meanwhile.
result<joined_group> join_group(transport::engine& engine, rank_shared& shared,
                                const caf::actor& self, const caf::actor& coordinator, int rank,
                                int world, uint32_t timeout_ms);

/// Runs `loop` on a thread of its own for as long as `self` lives: on any exit of the actor the
/// group's transfers are cancelled and the thread is joined, so that nothing of this incarnation
/// outlives it.
void run_beside(caf::local_actor* self, std::shared_ptr<rank_shared> shared,
                std::function<void()> loop);

}  // namespace weft::train
