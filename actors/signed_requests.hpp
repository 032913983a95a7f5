#pragma once
/// Requests that change the cluster (spawn, stop, supervise) carry a token:
/// HMAC-SHA256(secret, purpose || canonical encoding of every other field || deadline). The
/// canonical Cap'n Proto encoding of the request with its token cleared covers every field —
/// config_json, children, restart limits — so no field can be changed in flight, and a token
/// always expires (a deadline of 0 or more than `max_token_lifetime_ms` ahead is refused). These
/// tokens sit inside the mutual-TLS channel (actors/cluster_tls.hpp): they keep a request bound to
/// what its sender signed when it is relayed (head -> node agent, supervisor -> node).
/// No CAF here.

#include <cstdint>
#include <string>
#include <vector>

#include "actors/auth.hpp"
#include "actors/supervisor.hpp"
#include "schema/envelope.hpp"

namespace weft::actors {

/// The longest a request token may stay valid.
inline constexpr uint64_t max_token_lifetime_ms = 10 * 60 * 1000;

/// Builds and signs a SpawnRequest envelope.
schema::envelope make_spawn_request(const cluster_secret& secret, uint64_t request_id,
                                    const std::string& role, const std::string& name,
                                    const std::string& config_json, uint64_t timeout_ms);

/// Builds and signs a StopRequest envelope (valid for `timeout_ms`).
schema::envelope make_stop_request(const cluster_secret& secret, uint64_t request_id,
                                   const std::string& name, const std::string& reason,
                                   uint64_t timeout_ms);

/// Builds and signs a SupervisorSpec envelope.
schema::envelope make_supervisor_spec(const cluster_secret& secret, const std::string& name,
                                      restart_strategy strategy, restart_intensity intensity,
                                      backoff_policy backoff,
                                      const std::vector<child_spec>& children, uint64_t timeout_ms);

/// What a TransportFaults request asks for (transport/fault_injection.hpp's policy, without the
/// CAF-free transport header here).
struct transport_faults {
  double drop_probability = 0.0;
  uint32_t delay_ms = 0;
  double corrupt_probability = 0.0;
  int64_t fail_after_n = -1;
  uint64_t seed = 1;
};

/// Builds and signs a TransportFaults envelope (valid for `timeout_ms`).
schema::envelope make_transport_faults(const cluster_secret& secret, const transport_faults& f,
                                       uint64_t timeout_ms);

/// Verify a request's token. Return the error to answer with, or ok.
status verify_spawn_request(const cluster_secret& secret,
                            const schema::wire::SpawnRequest::Reader& req);
status verify_stop_request(const cluster_secret& secret,
                           const schema::wire::StopRequest::Reader& req);
status verify_supervisor_spec(const cluster_secret& secret,
                              const schema::wire::SupervisorSpec::Reader& spec);
status verify_transport_faults(const cluster_secret& secret,
                               const schema::wire::TransportFaults::Reader& req);

}  // namespace weft::actors
