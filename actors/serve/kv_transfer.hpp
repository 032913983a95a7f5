#pragma once
/// Moving one sequence's KV blocks from a prefill worker's paged cache to a decode worker's cache
/// over the transport (DistServe disaggregation): the data-plane building block, no CAF.
///
/// Protocol (the control messages travel through the actors; the bytes never do):
///   prefill side   auto d = exporter->offer({.request_id = r, .seq = s, .tokens = t, .lease_ms =
///   5000});
///                  // d is a KvDescriptor envelope (schema/serve.capnp): send it to the decode
///                  side
///   decode side    auto p = importer->start(d, on_transfer_done);   // validates, allocates,
///   starts get
///                  // ... on_transfer_done(pull_id, completion) fires on the transport's progress
///                  // thread: marshal it back to the owner thread, then:
///                  auto got = importer->finish(pull_id);   // commits, or frees on error
///                  // either way, tell the prefill side that the pull ended (lease id in the
///                  descriptor)
///   prefill side   auto seq = exporter->release(lease_id);   // hands the sequence back: free it
///                  // or, when nobody released in time: for (auto& l : exporter->expire(now))
///                  free(l.seq)
///
/// Who frees what: neither class ever frees a sequence of the prefill side. The exporter hands the
/// leased sequence back exactly once (release() or expire(), whichever comes first) and its caller
/// frees it through its own engine. The importer owns a sequence it is importing until finish()
/// returns: on any failure finish() frees it (and start() frees it when it cannot start the
/// transfer); on success the caller owns the returned sequence.
/// While a sequence is leased its owner must neither append to it nor free it: to abort it,
/// release() the lease and free the sequence that comes back.
///
/// Deadlines: the descriptor carries the lease deadline (unix ms). The importer refuses a
/// descriptor whose deadline has passed and gives its transfer the time left minus a safety margin,
/// so the transfer is over (completed or canceled with timeout) before the exporter may reclaim the
/// blocks at deadline + grace. No transfer waits forever.
///
/// Validation: format version, model id, weights version, layout string (dims, block size, dtype),
/// engine, block size in bytes, region bounds of every block are checked against the local cache; a
/// mismatch is refused with version_mismatch / invalid_argument, never guessed. Descriptor bytes
/// from another process are decoded with the envelope's limits: malformed bytes give `malformed`.
///
/// Thread safety: kv_exporter and kv_importer are not thread-safe, like the kv_cache they wrap:
/// call every member from the thread that owns the cache (the worker actor). The only code that
/// runs elsewhere is the caller's transfer callback given to kv_importer::start (progress thread),
/// which must not touch the importer or the cache.

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/kv_cache.hpp"
#include "schema/envelope.hpp"
#include "schema/status.hpp"
#include "transport/engine.hpp"

namespace weft::serve {

/// The KvDescriptor format this build writes and accepts.
inline constexpr uint32_t kv_descriptor_format = 1;

/// Milliseconds since the unix epoch (the clock of every deadline in descriptors).
uint64_t unix_now_ms();

/// What the KV of a cache is: both ends of a transfer must agree on all of it.
struct kv_transfer_config {
  std::string model_id;                                          ///< e.g. model_id_for(path)
  uint64_t weights_version = 0;                                  ///< bumped on every weight update
  transport::memory_kind memory = transport::memory_kind::host;  ///< where the cache pool lives
  /// Exporter: blocks are reclaimed by expire() only at deadline + grace, so that a pull that ran
  /// up to the deadline is surely over. Importer: ignored.
  uint64_t expiry_grace_ms = 200;
  /// Importer: the transfer must end this long before the lease deadline. Exporter: ignored.
  uint64_t deadline_margin_ms = 20;
};

/// Whether offer() computes a checksum of the KV bytes (verified by the importer).
enum class kv_checksum_mode { none, xxh3 };

/// One offer of a sequence's KV.
struct kv_offer {
  uint64_t request_id = 0;
  gpu::seq_id seq = 0;
  std::span<const int32_t> tokens;  ///< the sequence's committed tokens (kv.length(seq) of them)
  uint64_t lease_ms = 10'000;       ///< lease duration from now_ms
  uint64_t now_ms = 0;              ///< 0: unix_now_ms()
  kv_checksum_mode checksum = kv_checksum_mode::xxh3;
};

/// A lease on an offered sequence, as handed back by release() and expire().
struct kv_lease {
  uint64_t lease_id = 0;
  uint64_t request_id = 0;
  gpu::seq_id seq = 0;
  uint64_t deadline_ms = 0;  ///< unix ms
};

/// The fields of a KvDescriptor the control plane needs (ids to route the reply and release).
struct kv_descriptor_info {
  uint64_t request_id = 0;
  uint64_t lease_id = 0;
  uint64_t lease_deadline_ms = 0;
  int64_t n_tokens = 0;
  uint64_t size_bytes = 0;  ///< KV bytes the pull moves (0 from read_kv_descriptor)
};

/// Reads the routing fields of a KvDescriptor envelope (decode + field validation only; the
/// layout-dependent size_bytes is left 0: kv_importer::check fills it).
result<kv_descriptor_info> read_kv_descriptor(const schema::envelope& descriptor);

/// Checksum carried in descriptors: XXH3-64 over the XXH3-64 of `tokens` followed by the XXH3-64s
/// of `ranges` in export order (never 0), so a token list altered on the way is caught as well as
/// altered KV bytes. The ranges must be host-readable.
uint64_t kv_checksum(std::span<const gpu::kv_byte_range> ranges, std::span<const int32_t> tokens);

/// The prefill side: offers sequences of its cache under leases.
class kv_exporter {
 public:
  /// Registers the cache's K and V pools with `engine` (once, for the exporter's lifetime).
  /// `kv` must outlive the exporter. Errors: unsupported (engine without one-sided transfers),
  /// unavailable (registration failed).
  static result<std::unique_ptr<kv_exporter>> create(gpu::kv_cache& kv,
                                                     std::shared_ptr<transport::engine> engine,
                                                     kv_transfer_config config);
  /// Deregisters the pools. Leases still held are logged; their sequences stay in the cache (the
  /// caller frees them).
  ~kv_exporter();
  kv_exporter(const kv_exporter&) = delete;
  kv_exporter& operator=(const kv_exporter&) = delete;

  /// Builds a KvDescriptor for `o.seq` and records a lease on it. Errors: not_found (unknown
  /// sequence), invalid_argument (swapped out, empty, tokens that do not match its length, checksum
  /// of device-only memory), already_exists (the sequence is leased already).
  result<schema::envelope> offer(const kv_offer& o);

  /// Ends a lease and hands its sequence back for the caller to free. A second release (or one
  /// after expiry) returns not_found naming what happened to the lease, and no sequence.
  result<kv_lease> release(uint64_t lease_id);

  /// Moves a lease's deadline to now_ms + lease_ms (0 now_ms: unix_now_ms()); returns the new
  /// deadline. not_found for a lease that ended.
  result<uint64_t> renew(uint64_t lease_id, uint64_t lease_ms, uint64_t now_ms = 0);

  /// Ends every lease with deadline + grace <= now_ms and hands their sequences back (each lease
  /// exactly once over all calls of release() and expire()).
  std::vector<kv_lease> expire(uint64_t now_ms);

  /// Leases currently held.
  size_t n_leases() const { return leases_.size(); }
  /// The registered K (0) and V (1) pools of the cache (e.g. to pull into them).
  const transport::region& pool(int i) const { return pools_[i]; }
  /// The earliest deadline + grace of a held lease (0 when none): when to call expire() next.
  uint64_t next_expiry_ms() const;

 private:
  kv_exporter(gpu::kv_cache& kv, std::shared_ptr<transport::engine> engine,
              kv_transfer_config config);
  void remember_end(uint64_t lease_id, const char* how);

  gpu::kv_cache& kv_;
  std::shared_ptr<transport::engine> engine_;
  kv_transfer_config config_;
  transport::region pools_[2]{};   ///< K, V
  transport::bytes pool_keys_[2];  ///< describe() of each pool
  transport::bytes address_;
  size_t layer_stride_bytes_ = 0;
  uint64_t next_lease_ = 1;
  std::map<uint64_t, kv_lease> leases_;
  std::unordered_map<gpu::seq_id, uint64_t> lease_of_seq_;
  std::unordered_map<uint64_t, const char*>
      ended_;  ///< recently ended leases -> "released"/"expired"
  std::deque<uint64_t> ended_order_;
};

/// What a finished pull produced.
struct kv_pull_result {
  gpu::seq_id seq = 0;  ///< the new sequence, tokens committed; the caller owns it
  uint64_t request_id = 0;
  uint64_t lease_id = 0;  ///< release it on the exporter
  int64_t n_tokens = 0;
  uint64_t size_bytes = 0;
  bool checksum_verified = false;
};

/// Called once per started pull, on the transport's progress thread (or inside
/// engine::progress() in manual mode). Must not touch the importer or its cache: hand the
/// completion to the owner thread, which calls kv_importer::finish().
using kv_transfer_done_fn = std::function<void(uint64_t pull_id, const transport::completion&)>;

/// The decode side: pulls offered sequences into its cache.
class kv_importer {
 public:
  /// Registers the cache's K and V pools with `engine` (once). `kv` must outlive the importer.
  static result<std::unique_ptr<kv_importer>> create(gpu::kv_cache& kv,
                                                     std::shared_ptr<transport::engine> engine,
                                                     kv_transfer_config config);
  /// Cancels pulls still in flight, waits for their completions, frees their sequences and
  /// deregisters the pools.
  ~kv_importer();
  kv_importer(const kv_importer&) = delete;
  kv_importer& operator=(const kv_importer&) = delete;

  /// Validates `descriptor` against the local cache without allocating anything.
  result<kv_descriptor_info> check(const schema::envelope& descriptor, uint64_t now_ms = 0) const;

  /// Validates the descriptor, allocates the sequence's blocks and starts the transfer; returns a
  /// pull id. `on_done` fires exactly once iff this returns ok. Errors (nothing stays allocated):
  /// malformed, version_mismatch, invalid_argument, timeout (deadline passed), overloaded (no free
  /// blocks), unavailable (peer unreachable / transfer could not start).
  result<uint64_t> start(const schema::envelope& descriptor, kv_transfer_done_fn on_done,
                         uint64_t now_ms = 0);

  /// Completes a pull once its callback fired: on success verifies the checksum (if the descriptor
  /// has one), commits the tokens and returns the sequence; on failure frees the half-imported
  /// sequence and returns the error (timeout, unavailable, malformed for a checksum mismatch).
  /// not_found for an unknown (or already finished) pull id; invalid_argument (and nothing
  /// changes) while the transfer is still in flight.
  result<kv_pull_result> finish(uint64_t pull_id);

  /// Cancels a started pull: its callback fires with canceled; finish() it as usual.
  status cancel(uint64_t pull_id);

  /// start + wait + finish on the calling thread (blocks until the transfer ends, at the latest at
  /// the lease deadline).
  result<kv_pull_result> pull(const schema::envelope& descriptor, uint64_t now_ms = 0);

  /// Pulls started and not finished yet.
  size_t n_pending() const { return pending_.size(); }

 private:
  struct pending_pull;
  struct pull_state;

  kv_importer(gpu::kv_cache& kv, std::shared_ptr<transport::engine> engine,
              kv_transfer_config config);
  result<transport::peer_handle> peer_for(std::span<const std::byte> address);
  void forget_peer(transport::peer_handle peer);
  void drop_pending(pending_pull& p);
  void wait_done(pull_state& s);

  gpu::kv_cache& kv_;
  std::shared_ptr<transport::engine> engine_;
  kv_transfer_config config_;
  transport::region pools_[2]{};
  size_t layer_stride_bytes_ = 0;
  uint64_t next_pull_ = 1;
  std::map<uint64_t, std::unique_ptr<pending_pull>> pending_;
  std::map<transport::bytes, transport::peer_handle> peers_;
};

}  // namespace weft::serve
