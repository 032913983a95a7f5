#pragma once
/// Weight versions on the wire (docs/rl.md, "Rollout agents"): the trainer's f32 tensors packed
/// into one registered region of the data-plane engine (the image), described by a WeightOffer
/// (version, address, region, tensor table, XXH3-64 checksum, deadline), and pulled by an agent
/// in buckets with one-sided gets. No CAF here.

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "gpu/rl/rollout_backend.hpp"
#include "schema/envelope.hpp"
#include "schema/status.hpp"
#include "transport/engine.hpp"

namespace weft::rl {

/// Pull granularity: one get per bucket (several in flight).
inline constexpr uint64_t weight_bucket_bytes = 16ull << 20;

/// The source side: an image of a fixed tensor layout in registered memory.
class weight_image {
 public:
  /// Lays out `tensors` (names and sizes; values are copied by fill()) in `engine`'s memory.
  static result<std::unique_ptr<weight_image>> create(
      transport::engine& engine, std::span<const gpu::rl::named_weights> tensors);
  ~weight_image();
  weight_image(const weight_image&) = delete;
  weight_image& operator=(const weight_image&) = delete;

  /// Copies the tensors (same names and sizes, same order as at create) and makes `version` the
  /// image's version.
  status fill(int64_t version, std::span<const gpu::rl::named_weights> tensors);
  /// The offer of the current version. With `peer_address` and `peer_region` (an agent's
  /// buffer that holds this version), the offer points the puller at that peer instead.
  result<schema::envelope> offer(uint32_t timeout_ms,
                                 const transport::bytes* peer_address = nullptr,
                                 const transport::bytes* peer_region = nullptr) const;
  int64_t version() const { return version_; }
  uint64_t bytes() const { return region_.size_bytes; }

 private:
  weight_image(transport::engine& e) : engine_(e) {}
  struct entry {
    std::string name;
    uint64_t offset = 0;
    uint64_t count = 0;
  };
  transport::engine& engine_;
  transport::region region_{};
  std::vector<entry> entries_;
  int64_t version_ = -1;
  uint64_t checksum_ = 0;
};

/// The receiving side: a registered buffer the size of the image, reused across versions.
class weight_receiver {
 public:
  explicit weight_receiver(transport::engine& e) : engine_(e) {}
  ~weight_receiver();
  weight_receiver(const weight_receiver&) = delete;
  weight_receiver& operator=(const weight_receiver&) = delete;

  /// Pulls the offered image (validated: sizes, tensor table inside the image, checksum) and
  /// returns its tensors as views into the buffer (valid until the next pull).
  result<std::vector<gpu::rl::named_weights>> pull(const schema::wire::WeightOffer::Reader& offer);
  /// The descriptor of the buffer (holding the last pulled version), for a peer to pull from;
  /// empty before the first pull.
  transport::bytes describe() const;

 private:
  transport::engine& engine_;
  transport::region buffer_{};
  std::vector<std::string> names_;
};

}  // namespace weft::rl
