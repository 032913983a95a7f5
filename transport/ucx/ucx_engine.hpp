#pragma once
/// The UCX backend: one ucp context + worker per engine; tcp, shm (posix/sysv/cma) here.
///
/// Config params (engine_config::params): every key "ucx.<name>" sets the UCX config variable
/// <NAME> for this engine only, overriding the environment: e.g. {"ucx.tls", "tcp"},
/// {"ucx.tls", "shm"}, {"ucx.net_devices", "lo"}. Keys without the "ucx." or "weft." prefix ->
/// invalid_argument; UCX 1.13 accepts unknown variable names (transport variables are resolved
/// late) and only logs "invalid configuration" when the worker starts.
/// {"weft.error_handling", "auto"|"peer"|"none"}: UCX peer-failure detection. UCX 1.13's shm
/// transports cannot do it, so "peer" restricts UCX to tcp; "auto" (default) picks "peer" only
/// when ucx.tls (or UCX_TLS) is exactly "tcp". Without it a dead peer shows up as a timeout.
///
/// Traps (see docs/transport.md): a put into memory registered with register_memory() completes
/// only while the target engine progresses (always over tcp); memory from allocate_memory() is
/// mapped by UCX (UCP_MEM_MAP_ALLOCATE) and on shm is written without any target involvement.

#include <memory>

#include "transport/engine.hpp"

namespace weft::transport::ucx {

/// Makes a UCX engine. Fails with io_error when UCX cannot initialise (e.g. bad UCX_TLS).
result<std::unique_ptr<engine>> make_engine(const engine_config& config);

}  // namespace weft::transport::ucx
