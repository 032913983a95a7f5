#include "actors/node_agent.hpp"
#include "actors/private_messages.hpp"

#include <spdlog/spdlog.h>
#include <unistd.h>
#include <caf/all.hpp>

#include <map>

#include "transport/fault_injection.hpp"

namespace weft::actors {

namespace {

using namespace schema;

envelope spawn_reply(uint64_t request_id, const std::string& name, const std::string& node_id) {
  return envelope::build<wire::SpawnReply>([&](wire::SpawnReply::Builder b) {
    b.setRequestId(request_id);
    b.setOk(true);
    b.setName(name);
    b.setNodeId(node_id);
  });
}

struct child_record {
  std::string name;
  std::string role;
  caf::actor handle;
  wire::ActorState state = wire::ActorState::RUNNING;
};

struct node_agent_state {
  node_agent_config cfg;
  caf::actor sentinel;
  caf::actor head;
  uint64_t heartbeat_seq = 0;
  uint64_t last_heartbeat_sent_ms = 0;  ///< 0 until the node joined a head
  uint64_t started_at_ms = 0;
  std::map<std::string, child_record> children;  // by name
  static inline const char* name = "weft.node_agent";
};

using agent_ptr = node_agent_actor::stateful_pointer<node_agent_state>;

bool role_allowed(const node_agent_config& cfg, const std::string& role) {
  if (cfg.roles.empty()) return true;
  return std::find(cfg.roles.begin(), cfg.roles.end(), role) != cfg.roles.end();
}

void fill_node_info(wire::NodeInfo::Builder b, const node_agent_state& st) {
  b.setNodeId(st.cfg.node_id);
  b.setPid(static_cast<uint32_t>(::getpid()));
  b.setHost(st.cfg.host);
  b.setPort(st.cfg.port->load());
  auto roles =
      st.cfg.roles.empty() && st.cfg.role_table ? st.cfg.role_table->names() : st.cfg.roles;
  auto rl = b.initRoles(static_cast<unsigned>(roles.size()));
  for (unsigned i = 0; i < roles.size(); ++i) rl.set(i, roles[i]);
  auto devs = b.initDevices(1);
  devs[0].setKind("cpu");
  devs[0].setIndex(0);
  devs[0].setMemoryBytes(static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) *
                         static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE)));
  devs[0].setName("cpu");
  b.setTransportAddress(
      kj::arrayPtr(reinterpret_cast<const kj::byte*>(st.cfg.transport_address.data()),
                   st.cfg.transport_address.size()));
  b.setStartedAtMs(st.started_at_ms);
  b.setBuildVersion(st.cfg.build_version);
}

caf::behavior sentinel_actor(caf::event_based_actor*) {
  // Exists only to be monitored: its down message means the node is gone.
  return {[](ping_atom, const envelope& e) { return e; }};
}

node_agent_actor::behavior_type node_agent(agent_ptr self, node_agent_config cfg) {
  self->state.cfg = std::move(cfg);
  self->state.started_at_ms = now_ms();
  self->state.sentinel = self->spawn<caf::linked>(sentinel_actor);
  // Stopping the agent stops every actor it spawned (the node is going away).
  self->set_exit_handler([self](caf::exit_msg& em) {
    for (auto& [name, child] : self->state.children) self->send_exit(child.handle, em.reason);
    self->state.children.clear();
    self->quit(em.reason);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    for (auto& [name, child] : self->state.children) {
      if (child.handle && child.handle.address() == dm.source) {
        spdlog::debug("node {}: actor '{}' ({}) ended: {}", self->state.cfg.node_id, name,
                      child.role, caf::to_string(dm.reason));
        self->state.children.erase(name);
        return;
      }
    }
  });
  return {
      [self](spawn_atom, const envelope& env) -> caf::result<envelope, caf::actor> {
        auto req = env.read<wire::SpawnRequest>();
        if (!req) return {make_error_envelope(req.error()), caf::actor{}};
        auto r = req->get();
        if (auto st = verify_spawn_request(self->state.cfg.secret, r); !st.ok()) {
          spdlog::warn("node {}: refused spawn request: {}", self->state.cfg.node_id,
                       st.to_string());
          return {make_error_envelope(st), caf::actor{}};
        }
        std::string role = r.getRole().cStr();
        std::string name = r.getName().cStr();
        if (name.empty()) {
          return {make_error_envelope(make_error(errc::invalid_argument, "spawn: empty name")),
                  caf::actor{}};
        }
        if (auto old = self->state.children.find(name); old != self->state.children.end()) {
          // Names are cluster-unique and owned by one supervisor: a second spawn under the same
          // name is a restart racing the old incarnation's shutdown. The new one replaces it.
          self->send_exit(old->second.handle, caf::exit_reason::user_shutdown);
          self->demonitor(old->second.handle);
          self->state.children.erase(old);
        }
        const role_factory* factory =
            self->state.cfg.role_table ? self->state.cfg.role_table->find(role) : nullptr;
        if (factory == nullptr || !role_allowed(self->state.cfg, role)) {
          return {
              make_error_envelope(make_error(errc::not_found, "node " + self->state.cfg.node_id +
                                                                  " has no role '" + role + "'")),
              caf::actor{}};
        }
        role_context ctx{name, r.getConfigJson().cStr(), self->state.cfg.node_id,
                         self->state.cfg.engine, self->state.cfg.secret};
        auto spawned = (*factory)(self->system(), ctx);
        if (!spawned) {
          return {make_error_envelope(spawned.error()), caf::actor{}};
        }
        self->monitor(*spawned);
        self->state.children[name] = child_record{name, role, *spawned, wire::ActorState::RUNNING};
        spdlog::info("node {}: spawned '{}' (role {})", self->state.cfg.node_id, name, role);
        return {spawn_reply(r.getRequestId(), name, self->state.cfg.node_id), *spawned};
      },
      [self](stop_atom, const envelope& env) -> envelope {
        auto req = env.read<wire::StopRequest>();
        if (!req) return make_error_envelope(req.error());
        auto r = req->get();
        std::string name = r.getName().cStr();
        if (auto st = verify_stop_request(self->state.cfg.secret, r); !st.ok()) {
          return make_error_envelope(st);
        }
        auto it = self->state.children.find(name);
        if (it == self->state.children.end()) {
          return make_error_envelope(make_error(errc::not_found, "no actor named '" + name + "'"));
        }
        self->send_exit(it->second.handle, caf::exit_reason::user_shutdown);
        self->state.children.erase(it);
        return spawn_reply(r.getRequestId(), name, self->state.cfg.node_id);
      },
      [self](fault_atom, const envelope& env) -> envelope {
        auto req = env.read<wire::TransportFaults>();
        if (!req) return make_error_envelope(req.error());
        auto r = req->get();
        if (auto st = verify_transport_faults(self->state.cfg.secret, r); !st.ok()) {
          spdlog::warn("node {}: refused transport faults: {}", self->state.cfg.node_id,
                       st.to_string());
          return make_error_envelope(st);
        }
        auto* faulty =
            dynamic_cast<transport::fault_injecting_engine*>(self->state.cfg.engine.get());
        if (faulty == nullptr) {
          return make_error_envelope(make_error(
              errc::invalid_argument,
              "node " + self->state.cfg.node_id + "'s transport is " +
                  (self->state.cfg.engine ? self->state.cfg.engine->caps().name
                                          : std::string{"none"}) +
                  ", not the fault-injecting decorator (start it with --transport fault:ucx)"));
        }
        transport::fault_policy policy;
        policy.drop_probability = r.getDropProbability();
        policy.delay_ms = r.getDelayMs();
        policy.corrupt_probability = r.getCorruptProbability();
        policy.fail_after_n = r.getFailAfterN();
        policy.seed = r.getSeed();
        if (auto st = faulty->set_policy(policy); !st.ok()) {
          return make_error_envelope(make_error(errc::invalid_argument, st.message));
        }
        spdlog::warn("node {}: transport faults now drop {} delay {} ms corrupt {} fail-after {}",
                     self->state.cfg.node_id, policy.drop_probability, policy.delay_ms,
                     policy.corrupt_probability, policy.fail_after_n);
        return env;  // the policy it applied
      },
      [self](status_atom) -> envelope {
        const auto& st = self->state;
        return envelope::build<wire::NodeStatus>([&](wire::NodeStatus::Builder b) {
          fill_node_info(b.initNode(), st);
          b.setState(wire::NodeState::ALIVE);
          auto actors = b.initActors(static_cast<unsigned>(st.children.size()));
          unsigned i = 0;
          for (const auto& [name, child] : st.children) {
            actors[i].setName(name);
            actors[i].setRole(child.role);
            actors[i].setState(child.state);
            actors[i].setNodeId(st.cfg.node_id);
            ++i;
          }
          b.setLastHeartbeatMs(st.last_heartbeat_sent_ms);
        });
      },
      [](ping_atom, const envelope& e) { return e; },
      [self](sentinel_atom) { return self->state.sentinel; },
      [self](join_atom, caf::actor head) {
        // Only this process (the app that ran the join) may point the heartbeats at a head.
        const auto& sender = self->current_sender();
        if (!sender || sender->node() != self->node()) {
          spdlog::warn("node {}: ignored a head redirection from outside the process",
                       self->state.cfg.node_id);
          return;
        }
        self->state.head = std::move(head);
        self->send(self, tick_atom::value);
      },
      [self](tick_atom) {
        if (!from_self(self)) return;
        auto& st = self->state;
        if (!st.head) return;
        auto hb = envelope::build<wire::Heartbeat>([&](wire::Heartbeat::Builder b) {
          b.setNodeId(st.cfg.node_id);
          b.setSeq(++st.heartbeat_seq);
          b.setSentAtMs(now_ms());
          b.setLoad(static_cast<float>(st.children.size()));
        });
        self->send(caf::actor_cast<head_actor>(st.head), heartbeat_atom::value, std::move(hb));
        st.last_heartbeat_sent_ms = now_ms();
        self->delayed_send(self, std::chrono::milliseconds(st.cfg.heartbeat_interval_ms),
                           tick_atom::value);
      },
  };
}

}  // namespace

node_agent_actor spawn_node_agent(caf::actor_system& sys, node_agent_config cfg) {
  return sys.spawn(node_agent, std::move(cfg));
}

caf::actor sentinel_of(caf::actor_system& sys, const node_agent_actor& agent) {
  caf::scoped_actor self{sys};
  caf::actor out;
  self->request(caf::actor_cast<caf::actor>(agent), std::chrono::seconds(5), sentinel_atom::value)
      .receive([&](caf::actor s) { out = std::move(s); },
               [&](caf::error& err) {
                 spdlog::error("cannot get the node sentinel: {}", caf::to_string(err));
               });
  return out;
}

}  // namespace weft::actors
