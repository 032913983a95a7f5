#include "transport/peer_group.hpp"

#include <algorithm>
#include <cstring>
#include <string>

namespace weft::transport {

namespace {

/// [lo, hi) of chunk c of n elements cut into k.
std::pair<size_t, size_t> chunk(size_t n, int k, int c) {
  const auto kk = static_cast<size_t>(k);
  const auto cc = static_cast<size_t>(c);
  return {n * cc / kk, n * (cc + 1) / kk};
}

}  // namespace

peer_group::peer_group(engine& e, int rank, group_options options)
    : engine_(e), rank_(rank), options_(options) {}

result<std::unique_ptr<peer_group>> peer_group::connect(engine& e, int rank,
                                                        const std::vector<bytes>& addresses,
                                                        group_options options) {
  const int n = static_cast<int>(addresses.size());
  if (n < 1 || rank < 0 || rank >= n || n > 2047) {
    return make_status(status_code::invalid_argument, "peer group: rank " + std::to_string(rank) +
                                                          " of " + std::to_string(n) +
                                                          " members (1..2047)");
  }
  if (n > 1 && !e.caps().tagged) {
    return make_status(status_code::unsupported,
                       "peer group: engine " + e.caps().name + " has no tagged send/recv");
  }
  std::unique_ptr<peer_group> g(new peer_group(e, rank, options));
  g->peers_.resize(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    if (r == rank) continue;
    auto p = e.connect(addresses[static_cast<size_t>(r)]);
    if (!p) {
      return make_status(p.error().code, "peer group: connecting to rank " + std::to_string(r) +
                                             ": " + p.error().message);
    }
    g->peers_[static_cast<size_t>(r)] = *p;
  }
  return g;
}

peer_group::~peer_group() {
  abort();
  for (const auto& p : peers_) {
    if (p.id != 0) (void)engine_.disconnect(p);
  }
  if (scratch_.id != 0) (void)engine_.release_memory(scratch_);
}

void peer_group::abort() {
  aborted_.store(true);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& t : in_flight_) (void)engine_.cancel(t);
}

tag_t peer_group::tag(uint32_t phase, int src, int dst) const {
  // generation:16 | sequence:24 | phase:2 | source rank:11 | destination rank:11. The destination
  // keeps apart two members that share one engine (two ranks in one process).
  return (tag_t{options_.generation} << 48) | (tag_t{seq_ & 0xFFFFFF} << 24) |
         (tag_t{phase & 0x3} << 22) | (static_cast<tag_t>(src & 0x7FF) << 11) |
         static_cast<tag_t>(dst & 0x7FF);
}

status peer_group::ensure_scratch(size_t bytes) {
  if (scratch_.id != 0 && scratch_.size_bytes >= bytes) return ok_status();
  if (scratch_.id != 0) {
    if (auto s = engine_.release_memory(scratch_); !s.ok()) return s;
    scratch_ = {};
  }
  auto r = engine_.allocate_memory(bytes);
  if (!r) return r.error();
  scratch_ = *r;
  return ok_status();
}

status peer_group::run(std::vector<transfer>& started) {
  status first = ok_status();
  for (const auto& t : started) {
    const completion c = engine_.wait(t);
    if (!c.result.ok() && first.ok()) {
      first = c.result;
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& other : started) (void)engine_.cancel(other);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    in_flight_.clear();
  }
  started.clear();
  if (aborted_.load()) return make_status(status_code::canceled, "peer group: aborted");
  return first;
}

status peer_group::start(result<transfer> t, std::vector<transfer>& started) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!t) {
    for (const auto& other : started) (void)engine_.cancel(other);
    return t.error();
  }
  in_flight_.push_back(*t);
  started.push_back(*t);
  // abort() may have run between the start and the push: cancel what it could not see.
  if (aborted_.load()) (void)engine_.cancel(*t);
  return ok_status();
}

template <class T>
status peer_group::reduce(std::span<const std::span<T>> pieces) {
  if (aborted_.load()) return make_status(status_code::canceled, "peer group: aborted");
  const int k = size();
  if (k == 1) return ok_status();
  ++seq_;
  size_t n = 0;
  for (const auto& p : pieces) n += p.size();
  const size_t max_chunk = (n + static_cast<size_t>(k) - 1) / static_cast<size_t>(k);
  // scratch: [ the vector | one slot of max_chunk per rank for the pieces of my chunk ]
  const size_t work_bytes = n * sizeof(T);
  if (auto s = ensure_scratch(work_bytes + static_cast<size_t>(k) * max_chunk * sizeof(T));
      !s.ok()) {
    return s;
  }
  T* work = reinterpret_cast<T*>(scratch_.data);
  T* slots = reinterpret_cast<T*>(scratch_.data + work_bytes);
  size_t at = 0;
  for (const auto& p : pieces) {
    if (!p.empty()) std::memcpy(work + at, p.data(), p.size() * sizeof(T));
    at += p.size();
  }
  const auto [my_lo, my_hi] = chunk(n, k, rank_);
  const size_t my_n = my_hi - my_lo;
  transfer_options to{options_.timeout_ms};
  std::vector<transfer> started;
  auto fail_started = [&](status s) {
    (void)run(started);
    return s;
  };

  // Phase 1 (reduce-scatter): my pieces of every chunk to its owner; the pieces of mine to slots.
  for (int r = 0; r < k; ++r) {
    if (r == rank_ || my_n == 0) continue;
    recv_request rq{tag(1, r, rank_),
                    ~tag_t{0},
                    peers_[static_cast<size_t>(r)],
                    scratch_,
                    work_bytes + static_cast<size_t>(r) * max_chunk * sizeof(T),
                    my_n * sizeof(T),
                    to};
    if (auto s = start(engine_.recv(rq, nullptr), started); !s.ok()) return fail_started(s);
  }
  for (int r = 0; r < k; ++r) {
    const auto [lo, hi] = chunk(n, k, r);
    if (r == rank_ || hi == lo) continue;
    send_request sq{peers_[static_cast<size_t>(r)],
                    tag(1, rank_, r),
                    scratch_,
                    lo * sizeof(T),
                    (hi - lo) * sizeof(T),
                    to};
    if (auto s = start(engine_.send(sq, nullptr), started); !s.ok()) return fail_started(s);
  }
  if (auto s = run(started); !s.ok()) return s;
  // Sum my chunk in rank order: every member's chunk is summed the same way.
  auto piece = [&](int r) -> const T* {
    return r == rank_ ? work + my_lo : slots + static_cast<size_t>(r) * max_chunk;
  };
  T* sum = slots + static_cast<size_t>(rank_) * max_chunk;  // my own slot is free
  std::memcpy(sum, piece(0), my_n * sizeof(T));
  for (int r = 1; r < k; ++r) {
    const T* p = piece(r);
    for (size_t i = 0; i < my_n; ++i) sum[i] += p[i];
  }
  std::memcpy(work + my_lo, sum, my_n * sizeof(T));

  // Phase 2 (all-gather): my summed chunk to everyone; theirs into place.
  for (int r = 0; r < k; ++r) {
    const auto [lo, hi] = chunk(n, k, r);
    if (r == rank_ || hi == lo) continue;
    recv_request rq{
        tag(2, r, rank_),      ~tag_t{0}, peers_[static_cast<size_t>(r)], scratch_, lo * sizeof(T),
        (hi - lo) * sizeof(T), to};
    if (auto s = start(engine_.recv(rq, nullptr), started); !s.ok()) return fail_started(s);
  }
  for (int r = 0; r < k; ++r) {
    if (r == rank_ || my_n == 0) continue;
    send_request sq{peers_[static_cast<size_t>(r)],
                    tag(2, rank_, r),
                    scratch_,
                    my_lo * sizeof(T),
                    my_n * sizeof(T),
                    to};
    if (auto s = start(engine_.send(sq, nullptr), started); !s.ok()) return fail_started(s);
  }
  if (auto s = run(started); !s.ok()) return s;
  at = 0;
  for (const auto& p : pieces) {
    if (!p.empty()) std::memcpy(p.data(), work + at, p.size() * sizeof(T));
    at += p.size();
  }
  return ok_status();
}

status peer_group::all_reduce_sum(std::span<float> data) {
  const std::span<float> one[1] = {data};
  return reduce(std::span<const std::span<float>>(one));
}

status peer_group::all_reduce_sum(std::span<double> data) {
  const std::span<double> one[1] = {data};
  return reduce(std::span<const std::span<double>>(one));
}

status peer_group::all_reduce_sum(std::span<const std::span<float>> pieces) {
  return reduce(pieces);
}

status peer_group::broadcast(std::span<std::byte> data, int root,
                             const std::vector<bool>& receivers) {
  if (aborted_.load()) return make_status(status_code::canceled, "peer group: aborted");
  const int k = size();
  if (root < 0 || root >= k || receivers.size() != static_cast<size_t>(k)) {
    return make_status(status_code::invalid_argument,
                       "peer group: broadcast from rank " + std::to_string(root) + " to " +
                           std::to_string(receivers.size()) + " flags in a group of " +
                           std::to_string(k));
  }
  ++seq_;
  const bool receiving = rank_ != root && receivers[static_cast<size_t>(rank_)];
  if (k == 1 || data.empty() || (rank_ != root && !receiving)) return ok_status();
  if (auto s = ensure_scratch(data.size()); !s.ok()) return s;
  transfer_options to{options_.timeout_ms};
  std::vector<transfer> started;
  if (receiving) {
    recv_request rq{tag(3, root, rank_), ~tag_t{0}, peers_[static_cast<size_t>(root)], scratch_, 0,
                    data.size(),         to};
    if (auto s = start(engine_.recv(rq, nullptr), started); !s.ok()) return s;
    if (auto s = run(started); !s.ok()) return s;
    std::memcpy(data.data(), scratch_.data, data.size());
    return ok_status();
  }
  std::memcpy(scratch_.data, data.data(), data.size());
  for (int r = 0; r < k; ++r) {
    if (r == root || !receivers[static_cast<size_t>(r)]) continue;
    send_request sq{peers_[static_cast<size_t>(r)], tag(3, root, r), scratch_, 0, data.size(), to};
    if (auto s = start(engine_.send(sq, nullptr), started); !s.ok()) {
      (void)run(started);
      return s;
    }
  }
  return run(started);
}

}  // namespace weft::transport
