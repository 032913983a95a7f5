#pragma once
/// CAF atoms of weft's actor protocols (CAF 0.17: atoms are values, at most 10 characters).

#include <caf/atom.hpp>

namespace weft::actors {

using spawn_atom = caf::atom_constant<caf::atom("w_spawn")>;
using stop_atom = caf::atom_constant<caf::atom("w_stop")>;
using status_atom = caf::atom_constant<caf::atom("w_status")>;
using join_atom = caf::atom_constant<caf::atom("w_join")>;
using challenge_atom = caf::atom_constant<caf::atom("w_chall")>;
using heartbeat_atom = caf::atom_constant<caf::atom("w_hbeat")>;
using tick_atom = caf::atom_constant<caf::atom("w_tick")>;
using ping_atom = caf::atom_constant<caf::atom("w_ping")>;
using leave_atom = caf::atom_constant<caf::atom("w_leave")>;
using supervise_atom = caf::atom_constant<caf::atom("w_superv")>;
using restart_atom = caf::atom_constant<caf::atom("w_restart")>;
using lookup_atom = caf::atom_constant<caf::atom("w_lookup")>;
using region_atom = caf::atom_constant<caf::atom("w_region")>;
using transfer_atom = caf::atom_constant<caf::atom("w_xfer")>;
using node_down_atom = caf::atom_constant<caf::atom("w_nodedown")>;
using sentinel_atom = caf::atom_constant<caf::atom("w_sentin")>;
using shutdown_atom = caf::atom_constant<caf::atom("w_shutdown")>;
using fault_atom = caf::atom_constant<caf::atom("w_fault")>;

}  // namespace weft::actors
