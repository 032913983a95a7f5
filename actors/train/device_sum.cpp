#include "actors/train/device_sum.hpp"

#include <exception>

#include "actors/train/gradient_backend.hpp"
#include "actors/train/local_rank.hpp"

namespace weft::train {

int cuda_ordinal(const std::string& device) {
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) != 0) return -1;
  try {
    return std::stoi(device.substr(5));
  } catch (const std::exception&) {
    return -1;
  }
}

result<device_sum> form_device_sum(transport::peer_group& peers, const std::string& requested,
                                   int cuda_device, uint32_t timeout_ms,
                                   const std::string& engine) {
  const uint64_t key =
      cuda_device < 0 || requested == "ucx" ? 0 : device_key(this_host_key(), cuda_device);
  auto keys = all_gather_keys(peers, key);
  if (!keys) return keys.error();
  const auto choice = choose_gradient_backend(requested, *keys);
  if (choice.refused) {
    return make_error(errc::invalid_argument, "--dist-backend nccl: " + choice.why);
  }
  device_sum out;
  if (!choice.device) {
    out.why = choice.why;
    return out;
  }
  transport::device_group_options o;
  o.engine = engine;
  o.device = cuda_device;
  o.timeout_ms = timeout_ms;
  auto g = transport::device_group::join(peers, o);
  if (!g) {
    // Every rank sees the same failure (join agrees on it); a lost peer re-forms the group.
    const auto code = g.error().code;
    if (code == transport::status_code::canceled || code == transport::status_code::timeout ||
        code == transport::status_code::peer_unreachable) {
      return make_error(errc::unavailable, g.error().to_string());
    }
    if (requested == "nccl") {
      return make_error(errc::invalid_argument, "--dist-backend nccl: " + g.error().to_string());
    }
    out.why = "NCCL group not formed (" + g.error().to_string() + ")";
    out.join_failed = true;
    return out;
  }
  out.group = std::move(*g);
  return out;
}

}  // namespace weft::train
