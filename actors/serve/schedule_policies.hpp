#pragma once
/// The registry of engine scheduling policies by name, for `weft serve` worker configs.

#include <memory>
#include <string_view>

#include "actors/serve/mlfq_policy.hpp"
#include "gpu/schedule_policy.hpp"
#include "schema/status.hpp"

namespace weft::serve {

/// A new policy instance (one per engine): "fcfs" (gpu::fcfs_policy), "mlfq" (mlfq_policy with
/// `mlfq`) or "priority" (gpu::priority_policy: the requests' `priority` field). invalid_argument
/// for any other name or an invalid mlfq config.
result<std::shared_ptr<gpu::schedule_policy>> make_schedule_policy(std::string_view name,
                                                                   const mlfq_config& mlfq = {});

}  // namespace weft::serve
