#pragma once
/// Roles that exist only to test the runtime; registered by the test build of the binary
/// (`weft_test`) and by in-process tests, never by the product `weft` (docs/security.md):
/// - "crasher": fails after `{"after_ms": N}` (default 0) — exercises supervision;
/// - "blob": owns `{"size_bytes": N, "seed": S}` bytes of registered memory; answers
///   (region_atom) with a TransferRequest describing them (descriptor, checksum) and pulls another
///   blob's bytes on (transfer_atom, TransferRequest) over the node's transport, verifying the
///   checksum — the data-plane path of KV transfers, exercised end to end.

#include "actors/roles.hpp"

namespace weft::testing {

void add_test_roles(actors::role_registry& roles);

}  // namespace weft::testing
