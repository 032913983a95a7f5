#include "actors/supervisor.hpp"

#include <spdlog/spdlog.h>
#include <caf/all.hpp>

#include "actors/atoms.hpp"
#include "actors/node_agent.hpp"
#include "actors/private_messages.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::actors {

namespace {

using namespace schema;

struct child_slot {
  child_spec spec;
  caf::actor handle = {};
  std::string node_id = {};
  uint64_t generation = 0;  // bumps on every (re)start; stale events carry an old one
  uint64_t started_at_ms = 0;
  uint32_t restarts = 0;
  wire::ActorState state = wire::ActorState::STARTING;
};

struct supervisor_state {
  supervisor_config cfg;
  std::unique_ptr<restart_tracker> tracker;
  std::vector<child_slot> children;
  std::vector<caf::response_promise> waiting_for_start;
  bool failed = false;
  bool started = false;
  uint64_t next_request_id = 1;
  static inline const char* name = "weft.supervisor";
};

using sup_ptr = caf::stateful_actor<supervisor_state>*;

envelope status_envelope(const supervisor_state& st) {
  return envelope::build<wire::SupervisorStatus>([&](wire::SupervisorStatus::Builder b) {
    b.setName(st.cfg.name);
    b.setStrategy(to_string(st.cfg.strategy));
    b.setState(st.failed ? wire::ActorState::FAILED : wire::ActorState::RUNNING);
    auto list = b.initChildren(static_cast<unsigned>(st.children.size()));
    for (unsigned i = 0; i < st.children.size(); ++i) {
      list[i].setName(st.children[i].spec.name);
      list[i].setRole(st.children[i].spec.role);
      list[i].setState(st.children[i].state);
      list[i].setRestarts(st.children[i].restarts);
    }
    b.setRestartsInWindow(static_cast<uint32_t>(st.tracker->restarts_in_window(now_ms())));
  });
}

/// Tells the observer (the head) a child's state, so `weft cluster status` shows restarting,
/// stopped and failed children as they are.
void report(sup_ptr self, const child_slot& c) {
  auto& st = self->state;
  if (!st.cfg.observer) return;
  auto env = envelope::build<wire::ActorStatus>([&](wire::ActorStatus::Builder b) {
    b.setName(c.spec.name);
    b.setRole(c.spec.role);
    b.setState(c.state);
    b.setRestarts(c.restarts);
    b.setNodeId(c.node_id);
  });
  self->send(st.cfg.observer, status_atom::value, std::move(env));
}

void answer_waiters(sup_ptr self) {
  auto& st = self->state;
  for (auto& rp : st.waiting_for_start) {
    rp.deliver(st.failed ? make_error_envelope(make_error(
                               errc::unavailable, "supervisor '" + st.cfg.name +
                                                      "' gave up: restart intensity exceeded"))
                         : status_envelope(st));
  }
  st.waiting_for_start.clear();
}

void give_up(sup_ptr self, const std::string& why) {
  auto& st = self->state;
  st.failed = true;
  spdlog::error("supervisor '{}': {} — giving up", st.cfg.name, why);
  for (auto& c : st.children) {
    if (c.handle) self->send_exit(c.handle, caf::exit_reason::user_shutdown);
    c.handle = caf::actor{};
    c.state = wire::ActorState::FAILED;
    report(self, c);
  }
  if (st.cfg.observer) {
    auto report = envelope::build<wire::ActorStatus>([&](wire::ActorStatus::Builder b) {
      b.setName(st.cfg.name);
      b.setRole("supervisor");
      b.setState(wire::ActorState::FAILED);
    });
    self->send(st.cfg.observer, status_atom::value, std::move(report));
  }
  answer_waiters(self);
  self->quit(caf::make_error(caf::sec::runtime_error, "restart intensity exceeded"));
}

void on_child_exit(sup_ptr self, size_t index, exit_kind how);

/// Starts child `index` (generation `gen`); on success continues with `then_next` children in
/// order.
void start_child(sup_ptr self, size_t index, bool chain) {
  auto& st = self->state;
  auto& slot = st.children[index];
  uint64_t gen = ++slot.generation;
  slot.state = wire::ActorState::STARTING;
  auto req = make_spawn_request(st.cfg.secret, st.next_request_id++, slot.spec.role, slot.spec.name,
                                slot.spec.config_json, st.cfg.spawn_timeout_ms);
  self->request(st.cfg.spawner, std::chrono::milliseconds(st.cfg.spawn_timeout_ms),
                spawn_atom::value, std::move(req))
      .then(
          [self, index, gen, chain](const envelope& reply, const caf::actor& child) {
            auto& st = self->state;
            if (st.failed || st.children[index].generation != gen) return;
            auto& slot = st.children[index];
            if (auto err = error_from(reply); !err.ok() || !child) {
              spdlog::warn("supervisor '{}': starting '{}' failed: {}", st.cfg.name, slot.spec.name,
                           err.ok() ? "no actor returned" : err.to_string());
              on_child_exit(self, index, exit_kind::abnormal);
              return;
            }
            slot.handle = child;
            if (auto v = reply.read<wire::SpawnReply>()) slot.node_id = v->get().getNodeId().cStr();
            slot.started_at_ms = now_ms();
            slot.state = wire::ActorState::RUNNING;
            report(self, slot);
            self->monitor(child);
            if (chain && index + 1 < st.children.size()) {
              start_child(self, index + 1, true);
            } else if (!st.started &&
                       std::all_of(st.children.begin(), st.children.end(), [](const child_slot& c) {
                         return c.state == wire::ActorState::RUNNING;
                       })) {
              st.started = true;
              answer_waiters(self);
            }
          },
          [self, index, gen](caf::error& err) {
            auto& st = self->state;
            if (st.failed || st.children[index].generation != gen) return;
            spdlog::warn("supervisor '{}': spawn request for '{}' failed: {}", st.cfg.name,
                         st.children[index].spec.name, caf::to_string(err));
            on_child_exit(self, index, exit_kind::abnormal);
          });
}

void on_child_exit(sup_ptr self, size_t index, exit_kind how) {
  auto& st = self->state;
  auto& slot = st.children[index];
  slot.handle = caf::actor{};
  auto decision = st.tracker->on_exit(index, st.children.size(), slot.spec.restart, how, now_ms(),
                                      slot.started_at_ms);
  if (decision.give_up) {
    give_up(self, "child '" + slot.spec.name + "' failed too often");
    return;
  }
  if (decision.to_restart.empty()) {
    slot.state = wire::ActorState::STOPPED;
    report(self, slot);
    return;
  }
  for (size_t i : decision.to_restart) {
    auto& c = st.children[i];
    if (c.handle) {
      // Siblings restarted by one_for_all / rest_for_one: stop the running incarnation first.
      self->demonitor(c.handle);
      self->send_exit(c.handle, caf::exit_reason::user_shutdown);
      c.handle = caf::actor{};
    }
    ++c.generation;  // ignore anything still in flight for the old incarnation
    c.state = wire::ActorState::RESTARTING;
    c.restarts++;
    report(self, c);
  }
  spdlog::info("supervisor '{}': restarting {} child(ren) after '{}' ended ({}), in {} ms",
               st.cfg.name, decision.to_restart.size(), slot.spec.name,
               how == exit_kind::normal ? "normal" : "abnormal", decision.delay_ms);
  for (size_t i : decision.to_restart) {
    self->delayed_send(self, std::chrono::milliseconds(decision.delay_ms), restart_atom::value,
                       static_cast<uint64_t>(i), st.children[i].generation);
  }
}

caf::behavior supervisor_actor(sup_ptr self, supervisor_config cfg) {
  self->state.tracker = std::make_unique<restart_tracker>(cfg.strategy, cfg.intensity, cfg.backoff);
  for (auto& spec : cfg.children) self->state.children.push_back(child_slot{spec});
  self->state.cfg = std::move(cfg);
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (size_t i = 0; i < st.children.size(); ++i) {
      if (st.children[i].handle && st.children[i].handle.address() == dm.source) {
        bool normal =
            dm.reason == caf::exit_reason::normal || dm.reason == caf::exit_reason::user_shutdown;
        spdlog::info("supervisor '{}': child '{}' down: {}", st.cfg.name, st.children[i].spec.name,
                     caf::to_string(dm.reason));
        on_child_exit(self, i, normal ? exit_kind::normal : exit_kind::abnormal);
        return;
      }
    }
  });
  // An exit request for the supervisor takes its children down with it (OTP semantics).
  self->set_exit_handler([self](caf::exit_msg& em) {
    for (auto& c : self->state.children) {
      if (c.handle) {
        self->demonitor(c.handle);
        self->send_exit(c.handle, em.reason);
      }
    }
    self->quit(em.reason);
  });
  if (!self->state.children.empty()) {
    start_child(self, 0, true);
  } else {
    self->state.started = true;
  }
  return {
      [self](supervise_atom) -> caf::result<envelope> {
        auto& st = self->state;
        if (st.started || st.failed) return status_envelope(st);
        auto rp = self->make_response_promise();
        st.waiting_for_start.push_back(rp);
        return caf::delegated<envelope>{};
      },
      [self](status_atom) { return status_envelope(self->state); },
      [self](lookup_atom, const std::string& name) -> caf::actor {
        for (auto& c : self->state.children) {
          if (c.spec.name == name) return c.handle;
        }
        return caf::actor{};
      },
      [self](node_down_atom, const std::string& node_id) {
        auto& st = self->state;
        // Only the head that runs this supervisor reports node deaths.
        const auto& sender = self->current_sender();
        if (!sender || !st.cfg.observer || sender->address() != st.cfg.observer.address()) return;
        for (size_t i = 0; i < st.children.size(); ++i) {
          auto& c = st.children[i];
          if (c.handle && c.node_id == node_id && !st.failed) {
            spdlog::info("supervisor '{}': child '{}' lost with node {}", st.cfg.name, c.spec.name,
                         node_id);
            self->demonitor(c.handle);
            on_child_exit(self, i, exit_kind::abnormal);
          }
        }
      },
      [self](restart_atom, uint64_t index, uint64_t gen) {
        if (!from_self(self)) return;  // restart timers are private
        auto& st = self->state;
        if (st.failed || index >= st.children.size() || st.children[index].generation != gen)
          return;
        // The restart gets a fresh generation inside start_child.
        start_child(self, index, false);
        // Every restarted child must be running again before a new waiter is told "started".
      },
  };
}

}  // namespace

caf::actor spawn_supervisor(caf::actor_system& sys, supervisor_config cfg) {
  return sys.spawn(supervisor_actor, std::move(cfg));
}

}  // namespace weft::actors
