#pragma once
/// Which ranks of a trainer group share a host, so that a rank on a host with several GPUs takes
/// its own (docs/training.md, "Device"): the local rank is the number of lower ranks on the same
/// machine, as torchrun's LOCAL_RANK. A machine is known by its boot id (network namespaces and
/// containers of one machine share it, and its GPUs). Plain code: no CAF.

#include <cstdint>
#include <vector>

#include "schema/status.hpp"
#include "transport/peer_group.hpp"

namespace weft::train {

/// This machine's key: XXH3-64 of /proc/sys/kernel/random/boot_id (of the host name where that
/// cannot be read).
uint64_t this_host_key();

/// Every member calls it (the group's calls stay in step): every member's `key`, by rank.
/// unavailable when the group's transfer fails.
result<std::vector<uint64_t>> all_gather_keys(transport::peer_group& group, uint64_t key);

/// Every member calls it (the group's calls stay in step): the member's index among the members
/// with the same `host_key`, in rank order. unavailable when the group's transfer fails.
result<int> local_rank(transport::peer_group& group, uint64_t host_key);

}  // namespace weft::train
