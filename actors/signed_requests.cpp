#include "actors/signed_requests.hpp"

#include <capnp/message.h>

#include <memory>

namespace weft::actors {

namespace {

using namespace schema;

/// The canonical encoding of `r` with its session token cleared: every field but the token, in
/// one byte string that both sides compute the same way.
template <class T>
std::string canonical_fields(typename T::Reader r) {
  capnp::MallocMessageBuilder copy;
  copy.setRoot(r);
  auto b = copy.getRoot<T>();
  b.disownSessionToken();
  auto words = capnp::canonicalize(b.asReader());
  auto bytes = words.asBytes();
  return std::string(reinterpret_cast<const char*>(bytes.begin()), bytes.size());
}

/// Signs the request being built in `mb` (root T, token still empty) and wraps it.
template <class T>
envelope sign(const cluster_secret& secret, const char* purpose,
              std::unique_ptr<capnp::MallocMessageBuilder> mb) {
  auto b = mb->getRoot<T>();
  auto token = request_token(secret, purpose, canonical_fields<T>(b.asReader()), b.getDeadlineMs());
  b.setSessionToken(kj::arrayPtr(token.data(), token.size()));
  return envelope::from_builder(kind_of<T>::value, std::move(mb));
}

template <class T>
status verify(const cluster_secret& secret, const char* purpose, typename T::Reader r) {
  uint64_t deadline = r.getDeadlineMs();
  if (deadline == 0)
    return make_error(errc::unauthorized, std::string{purpose} + " request without a deadline");
  if (deadline > now_ms() + max_token_lifetime_ms) {
    return make_error(errc::unauthorized,
                      std::string{purpose} + " request deadline is too far in the future");
  }
  return verify_request_token(secret, purpose, canonical_fields<T>(r), deadline,
                              r.getSessionToken().begin(), r.getSessionToken().size());
}

uint64_t deadline_after(uint64_t timeout_ms) {
  return now_ms() + std::min(timeout_ms, max_token_lifetime_ms);
}

}  // namespace

envelope make_spawn_request(const cluster_secret& secret, uint64_t request_id,
                            const std::string& role, const std::string& name,
                            const std::string& config_json, uint64_t timeout_ms) {
  auto mb = std::make_unique<capnp::MallocMessageBuilder>(256);
  auto b = mb->initRoot<wire::SpawnRequest>();
  b.setRequestId(request_id);
  b.setRole(role);
  b.setName(name);
  b.setConfigJson(config_json);
  b.setDeadlineMs(deadline_after(timeout_ms));
  return sign<wire::SpawnRequest>(secret, "spawn", std::move(mb));
}

envelope make_stop_request(const cluster_secret& secret, uint64_t request_id,
                           const std::string& name, const std::string& reason,
                           uint64_t timeout_ms) {
  auto mb = std::make_unique<capnp::MallocMessageBuilder>(256);
  auto b = mb->initRoot<wire::StopRequest>();
  b.setRequestId(request_id);
  b.setName(name);
  b.setReason(reason);
  b.setDeadlineMs(deadline_after(timeout_ms));
  return sign<wire::StopRequest>(secret, "stop", std::move(mb));
}

envelope make_supervisor_spec(const cluster_secret& secret, const std::string& name,
                              restart_strategy strategy, restart_intensity intensity,
                              backoff_policy backoff, const std::vector<child_spec>& children,
                              uint64_t timeout_ms) {
  auto mb = std::make_unique<capnp::MallocMessageBuilder>(512);
  auto b = mb->initRoot<wire::SupervisorSpec>();
  b.setName(name);
  b.setStrategy(to_string(strategy));
  b.setMaxRestarts(intensity.max_restarts);
  b.setWindowMs(intensity.window_ms);
  b.setBackoffInitialMs(backoff.initial_ms);
  b.setBackoffMaxMs(backoff.max_ms);
  b.setBackoffFirstMs(backoff.first_delay_ms);
  auto list = b.initChildren(static_cast<unsigned>(children.size()));
  for (unsigned i = 0; i < children.size(); ++i) {
    list[i].setName(children[i].name);
    list[i].setRole(children[i].role);
    list[i].setConfigJson(children[i].config_json);
    list[i].setRestart(static_cast<wire::RestartType>(children[i].restart));
  }
  b.setDeadlineMs(deadline_after(timeout_ms));
  return sign<wire::SupervisorSpec>(secret, "supervise", std::move(mb));
}

status verify_spawn_request(const cluster_secret& secret, const wire::SpawnRequest::Reader& req) {
  return verify<wire::SpawnRequest>(secret, "spawn", req);
}

status verify_stop_request(const cluster_secret& secret, const wire::StopRequest::Reader& req) {
  return verify<wire::StopRequest>(secret, "stop", req);
}

status verify_supervisor_spec(const cluster_secret& secret,
                              const wire::SupervisorSpec::Reader& spec) {
  return verify<wire::SupervisorSpec>(secret, "supervise", spec);
}

envelope make_transport_faults(const cluster_secret& secret, const transport_faults& f,
                               uint64_t timeout_ms) {
  auto mb = std::make_unique<capnp::MallocMessageBuilder>(128);
  auto b = mb->initRoot<wire::TransportFaults>();
  b.setDropProbability(f.drop_probability);
  b.setDelayMs(f.delay_ms);
  b.setCorruptProbability(f.corrupt_probability);
  b.setFailAfterN(f.fail_after_n);
  b.setSeed(f.seed);
  b.setDeadlineMs(deadline_after(timeout_ms));
  return sign<wire::TransportFaults>(secret, "weft.node.faults", std::move(mb));
}

status verify_transport_faults(const cluster_secret& secret,
                               const wire::TransportFaults::Reader& req) {
  return verify<wire::TransportFaults>(secret, "weft.node.faults", req);
}

}  // namespace weft::actors
