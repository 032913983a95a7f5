#pragma once
/// The body of every weft CAF message: one Cap'n Proto struct from schema/control.capnp.
///
/// Inside a process an envelope shares its built message (copying an envelope copies a pointer,
/// never the bytes). Across processes CAF carries the flat bytes (see schema/caf_bridge.hpp) and
/// the receiver decodes them with `read<T>()`, which enforces size, traversal and nesting limits
/// and validates every field before handing out a reader. Bytes from a peer are untrusted: a
/// malformed envelope yields an error, never a crash.

#include <capnp/message.h>
#include <capnp/schema.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "schema/control.capnp.h"
#include "schema/rl.capnp.h"
#include "schema/serve.capnp.h"
#include "schema/status.hpp"
#include "schema/train.capnp.h"

namespace weft::schema {

/// Which root struct an envelope holds. Values are on the wire: append, never renumber (and move
/// known_kind's bound in envelope.cpp to the new last kind).
enum class kind : uint16_t {
  none = 0,
  error = 1,
  join_challenge = 2,
  join_request = 3,
  join_reply = 4,
  leave_notice = 5,
  heartbeat = 6,
  spawn_request = 7,
  spawn_reply = 8,
  stop_request = 9,
  actor_status = 10,
  node_status = 11,
  cluster_status = 12,
  region_descriptor = 13,
  transfer_request = 14,
  transfer_reply = 15,
  ping = 16,
  supervisor_spec = 17,
  supervisor_status = 18,
  generate_request = 19,
  token_chunk = 20,
  abort_request = 21,
  worker_hello = 22,
  worker_load = 23,
  kv_descriptor = 24,
  kv_region = 25,
  kv_handoff = 26,
  cache_lookup = 27,
  cache_lookup_reply = 28,
  cache_release = 29,
  cache_publish = 30,
  cache_publish_done = 31,
  cache_shard_load = 32,
  trainer_hello = 33,
  trainer_group = 34,
  trainer_step = 35,
  trainer_done = 36,
  trainer_started = 37,
  /// A struct of an embedder's own schema (wire::UserMessage; envelope::build_user/read_user).
  user = 38,
  transport_faults = 39,
  rollout_agent_hello = 40,
  rollout_batch = 41,
  rollout_abort = 42,
  rollout_progress = 43,
  weight_offer = 44,
  weight_ack = 45,
  pool_checkpoint = 46,
  reward_worker_hello = 47,
  reward_batch = 48,
  reward_result = 49,
  trainer_work = 50,
  reference_hello = 51,
  reference_work = 52,
  reference_result = 53,
  tool_worker_hello = 54,
  tool_call = 55,
  tool_result = 56,
  trainer_eval = 57,
  /// Received bytes larger than the envelope size limit; they were skipped, not stored.
  oversize = 0xFFFF,
};

const char* to_string(kind k);

template <class T>
struct kind_of;
#define WEFT_SCHEMA_KIND(Struct, k)        \
  template <>                              \
  struct kind_of<wire::Struct> {           \
    static constexpr kind value = kind::k; \
  };
WEFT_SCHEMA_KIND(Error, error)
WEFT_SCHEMA_KIND(JoinChallenge, join_challenge)
WEFT_SCHEMA_KIND(JoinRequest, join_request)
WEFT_SCHEMA_KIND(JoinReply, join_reply)
WEFT_SCHEMA_KIND(LeaveNotice, leave_notice)
WEFT_SCHEMA_KIND(Heartbeat, heartbeat)
WEFT_SCHEMA_KIND(SpawnRequest, spawn_request)
WEFT_SCHEMA_KIND(SpawnReply, spawn_reply)
WEFT_SCHEMA_KIND(StopRequest, stop_request)
WEFT_SCHEMA_KIND(ActorStatus, actor_status)
WEFT_SCHEMA_KIND(NodeStatus, node_status)
WEFT_SCHEMA_KIND(ClusterStatus, cluster_status)
WEFT_SCHEMA_KIND(RegionDescriptor, region_descriptor)
WEFT_SCHEMA_KIND(TransferRequest, transfer_request)
WEFT_SCHEMA_KIND(TransferReply, transfer_reply)
WEFT_SCHEMA_KIND(Ping, ping)
WEFT_SCHEMA_KIND(SupervisorSpec, supervisor_spec)
WEFT_SCHEMA_KIND(SupervisorStatus, supervisor_status)
WEFT_SCHEMA_KIND(GenerateRequest, generate_request)
WEFT_SCHEMA_KIND(TokenChunk, token_chunk)
WEFT_SCHEMA_KIND(AbortRequest, abort_request)
WEFT_SCHEMA_KIND(WorkerHello, worker_hello)
WEFT_SCHEMA_KIND(WorkerLoad, worker_load)
WEFT_SCHEMA_KIND(KvDescriptor, kv_descriptor)
WEFT_SCHEMA_KIND(KvRegion, kv_region)
WEFT_SCHEMA_KIND(KvHandoff, kv_handoff)
WEFT_SCHEMA_KIND(CacheLookup, cache_lookup)
WEFT_SCHEMA_KIND(CacheLookupReply, cache_lookup_reply)
WEFT_SCHEMA_KIND(CacheRelease, cache_release)
WEFT_SCHEMA_KIND(CachePublish, cache_publish)
WEFT_SCHEMA_KIND(CachePublishDone, cache_publish_done)
WEFT_SCHEMA_KIND(CacheShardLoad, cache_shard_load)
WEFT_SCHEMA_KIND(TrainerHello, trainer_hello)
WEFT_SCHEMA_KIND(TrainerGroup, trainer_group)
WEFT_SCHEMA_KIND(TrainerStep, trainer_step)
WEFT_SCHEMA_KIND(TrainerDone, trainer_done)
WEFT_SCHEMA_KIND(TrainerStarted, trainer_started)
WEFT_SCHEMA_KIND(UserMessage, user)
WEFT_SCHEMA_KIND(TransportFaults, transport_faults)
WEFT_SCHEMA_KIND(RolloutAgentHello, rollout_agent_hello)
WEFT_SCHEMA_KIND(RolloutBatch, rollout_batch)
WEFT_SCHEMA_KIND(RolloutAbort, rollout_abort)
WEFT_SCHEMA_KIND(RolloutProgress, rollout_progress)
WEFT_SCHEMA_KIND(WeightOffer, weight_offer)
WEFT_SCHEMA_KIND(WeightAck, weight_ack)
WEFT_SCHEMA_KIND(PoolCheckpoint, pool_checkpoint)
WEFT_SCHEMA_KIND(RewardWorkerHello, reward_worker_hello)
WEFT_SCHEMA_KIND(RewardBatch, reward_batch)
WEFT_SCHEMA_KIND(TrainerWork, trainer_work)
WEFT_SCHEMA_KIND(RewardResult, reward_result)
WEFT_SCHEMA_KIND(ReferenceHello, reference_hello)
WEFT_SCHEMA_KIND(ReferenceWork, reference_work)
WEFT_SCHEMA_KIND(ReferenceResult, reference_result)
WEFT_SCHEMA_KIND(ToolWorkerHello, tool_worker_hello)
WEFT_SCHEMA_KIND(ToolCallMsg, tool_call)
WEFT_SCHEMA_KIND(ToolResultMsg, tool_result)
WEFT_SCHEMA_KIND(TrainerEval, trainer_eval)
#undef WEFT_SCHEMA_KIND

/// Limits applied when decoding an envelope. Control messages are small (< 64 KiB); the defaults
/// leave room and stop anything hostile long before it costs memory or time.
struct decode_limits {
  uint64_t max_size_bytes = 1u << 20;
  uint64_t traversal_limit_words = 1u << 17;
  int nesting_limit = 16;
  uint32_t max_text_bytes = 64u << 10;
  uint32_t max_list_elements = 1u << 14;
};

namespace internal {
struct envelope_storage;
/// Opens a validated reader over `storage` for root kind `k`; the returned message reader stays
/// valid as long as the storage lives.
result<std::shared_ptr<capnp::MessageReader>> open_reader(
    const std::shared_ptr<const envelope_storage>& storage, kind k, const decode_limits& limits);
/// Validates the root of `reader` as kind `k` (every field, enum ranges, text and list sizes).
/// For kind::user only the wrapper is checked here; its body by validate_user_body.
status validate_root(capnp::MessageReader& reader, kind k, const decode_limits& limits);
/// Checks that a UserMessage's type id is `type_id` and validates its body as a `type` struct
/// (every field, as validate_root does for weft's own kinds).
status validate_user_body(capnp::MessageReader& reader, capnp::StructSchema type, uint64_t type_id,
                          const decode_limits& limits);
}  // namespace internal

/// A typed, validated view of an envelope's root struct. Keeps the bytes alive.
template <class T>
class view {
 public:
  view(std::shared_ptr<const internal::envelope_storage> storage,
       std::shared_ptr<capnp::MessageReader> reader)
      : storage_(std::move(storage)), reader_(std::move(reader)), root_(reader_->getRoot<T>()) {}
  /// A view whose root is `root`, a struct inside `reader`'s message (a user message's body).
  view(std::shared_ptr<const internal::envelope_storage> storage,
       std::shared_ptr<capnp::MessageReader> reader, typename T::Reader root)
      : storage_(std::move(storage)), reader_(std::move(reader)), root_(root) {}
  typename T::Reader get() const { return root_; }
  const typename T::Reader* operator->() const { return &root_; }

 private:
  std::shared_ptr<const internal::envelope_storage> storage_;
  std::shared_ptr<capnp::MessageReader> reader_;
  typename T::Reader root_;
};

/// A Cap'n Proto message with its root kind; cheap to copy (shared, immutable after building).
class envelope {
 public:
  envelope() = default;

  /// Builds an envelope whose root is a T, filled in by `fill(T::Builder)`.
  template <class T, class F>
  static envelope build(F&& fill) {
    auto builder = std::make_unique<capnp::MallocMessageBuilder>(256);
    fill(builder->initRoot<T>());
    return from_builder(kind_of<T>::value, std::move(builder));
  }

  /// Builds an envelope carrying a struct T of your own Cap'n Proto schema (kind::user), filled in
  /// by `fill(T::Builder)`. The receiver reads it with read_user<T>().
  template <class T, class F>
  static envelope build_user(F&& fill) {
    auto builder = std::make_unique<capnp::MallocMessageBuilder>(256);
    auto root = builder->initRoot<wire::UserMessage>();
    root.setTypeId(capnp::typeId<T>());
    fill(root.getBody().template initAs<T>());
    return from_builder(kind::user, std::move(builder));
  }

  /// Adopts a finished builder (advanced use: building in several steps).
  static envelope from_builder(kind k, std::unique_ptr<capnp::MallocMessageBuilder> builder);

  /// Copies received bytes into word-aligned storage. Never fails: bytes are checked by read().
  static envelope from_bytes(kind k, std::span<const std::byte> bytes);

  /// An envelope that stands for bytes that were too large to keep (read() reports it).
  static envelope oversize(uint64_t size_bytes);

  kind what() const { return kind_; }
  bool empty() const { return kind_ == kind::none; }
  /// Size of the flat encoding in bytes.
  size_t size_bytes() const;
  /// Identity of the underlying bytes: equal for copies of one envelope (no byte was copied).
  const void* storage_id() const { return storage_.get(); }
  /// The flat (unpacked) Cap'n Proto encoding, as carried across processes.
  std::vector<std::byte> to_bytes() const;

  /// Decodes and validates the root as T. Errors: malformed (wrong kind, bad bytes, failed
  /// validation, oversize). Thread-safe: the storage is immutable.
  template <class T>
  result<view<T>> read(const decode_limits& limits = {}) const {
    if (kind_ != kind_of<T>::value) {
      return make_error(errc::malformed, std::string{"expected a "} + to_string(kind_of<T>::value) +
                                             " message, got " + to_string(kind_));
    }
    auto reader = internal::open_reader(storage_, kind_, limits);
    if (!reader) return reader.error();
    return view<T>(storage_, std::move(reader.value()));
  }

  /// Decodes a message of your own schema sent with build_user<T>(). Errors (malformed): not a
  /// user message, a user message of another type, or a body that fails validation against T's
  /// schema (bounds, nesting, text/list limits, enum ranges; as for weft's own messages).
  template <class T>
  result<view<T>> read_user(const decode_limits& limits = {}) const {
    if (kind_ != kind::user) {
      return make_error(errc::malformed,
                        std::string{"expected a user message, got "} + to_string(kind_));
    }
    auto reader = internal::open_reader(storage_, kind_, limits);
    if (!reader) return reader.error();
    auto st = internal::validate_user_body(**reader, capnp::Schema::from<T>(), capnp::typeId<T>(),
                                           limits);
    if (!st.ok()) return st;
    auto root = (*reader)->template getRoot<wire::UserMessage>().getBody().template getAs<T>();
    return view<T>(storage_, std::move(reader.value()), root);
  }

  /// The Cap'n Proto type id of a user message's body (0 when this is no user message or its
  /// bytes do not decode): lets one actor accept several of your types.
  uint64_t user_type_id() const;

 private:
  kind kind_ = kind::none;
  uint64_t oversize_bytes_ = 0;
  std::shared_ptr<const internal::envelope_storage> storage_;
};

// -- convenience builders for messages every actor sends -------------------------------------

/// An envelope holding a wire::Error.
envelope make_error_envelope(const error& err);

/// Reads `env` as a wire::Error if it is one; returns ok status otherwise.
status error_from(const envelope& env);

/// Converts between the C++ error code and the wire enum.
wire::ErrorCode to_wire(errc code);
errc from_wire(wire::ErrorCode code);

}  // namespace weft::schema
