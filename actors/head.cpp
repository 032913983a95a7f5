#include "actors/head.hpp"
#include "actors/private_messages.hpp"

#include <spdlog/spdlog.h>
#include <caf/all.hpp>

#include <algorithm>
#include <deque>
#include <map>
#include <string_view>

#include "actors/node_agent.hpp"
#include "actors/supervisor.hpp"

namespace weft::actors {

namespace {

using namespace schema;

constexpr uint32_t protocol_version = 1;
constexpr uint64_t nonce_ttl_ms = 30'000;
/// Join challenges outstanding at once; more are refused until some expire or are used.
constexpr size_t max_pending_nonces = 1024;

struct node_entry {
  std::string node_id;
  envelope join;  // the JoinRequest (carries NodeInfo)
  caf::actor agent;
  caf::actor sentinel;
  wire::NodeState state = wire::NodeState::ALIVE;
  uint64_t last_heartbeat_ms = 0;
  std::vector<std::string> roles;
};

struct registered_actor {
  caf::actor handle;
  std::string node_id;
  std::string role;
};

/// The last state a supervisor reported for one of its children.
struct supervised_child {
  std::string role, node_id;
  wire::ActorState state = wire::ActorState::STARTING;
  uint32_t restarts = 0;
};

struct event {
  uint64_t at_ms;
  std::string kind, subject, detail;
};

struct head_state {
  head_config cfg;
  std::map<std::string, node_entry> nodes;
  std::map<std::string, uint64_t> nonces;  // hex nonce -> issued at
  std::map<std::string, registered_actor> registry;
  std::vector<caf::actor> supervisors;
  std::map<std::string, supervised_child> supervised;
  std::deque<event> events;
  uint64_t next_request_id = 1;
  static inline const char* name = "weft.head";
};

using head_ptr = head_actor::stateful_pointer<head_state>;

std::string hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s;
}

void record(head_ptr self, std::string kind, std::string subject, std::string detail) {
  auto& st = self->state;
  spdlog::info("cluster: {} {} {}", kind, subject, detail);
  st.events.push_back(event{now_ms(), std::move(kind), std::move(subject), std::move(detail)});
  while (st.events.size() > st.cfg.max_events) st.events.pop_front();
}

void declare_dead(head_ptr self, const std::string& node_id, const std::string& why) {
  auto& st = self->state;
  auto it = st.nodes.find(node_id);
  if (it == st.nodes.end() || it->second.state == wire::NodeState::DEAD) return;
  it->second.state = wire::NodeState::DEAD;
  record(self, "node_down", node_id, why);
  for (auto r = st.registry.begin(); r != st.registry.end();) {
    if (r->second.node_id == node_id) {
      r = st.registry.erase(r);
    } else {
      ++r;
    }
  }
  // With the head as sender: supervisors take node deaths from their head only.
  for (auto& sup : st.supervisors) {
    caf::send_as(caf::actor_cast<caf::actor>(self), sup, node_down_atom::value, node_id);
  }
}

bool accepts(const node_entry& n, const std::string& role) {
  return n.roles.empty() || std::find(n.roles.begin(), n.roles.end(), role) != n.roles.end();
}

/// Picks the live node accepting `role` with the fewest registered actors.
node_entry* place(head_ptr self, const std::string& role) {
  auto& st = self->state;
  node_entry* best = nullptr;
  size_t best_load = SIZE_MAX;
  for (auto& [id, n] : st.nodes) {
    if (n.state != wire::NodeState::ALIVE || !accepts(n, role)) continue;
    size_t load = 0;
    for (auto& [_, r] : st.registry) load += r.node_id == id ? 1 : 0;
    if (load < best_load) {
      best = &n;
      best_load = load;
    }
  }
  return best;
}

envelope cluster_status(head_ptr self) {
  auto& st = self->state;
  return envelope::build<wire::ClusterStatus>([&](wire::ClusterStatus::Builder b) {
    b.setHeadId(st.cfg.head_id);
    auto nodes = b.initNodes(static_cast<unsigned>(st.nodes.size()));
    unsigned i = 0;
    for (auto& [id, n] : st.nodes) {
      auto ns = nodes[i++];
      if (auto jr = n.join.read<wire::JoinRequest>()) ns.setNode(jr->get().getNode());
      ns.setState(n.state);
      ns.setLastHeartbeatMs(n.last_heartbeat_ms);
      // Running actors are the registered ones (monitored: they leave the registry when they
      // die). Supervised children that are not running (restarting, stopped, failed) are listed
      // on the node they last ran on, with the state their supervisor reported.
      struct row {
        std::string name, role;
        wire::ActorState state;
        uint32_t restarts;
      };
      std::vector<row> mine;
      for (auto& [name, r] : st.registry) {
        if (r.node_id != id) continue;
        auto sc = st.supervised.find(name);
        mine.push_back({name, r.role, wire::ActorState::RUNNING,
                        sc == st.supervised.end() ? 0u : sc->second.restarts});
      }
      for (auto& [name, c] : st.supervised) {
        if (c.state == wire::ActorState::RUNNING || st.registry.count(name) > 0) continue;
        // On its last node if the head knows that node, else on the head's own node.
        const bool here = st.nodes.count(c.node_id) > 0 ? c.node_id == id : id == st.cfg.head_id;
        if (here) mine.push_back({name, c.role, c.state, c.restarts});
      }
      auto actors = ns.initActors(static_cast<unsigned>(mine.size()));
      for (unsigned k = 0; k < mine.size(); ++k) {
        actors[k].setName(mine[k].name);
        actors[k].setRole(mine[k].role);
        actors[k].setState(mine[k].state);
        actors[k].setRestarts(mine[k].restarts);
        actors[k].setNodeId(id);
      }
    }
    auto events = b.initEvents(static_cast<unsigned>(st.events.size()));
    for (unsigned k = 0; k < st.events.size(); ++k) {
      events[k].setAtMs(st.events[k].at_ms);
      events[k].setKind(st.events[k].kind);
      events[k].setSubject(st.events[k].subject);
      events[k].setDetail(st.events[k].detail);
    }
  });
}

/// Drops the join challenges older than their time to live.
void expire_nonces(head_state& st, uint64_t now) {
  for (auto it = st.nonces.begin(); it != st.nonces.end();) {
    it = it->second + nonce_ttl_ms < now ? st.nonces.erase(it) : std::next(it);
  }
}

/// True when the message being handled comes from one of the supervisors this head runs.
bool from_supervisor(head_ptr self) {
  const auto& sender = self->current_sender();
  const auto& sups = self->state.supervisors;
  return sender && std::any_of(sups.begin(), sups.end(), [&](const caf::actor& s) {
           return s.address() == sender->address();
         });
}

head_actor::behavior_type head(head_ptr self, head_config cfg) {
  self->state.cfg = std::move(cfg);
  // Stopping the head stops the supervisors it hosts (and through them their children).
  self->set_exit_handler([self](caf::exit_msg& em) {
    for (auto& sup : self->state.supervisors) self->send_exit(sup, em.reason);
    self->state.supervisors.clear();
    self->quit(em.reason);
  });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& st = self->state;
    for (auto& [id, n] : st.nodes) {
      if (n.sentinel && n.sentinel.address() == dm.source) {
        declare_dead(self, id, "sentinel down: " + caf::to_string(dm.reason));
        return;
      }
    }
    for (auto it = st.registry.begin(); it != st.registry.end(); ++it) {
      if (it->second.handle.address() == dm.source) {
        record(self, "actor_down", it->first, caf::to_string(dm.reason));
        st.registry.erase(it);
        return;
      }
    }
    for (auto it = st.supervisors.begin(); it != st.supervisors.end(); ++it) {
      if (it->address() == dm.source) {
        st.supervisors.erase(it);
        return;
      }
    }
  });
  self->send(self, tick_atom::value);
  return {
      [self](challenge_atom) -> envelope {
        auto& nonces = self->state.nonces;
        if (nonces.size() >= max_pending_nonces) expire_nonces(self->state, now_ms());
        if (nonces.size() >= max_pending_nonces) {
          return make_error_envelope(make_error(
              errc::overloaded, std::to_string(max_pending_nonces) +
                                    " join challenges are outstanding; try again later"));
        }
        auto nonce = random_bytes(32);
        self->state.nonces[hex(nonce.data(), nonce.size())] = now_ms();
        return envelope::build<wire::JoinChallenge>([&](wire::JoinChallenge::Builder b) {
          b.setNonce(kj::arrayPtr(nonce.data(), nonce.size()));
          b.setHeadId(self->state.cfg.head_id);
          b.setProtocolVersion(protocol_version);
        });
      },
      [self](join_atom, const envelope& env, caf::actor agent, caf::actor sentinel) -> envelope {
        auto& st = self->state;
        auto refuse = [&](errc code, const std::string& why) {
          spdlog::warn("cluster: refused a join: {}", why);
          return envelope::build<wire::JoinReply>([&](wire::JoinReply::Builder b) {
            b.setAccepted(false);
            b.initError().setCode(to_wire(code));
            b.getError().setMessage(why);
            b.setHeadId(st.cfg.head_id);
          });
        };
        auto req = env.read<wire::JoinRequest>();
        if (!req) return refuse(errc::malformed, req.error().to_string());
        auto r = req->get();
        if (r.getProtocolVersion() != protocol_version) {
          return refuse(errc::version_mismatch,
                        "protocol version " + std::to_string(r.getProtocolVersion()));
        }
        auto nonce = r.getNonce();
        auto nonce_hex = hex(nonce.begin(), nonce.size());
        auto issued = st.nonces.find(nonce_hex);
        if (issued == st.nonces.end() || issued->second + nonce_ttl_ms < now_ms()) {
          return refuse(errc::unauthorized, "unknown or expired nonce");
        }
        st.nonces.erase(issued);  // one use only
        std::string node_id = r.getNode().getNodeId().cStr();
        std::string msg(reinterpret_cast<const char*>(nonce.begin()), nonce.size());
        msg += "|" + node_id;
        auto expected = hmac_sha256(st.cfg.secret, msg);
        if (!macs_equal(expected, r.getProof().begin(), r.getProof().size())) {
          record(self, "join_refused", node_id, "wrong cluster secret");
          return refuse(errc::unauthorized, "proof does not match the cluster secret");
        }
        if (node_id.empty() || !agent || !sentinel) {
          return refuse(errc::invalid_argument, "join without node id, agent or sentinel");
        }
        if (auto old = st.nodes.find(node_id);
            old != st.nodes.end() && old->second.state != wire::NodeState::DEAD) {
          return refuse(errc::already_exists, "node id '" + node_id + "' is alive");
        }
        node_entry n;
        n.node_id = node_id;
        n.join = env;
        n.agent = agent;
        n.sentinel = sentinel;
        n.last_heartbeat_ms = now_ms();
        for (auto role : r.getNode().getRoles()) n.roles.emplace_back(role.cStr());
        self->monitor(sentinel);
        st.nodes[node_id] = std::move(n);
        record(self, "node_joined", node_id, "pid " + std::to_string(r.getNode().getPid()));
        return envelope::build<wire::JoinReply>([&](wire::JoinReply::Builder b) {
          b.setAccepted(true);
          b.setHeadId(st.cfg.head_id);
          b.setHeartbeatIntervalMs(st.cfg.heartbeat_interval_ms);
        });
      },
      [self](heartbeat_atom, const envelope& env) {
        auto hb = env.read<wire::Heartbeat>();
        if (!hb) return;
        auto it = self->state.nodes.find(hb->get().getNodeId().cStr());
        if (it == self->state.nodes.end() || it->second.state == wire::NodeState::DEAD) return;
        // A heartbeat counts only from the agent that joined as this node: another member cannot
        // keep a dead node alive by naming it.
        const auto& sender = self->current_sender();
        if (!sender || sender->address() != it->second.agent.address()) {
          spdlog::warn("cluster: ignored a heartbeat for {} from another actor", it->first);
          return;
        }
        it->second.last_heartbeat_ms = now_ms();
        if (it->second.state == wire::NodeState::SUSPECT) {
          it->second.state = wire::NodeState::ALIVE;
          record(self, "node_alive", it->first, "heartbeats resumed");
        }
      },
      [self](spawn_atom, const envelope& env) -> caf::result<envelope, caf::actor> {
        auto& st = self->state;
        auto req = env.read<wire::SpawnRequest>();
        if (!req) return {make_error_envelope(req.error()), caf::actor{}};
        if (auto err = verify_spawn_request(st.cfg.secret, req->get()); !err.ok()) {
          return {make_error_envelope(err), caf::actor{}};
        }
        std::string role = req->get().getRole().cStr();
        std::string name = req->get().getName().cStr();
        // Names are cluster-unique. A supervisor this head runs may re-spawn a name it owns (the
        // old child's down message can arrive after the restart request); anyone else is refused.
        if (st.registry.count(name) > 0 && !from_supervisor(self)) {
          return {make_error_envelope(
                      make_error(errc::already_exists, "an actor named '" + name + "' is running")),
                  caf::actor{}};
        }
        node_entry* target = place(self, role);
        if (target == nullptr) {
          return {make_error_envelope(
                      make_error(errc::unavailable, "no live node accepts role '" + role + "'")),
                  caf::actor{}};
        }
        auto rp = self->make_response_promise<envelope, caf::actor>();
        std::string node_id = target->node_id;
        self->request(caf::actor_cast<node_agent_actor>(target->agent),
                      std::chrono::milliseconds(st.cfg.spawn_timeout_ms), spawn_atom::value, env)
            .then(
                [self, rp, name, role, node_id](envelope reply, caf::actor a) mutable {
                  if (a) {
                    self->monitor(a);
                    self->state.registry[name] = registered_actor{a, node_id, role};
                    record(self, "actor_spawned", name, "role " + role + " on " + node_id);
                  }
                  rp.deliver(std::move(reply), std::move(a));
                },
                [rp, node_id](caf::error& err) mutable {
                  rp.deliver(make_error_envelope(make_error(
                                 errc::unavailable,
                                 "node " + node_id + " did not answer: " + caf::to_string(err))),
                             caf::actor{});
                });
        return rp;
      },
      [self](supervise_atom, const envelope& env) -> caf::result<envelope, caf::actor> {
        auto& st = self->state;
        auto spec = env.read<wire::SupervisorSpec>();
        if (!spec) return {make_error_envelope(spec.error()), caf::actor{}};
        auto s = spec->get();
        std::string sup_name = s.getName().cStr();
        auto err = verify_supervisor_spec(st.cfg.secret, s);
        if (!err.ok()) return {make_error_envelope(err), caf::actor{}};
        supervisor_config cfg;
        cfg.name = sup_name;
        bool ok = false;
        cfg.strategy = parse_strategy(s.getStrategy().cStr(), &ok);
        if (!ok) {
          return {make_error_envelope(
                      make_error(errc::invalid_argument,
                                 std::string{"unknown strategy '"} + s.getStrategy().cStr() + "'")),
                  caf::actor{}};
        }
        if (s.getMaxRestarts() > 0) cfg.intensity.max_restarts = s.getMaxRestarts();
        if (s.getWindowMs() > 0) cfg.intensity.window_ms = s.getWindowMs();
        if (s.getBackoffInitialMs() > 0) cfg.backoff.initial_ms = s.getBackoffInitialMs();
        if (s.getBackoffMaxMs() > 0) cfg.backoff.max_ms = s.getBackoffMaxMs();
        cfg.backoff.first_delay_ms = std::min<uint64_t>(s.getBackoffFirstMs(), 600'000);
        for (auto c : s.getChildren()) {
          child_spec cs;
          cs.name = c.getName().cStr();
          cs.role = c.getRole().cStr();
          cs.config_json = c.getConfigJson().cStr();
          cs.restart = static_cast<restart_type>(c.getRestart());
          cfg.children.push_back(std::move(cs));
        }
        cfg.spawner = caf::actor_cast<caf::actor>(self);
        cfg.observer = caf::actor_cast<caf::actor>(self);
        cfg.secret = st.cfg.secret;
        auto sup = spawn_supervisor(self->system(), std::move(cfg));
        self->monitor(sup);
        st.supervisors.push_back(sup);
        record(self, "supervisor_started", sup_name, s.getStrategy().cStr());
        auto rp = self->make_response_promise<envelope, caf::actor>();
        self->request(sup, std::chrono::milliseconds(st.cfg.spawn_timeout_ms * 4),
                      supervise_atom::value)
            .then([rp, sup](envelope status) mutable { rp.deliver(std::move(status), sup); },
                  [rp](caf::error& e) mutable {
                    rp.deliver(
                        make_error_envelope(make_error(
                            errc::unavailable, "supervisor did not start: " + caf::to_string(e))),
                        caf::actor{});
                  });
        return rp;
      },
      [self](status_atom) { return cluster_status(self); },
      [self](status_atom, const envelope& env) {
        // Actor states are reported by the supervisors this head runs, and by no one else.
        if (!from_supervisor(self)) return;
        auto v = env.read<wire::ActorStatus>();
        if (!v) return;
        auto a = v->get();
        std::string name = a.getName().cStr();
        if (std::string_view(a.getRole().cStr()) == "supervisor") {
          if (a.getState() == wire::ActorState::FAILED) {
            record(self, "actor_failed", name, "restart intensity exceeded");
          }
          return;
        }
        auto& c = self->state.supervised[name];
        c.role = a.getRole().cStr();
        if (a.getNodeId().size() > 0) c.node_id = a.getNodeId().cStr();
        c.state = a.getState();
        c.restarts = a.getRestarts();
        if (c.state == wire::ActorState::RESTARTING) {
          record(self, "actor_restarting", name, "restart " + std::to_string(c.restarts));
        } else if (c.state == wire::ActorState::FAILED) {
          record(self, "actor_failed", name, "its supervisor gave up");
        }
      },
      [self](lookup_atom, const std::string& name) -> caf::actor {
        auto it = self->state.registry.find(name);
        return it == self->state.registry.end() ? caf::actor{} : it->second.handle;
      },
      [self](tick_atom) {
        if (!from_self(self)) return;
        auto& st = self->state;
        uint64_t now = now_ms();
        for (auto& [id, n] : st.nodes) {
          if (n.state == wire::NodeState::DEAD) continue;
          uint64_t silent = now - n.last_heartbeat_ms;
          if (silent > st.cfg.dead_after_ms) {
            declare_dead(self, id, "no heartbeat for " + std::to_string(silent) + " ms");
          } else if (silent > st.cfg.suspect_after_ms && n.state == wire::NodeState::ALIVE) {
            n.state = wire::NodeState::SUSPECT;
            record(self, "node_suspect", id, "no heartbeat for " + std::to_string(silent) + " ms");
          }
        }
        expire_nonces(st, now);
        self->delayed_send(
            self, std::chrono::milliseconds(std::max(20u, st.cfg.heartbeat_interval_ms / 2)),
            tick_atom::value);
      },
  };
}

}  // namespace

head_actor spawn_head(caf::actor_system& sys, head_config cfg) {
  return sys.spawn(head, std::move(cfg));
}

}  // namespace weft::actors
