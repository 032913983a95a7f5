#include "gpu/device.hpp"

#include <algorithm>
#include <mutex>

#include "gpu/cpu/cpu_device.hpp"
#ifdef WEFT_WITH_CUDA
#include "gpu/cuda/cuda_device.hpp"
#endif

namespace weft::gpu {

namespace {
std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
}  // namespace

device_registry& device_registry::instance() {
  static device_registry* registry = [] {
    auto* r = new device_registry();
    r->add("cpu", device_kind::cpu, [](const device_config& c) { return cpu::make_cpu_device(c); });
#ifdef WEFT_WITH_CUDA
    r->add(
        "cuda", device_kind::cuda, [](const device_config& c) { return cuda::make_cuda_device(c); },
        [] { return cuda::cuda_device_count(); });
#endif
    return r;
  }();
  return *registry;
}

void device_registry::add(const std::string& name, device_kind kind, device_factory factory,
                          device_counter count) {
  std::lock_guard lock{registry_mutex()};
  for (auto& e : entries_) {
    if (e.name == name) {
      e.kind = kind;
      e.factory = std::move(factory);
      e.count = std::move(count);
      return;
    }
  }
  entries_.push_back({name, kind, std::move(factory), std::move(count)});
}

int device_registry::count(const std::string& name) const {
  device_counter counter;
  {
    std::lock_guard lock{registry_mutex()};
    auto it = std::find_if(entries_.begin(), entries_.end(),
                           [&](const entry& e) { return e.name == name; });
    if (it == entries_.end()) return 0;
    if (!it->count) return 1;
    counter = it->count;
  }
  return std::max(0, counter());
}

result<std::unique_ptr<device>> device_registry::create(const std::string& name,
                                                        const device_config& config) const {
  device_factory factory;
  {
    std::lock_guard lock{registry_mutex()};
    for (const auto& e : entries_) {
      if (e.name == name) factory = e.factory;
    }
  }
  if (!factory) return status{status_code::not_found, "no device backend named '" + name + "'"};
  return factory(config);
}

result<std::unique_ptr<device>> device_registry::open(const std::string& spec, int threads) const {
  std::string backend = spec;
  int index = 0;
  if (const auto colon = spec.find(':'); colon != std::string::npos) {
    backend = spec.substr(0, colon);
    const std::string num = spec.substr(colon + 1);
    if (num.empty() || num.size() > 4 ||
        !std::all_of(num.begin(), num.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return status{status_code::invalid_argument,
                    "device '" + spec + "': expected BACKEND or BACKEND:INDEX (cpu, cuda, cuda:1)"};
    }
    index = std::stoi(num);
  }
  auto d = create(backend, device_config{threads, index});
  if (!d && d.error().code() == status_code::not_found) {
    std::string known;
    for (const auto& n : names()) known += (known.empty() ? "" : ", ") + n;
    return status{status_code::invalid_argument, "device '" + spec + "': no backend '" + backend +
                                                     "' in this build (built: " + known + ")"};
  }
  return d;
}

std::vector<std::string> device_registry::names() const {
  std::lock_guard lock{registry_mutex()};
  std::vector<std::string> out;
  for (const auto& e : entries_) out.push_back(e.name);
  return out;
}

}  // namespace weft::gpu
