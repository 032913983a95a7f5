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
struct generate_spec {
  uint64_t request_id = 0;
  std::string trace_id;
  std::vector<int32_t> prompt;
  std::vector<int32_t> resume;  ///< tokens already generated (and streamed) by an earlier attempt
  gpu::sampling_params params;
  bool want_logprobs = false;  ///< report each token's log-probability
  uint64_t deadline_ms = 0;
  uint32_t attempt = 0;
};

schema::envelope to_wire(const generate_spec& spec);
/// Decodes and validates (finite sampling values, sane ranges, non-empty prompt).
result<generate_spec> from_wire(schema::wire::GenerateRequest::Reader r);

}  // namespace weft::serve
