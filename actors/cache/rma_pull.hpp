#pragma once
/// One-sided pulls of scattered byte pieces from a peer's registered regions into a local region:
/// what the prefix-cache pool uses to move segments (a shard pulls a worker's KV blocks on publish;
/// a worker pulls a shard's staged segments on fetch). Peers and imported remote regions are cached
/// per address and key; a peer that turns out dead is forgotten. Batches go as one get_batch where
/// the engine supports it, else as one get per piece with one completion for all.
///
/// Plain C++ (no CAF). Not thread-safe: call from the owner's thread. The completion callback runs
/// on the transport's progress thread: it must only hand the result to the owner thread.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "schema/status.hpp"
#include "transport/engine.hpp"

namespace weft::cache {

/// One contiguous piece: `size_bytes` from offset `remote_offset` of remote region `remote_index`
/// (an index into the keys given to start()) to `local_offset` of local region `local_index`.
struct pull_piece {
  uint32_t remote_index = 0;
  uint64_t remote_offset = 0;
  uint64_t local_offset = 0;
  uint64_t size_bytes = 0;
  uint32_t local_index = 0;
};

/// Called once per started pull with its id and the outcome (ok or the transport's error text).
using pull_done_fn = std::function<void(uint64_t pull_id, bool ok, std::string error)>;

class rma_puller {
 public:
  explicit rma_puller(std::shared_ptr<transport::engine> engine) : engine_(std::move(engine)) {}
  ~rma_puller();
  rma_puller(const rma_puller&) = delete;
  rma_puller& operator=(const rma_puller&) = delete;

  /// Starts pulling `pieces` from the peer at `address` (regions described by `remote_keys`) into
  /// the `locals` regions. Every piece is bounds-checked against both regions first. Returns the
  /// pull id; `done` fires exactly once iff this returns ok. Errors: invalid_argument (a piece out
  /// of bounds, no pieces), unavailable (peer unreachable, transfer could not start).
  result<uint64_t> start(std::span<const std::byte> address,
                         const std::vector<std::vector<std::byte>>& remote_keys,
                         const std::vector<transport::region>& locals,
                         const std::vector<pull_piece>& pieces, uint32_t timeout_ms,
                         pull_done_fn done);

  /// Call from the owner thread once a pull's callback fired (drops its bookkeeping); a failed
  /// pull's peer is forgotten so the next pull reconnects.
  void finished(uint64_t pull_id, bool ok);

  const std::shared_ptr<transport::engine>& engine() const { return engine_; }

 private:
  struct peer_entry {
    transport::peer_handle peer;
    std::map<std::vector<std::byte>, transport::remote_region> remotes;
  };
  result<peer_entry*> peer_for(std::span<const std::byte> address);
  void forget(const std::vector<std::byte>& address);

  std::shared_ptr<transport::engine> engine_;
  std::map<std::vector<std::byte>, peer_entry> peers_;
  std::map<uint64_t, std::vector<std::byte>> pull_peer_;  ///< pull id -> peer address
  uint64_t next_pull_ = 1;
};

}  // namespace weft::cache
