#include "actors/cluster_client.hpp"

#include <fmt/format.h>
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include "actors/node_agent.hpp"
#include "actors/runtime.hpp"

namespace weft::actors {

namespace {

using namespace schema;

std::string caf_error(caf::actor_system& sys, const caf::error& e) {
  return sys.render(e);
}

const char* state_name(wire::NodeState s) {
  switch (s) {
    case wire::NodeState::JOINING:
      return "joining";
    case wire::NodeState::ALIVE:
      return "alive";
    case wire::NodeState::SUSPECT:
      return "suspect";
    case wire::NodeState::DEAD:
      return "dead";
    case wire::NodeState::LEAVING:
      return "leaving";
  }
  return "?";
}

const char* actor_state_name(wire::ActorState s) {
  switch (s) {
    case wire::ActorState::STARTING:
      return "starting";
    case wire::ActorState::RUNNING:
      return "running";
    case wire::ActorState::RESTARTING:
      return "restarting";
    case wire::ActorState::STOPPED:
      return "stopped";
    case wire::ActorState::FAILED:
      return "failed";
  }
  return "?";
}

}  // namespace

result<head_actor> connect_head(caf::actor_system& sys, const std::string& host, uint16_t port) {
  return connect_actor<head_actor>(sys, host, port);
}

result<node_agent_actor> connect_node_agent(caf::actor_system& sys, const std::string& host,
                                            uint16_t port) {
  return connect_actor<node_agent_actor>(sys, host, port);
}

status join_cluster(caf::actor_system& sys, const head_actor& head, const node_agent_actor& agent,
                    const cluster_secret& secret, uint64_t timeout_ms) {
  caf::scoped_actor self{sys};
  auto timeout = std::chrono::milliseconds(timeout_ms);
  status result_status = make_error(errc::timeout, "join did not complete");
  envelope challenge, node_status;
  caf::actor sentinel;
  bool ok = true;
  self->request(head, timeout, challenge_atom::value)
      .receive([&](envelope e) { challenge = std::move(e); },
               [&](caf::error& e) {
                 ok = false;
                 result_status = make_error(errc::unavailable, "challenge: " + caf_error(sys, e));
               });
  if (!ok) return result_status;
  self->request(agent, timeout, status_atom::value)
      .receive([&](envelope e) { node_status = std::move(e); },
               [&](caf::error& e) {
                 ok = false;
                 result_status = make_error(errc::internal, "node status: " + caf_error(sys, e));
               });
  if (!ok) return result_status;
  self->request(agent, timeout, sentinel_atom::value)
      .receive([&](caf::actor s) { sentinel = std::move(s); },
               [&](caf::error& e) {
                 ok = false;
                 result_status = make_error(errc::internal, "sentinel: " + caf_error(sys, e));
               });
  if (!ok) return result_status;
  auto ch = challenge.read<wire::JoinChallenge>();
  if (!ch) return ch.error();
  auto ns = node_status.read<wire::NodeStatus>();
  if (!ns) return ns.error();
  auto nonce = ch->get().getNonce();
  std::string node_id = ns->get().getNode().getNodeId().cStr();
  std::string msg(reinterpret_cast<const char*>(nonce.begin()), nonce.size());
  msg += "|" + node_id;
  auto proof = hmac_sha256(secret, msg);
  auto req = envelope::build<wire::JoinRequest>([&](wire::JoinRequest::Builder b) {
    b.setNode(ns->get().getNode());
    b.setNonce(nonce);
    b.setProof(kj::arrayPtr(proof.data(), proof.size()));
    b.setProtocolVersion(ch->get().getProtocolVersion());
  });
  self->request(head, timeout, join_atom::value, std::move(req), caf::actor_cast<caf::actor>(agent),
                sentinel)
      .receive(
          [&](envelope reply) {
            auto r = reply.read<wire::JoinReply>();
            if (!r) {
              result_status = r.error();
            } else if (!r->get().getAccepted()) {
              result_status = make_error(from_wire(r->get().getError().getCode()),
                                         r->get().getError().getMessage().cStr());
            } else {
              result_status = {};
            }
          },
          [&](caf::error& e) {
            result_status = make_error(errc::unavailable, "join: " + caf_error(sys, e));
          });
  if (result_status.ok()) {
    self->send(agent, join_atom::value, caf::actor_cast<caf::actor>(head));
  }
  return result_status;
}

result<envelope> cluster_status(caf::actor_system& sys, const head_actor& head,
                                uint64_t timeout_ms) {
  caf::scoped_actor self{sys};
  result<envelope> out = make_error(errc::timeout, "no status");
  self->request(head, std::chrono::milliseconds(timeout_ms), status_atom::value)
      .receive([&](envelope e) { out = std::move(e); },
               [&](caf::error& e) {
                 out = make_error(errc::unavailable, "status: " + caf_error(sys, e));
               });
  return out;
}

result<caf::actor> spawn_on_cluster(caf::actor_system& sys, const head_actor& head,
                                    const cluster_secret& secret, const std::string& role,
                                    const std::string& name, const std::string& config_json,
                                    uint64_t timeout_ms) {
  static std::atomic<uint64_t> next_id{1};
  caf::scoped_actor self{sys};
  result<caf::actor> out = make_error(errc::timeout, "no reply");
  auto req = make_spawn_request(secret, next_id++, role, name, config_json, timeout_ms);
  self->request(head, std::chrono::milliseconds(timeout_ms), spawn_atom::value, std::move(req))
      .receive(
          [&](envelope reply, caf::actor a) {
            if (auto err = error_from(reply); !err.ok()) {
              out = err;
            } else if (!a) {
              out = make_error(errc::internal, "spawn returned no actor");
            } else {
              out = a;
            }
          },
          [&](caf::error& e) { out = make_error(errc::unavailable, caf_error(sys, e)); });
  return out;
}

result<caf::actor> supervise_on_cluster(caf::actor_system& sys, const head_actor& head,
                                        const cluster_secret& secret, const std::string& name,
                                        restart_strategy strategy, restart_intensity intensity,
                                        backoff_policy backoff,
                                        const std::vector<child_spec>& children,
                                        uint64_t timeout_ms) {
  auto spec =
      make_supervisor_spec(secret, name, strategy, intensity, backoff, children, timeout_ms);
  caf::scoped_actor self{sys};
  result<caf::actor> out = make_error(errc::timeout, "no reply");
  self->request(head, std::chrono::milliseconds(timeout_ms), supervise_atom::value, std::move(spec))
      .receive(
          [&](envelope reply, caf::actor sup) {
            if (auto err = error_from(reply); !err.ok()) {
              out = err;
            } else {
              out = sup;
            }
          },
          [&](caf::error& e) { out = make_error(errc::unavailable, caf_error(sys, e)); });
  return out;
}

result<caf::actor> lookup_on_cluster(caf::actor_system& sys, const head_actor& head,
                                     const std::string& name, uint64_t timeout_ms) {
  caf::scoped_actor self{sys};
  result<caf::actor> out = make_error(errc::timeout, "no reply");
  self->request(head, std::chrono::milliseconds(timeout_ms), lookup_atom::value, name)
      .receive(
          [&](caf::actor a) {
            if (a) {
              out = a;
            } else {
              out = make_error(errc::not_found, "no actor named '" + name + "'");
            }
          },
          [&](caf::error& e) { out = make_error(errc::unavailable, caf_error(sys, e)); });
  return out;
}

std::string cluster_status_json(const envelope& status) {
  auto v = status.read<wire::ClusterStatus>();
  if (!v) return nlohmann::json{{"error", v.error().to_string()}}.dump();
  auto cs = v->get();
  nlohmann::json out;
  out["head"] = cs.getHeadId().cStr();
  out["nodes"] = nlohmann::json::array();
  for (auto n : cs.getNodes()) {
    nlohmann::json node;
    auto info = n.getNode();
    node["id"] = info.getNodeId().cStr();
    node["pid"] = info.getPid();
    node["address"] = fmt::format("{}:{}", info.getHost().cStr(), info.getPort());
    node["state"] = state_name(n.getState());
    node["roles"] = nlohmann::json::array();
    for (auto r : info.getRoles()) node["roles"].push_back(r.cStr());
    node["last_heartbeat_ms"] = n.getLastHeartbeatMs();
    const uint64_t now = now_ms();
    node["heartbeat_age_ms"] = now - std::min(now, n.getLastHeartbeatMs());
    node["actors"] = nlohmann::json::array();
    for (auto a : n.getActors()) {
      node["actors"].push_back({{"name", a.getName().cStr()},
                                {"role", a.getRole().cStr()},
                                {"state", actor_state_name(a.getState())},
                                {"restarts", a.getRestarts()}});
    }
    out["nodes"].push_back(std::move(node));
  }
  out["events"] = nlohmann::json::array();
  for (auto e : cs.getEvents()) {
    out["events"].push_back({{"at_ms", e.getAtMs()},
                             {"kind", e.getKind().cStr()},
                             {"subject", e.getSubject().cStr()},
                             {"detail", e.getDetail().cStr()}});
  }
  return out.dump(2);
}

std::string cluster_status_table(const envelope& status) {
  auto v = status.read<wire::ClusterStatus>();
  if (!v) return "error: " + v.error().to_string() + "\n";
  auto cs = v->get();
  std::string out = fmt::format("{:<12} {:>8} {:<22} {:<8} {:>9} {:<24} {}\n", "NODE", "PID",
                                "ADDRESS", "STATE", "HEARTBEAT", "ROLES", "ACTORS");
  const uint64_t now = now_ms();
  for (auto n : cs.getNodes()) {
    auto info = n.getNode();
    std::string roles, actors;
    for (auto r : info.getRoles()) roles += (roles.empty() ? "" : ",") + std::string(r.cStr());
    for (auto a : n.getActors()) {
      actors += (actors.empty() ? "" : ",") + std::string(a.getName().cStr());
      // Only what is not plainly running gets a note: name(restarting, 2 restarts).
      if (a.getState() != wire::ActorState::RUNNING || a.getRestarts() > 0) {
        actors += fmt::format(
            "({}{})", actor_state_name(a.getState()),
            a.getRestarts() > 0 ? fmt::format(", {} restarts", a.getRestarts()) : std::string{});
      }
    }
    const uint64_t age = now - std::min(now, n.getLastHeartbeatMs());
    out += fmt::format("{:<12} {:>8} {:<22} {:<8} {:>9} {:<24} {}\n", info.getNodeId().cStr(),
                       info.getPid(), fmt::format("{}:{}", info.getHost().cStr(), info.getPort()),
                       state_name(n.getState()), fmt::format("{:.1f}s ago", age / 1000.0),
                       roles.empty() ? "*" : roles, actors.empty() ? "-" : actors);
  }
  return out;
}

}  // namespace weft::actors
