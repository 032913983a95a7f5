#pragma once
/// A fixed group of engines (one per process, rank 0..size-1) and the collective that data-parallel
/// trainers need: an all-reduce sum over tagged send/recv, for engines without built-in collectives
/// (ucx, inproc). NCCL has its own all_reduce; this is the CPU path.
///
/// The reduction is deterministic and the same bits land on every member: the vector is cut into
/// `size` chunks; chunk c is sent to rank c, which sums the members' pieces in rank order
/// (x_0 + x_1 + ... + x_{size-1}, whatever order the bytes arrived in), then sends the sum to
/// everyone (a reduce-scatter and an all-gather: 2 (size-1)/size of the vector sent per member,
/// like a ring, in size-1 steps less latency for the small groups of a CPU cluster).
///
/// Every message carries a tag of (generation, sequence number, phase, sender and receiver rank):
/// the group's calls must be made in the same order on every member, and a message of an older
/// incarnation of the group (another `generation`) never matches. Every transfer has the group's
/// deadline, so a member that died makes the call fail (timeout or peer_unreachable) instead of
/// hanging; abort() makes it fail at once.
///
/// Thread safety: one thread makes the calls; abort() may come from any thread.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "transport/engine.hpp"

namespace weft::transport {

struct group_options {
  uint32_t timeout_ms = 60'000;  ///< deadline of every transfer of a call
  uint16_t generation = 0;       ///< incarnation of the group (keeps old messages out)
};

class peer_group {
 public:
  /// Connects `e` (rank `rank`) to every other member; `addresses[r]` is rank r's
  /// engine::local_address(). The engine must outlive the group.
  static result<std::unique_ptr<peer_group>> connect(engine& e, int rank,
                                                     const std::vector<bytes>& addresses,
                                                     group_options options = {});
  ~peer_group();
  peer_group(const peer_group&) = delete;
  peer_group& operator=(const peer_group&) = delete;

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }

  /// Replaces `data` on every member by the element-wise sum over the group (rank order).
  status all_reduce_sum(std::span<float> data);
  status all_reduce_sum(std::span<double> data);
  /// The same over the concatenation of `pieces` (e.g. every gradient tensor of a model), copied
  /// straight into and out of the group's registered buffer.
  status all_reduce_sum(std::span<const std::span<float>> pieces);
  /// Rank `root`'s `data` to the members r with receivers[r] set (their `data` is overwritten with
  /// the same bytes); every member calls it with the same size, root and receivers, including
  /// those that neither send nor receive (the group's calls stay in step). At most the size of
  /// one registered buffer per call: callers cut a file into pieces.
  status broadcast(std::span<std::byte> data, int root, const std::vector<bool>& receivers);

  /// Cancels what is in flight; this call and every later one fail with canceled.
  void abort();
  bool aborted() const { return aborted_.load(); }

 private:
  peer_group(engine& e, int rank, group_options options);
  template <class T>
  status reduce(std::span<const std::span<T>> pieces);
  status ensure_scratch(size_t bytes);
  status run(std::vector<transfer>& started);
  /// Records a started transfer (cancelled at once if the group was aborted meanwhile); on a
  /// failed start cancels what `started` holds and returns the error.
  status start(result<transfer> t, std::vector<transfer>& started);
  tag_t tag(uint32_t phase, int src, int dst) const;

  engine& engine_;
  int rank_;
  group_options options_;
  std::vector<peer_handle> peers_;  ///< by rank; invalid for this rank
  region scratch_{};
  uint32_t seq_ = 0;
  std::atomic<bool> aborted_{false};
  std::mutex mu_;
  std::vector<transfer> in_flight_;
};

}  // namespace weft::transport
