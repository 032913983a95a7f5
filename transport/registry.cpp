// The one place that knows every built-in backend (and the only non-nccl file with its #ifdef).
#include "transport/registry.hpp"

#include <algorithm>
#include <map>
#include <mutex>

#include "transport/fault_injection.hpp"
#include "transport/inproc/inproc_engine.hpp"
#include "transport/ucx/ucx_engine.hpp"
#ifdef WEFT_WITH_NCCL
#include "transport/nccl/nccl_engine.hpp"
#endif

namespace weft::transport {

namespace {

struct registry_state {
  std::mutex mutex;
  std::map<std::string, engine_factory> factories;
};

registry_state& state() {
  static registry_state* s = [] {
    auto* r = new registry_state;  // never destroyed: engines may be made during static teardown
    r->factories["ucx"] = [](const engine_config& c) { return ucx::make_engine(c); };
    r->factories["inproc"] = [](const engine_config& c) { return inproc::make_engine(c); };
#ifdef WEFT_WITH_NCCL
    r->factories["nccl"] = [](const engine_config& c) { return nccl::make_engine(c); };
#endif
    return r;
  }();
  return *s;
}

}  // namespace

void register_engine(const std::string& name, engine_factory factory) {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.factories[name] = std::move(factory);
}

std::vector<std::string> engine_names() {
  auto& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<std::string> names;
  for (const auto& [name, f] : s.factories) names.push_back(name);
  return names;
}

result<std::unique_ptr<engine>> make_engine(const std::string& name, const engine_config& config) {
  constexpr std::string_view fault_prefix = "fault:";
  if (name.rfind(fault_prefix, 0) == 0) {
    auto policy = parse_fault_policy(config.params);
    if (!policy) return policy.error();
    policy->default_timeout_ms = config.default_timeout_ms;
    engine_config inner_config = config;
    std::erase_if(inner_config.params,
                  [](const auto& kv) { return kv.first.rfind("fault.", 0) == 0; });
    auto inner = make_engine(name.substr(fault_prefix.size()), inner_config);
    if (!inner) return inner.error();
    auto wrapped = make_fault_injecting_engine(std::move(*inner), *policy);
    if (!wrapped) return wrapped.error();
    return std::unique_ptr<engine>(std::move(*wrapped));
  }
  engine_factory factory;
  {
    auto& s = state();
    std::lock_guard<std::mutex> lock(s.mutex);
    auto it = s.factories.find(name);
    if (it != s.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const auto& n : engine_names()) known += (known.empty() ? "" : ", ") + n;
    return make_status(status_code::invalid_argument,
                       "unknown transport engine '" + name + "' (known: " + known + ")");
  }
  return factory(config);
}

}  // namespace weft::transport
