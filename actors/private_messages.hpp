#pragma once
/// Timers and self-scheduling messages (ticks, steps, fetch timeouts, transfer completions) are
/// private to their actor: the handler of one ignores it unless the actor sent it to itself
/// (directly, or from its transport callback through caf::send_as). A peer that sends a tick does
/// not start a second timer chain. See docs/security.md.

#include <caf/actor_control_block.hpp>
#include <caf/local_actor.hpp>

namespace weft::actors {

/// True when the message being handled was sent by `self` to itself.
inline bool from_self(caf::local_actor* self) {
  const auto& sender = self->current_sender();
  return sender && sender.get() == self->ctrl();
}

}  // namespace weft::actors
