#pragma once
/// The state behind remote_rollouts (private to its two source files): the rollouts and the agents
/// that run them (remote_rollouts.cpp: hellos, dispatch, progress, losses, tail consolidation) and
/// the weight versions the agents pull (rollout_weights.cpp: offers, the --weight-fanout tree,
/// acknowledgements, publish).

#include <caf/actor.hpp>
#include <caf/actor_addr.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "actors/rl/remote_rollouts.hpp"
#include "actors/rl/rl_plumbing.hpp"
#include "actors/rl/weight_image.hpp"
#include "gpu/rl/dispatch.hpp"
#include "schema/caf_bridge.hpp"
#include "transport/registry.hpp"

namespace weft::rl {

namespace rollouts_detail {

/// What the controller actor hands to the loop's thread.
struct event {
  enum class type { hello, tokens, ack, down } what = type::hello;
  caf::actor who;        ///< hello: the agent
  caf::actor_addr from;  ///< tokens, ack, down: the sender
  schema::envelope env;
};

using events = rl::event_queue<event>;
using clock_type = std::chrono::steady_clock;

}  // namespace rollouts_detail

struct remote_rollouts::impl {
  using event = rollouts_detail::event;
  using events = rollouts_detail::events;
  using clock_type = rollouts_detail::clock_type;
  using envelope = schema::envelope;

  remote_rollouts_config cfg;
  std::shared_ptr<events> queue = std::make_shared<events>();
  caf::actor controller;
  std::unique_ptr<transport::engine> transport;
  std::unique_ptr<weight_image> image;
  int64_t version = 0;

  static constexpr int no_pull = -3;  ///< agent_slot::pulling_from once its pull is done
  struct agent_slot {
    caf::actor who;
    bool alive = false;
    bool ready = false;  ///< holds `version` and takes rollouts
    uint32_t pid = 0;
    std::map<gpu::request_id, double> assigned;  ///< rollouts and their predicted cost
    double load = 0.0;
    /// Where peers can pull the version it holds (its pull buffer), once it pulled one.
    transport::bytes source_address, source_region;
    int64_t source_version = -1;
    int pulling_from = -1;  ///< the peer of its current pull (-1: the controller; no_pull)
    /// --weight-fanout: waits for a source with a free pull slot (the controller or an agent
    /// that holds the version) before it is offered the version.
    bool queued = false;
    /// Holds the current version in its pull buffer, pulled and verified, while it applies it
    /// (its acknowledgement follows): peers may pull it from there already.
    bool holding = false;
  };
  std::vector<agent_slot> agents;

  struct tracked {
    gpu::rl::rollout_request req;
    uint64_t key = 0;
    int agent = -1;                  ///< -1: waiting for an agent
    std::vector<int32_t> generated;  ///< tokens so far (replayed when it moves)
  };
  std::unordered_map<gpu::request_id, tracked> live;
  std::vector<gpu::request_id> waiting;  ///< in arrival order
  std::vector<gpu::rl::rollout_output> ready;
  gpu::rl::length_ranker ranker;
  int rr_next = 0;
  /// The agent each group's samples went to: a later request of the group (an agentic rollout's
  /// continuation after a tool call) goes there too while it lives, to reuse the KV of the turns
  /// before the call (its prefix cache).
  std::unordered_map<int64_t, int> group_agent;
  gpu::rl::rollout_backend_stats st;
  clock_type::time_point no_agent_since = clock_type::now();
  clock_type::time_point offered_at{};
  int controller_offers = 0;  ///< --weight-fanout: the current version's offers from the image
  std::string failure;        ///< set by handlers: poll() reports it
  bool started = false;       ///< wait_ready() saw every agent ready

  // The agents and their rollouts (remote_rollouts.cpp).

  int slot_of(const caf::actor_addr& a) const;

  void send(const caf::actor& to, caf::atom_value what, envelope env);

  void on_hello(const event& e);

  /// Whether an output's routes are whole positions of valid expert ids (routing replay) or
  /// absent.
  bool routes_fit(capnp::Data::Reader routes) const;

  void on_tokens(const event& e);

  /// The agent's rollouts go back to the waiting list (they resume elsewhere).
  void lose(int i, const std::string& why);

  void stop_agent(int i);

  void on_down(const event& e);

  void drain();

  /// What status_json() answers (read from other threads: an HTTP endpoint).
  std::mutex status_mu;
  std::string status;

  void refresh_status();

  void wait_a_little();

  std::vector<int> ready_agents() const;

  /// Places the waiting rollouts on the ready agents.
  void dispatch();

  /// Sends rollouts to agent a: each one's prompt and tokens so far (which it replays).
  void send_batch(int a, const std::vector<gpu::request_id>& ids);

  /// Tail consolidation (cfg.consolidate_tail > 0): once the ready agents' unfinished rollouts fit
  /// on half of the agents holding them, the others' rollouts are aborted where they run and
  /// resumed on the agents that keep theirs — as a lost agent's are (the tokens that arrive in
  /// between from the source are dropped; the seeded replay gives them again).
  void consolidate();

  gpu::status check_failure();

  // The weight versions (rollout_weights.cpp).

  /// Offers the current version to agent i: from a live peer that holds it when `from_peer`
  /// (a joining agent spares the trainer's process), else from the controller's image.
  void offer_to(int i, bool from_peer);

  /// Whether agent j holds the current version where peers can pull it.
  bool holds_current(int j) const;

  /// Pulls of the current version now running from `source` (−1: the controller).
  int pulls_from(int source) const;

  /// --weight-fanout F: the queued agents are offered the current version as a tree — F of
  /// them from the controller, then each from an agent that holds it, the one with the fewest
  /// pulls running, at most F at a time each — so a version leaves the trainer's process F times,
  /// not once per agent. With no agent holding it and no pull running (the holders died), the
  /// controller serves again.
  void relay();

  bool any_pull_running() const;
  bool any_holder() const;

  /// Offers the current version to agent i from `peer`'s pull buffer (−1: the controller).
  void offer_from(int i, int peer);

  /// A weight acknowledgement: pulled (a source for its peers), applied (ready), or failed.
  void on_ack(const event& e);
};

}  // namespace weft::rl
