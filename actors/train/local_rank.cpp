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

result<int> local_rank(transport::peer_group& group, uint64_t host_key) {
  // Every rank's key in its own two slots (32-bit halves, exact in a double); the others add 0.
  const auto k = static_cast<size_t>(group.size());
  const auto me = static_cast<size_t>(group.rank());
  std::vector<double> keys(2 * k, 0.0);
  keys[2 * me] = static_cast<double>(host_key >> 32);
  keys[2 * me + 1] = static_cast<double>(host_key & 0xFFFFFFFFu);
  if (auto s = group.all_reduce_sum(std::span<double>(keys)); !s.ok()) {
    return make_error(errc::unavailable, "exchanging the ranks' hosts: " + s.to_string());
  }
  int local = 0;
  for (size_t r = 0; r < me; ++r) {
    if (keys[2 * r] == keys[2 * me] && keys[2 * r + 1] == keys[2 * me + 1]) ++local;
  }
  return local;
}

}  // namespace weft::train
