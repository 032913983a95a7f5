#pragma once
/// The tool actors of agentic rollouts (`weft rl --tools`, docs/rl.md "Agentic rollouts"): one
/// actor per tool (calc, lookup) answers each call after the tool's latency, so a slow tool
/// delays only the samples waiting for it; a router actor sends the GRPO loop's calls to them,
/// restarts a tool actor that dies and sends its unanswered calls again — a call unanswered past
/// its deadline is sent again too, and after `max_attempts` its sample gets an error result (the
/// model sees "error: ..." as a tool's answer, as it would from a real tool). Results are a
/// function of the call, so a restart changes nothing. The loop's thread sees
/// gpu::rl::tool_backend.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "gpu/rl/tools.hpp"
#include "schema/status.hpp"

namespace weft::rl {

struct tool_actors_config {
  /// The tools: built-in ("calc", "lookup") or of your own (named in `commands`).
  std::vector<std::string> tools;
  /// Tools of your own (`--tool-cmd NAME=COMMAND`; a built-in's name replaces it): each runs as
  /// `processes` gpu::rl::tool_process, each in a detached actor serving one call at a time (a
  /// call goes to the process with the fewest calls; ties: the first); a program that crashes or
  /// does not answer within timeout_ms is restarted and asked again, up to max_attempts times,
  /// then the call's result is an error. A command with `http` is an endpoint
  /// (actors/rl/tool_http.hpp) taking `concurrency` calls at once, each request bounded by
  /// timeout_ms and sent up to max_attempts times. latency_ms does not apply to them.
  std::vector<gpu::rl::tool_command> commands;
  uint32_t latency_ms = 0;  ///< Each call's service time (a tool behind a network).
  /// false: every call takes latency_ms; true: exponentially distributed with that mean (a
  /// long-tailed tool, Heddle's setting), drawn from the call's id (continuations get their ids as
  /// results come in) and capped at 10 × the mean and half the deadline.
  bool exponential_latency = false;
  uint32_t timeout_ms = 10'000;  ///< A call unanswered this long is sent again.
  /// Tools behind an HTTP endpoint (commands with `http`, `--tool-url`): calls in flight at once,
  /// each on a detached worker of the tool's actor (they take the calls in turn).
  int concurrency = 8;
  /// Tools of your own that are programs (`--tool-procs`): processes of each, calls at once.
  int processes = 1;
  int max_attempts = 3;  ///< Sends of one call before its error result.
};

class tool_actors final : public gpu::rl::tool_backend {
 public:
  /// Spawns the tools and the router in `sys` (which must outlive this object).
  static result<std::unique_ptr<tool_actors>> create(caf::actor_system& sys,
                                                     tool_actors_config cfg);
  /// The same in an actor system of its own (one scheduler thread), for a run without a cluster.
  static result<std::unique_ptr<tool_actors>> create(tool_actors_config cfg);
  ~tool_actors() override;

  gpu::status call(uint64_t id, gpu::rl::tool_call c) override;
  std::vector<gpu::rl::tool_result> ready(bool wait) override;
  int64_t pending() const override;
  int64_t calls() const override;

  /// The actor serving `tool` now (null when unknown); chaos tests kill it.
  caf::actor tool_actor(const std::string& tool) const;
  /// Tool actors restarted after dying, and calls sent again (after a death or a deadline).
  int64_t restarts() const;
  int64_t resent() const;
  /// The tools for `weft cluster status --rl`: {"tools": [{"tool", "kind" (built-in | program),
  /// "calls", "restarts"}], "pending", "resent", "latency_ms"}.
  std::string status_json() const;

  struct impl;

 private:
  explicit tool_actors(std::unique_ptr<impl> d);
  std::unique_ptr<impl> d_;
};

}  // namespace weft::rl
