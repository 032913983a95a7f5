#pragma once
/// Paged KV cache: fixed-size blocks of K/V (fp16) in device memory, per-sequence block tables,
/// reference counts with copy-on-write forks, chained block hashes for prefix reuse, export/import
/// of a sequence's blocks as byte ranges, swap to host memory, and block accounting.
///
/// Storage layout per layer: [block][slot][kv_head][head_dim] fp16, K and V in separate buffers.
/// Not thread-safe: the engine that owns it serialises all calls.

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "gpu/device.hpp"
#include "gpu/status.hpp"

namespace weft::gpu {

/// Identifies a sequence in a kv_cache.
using seq_id = int64_t;

/// Shape of the cache. Two caches can exchange blocks only when their layouts are equal.
struct kv_layout {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;  ///< Tokens per block.
  ggml_type dtype = ggml_type::f16;

  /// Bytes of one block of one layer, K or V.
  size_t block_bytes() const { return static_cast<size_t>(block_size * n_kv_heads * head_dim) * 2; }
  bool operator==(const kv_layout&) const = default;
  /// "layers=30 kv_heads=3 head_dim=64 block=16 f16" — goes into transfer descriptors.
  std::string describe() const;
};

/// How a cache is created.
struct kv_cache_config {
  kv_layout layout;
  int64_t n_blocks = 0;  ///< Blocks in the pool (each holds block_size tokens of every layer).
  /// Host bytes kept beside each token slot (0: none): data that belongs with the token's K/V,
  /// such as the experts a mixture-of-experts model routed it to (routing replay, gpu::engine).
  /// A block's payload moves with the block: copied on copy-on-write, swapped out and in, revived
  /// with it by attach_prefix. It does not travel with export_ranges / prepare_import.
  int64_t slot_payload_bytes = 0;
  /// attach_prefix / match_prefix go on into one more cached block token by token (false: whole
  /// blocks only).
  bool leading_token_matches = true;
};

/// Block accounting. used + free = total; cached blocks are free blocks that still hold a
/// registered prefix and can be revived by a prefix match until they are reused.
struct kv_stats {
  int64_t n_blocks_total = 0;
  int64_t n_blocks_used = 0;    ///< Referenced by at least one sequence.
  int64_t n_blocks_free = 0;    ///< Not referenced (includes cached).
  int64_t n_blocks_cached = 0;  ///< Free but holding a hashed full block.
  int64_t n_sequences = 0;
  int64_t n_swapped_sequences = 0;
  int64_t n_prefix_hits_tokens = 0;  ///< Tokens served from cached blocks since creation.
};

/// One contiguous piece of cache memory (device pointer) — what a transport moves.
struct kv_byte_range {
  int64_t layer = 0;
  int64_t block_index = 0;  ///< Index in the sequence's block table.
  bool is_value = false;    ///< V (true) or K (false).
  void* data = nullptr;
  size_t size_bytes = 0;
};

/// The cache.
class kv_cache {
 public:
  /// Allocates the pool on `dev` (which must outlive the cache).
  static result<std::unique_ptr<kv_cache>> create(device& dev, const kv_cache_config& config);
  ~kv_cache();
  kv_cache(const kv_cache&) = delete;
  kv_cache& operator=(const kv_cache&) = delete;

  const kv_layout& layout() const { return config_.layout; }

  // -- sequences --------------------------------------------------------------------------------

  /// A new empty sequence.
  seq_id create_sequence();
  /// Makes an empty sequence start with the longest cached prefix of `tokens`: the run of cached
  /// full blocks matching it (chained hashes), then the leading tokens of one more cached block
  /// chained from the last of them (token-granular: a prompt that stops inside a block, or leaves
  /// it, reuses the rows it shares; they are copied into a block of its own, which it then goes
  /// on writing). Returns the number of tokens now present (< tokens.size(), so at least one
  /// token is left to compute).
  result<int64_t> attach_prefix(seq_id seq, std::span<const int32_t> tokens);
  /// What attach_prefix would match for `tokens` (tokens), without attaching or counting a hit.
  int64_t match_prefix(std::span<const int32_t> tokens) const;
  /// Starts a new prefix namespace (e.g. a model weight version, docs/rl.md): blocks cached under
  /// another namespace are never matched again (they age out as free blocks); sequences keep the
  /// namespace they were created in, so KV computed with old weights is never published under the
  /// new one. 0 is the default namespace.
  void set_prefix_namespace(uint64_t ns) { namespace_ = ns; }
  uint64_t prefix_namespace() const { return namespace_; }
  /// Ensures room for `n_new` more tokens (allocating blocks; copying a shared last block first).
  status reserve(seq_id seq, int64_t n_new);
  /// Cache slots (block * block_size + offset) of positions [pos, pos + n); must be reserved.
  status slots(seq_id seq, int64_t pos, int64_t n, std::vector<int32_t>& out) const;
  /// Records that `tokens` were appended (their K/V written); hashes blocks that became full.
  status commit(seq_id seq, std::span<const int32_t> tokens);
  /// A new sequence sharing all blocks of `seq` (copy-on-write on the next write to a shared
  /// block).
  result<seq_id> fork(seq_id seq);
  /// Frees a sequence: every block's reference is dropped exactly once. Swapped-out data too.
  status free_sequence(seq_id seq);

  /// Tokens committed to `seq` (0 for an unknown sequence).
  int64_t length(seq_id seq) const;
  /// Block ids of `seq` in order (empty for an unknown or swapped sequence).
  std::span<const int32_t> block_table(seq_id seq) const;
  bool contains(seq_id seq) const;

  // -- storage ----------------------------------------------------------------------------------

  uint16_t* k_layer(int64_t layer) const;
  /// The payload of cache slot `slot` (block · block_size + offset), slot_payload_bytes of host
  /// memory; nullptr when the cache keeps none.
  uint8_t* slot_payload(int32_t slot) {
    return payload_.empty() ? nullptr
                            : payload_.data() + static_cast<size_t>(slot) *
                                                    static_cast<size_t>(config_.slot_payload_bytes);
  }
  uint16_t* v_layer(int64_t layer) const;

  // -- transfer ---------------------------------------------------------------------------------

  /// The byte ranges holding `seq`'s committed tokens: per block, per layer, K then V.
  result<std::vector<kv_byte_range>> export_ranges(seq_id seq) const;
  /// Creates a sequence of `tokens` whose blocks are allocated but empty, and returns the ranges
  /// to fill (same order as export_ranges). `layout` must equal this cache's layout.
  result<std::pair<seq_id, std::vector<kv_byte_range>>> prepare_import(
      const kv_layout& layout, std::span<const int32_t> tokens);

  // -- swap -------------------------------------------------------------------------------------

  /// Copies `seq`'s blocks to host memory and releases them on the device.
  status swap_out(seq_id seq);
  /// Allocates blocks and copies a swapped sequence back.
  status swap_in(seq_id seq);
  bool is_swapped(seq_id seq) const;

  // -- accounting -------------------------------------------------------------------------------

  kv_stats stats() const;
  /// Blocks needed to hold `n_tokens` tokens.
  int64_t blocks_for(int64_t n_tokens) const;
  /// Checks every invariant (refcounts == references from tables, free list consistent, hashes
  /// point at blocks that hold them); a non-ok status describes the first violation.
  status check_invariants() const;

 private:
  struct sequence {
    std::vector<int32_t> blocks;
    std::vector<int32_t> tokens;
    std::vector<uint64_t> block_hashes;  ///< Chained hash of each full block.
    uint64_t root = 0;                   ///< Prefix namespace when the sequence was created.
    bool swapped = false;
    std::vector<uint8_t> host_copy;     ///< Swapped data: per block, per layer, K then V.
    std::vector<uint8_t> host_payload;  ///< Swapped slot payload, block after block.
  };

  kv_cache(device& dev, const kv_cache_config& config);
  uint64_t namespace_ = 0;
  result<int32_t> allocate_block();
  void release_block(int32_t block);
  status copy_block(int32_t dst, int32_t src);
  /// Payload bytes of one block (0: none).
  size_t payload_block_bytes() const {
    return static_cast<size_t>(config_.layout.block_size * config_.slot_payload_bytes);
  }
  static uint64_t chain_hash(uint64_t prev, std::span<const int32_t> tokens);
  /// Registers full block `b` (hash `h`, chained from `parent`, holding `tokens`) for prefix
  /// matches: whole ones (hash_to_block_) and leading-token ones (children_).
  void register_block(int32_t b, uint64_t h, uint64_t parent, std::span<const int32_t> tokens);
  /// Forgets block `b`'s registration (it is being reused).
  void unregister_block(int32_t b);
  /// The registered block chained from `parent` whose leading tokens match `rest` longest, and
  /// how many tokens match (at most rest.size() - 1 and block_size - 1); {-1, 0} when none does.
  std::pair<int32_t, int64_t> partial_match(uint64_t parent, std::span<const int32_t> rest) const;
  static uint64_t child_key(uint64_t parent, int32_t first_token);
  sequence* find(seq_id seq);
  const sequence* find(seq_id seq) const;

  device& dev_;
  kv_cache_config config_;
  device_buffer k_;
  device_buffer v_;
  std::vector<int32_t> refcount_;
  std::vector<std::optional<uint64_t>> block_hash_;  ///< Hash registered for a block.
  std::list<int32_t> free_list_;                     ///< Free blocks, least recently freed first.
  std::vector<std::list<int32_t>::iterator> free_pos_;  ///< Position in free_list_ if free.
  std::vector<bool> is_free_;
  std::unordered_map<uint64_t, int32_t> hash_to_block_;
  std::vector<uint64_t> block_parent_;  ///< A registered block's parent hash (chain predecessor).
  std::vector<int32_t> block_tokens_;   ///< A registered block's tokens, [block][block_size].
  /// Registered blocks by child_key(parent hash, first token): the candidates of a leading-token
  /// match after a run of full blocks.
  std::unordered_multimap<uint64_t, int32_t> children_;
  std::unordered_map<seq_id, sequence> seqs_;
  seq_id next_seq_ = 1;
  int64_t prefix_hit_tokens_ = 0;
  std::vector<uint8_t> payload_;  ///< [n_blocks · block_size][slot_payload_bytes], host memory.
};

}  // namespace weft::gpu
