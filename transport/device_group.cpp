#include "transport/device_group.hpp"

#include <string>

#include "transport/registry.hpp"

namespace weft::transport {

namespace {

/// The ranks of the group whose `ok` is false (every member gets the same list).
result<std::vector<int>> failed_ranks(peer_group& g, bool ok) {
  std::vector<double> flags(static_cast<size_t>(g.size()), 0.0);
  flags[static_cast<size_t>(g.rank())] = ok ? 0.0 : 1.0;
  if (auto s = g.all_reduce_sum(std::span<double>(flags)); !s.ok()) return s;
  std::vector<int> failed;
  for (size_t r = 0; r < flags.size(); ++r) {
    if (flags[r] != 0.0) failed.push_back(static_cast<int>(r));
  }
  return failed;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

/// The group's error when `failed` is not empty: this member's own reason if it is one of them.
status group_failure(const std::string& what, const std::vector<int>& failed, const status& mine) {
  std::string msg = "device group: " + what + " failed on " + rank_list(failed);
  if (!mine.ok()) return make_status(mine.code, msg + " (here: " + mine.message + ")");
  return make_status(status_code::unsupported, msg + " (see that rank's log)");
}

}  // namespace

device_group::device_group(std::unique_ptr<engine> e, int rank, int size, uint32_t timeout_ms)
    : engine_(std::move(e)), rank_(rank), size_(size), timeout_ms_(timeout_ms) {
  engine_name_ = engine_->caps().name;
}

device_group::~device_group() {
  for (const auto& r : regions_) {
    if (r.id != 0) (void)engine_->release_memory(r);
  }
}

result<std::unique_ptr<device_group>> device_group::join(peer_group& bootstrap,
                                                         const device_group_options& options) {
  const int rank = bootstrap.rank(), size = bootstrap.size();
  engine_config cfg;
  cfg.progress = progress_mode::manual;
  cfg.default_timeout_ms = options.timeout_ms;
  cfg.params = {{"nccl.rank", std::to_string(rank)},
                {"nccl.world_size", std::to_string(size)},
                {"nccl.device", std::to_string(options.device)}};

  // 1. Every member's engine (and rank 0's group id).
  std::unique_ptr<engine> e;
  bytes address;
  status mine = ok_status();
  if (auto made = make_engine(options.engine, cfg); !made) {
    mine = made.error();
  } else if (!(*made)->caps().collectives || !(*made)->caps().gpu_memory) {
    mine = make_status(status_code::unsupported,
                       "engine " + options.engine + " has no collectives on GPU memory");
  } else {
    e = std::move(*made);
    if (rank == 0) {
      if (auto a = e->local_address(); !a) {
        mine = a.error();
      } else {
        address = std::move(*a);
      }
    }
  }
  auto failed = failed_ranks(bootstrap, mine.ok());
  if (!failed) return failed.error();
  if (!failed->empty())
    return group_failure("making the " + options.engine + " engine", *failed, mine);

  // 2. Rank 0's group id to everyone.
  double length[1] = {static_cast<double>(address.size())};
  if (auto s = bootstrap.all_reduce_sum(std::span<double>(length, 1)); !s.ok()) return s;
  address.resize(static_cast<size_t>(length[0]));
  std::vector<bool> receivers(static_cast<size_t>(size), true);
  receivers[0] = false;
  if (auto s = bootstrap.broadcast(std::span<std::byte>(address), 0, receivers); !s.ok()) return s;

  // 3. Join the communicator (NCCL: blocks until every member joined, or the deadline).
  if (auto p = e->connect(address); !p) mine = p.error();
  failed = failed_ranks(bootstrap, mine.ok());
  if (!failed) return failed.error();
  if (!failed->empty()) return group_failure("joining the communicator", *failed, mine);
  return std::unique_ptr<device_group>(
      new device_group(std::move(e), rank, size, options.timeout_ms));
}

result<region> device_group::region_of(std::span<float> piece, size_t index) {
  if (index >= regions_.size()) regions_.resize(index + 1);
  region& r = regions_[index];
  const auto* p = reinterpret_cast<const std::byte*>(piece.data());
  if (r.id != 0 && r.data == p && r.size_bytes == piece.size_bytes()) return r;
  if (r.id != 0) {
    if (auto s = engine_->release_memory(r); !s.ok()) return s;
    r = {};
  }
  auto reg = engine_->register_memory(piece.data(), piece.size_bytes(), memory_kind::gpu);
  if (!reg) return reg.error();
  r = *reg;
  return r;
}

status device_group::all_reduce_sum(std::span<const std::span<float>> device_pieces) {
  std::vector<transfer> started;
  started.reserve(device_pieces.size());
  status first = ok_status();
  for (size_t i = 0; i < device_pieces.size() && first.ok(); ++i) {
    if (device_pieces[i].empty()) continue;
    auto r = region_of(device_pieces[i], i);
    if (!r) {
      first = r.error();
      break;
    }
    collective_request rq;
    rq.send = *r;
    rq.recv = *r;
    rq.count = device_pieces[i].size();
    rq.type = data_type::f32;
    rq.op = reduce_op::sum;
    rq.options.timeout_ms = timeout_ms_;
    auto t = engine_->all_reduce(rq, nullptr);
    if (!t) {
      first = t.error();
      break;
    }
    started.push_back(std::move(*t));
  }
  // Everything started completes (by its deadline at the latest) before the pieces are reused.
  for (const auto& t : started) {
    auto c = engine_->wait(t);
    if (first.ok() && !c.result.ok()) first = c.result;
  }
  if (!first.ok()) {
    return make_status(first.code, "device all-reduce (" + engine_name_ + "): " + first.message);
  }
  return ok_status();
}

}  // namespace weft::transport
