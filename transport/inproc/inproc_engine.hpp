#pragma once
/// The in-process backend: memcpy between regions of engines living in the same process.
///
/// Same API and contract as every engine (addresses, descriptors, deadlines, callbacks from
/// progress), so code written against it runs unchanged on UCX. Addresses from another process
/// are rejected with peer_unreachable. No backend params.

#include <memory>

#include "transport/engine.hpp"

namespace weft::transport::inproc {

/// Makes an in-process engine.
result<std::unique_ptr<engine>> make_engine(const engine_config& config);

}  // namespace weft::transport::inproc
