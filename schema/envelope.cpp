#include "schema/envelope.hpp"

#include <capnp/dynamic.h>
#include <capnp/schema.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include <cstring>

namespace weft::schema {

namespace internal {

/// Immutable bytes of one message: either the builder that made it (in-process, zero copy) or
/// word-aligned received bytes.
struct envelope_storage {
  std::unique_ptr<capnp::MallocMessageBuilder> builder;
  kj::Array<capnp::word> words;
  size_t received_bytes = 0;
};

namespace {

capnp::ReaderOptions reader_options(const decode_limits& limits) {
  capnp::ReaderOptions options;
  options.traversalLimitInWords = limits.traversal_limit_words;
  options.nestingLimit = limits.nesting_limit;
  return options;
}

bool valid_utf8(kj::ArrayPtr<const char> s) {
  size_t i = 0;
  const auto* p = reinterpret_cast<const unsigned char*>(s.begin());
  size_t n = s.size();
  while (i < n) {
    unsigned char c = p[i];
    size_t len = c < 0x80           ? 1
                 : (c >> 5) == 0x6  ? 2
                 : (c >> 4) == 0xE  ? 3
                 : (c >> 3) == 0x1E ? 4
                                    : 0;
    if (len == 0 || i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
    }
    if (len == 2 && c < 0xC2) return false;  // overlong
    i += len;
  }
  return true;
}

status validate_value(const capnp::DynamicValue::Reader& value, const decode_limits& limits,
                      const std::string& path, int depth);

status validate_struct(const capnp::DynamicStruct::Reader& s, const decode_limits& limits,
                       const std::string& path, int depth) {
  if (depth > limits.nesting_limit) {
    return make_error(errc::malformed, "nesting deeper than " +
                                           std::to_string(limits.nesting_limit) + " at " + path);
  }
  for (auto field : s.getSchema().getFields()) {
    if (!s.has(field)) continue;
    std::string field_path = path + "." + std::string(field.getProto().getName().cStr());
    auto st = validate_value(s.get(field), limits, field_path, depth + 1);
    if (!st.ok()) return st;
  }
  return {};
}

status validate_value(const capnp::DynamicValue::Reader& value, const decode_limits& limits,
                      const std::string& path, int depth) {
  switch (value.getType()) {
    case capnp::DynamicValue::TEXT: {
      auto text = value.as<capnp::Text>();
      if (text.size() > limits.max_text_bytes) {
        return make_error(errc::malformed, path + ": text of " + std::to_string(text.size()) +
                                               " bytes exceeds " +
                                               std::to_string(limits.max_text_bytes));
      }
      if (!valid_utf8(text.asArray())) {
        return make_error(errc::malformed, path + ": text is not valid UTF-8");
      }
      return {};
    }
    case capnp::DynamicValue::DATA: {
      auto data = value.as<capnp::Data>();
      if (data.size() > limits.max_size_bytes) {
        return make_error(errc::malformed, path + ": data field too large");
      }
      return {};
    }
    case capnp::DynamicValue::ENUM: {
      auto e = value.as<capnp::DynamicEnum>();
      if (e.getEnumerant() == nullptr) {
        return make_error(errc::malformed,
                          path + ": unknown enum value " + std::to_string(e.getRaw()));
      }
      return {};
    }
    case capnp::DynamicValue::LIST: {
      auto list = value.as<capnp::DynamicList>();
      if (list.size() > limits.max_list_elements) {
        return make_error(errc::malformed, path + ": list of " + std::to_string(list.size()) +
                                               " elements exceeds " +
                                               std::to_string(limits.max_list_elements));
      }
      for (uint32_t i = 0; i < list.size(); ++i) {
        auto st = validate_value(list[i], limits, path + "[" + std::to_string(i) + "]", depth + 1);
        if (!st.ok()) return st;
      }
      return {};
    }
    case capnp::DynamicValue::STRUCT:
      return validate_struct(value.as<capnp::DynamicStruct>(), limits, path, depth);
    case capnp::DynamicValue::ANY_POINTER:
    case capnp::DynamicValue::CAPABILITY:
      return make_error(errc::malformed, path + ": unexpected pointer or capability");
    default:
      return {};
  }
}

capnp::StructSchema schema_of(kind k) {
  switch (k) {
    case kind::error:
      return capnp::Schema::from<wire::Error>();
    case kind::join_challenge:
      return capnp::Schema::from<wire::JoinChallenge>();
    case kind::join_request:
      return capnp::Schema::from<wire::JoinRequest>();
    case kind::join_reply:
      return capnp::Schema::from<wire::JoinReply>();
    case kind::leave_notice:
      return capnp::Schema::from<wire::LeaveNotice>();
    case kind::heartbeat:
      return capnp::Schema::from<wire::Heartbeat>();
    case kind::spawn_request:
      return capnp::Schema::from<wire::SpawnRequest>();
    case kind::spawn_reply:
      return capnp::Schema::from<wire::SpawnReply>();
    case kind::stop_request:
      return capnp::Schema::from<wire::StopRequest>();
    case kind::actor_status:
      return capnp::Schema::from<wire::ActorStatus>();
    case kind::node_status:
      return capnp::Schema::from<wire::NodeStatus>();
    case kind::cluster_status:
      return capnp::Schema::from<wire::ClusterStatus>();
    case kind::region_descriptor:
      return capnp::Schema::from<wire::RegionDescriptor>();
    case kind::transfer_request:
      return capnp::Schema::from<wire::TransferRequest>();
    case kind::transfer_reply:
      return capnp::Schema::from<wire::TransferReply>();
    case kind::ping:
      return capnp::Schema::from<wire::Ping>();
    case kind::supervisor_spec:
      return capnp::Schema::from<wire::SupervisorSpec>();
    case kind::supervisor_status:
      return capnp::Schema::from<wire::SupervisorStatus>();
    case kind::generate_request:
      return capnp::Schema::from<wire::GenerateRequest>();
    case kind::token_chunk:
      return capnp::Schema::from<wire::TokenChunk>();
    case kind::abort_request:
      return capnp::Schema::from<wire::AbortRequest>();
    case kind::worker_hello:
      return capnp::Schema::from<wire::WorkerHello>();
    case kind::worker_load:
      return capnp::Schema::from<wire::WorkerLoad>();
    case kind::kv_descriptor:
      return capnp::Schema::from<wire::KvDescriptor>();
    case kind::kv_region:
      return capnp::Schema::from<wire::KvRegion>();
    case kind::kv_handoff:
      return capnp::Schema::from<wire::KvHandoff>();
    case kind::cache_lookup:
      return capnp::Schema::from<wire::CacheLookup>();
    case kind::cache_lookup_reply:
      return capnp::Schema::from<wire::CacheLookupReply>();
    case kind::cache_release:
      return capnp::Schema::from<wire::CacheRelease>();
    case kind::cache_publish:
      return capnp::Schema::from<wire::CachePublish>();
    case kind::cache_publish_done:
      return capnp::Schema::from<wire::CachePublishDone>();
    case kind::cache_shard_load:
      return capnp::Schema::from<wire::CacheShardLoad>();
    case kind::trainer_hello:
      return capnp::Schema::from<wire::TrainerHello>();
    case kind::trainer_group:
      return capnp::Schema::from<wire::TrainerGroup>();
    case kind::trainer_step:
      return capnp::Schema::from<wire::TrainerStep>();
    case kind::trainer_done:
      return capnp::Schema::from<wire::TrainerDone>();
    case kind::trainer_started:
      return capnp::Schema::from<wire::TrainerStarted>();
    case kind::user:
      return capnp::Schema::from<wire::UserMessage>();
    case kind::transport_faults:
      return capnp::Schema::from<wire::TransportFaults>();
    case kind::rollout_agent_hello:
      return capnp::Schema::from<wire::RolloutAgentHello>();
    case kind::rollout_batch:
      return capnp::Schema::from<wire::RolloutBatch>();
    case kind::rollout_abort:
      return capnp::Schema::from<wire::RolloutAbort>();
    case kind::rollout_progress:
      return capnp::Schema::from<wire::RolloutProgress>();
    case kind::weight_offer:
      return capnp::Schema::from<wire::WeightOffer>();
    case kind::weight_ack:
      return capnp::Schema::from<wire::WeightAck>();
    case kind::pool_checkpoint:
      return capnp::Schema::from<wire::PoolCheckpoint>();
    case kind::reward_worker_hello:
      return capnp::Schema::from<wire::RewardWorkerHello>();
    case kind::reward_batch:
      return capnp::Schema::from<wire::RewardBatch>();
    case kind::trainer_work:
      return capnp::Schema::from<wire::TrainerWork>();
    case kind::reward_result:
      return capnp::Schema::from<wire::RewardResult>();
    case kind::reference_hello:
      return capnp::Schema::from<wire::ReferenceHello>();
    case kind::reference_work:
      return capnp::Schema::from<wire::ReferenceWork>();
    case kind::reference_result:
      return capnp::Schema::from<wire::ReferenceResult>();
    case kind::tool_worker_hello:
      return capnp::Schema::from<wire::ToolWorkerHello>();
    case kind::tool_call:
      return capnp::Schema::from<wire::ToolCallMsg>();
    case kind::tool_result:
      return capnp::Schema::from<wire::ToolResultMsg>();
    case kind::trainer_eval:
      return capnp::Schema::from<wire::TrainerEval>();
    case kind::none:
    case kind::oversize:
      break;
  }
  return capnp::Schema::from<wire::Error>();
}

bool known_kind(kind k) {
  auto v = static_cast<uint16_t>(k);
  // The last kind: a kind appended to the enum moves this bound.
  return v >= static_cast<uint16_t>(kind::error) && v <= static_cast<uint16_t>(kind::trainer_eval);
}

}  // namespace

status validate_root(capnp::MessageReader& reader, kind k, const decode_limits& limits) {
  if (!known_kind(k)) {
    return make_error(errc::malformed,
                      "unknown message kind " + std::to_string(static_cast<uint16_t>(k)));
  }
  auto schema = schema_of(k);
  // Touch every word once: bounds, traversal limit and nesting limit are enforced here.
  auto root_any = reader.getRoot<capnp::AnyPointer>();
  if (root_any.isNull()) return make_error(errc::malformed, "message has no root");
  (void)root_any.targetSize();
  if (k == kind::user) {
    // The body's type is known only to the reader (validate_user_body); here: a struct or null.
    auto body = reader.getRoot<wire::UserMessage>().getBody();
    if (!body.isNull() && !body.isStruct()) {
      return make_error(errc::malformed, "UserMessage.body: not a struct");
    }
    return {};
  }
  auto root = reader.getRoot<capnp::DynamicStruct>(schema);
  return validate_struct(root, limits, to_string(k), 0);
}

status validate_user_body(capnp::MessageReader& reader, capnp::StructSchema type, uint64_t type_id,
                          const decode_limits& limits) {
  try {
    auto root = reader.getRoot<wire::UserMessage>();
    if (root.getTypeId() != type_id) {
      return make_error(errc::malformed, "user message of type id " +
                                             std::to_string(root.getTypeId()) + ", expected " +
                                             std::string(type.getShortDisplayName().cStr()) + " (" +
                                             std::to_string(type_id) + ")");
    }
    auto body = root.getBody().getAs<capnp::DynamicStruct>(type);
    return validate_struct(body, limits, std::string(type.getShortDisplayName().cStr()), 0);
  } catch (const kj::Exception& e) {
    return make_error(errc::malformed,
                      std::string{"undecodable user message: "} + e.getDescription().cStr());
  }
}

result<std::shared_ptr<capnp::MessageReader>> open_reader(
    const std::shared_ptr<const envelope_storage>& storage, kind k, const decode_limits& limits) {
  if (k == kind::oversize) {
    return make_error(errc::malformed, "message exceeds the envelope size limit");
  }
  if (!storage) return make_error(errc::malformed, "empty envelope");
  try {
    std::shared_ptr<capnp::MessageReader> reader;
    if (storage->builder) {
      reader = std::make_shared<capnp::SegmentArrayMessageReader>(
          storage->builder->getSegmentsForOutput(), reader_options(limits));
    } else {
      if (storage->received_bytes > limits.max_size_bytes) {
        return make_error(errc::malformed, "message of " + std::to_string(storage->received_bytes) +
                                               " bytes exceeds the limit of " +
                                               std::to_string(limits.max_size_bytes));
      }
      if (storage->received_bytes % sizeof(capnp::word) != 0) {
        return make_error(errc::malformed, "message size " +
                                               std::to_string(storage->received_bytes) +
                                               " is not a multiple of 8 bytes");
      }
      reader = std::make_shared<capnp::FlatArrayMessageReader>(storage->words.asPtr(),
                                                               reader_options(limits));
    }
    auto st = validate_root(*reader, k, limits);
    if (!st.ok()) return st;
    return reader;
  } catch (const kj::Exception& e) {
    return make_error(errc::malformed,
                      std::string{"undecodable message: "} + e.getDescription().cStr());
  } catch (const std::exception& e) {
    return make_error(errc::malformed, std::string{"undecodable message: "} + e.what());
  }
}

}  // namespace internal

const char* to_string(kind k) {
  switch (k) {
    case kind::none:
      return "none";
    case kind::error:
      return "Error";
    case kind::join_challenge:
      return "JoinChallenge";
    case kind::join_request:
      return "JoinRequest";
    case kind::join_reply:
      return "JoinReply";
    case kind::leave_notice:
      return "LeaveNotice";
    case kind::heartbeat:
      return "Heartbeat";
    case kind::spawn_request:
      return "SpawnRequest";
    case kind::spawn_reply:
      return "SpawnReply";
    case kind::stop_request:
      return "StopRequest";
    case kind::actor_status:
      return "ActorStatus";
    case kind::node_status:
      return "NodeStatus";
    case kind::cluster_status:
      return "ClusterStatus";
    case kind::region_descriptor:
      return "RegionDescriptor";
    case kind::transfer_request:
      return "TransferRequest";
    case kind::transfer_reply:
      return "TransferReply";
    case kind::ping:
      return "Ping";
    case kind::supervisor_spec:
      return "SupervisorSpec";
    case kind::supervisor_status:
      return "SupervisorStatus";
    case kind::generate_request:
      return "GenerateRequest";
    case kind::token_chunk:
      return "TokenChunk";
    case kind::abort_request:
      return "AbortRequest";
    case kind::worker_hello:
      return "WorkerHello";
    case kind::worker_load:
      return "WorkerLoad";
    case kind::kv_descriptor:
      return "KvDescriptor";
    case kind::kv_region:
      return "KvRegion";
    case kind::kv_handoff:
      return "KvHandoff";
    case kind::cache_lookup:
      return "CacheLookup";
    case kind::cache_lookup_reply:
      return "CacheLookupReply";
    case kind::cache_release:
      return "CacheRelease";
    case kind::cache_publish:
      return "CachePublish";
    case kind::cache_publish_done:
      return "CachePublishDone";
    case kind::cache_shard_load:
      return "CacheShardLoad";
    case kind::trainer_hello:
      return "TrainerHello";
    case kind::trainer_group:
      return "TrainerGroup";
    case kind::trainer_step:
      return "TrainerStep";
    case kind::trainer_done:
      return "TrainerDone";
    case kind::trainer_started:
      return "TrainerStarted";
    case kind::user:
      return "UserMessage";
    case kind::transport_faults:
      return "TransportFaults";
    case kind::rollout_agent_hello:
      return "RolloutAgentHello";
    case kind::rollout_batch:
      return "RolloutBatch";
    case kind::rollout_abort:
      return "RolloutAbort";
    case kind::rollout_progress:
      return "RolloutProgress";
    case kind::weight_offer:
      return "WeightOffer";
    case kind::weight_ack:
      return "WeightAck";
    case kind::pool_checkpoint:
      return "PoolCheckpoint";
    case kind::reward_worker_hello:
      return "RewardWorkerHello";
    case kind::reward_batch:
      return "RewardBatch";
    case kind::trainer_work:
      return "TrainerWork";
    case kind::reward_result:
      return "RewardResult";
    case kind::reference_hello:
      return "ReferenceHello";
    case kind::reference_work:
      return "ReferenceWork";
    case kind::reference_result:
      return "ReferenceResult";
    case kind::tool_worker_hello:
      return "ToolWorkerHello";
    case kind::tool_call:
      return "ToolCallMsg";
    case kind::tool_result:
      return "ToolResultMsg";
    case kind::trainer_eval:
      return "TrainerEval";
    case kind::oversize:
      return "oversize";
  }
  return "unknown";
}

envelope envelope::from_builder(kind k, std::unique_ptr<capnp::MallocMessageBuilder> builder) {
  auto storage = std::make_shared<internal::envelope_storage>();
  storage->builder = std::move(builder);
  envelope env;
  env.kind_ = k;
  env.storage_ = std::move(storage);
  return env;
}

envelope envelope::from_bytes(kind k, std::span<const std::byte> bytes) {
  auto storage = std::make_shared<internal::envelope_storage>();
  storage->received_bytes = bytes.size();
  // Word-aligned copy: FlatArrayMessageReader rejects unaligned input.
  storage->words =
      kj::heapArray<capnp::word>((bytes.size() + sizeof(capnp::word) - 1) / sizeof(capnp::word));
  if (!bytes.empty()) {
    std::memset(storage->words.begin(), 0, storage->words.size() * sizeof(capnp::word));
    std::memcpy(storage->words.begin(), bytes.data(), bytes.size());
  }
  envelope env;
  env.kind_ = k;
  env.storage_ = std::move(storage);
  return env;
}

envelope envelope::oversize(uint64_t size_bytes) {
  envelope env;
  env.kind_ = kind::oversize;
  env.oversize_bytes_ = size_bytes;
  return env;
}

uint64_t envelope::user_type_id() const {
  if (kind_ != kind::user) return 0;
  auto reader = internal::open_reader(storage_, kind_, {});
  if (!reader) return 0;
  return (*reader)->getRoot<wire::UserMessage>().getTypeId();
}

size_t envelope::size_bytes() const {
  if (kind_ == kind::oversize) return oversize_bytes_;
  if (!storage_) return 0;
  if (storage_->builder) {
    return capnp::computeSerializedSizeInWords(*storage_->builder) * sizeof(capnp::word);
  }
  return storage_->received_bytes;
}

std::vector<std::byte> envelope::to_bytes() const {
  std::vector<std::byte> out;
  if (!storage_) return out;
  if (storage_->builder) {
    auto words = capnp::messageToFlatArray(*storage_->builder);
    auto bytes = words.asBytes();
    out.resize(bytes.size());
    std::memcpy(out.data(), bytes.begin(), bytes.size());
  } else {
    out.resize(storage_->received_bytes);
    std::memcpy(out.data(), storage_->words.begin(), storage_->received_bytes);
  }
  return out;
}

wire::ErrorCode to_wire(errc code) {
  return static_cast<wire::ErrorCode>(code);
}

errc from_wire(wire::ErrorCode code) {
  return static_cast<errc>(code);
}

envelope make_error_envelope(const error& err) {
  return envelope::build<wire::Error>([&](wire::Error::Builder b) {
    b.setCode(to_wire(err.code));
    b.setMessage(err.message);
  });
}

status error_from(const envelope& env) {
  if (env.what() != kind::error) return {};
  auto v = env.read<wire::Error>();
  if (!v) return v.error();
  return make_error(from_wire(v->get().getCode()), v->get().getMessage().cStr());
}

}  // namespace weft::schema
