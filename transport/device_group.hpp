#pragma once
/// A device collective group (NCCL on CUDA) set up over a peer_group: data-parallel ranks whose
/// tensors live in GPU memory sum them with the GPUs' own collectives instead of copying them to
/// the host and through the peer group (docs/training.md, "Trainer groups on GPUs").
///
/// join() is collective over the bootstrap peer_group and cannot leave one member waiting for
/// another that failed: every member makes its engine, the members learn over the peer group
/// whether all of them have one (a member without a GPU, or in a build without NCCL, fails the
/// call on every member, naming the ranks), rank 0's group id goes to the others
/// (peer_group::broadcast), every member joins the communicator within the deadline, and the
/// members agree again that all of them joined.
///
/// Sums go through the engine's all_reduce (NCCL's ring or tree): the same bits land on every
/// member, and the same group shape gives the same bits run after run, but the order of the
/// additions is NCCL's, not peer_group's rank order. Every call has the deadline; a member that
/// died makes it fail (NCCL then aborts the communicator: later calls fail at once).
///
/// Thread safety: one thread makes the calls.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "transport/engine.hpp"
#include "transport/peer_group.hpp"

namespace weft::transport {

struct device_group_options {
  std::string engine = "nccl";   ///< registry name of a collectives engine
  int device = 0;                ///< this member's GPU ordinal
  uint32_t timeout_ms = 60'000;  ///< deadline of joining and of every collective
};

class device_group {
 public:
  /// Joins every member of `bootstrap` (see the file comment); the peer group must outlive the
  /// call only.
  static result<std::unique_ptr<device_group>> join(peer_group& bootstrap,
                                                    const device_group_options& options);
  ~device_group();
  device_group(const device_group&) = delete;
  device_group& operator=(const device_group&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& engine_name() const { return engine_name_; }

  /// Replaces each piece (device memory, f32; e.g. every gradient tensor of a model) by its
  /// element-wise sum over the group. Every member passes pieces of the same sizes in the same
  /// order. A piece's memory is registered with the engine on first use and stays registered
  /// while the same pointer and size come back.
  status all_reduce_sum(std::span<const std::span<float>> device_pieces);

 private:
  device_group(std::unique_ptr<engine> e, int rank, int size, uint32_t timeout_ms);
  result<region> region_of(std::span<float> piece, size_t index);

  std::unique_ptr<engine> engine_;
  int rank_, size_;
  uint32_t timeout_ms_;
  std::string engine_name_;
  std::vector<region> regions_;  ///< by piece index
};

}  // namespace weft::transport
