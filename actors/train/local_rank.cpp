#include "actors/train/local_rank.hpp"

#include <unistd.h>
#include <xxhash.h>

#include <fstream>
#include <string>
#include <vector>

namespace weft::train {

uint64_t this_host_key() {
  std::string id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  if (!(in >> id) || id.empty()) {
    char name[256] = {};
    (void)::gethostname(name, sizeof name - 1);
    id = name;
  }
  return XXH3_64bits(id.data(), id.size());
}

result<std::vector<uint64_t>> all_gather_keys(transport::peer_group& group, uint64_t key) {
  // Every member's key in its own two slots (32-bit halves, exact in a double); the others add 0.
  const auto k = static_cast<size_t>(group.size());
  const auto me = static_cast<size_t>(group.rank());
  std::vector<double> halves(2 * k, 0.0);
  halves[2 * me] = static_cast<double>(key >> 32);
  halves[2 * me + 1] = static_cast<double>(key & 0xFFFFFFFFu);
  if (auto s = group.all_reduce_sum(std::span<double>(halves)); !s.ok()) {
    return make_error(errc::unavailable, "exchanging the ranks' keys: " + s.to_string());
  }
  std::vector<uint64_t> keys(k);
  for (size_t r = 0; r < k; ++r) {
    keys[r] =
        (static_cast<uint64_t>(halves[2 * r]) << 32) | static_cast<uint64_t>(halves[2 * r + 1]);
  }
  return keys;
}

result<int> local_rank(transport::peer_group& group, uint64_t host_key) {
  auto keys = all_gather_keys(group, host_key);
  if (!keys) {
    return make_error(errc::unavailable, "exchanging the ranks' hosts: " + keys.error().message);
  }
  const auto me = static_cast<size_t>(group.rank());
  int local = 0;
  for (size_t r = 0; r < me; ++r) {
    if ((*keys)[r] == (*keys)[me]) ++local;
  }
  return local;
}

}  // namespace weft::train
