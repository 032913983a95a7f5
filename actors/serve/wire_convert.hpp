#pragma once
/// Conversions between the serving messages of schema/serve.capnp and plain C++ values, with the
/// validation a receiver applies to bytes from another process. No CAF.

#include <cstdint>
#include <string>
#include <vector>

#include "gpu/sampler.hpp"
#include "schema/envelope.hpp"

namespace weft::serve {

/// One sequence to generate, as the router dispatches it.
struct pool_segment {
  uint64_t key = 0;
  std::string read;
  std::string home;
};

struct generate_spec {
  uint64_t request_id = 0;
  std::string trace_id;
  std::vector<int32_t> prompt;
  std::vector<int32_t> resume;  ///< tokens already generated (and streamed) by an earlier attempt
  gpu::sampling_params params;
  bool want_logprobs = false;  ///< report each token's log-probability
  uint64_t deadline_ms = 0;
  uint32_t attempt = 0;
  /// Disaggregated prefill: offer the KV after the first new token instead of decoding.
  bool handoff = false;
  /// Disaggregated decode: the bytes of a KvDescriptor envelope to pull the KV from (empty:
  /// prefill).
  std::vector<std::byte> kv_source;
  /// Prefix-cache pool plan from the router's directory: per leading segment, its key, the shard
  /// to read it from and its home (empty: no pool for this request).
  std::vector<pool_segment> pool_plan;
};

/// One message of the KV handoff between a prefill and a decode worker (schema KvHandoff).
struct kv_handoff {
  uint64_t request_id = 0;
  uint32_t attempt = 0;
  schema::wire::KvHandoffStage stage = schema::wire::KvHandoffStage::OFFERED;
  uint64_t lease_id = 0;
  std::string worker;
  std::vector<std::byte> descriptor;  ///< offered: a KvDescriptor envelope's bytes
  uint64_t bytes = 0;                 ///< pulled
  uint64_t micros = 0;                ///< pulled
  error err;                          ///< failed
};

schema::envelope to_wire(const kv_handoff& h);
result<kv_handoff> from_wire(schema::wire::KvHandoff::Reader r);

schema::envelope to_wire(const generate_spec& spec);
/// Decodes and validates (finite sampling values, sane ranges, non-empty prompt).
result<generate_spec> from_wire(schema::wire::GenerateRequest::Reader r);

}  // namespace weft::serve
