#include "actors/serve/schedule_policies.hpp"

#include <string>

namespace weft::serve {

result<std::shared_ptr<gpu::schedule_policy>> make_schedule_policy(std::string_view name,
                                                                   const mlfq_config& mlfq) {
  if (name == "fcfs")
    return std::shared_ptr<gpu::schedule_policy>(std::make_shared<gpu::fcfs_policy>());
  if (name == "mlfq") {
    auto p = mlfq_policy::create(mlfq);
    if (!p) return p.error();
    return std::shared_ptr<gpu::schedule_policy>(std::move(p.value()));
  }
  if (name == "priority")
    return std::shared_ptr<gpu::schedule_policy>(std::make_shared<gpu::priority_policy>());
  return make_error(errc::invalid_argument, "unknown scheduling policy \"" + std::string(name) +
                                                "\" (known: fcfs, mlfq, priority)");
}

}  // namespace weft::serve
