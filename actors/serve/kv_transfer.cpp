#include "actors/serve/kv_transfer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <mutex>

#include "transport/checksum.hpp"

namespace weft::serve {

namespace {

using schema::envelope;
namespace wire = schema::wire;

constexpr size_t max_ended_leases = 4096;
constexpr size_t max_cached_peers = 64;

capnp::Data::Reader as_capnp(const transport::bytes& b) {
  return {reinterpret_cast<const capnp::byte*>(b.data()), b.size()};
}

transport::bytes to_bytes(capnp::Data::Reader d) {
  transport::bytes out(d.size());
  std::copy(d.begin(), d.end(), reinterpret_cast<capnp::byte*>(out.data()));
  return out;
}

error from_gpu(const gpu::status& st, const std::string& what) {
  const errc code = st.code() == gpu::status_code::out_of_memory      ? errc::overloaded
                    : st.code() == gpu::status_code::not_found        ? errc::not_found
                    : st.code() == gpu::status_code::invalid_argument ? errc::invalid_argument
                                                                      : errc::internal;
  return make_error(code, what + ": " + st.message());
}

errc from_transport(transport::status_code c) {
  switch (c) {
    case transport::status_code::ok:
      return errc::ok;
    case transport::status_code::timeout:
      return errc::timeout;
    case transport::status_code::invalid_argument:
      return errc::invalid_argument;
    case transport::status_code::peer_unreachable:
      return errc::unavailable;
    case transport::status_code::canceled:
      return errc::unavailable;
    case transport::status_code::corrupt:
      return errc::malformed;
    case transport::status_code::unsupported:
      return errc::invalid_argument;
    case transport::status_code::no_memory:
      return errc::overloaded;
    default:
      return errc::unavailable;
  }
}

error from_transport(const transport::status& st, const std::string& what) {
  return make_error(from_transport(st.code), what + ": " + st.to_string());
}

// "fault:ucx" moves bytes like "ucx": the decorator is invisible on the wire.
std::string base_engine_name(std::string name) {
  constexpr std::string_view prefix = "fault:";
  while (name.rfind(prefix, 0) == 0) name.erase(0, prefix.size());
  return name;
}

// The cache's K or V pool: every layer's blocks, contiguous (kv_cache allocates one buffer each).
struct pool_extent {
  void* base = nullptr;
  size_t size_bytes = 0;
  size_t layer_stride_bytes = 0;
};

pool_extent extent_of(const gpu::kv_cache& kv, bool value) {
  const auto& l = kv.layout();
  const size_t stride = l.block_bytes() * static_cast<size_t>(kv.stats().n_blocks_total);
  pool_extent e;
  e.base = value ? static_cast<void*>(kv.v_layer(0)) : static_cast<void*>(kv.k_layer(0));
  e.layer_stride_bytes = stride;
  e.size_bytes = stride * static_cast<size_t>(l.n_layers);
  return e;
}

result<std::pair<transport::region, transport::region>> register_pools(
    gpu::kv_cache& kv, transport::engine& eng, transport::memory_kind memory) {
  if (!eng.caps().one_sided) {
    return make_error(errc::invalid_argument,
                      "kv transfer: engine '" + eng.caps().name + "' has no one-sided transfers");
  }
  transport::region r[2];
  for (int i = 0; i < 2; ++i) {
    const pool_extent e = extent_of(kv, i == 1);
    auto reg = eng.register_memory(e.base, e.size_bytes, memory);
    if (!reg) {
      if (i == 1) (void)eng.release_memory(r[0]);
      return from_transport(
          reg.error(), std::string{"kv transfer: registering the "} + (i ? "V" : "K") + " pool");
    }
    r[i] = *reg;
  }
  return std::pair{r[0], r[1]};
}

// A decoded and validated KvDescriptor.
struct parsed_descriptor {
  kv_descriptor_info info;
  std::string model_id;
  std::string layout;
  uint64_t weights_version = 0;
  std::string engine;
  transport::bytes address;
  transport::bytes keys[2];
  uint64_t region_bytes[2] = {0, 0};
  std::vector<int32_t> tokens;
  std::vector<uint32_t> block_ids;
  uint64_t checksum = 0;
  uint64_t block_bytes = 0;
  uint64_t layer_stride_bytes = 0;
};

// Decodes the envelope and checks what needs no local cache: shape and consistency of the fields.
result<parsed_descriptor> decode(const envelope& env) {
  auto v = env.read<wire::KvDescriptor>();
  if (!v) return v.error();
  auto d = v->get();
  parsed_descriptor p;
  if (d.getVersion() != kv_descriptor_format) {
    return make_error(errc::version_mismatch,
                      "kv descriptor: format version " + std::to_string(d.getVersion()) +
                          ", this build reads " + std::to_string(kv_descriptor_format));
  }
  p.info.request_id = d.getRequestId();
  p.info.lease_id = d.getLeaseId();
  p.info.lease_deadline_ms = d.getLeaseDeadlineMs();
  p.model_id = d.getModelId().cStr();
  p.layout = d.getLayout().cStr();
  p.weights_version = d.getWeightsVersion();
  p.engine = d.getEngine().cStr();
  p.address = to_bytes(d.getPeerAddress());
  auto regions = d.getRegions();
  if (regions.size() != 2) {
    return make_error(errc::invalid_argument, "kv descriptor: " + std::to_string(regions.size()) +
                                                  " regions, expected 2 (K and V pools)");
  }
  for (unsigned i = 0; i < 2; ++i) {
    p.keys[i] = to_bytes(regions[i].getRemoteKey());
    p.region_bytes[i] = regions[i].getSizeBytes();
  }
  for (int32_t t : d.getTokens()) p.tokens.push_back(t);
  for (uint32_t b : d.getBlockIds()) p.block_ids.push_back(b);
  p.checksum = d.getChecksum();
  p.block_bytes = d.getBlockBytes();
  p.layer_stride_bytes = d.getLayerStrideBytes();
  p.info.n_tokens = static_cast<int64_t>(p.tokens.size());
  if (p.tokens.empty()) return make_error(errc::invalid_argument, "kv descriptor: no tokens");
  if (p.block_bytes == 0)
    return make_error(errc::invalid_argument, "kv descriptor: block size of 0 bytes");
  return p;
}

// Checks `p` against the local cache and engine.
status validate(const parsed_descriptor& p, const kv_transfer_config& cfg, const gpu::kv_cache& kv,
                const transport::engine& eng, uint64_t now_ms) {
  const std::string& model_id = cfg.model_id;
  const std::string& model_id_wire = p.model_id;
  const uint64_t weights_version = cfg.weights_version;
  const uint64_t weights_version_wire = p.weights_version;
  const std::string& layout_wire = p.layout;
  const uint64_t margin_ms = cfg.deadline_margin_ms;
  if (model_id_wire != model_id) {
    return make_error(errc::version_mismatch, "kv descriptor: model '" + model_id_wire +
                                                  "', this worker serves '" + model_id + "'");
  }
  if (weights_version_wire != weights_version) {
    return make_error(errc::version_mismatch, "kv descriptor: weights version " +
                                                  std::to_string(weights_version_wire) +
                                                  ", local " + std::to_string(weights_version));
  }
  const gpu::kv_layout& l = kv.layout();
  if (layout_wire != l.describe()) {
    return make_error(errc::version_mismatch, "kv descriptor: layout '" + layout_wire +
                                                  "', local cache '" + l.describe() + "'");
  }
  if (base_engine_name(p.engine) != base_engine_name(eng.caps().name)) {
    return make_error(errc::invalid_argument, "kv descriptor: engine '" + p.engine +
                                                  "', local engine '" + eng.caps().name + "'");
  }
  if (p.block_bytes != l.block_bytes()) {
    return make_error(errc::version_mismatch, "kv descriptor: " + std::to_string(p.block_bytes) +
                                                  " bytes per block, local " +
                                                  std::to_string(l.block_bytes()));
  }
  const auto n_blocks = static_cast<size_t>(kv.blocks_for(static_cast<int64_t>(p.tokens.size())));
  if (p.block_ids.size() != n_blocks) {
    return make_error(errc::invalid_argument,
                      "kv descriptor: " + std::to_string(p.block_ids.size()) + " blocks for " +
                          std::to_string(p.tokens.size()) + " tokens, expected " +
                          std::to_string(n_blocks));
  }
  // Every (layer, block) range must lie inside both remote pools: the last layer's range of the
  // largest block id is the farthest one. 128-bit arithmetic: the fields are untrusted.
  const uint32_t max_block = *std::max_element(p.block_ids.begin(), p.block_ids.end());
  const unsigned __int128 end =
      static_cast<unsigned __int128>(l.n_layers - 1) * p.layer_stride_bytes +
      static_cast<unsigned __int128>(max_block + uint64_t{1}) * p.block_bytes;
  if (l.n_layers > 1 && p.layer_stride_bytes < p.block_bytes) {
    return make_error(errc::invalid_argument, "kv descriptor: layer stride smaller than a block");
  }
  for (int i = 0; i < 2; ++i) {
    if (end > p.region_bytes[i]) {
      return make_error(errc::invalid_argument,
                        std::string{"kv descriptor: blocks reach beyond the "} + (i ? "V" : "K") +
                            " region of " + std::to_string(p.region_bytes[i]) + " bytes");
    }
  }
  if (p.info.lease_deadline_ms <= now_ms + margin_ms) {
    return make_error(errc::timeout, "kv descriptor: lease " + std::to_string(p.info.lease_id) +
                                         " deadline passed (" +
                                         std::to_string(p.info.lease_deadline_ms) + " <= now " +
                                         std::to_string(now_ms) + " + margin " +
                                         std::to_string(margin_ms) + " ms)");
  }
  return {};
}

result<parsed_descriptor> decode_and_validate(const envelope& env, const kv_transfer_config& cfg,
                                              const gpu::kv_cache& kv, const transport::engine& eng,
                                              uint64_t now_ms) {
  auto p = decode(env);
  if (!p) return p.error();
  auto st = validate(*p, cfg, kv, eng, now_ms);
  if (!st.ok()) return st;
  p->info.size_bytes = static_cast<uint64_t>(p->block_ids.size()) * 2 *
                       static_cast<uint64_t>(kv.layout().n_layers) * p->block_bytes;
  return p;
}

}  // namespace

uint64_t unix_now_ms() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

uint64_t kv_checksum(std::span<const gpu::kv_byte_range> ranges, std::span<const int32_t> tokens) {
  std::vector<uint64_t> sums;
  sums.reserve(ranges.size() + 1);
  sums.push_back(transport::checksum(tokens.data(), tokens.size_bytes()));
  for (const auto& r : ranges) sums.push_back(transport::checksum(r.data, r.size_bytes));
  const uint64_t h = transport::checksum(sums.data(), sums.size() * sizeof(uint64_t));
  return h == 0 ? 1 : h;
}

result<kv_descriptor_info> read_kv_descriptor(const envelope& descriptor) {
  auto p = decode(descriptor);
  if (!p) return p.error();
  p->info.size_bytes = 0;  // needs the layout's layer count: see kv_importer::check
  return p->info;
}

// -- kv_exporter ----------------------------------------------------------------------------------

kv_exporter::kv_exporter(gpu::kv_cache& kv, std::shared_ptr<transport::engine> engine,
                         kv_transfer_config config)
    : kv_(kv), engine_(std::move(engine)), config_(std::move(config)) {}

result<std::unique_ptr<kv_exporter>> kv_exporter::create(gpu::kv_cache& kv,
                                                         std::shared_ptr<transport::engine> engine,
                                                         kv_transfer_config config) {
  if (!engine) return make_error(errc::invalid_argument, "kv_exporter: no engine");
  std::unique_ptr<kv_exporter> e{new kv_exporter(kv, std::move(engine), std::move(config))};
  auto pools = register_pools(kv, *e->engine_, e->config_.memory);
  if (!pools) return pools.error();
  e->pools_[0] = pools->first;
  e->pools_[1] = pools->second;
  e->layer_stride_bytes_ = extent_of(kv, false).layer_stride_bytes;
  for (int i = 0; i < 2; ++i) {
    auto key = e->engine_->describe(e->pools_[i]);
    if (!key) return from_transport(key.error(), "kv_exporter: describing a pool");
    e->pool_keys_[i] = std::move(*key);
  }
  auto address = e->engine_->local_address();
  if (!address) return from_transport(address.error(), "kv_exporter: local address");
  e->address_ = std::move(*address);
  return e;
}

kv_exporter::~kv_exporter() {
  if (!leases_.empty()) {
    spdlog::warn("kv_exporter: destroyed with {} leases held; their sequences stay in the cache",
                 leases_.size());
  }
  for (auto& p : pools_) {
    if (p.id == 0) continue;
    if (auto st = engine_->release_memory(p); !st.ok()) {
      spdlog::warn("kv_exporter: releasing a pool registration: {}", st.to_string());
    }
  }
}

result<envelope> kv_exporter::offer(const kv_offer& o) {
  if (!kv_.contains(o.seq))
    return make_error(errc::not_found, "kv_exporter: unknown sequence " + std::to_string(o.seq));
  if (lease_of_seq_.count(o.seq) != 0) {
    return make_error(errc::already_exists, "kv_exporter: sequence " + std::to_string(o.seq) +
                                                " is leased (lease " +
                                                std::to_string(lease_of_seq_.at(o.seq)) + ")");
  }
  const int64_t n = kv_.length(o.seq);
  if (n == 0)
    return make_error(errc::invalid_argument, "kv_exporter: sequence has no committed tokens");
  if (static_cast<int64_t>(o.tokens.size()) != n) {
    return make_error(errc::invalid_argument, "kv_exporter: " + std::to_string(o.tokens.size()) +
                                                  " tokens given, the sequence holds " +
                                                  std::to_string(n));
  }
  if (o.checksum == kv_checksum_mode::xxh3 && config_.memory != transport::memory_kind::host) {
    return make_error(errc::invalid_argument,
                      "kv_exporter: checksums need host-readable cache memory");
  }
  auto ranges = kv_.export_ranges(o.seq);
  if (!ranges) return from_gpu(ranges.error(), "kv_exporter");
  // Block ids from the ranges' addresses; every range must sit where the descriptor says it is.
  const gpu::kv_layout& l = kv_.layout();
  const size_t bb = l.block_bytes();
  const auto n_blocks = static_cast<size_t>(kv_.blocks_for(n));
  std::vector<uint32_t> block_ids(n_blocks);
  for (const auto& r : *ranges) {
    const auto* base = reinterpret_cast<const std::byte*>(pools_[r.is_value ? 1 : 0].data);
    const auto off = static_cast<size_t>(reinterpret_cast<const std::byte*>(r.data) - base);
    const size_t in_layer = off - static_cast<size_t>(r.layer) * layer_stride_bytes_;
    if (r.size_bytes != bb || in_layer % bb != 0 ||
        static_cast<size_t>(r.block_index) >= n_blocks) {
      return make_error(errc::internal,
                        "kv_exporter: a range of the cache is not where the layout puts it");
    }
    const auto id = static_cast<uint32_t>(in_layer / bb);
    if (r.layer == 0 && !r.is_value) {
      block_ids[static_cast<size_t>(r.block_index)] = id;
    } else if (block_ids[static_cast<size_t>(r.block_index)] != id) {
      return make_error(errc::internal, "kv_exporter: K/V ranges of one block disagree on its id");
    }
  }
  const uint64_t now = o.now_ms != 0 ? o.now_ms : unix_now_ms();
  const uint64_t checksum =
      o.checksum == kv_checksum_mode::xxh3 ? kv_checksum(*ranges, o.tokens) : 0;
  kv_lease lease{next_lease_++, o.request_id, o.seq, now + o.lease_ms};
  auto env = envelope::build<wire::KvDescriptor>([&](wire::KvDescriptor::Builder b) {
    b.setRequestId(o.request_id);
    b.setModelId(config_.model_id);
    b.setLayout(l.describe());
    b.setVersion(kv_descriptor_format);
    auto toks = b.initTokens(static_cast<unsigned>(o.tokens.size()));
    for (unsigned i = 0; i < o.tokens.size(); ++i) toks.set(i, o.tokens[i]);
    b.setEngine(engine_->caps().name);
    b.setPeerAddress(as_capnp(address_));
    auto regions = b.initRegions(2);
    for (unsigned i = 0; i < 2; ++i) {
      regions[i].setRemoteAddress(reinterpret_cast<uint64_t>(pools_[i].data));
      regions[i].setRemoteKey(as_capnp(pool_keys_[i]));
      regions[i].setSizeBytes(pools_[i].size_bytes);
    }
    b.setLeaseId(lease.lease_id);
    b.setLeaseDeadlineMs(lease.deadline_ms);
    b.setChecksum(checksum);
    b.setWeightsVersion(config_.weights_version);
    auto ids = b.initBlockIds(static_cast<unsigned>(block_ids.size()));
    for (unsigned i = 0; i < block_ids.size(); ++i) ids.set(i, block_ids[i]);
    b.setBlockBytes(bb);
    b.setLayerStrideBytes(layer_stride_bytes_);
  });
  leases_.emplace(lease.lease_id, lease);
  lease_of_seq_.emplace(o.seq, lease.lease_id);
  spdlog::debug("kv_exporter: request {} seq {} offered under lease {} until {}", o.request_id,
                o.seq, lease.lease_id, lease.deadline_ms);
  return env;
}

void kv_exporter::remember_end(uint64_t lease_id, const char* how) {
  ended_[lease_id] = how;
  ended_order_.push_back(lease_id);
  while (ended_order_.size() > max_ended_leases) {
    ended_.erase(ended_order_.front());
    ended_order_.pop_front();
  }
}

result<kv_lease> kv_exporter::release(uint64_t lease_id) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) {
    auto e = ended_.find(lease_id);
    if (e != ended_.end()) {
      return make_error(errc::not_found, "kv_exporter: lease " + std::to_string(lease_id) +
                                             " already " + e->second +
                                             "; its sequence was handed back then");
    }
    return make_error(errc::not_found, "kv_exporter: unknown lease " + std::to_string(lease_id));
  }
  kv_lease l = it->second;
  leases_.erase(it);
  lease_of_seq_.erase(l.seq);
  remember_end(lease_id, "released");
  return l;
}

result<uint64_t> kv_exporter::renew(uint64_t lease_id, uint64_t lease_ms, uint64_t now_ms) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end())
    return make_error(errc::not_found,
                      "kv_exporter: lease " + std::to_string(lease_id) + " is not held");
  it->second.deadline_ms = (now_ms != 0 ? now_ms : unix_now_ms()) + lease_ms;
  return it->second.deadline_ms;
}

std::vector<kv_lease> kv_exporter::expire(uint64_t now_ms) {
  std::vector<kv_lease> out;
  for (auto it = leases_.begin(); it != leases_.end();) {
    if (it->second.deadline_ms + config_.expiry_grace_ms <= now_ms) {
      out.push_back(it->second);
      lease_of_seq_.erase(it->second.seq);
      remember_end(it->first, "expired");
      spdlog::info("kv_exporter: lease {} of request {} expired; seq {} handed back", it->first,
                   it->second.request_id, it->second.seq);
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

uint64_t kv_exporter::next_expiry_ms() const {
  uint64_t best = 0;
  for (const auto& [id, l] : leases_) {
    const uint64_t t = l.deadline_ms + config_.expiry_grace_ms;
    if (best == 0 || t < best) best = t;
  }
  return best;
}

// -- kv_importer ----------------------------------------------------------------------------------

// Completion of one pull; shared with the transport callbacks. Publishes the completion first (so
// a finish() prompted by the callback always finds it), then runs the caller's callback exactly
// once, then marks the callback returned (what the destructor waits for).
struct kv_importer::pull_state {
  uint64_t pull_id = 0;
  kv_transfer_done_fn on_done;
  std::mutex mutex;
  std::condition_variable cv;
  bool done = false;
  bool callback_returned = false;
  transport::completion result;

  void fire(const transport::completion& c) {
    {
      std::lock_guard lock(mutex);
      result = c;
      done = true;
    }
    if (on_done) on_done(pull_id, c);
    {
      std::lock_guard lock(mutex);
      callback_returned = true;
    }
    cv.notify_all();
  }
  bool is_done() {
    std::lock_guard lock(mutex);
    return done;
  }
  bool has_returned() {
    std::lock_guard lock(mutex);
    return callback_returned;
  }
};

struct kv_importer::pending_pull {
  uint64_t request_id = 0;
  uint64_t lease_id = 0;
  uint64_t checksum = 0;
  uint64_t size_bytes = 0;
  std::vector<int32_t> tokens;
  gpu::seq_id seq = 0;
  std::vector<gpu::kv_byte_range> ranges;
  transport::bytes address;
  transport::peer_handle peer{};
  transport::remote_region remotes[2]{};
  std::vector<transport::transfer> transfers;
  std::shared_ptr<pull_state> state;
};

kv_importer::kv_importer(gpu::kv_cache& kv, std::shared_ptr<transport::engine> engine,
                         kv_transfer_config config)
    : kv_(kv), engine_(std::move(engine)), config_(std::move(config)) {}

result<std::unique_ptr<kv_importer>> kv_importer::create(gpu::kv_cache& kv,
                                                         std::shared_ptr<transport::engine> engine,
                                                         kv_transfer_config config) {
  if (!engine) return make_error(errc::invalid_argument, "kv_importer: no engine");
  std::unique_ptr<kv_importer> im{new kv_importer(kv, std::move(engine), std::move(config))};
  auto pools = register_pools(kv, *im->engine_, im->config_.memory);
  if (!pools) return pools.error();
  im->pools_[0] = pools->first;
  im->pools_[1] = pools->second;
  im->layer_stride_bytes_ = extent_of(kv, false).layer_stride_bytes;
  return im;
}

kv_importer::~kv_importer() {
  for (auto& [id, p] : pending_) {
    for (const auto& t : p->transfers) (void)engine_->cancel(t);
  }
  for (auto& [id, p] : pending_) {
    wait_done(*p->state);
    spdlog::info("kv_importer: pull {} of request {} abandoned at shutdown; seq {} freed", id,
                 p->request_id, p->seq);
    drop_pending(*p);
  }
  pending_.clear();
  for (auto& [address, peer] : peers_) (void)engine_->disconnect(peer);
  for (auto& p : pools_) {
    if (p.id == 0) continue;
    if (auto st = engine_->release_memory(p); !st.ok()) {
      spdlog::warn("kv_importer: releasing a pool registration: {}", st.to_string());
    }
  }
}

void kv_importer::wait_done(pull_state& s) {
  if (engine_->mode() == transport::progress_mode::manual) {
    while (!s.has_returned()) engine_->progress();
    return;
  }
  std::unique_lock lock(s.mutex);
  s.cv.wait(lock, [&] { return s.callback_returned; });
}

// Frees the half-imported sequence and the pull's remote regions.
void kv_importer::drop_pending(pending_pull& p) {
  for (auto& r : p.remotes) {
    if (r.id != 0) (void)engine_->release_remote(r);
    r = {};
  }
  if (p.seq != 0) {
    if (auto st = kv_.free_sequence(p.seq); !st.ok()) {
      spdlog::error("kv_importer: freeing seq {}: {}", p.seq, st.to_string());
    }
    p.seq = 0;
  }
}

result<transport::peer_handle> kv_importer::peer_for(std::span<const std::byte> address) {
  transport::bytes key(address.begin(), address.end());
  if (auto it = peers_.find(key); it != peers_.end()) return it->second;
  auto peer = engine_->connect(address);
  if (!peer) return from_transport(peer.error(), "kv_importer: connecting to the exporter");
  if (peers_.size() >= max_cached_peers) {
    // Many distinct addresses (churn, or hostile descriptors): drop the idle connections.
    for (auto it = peers_.begin(); it != peers_.end();) {
      const bool busy = std::any_of(pending_.begin(), pending_.end(), [&](const auto& p) {
        return p.second->peer.id == it->second.id;
      });
      if (busy) {
        ++it;
      } else {
        (void)engine_->disconnect(it->second);
        it = peers_.erase(it);
      }
    }
  }
  peers_.emplace(std::move(key), *peer);
  return *peer;
}

void kv_importer::forget_peer(transport::peer_handle peer) {
  for (auto it = peers_.begin(); it != peers_.end(); ++it) {
    if (it->second.id == peer.id) {
      (void)engine_->disconnect(it->second);
      peers_.erase(it);
      return;
    }
  }
}

result<kv_descriptor_info> kv_importer::check(const envelope& descriptor, uint64_t now_ms) const {
  auto p =
      decode_and_validate(descriptor, config_, kv_, *engine_, now_ms != 0 ? now_ms : unix_now_ms());
  if (!p) return p.error();
  return p->info;
}

result<uint64_t> kv_importer::start(const envelope& descriptor, kv_transfer_done_fn on_done,
                                    uint64_t now_ms) {
  const uint64_t now = now_ms != 0 ? now_ms : unix_now_ms();
  auto parsed = decode_and_validate(descriptor, config_, kv_, *engine_, now);
  if (!parsed) return parsed.error();
  parsed_descriptor& d = *parsed;

  auto pull = std::make_unique<pending_pull>();
  pull->request_id = d.info.request_id;
  pull->lease_id = d.info.lease_id;
  pull->checksum = d.checksum;
  pull->size_bytes = d.info.size_bytes;
  pull->tokens = std::move(d.tokens);
  pull->address = d.address;
  if (d.checksum != 0 && config_.memory != transport::memory_kind::host) {
    return make_error(errc::invalid_argument,
                      "kv_importer: cannot verify a checksum in device-only memory");
  }

  auto peer = peer_for(d.address);
  if (!peer) return peer.error();
  pull->peer = *peer;
  for (int i = 0; i < 2; ++i) {
    auto rr = engine_->import_remote(pull->peer, d.keys[i]);
    if (!rr) {
      drop_pending(*pull);
      if (rr.error().code == transport::status_code::peer_unreachable) forget_peer(pull->peer);
      return from_transport(rr.error(), "kv_importer: importing an exporter pool");
    }
    if (rr->size_bytes < d.region_bytes[i]) {
      pull->remotes[i] = *rr;
      drop_pending(*pull);
      return make_error(errc::invalid_argument,
                        "kv_importer: the exporter's region is smaller than described");
    }
    pull->remotes[i] = *rr;
  }

  auto prepared = kv_.prepare_import(kv_.layout(), pull->tokens);
  if (!prepared) {
    drop_pending(*pull);
    return from_gpu(prepared.error(),
                    "kv_importer: allocating " + std::to_string(pull->tokens.size()) + " tokens");
  }
  pull->seq = prepared->first;
  pull->ranges = std::move(prepared->second);

  // One segment per range, then sorted by source offset and merged where both sides are
  // contiguous: blocks allocated in a row on both sides move as one segment per layer.
  const size_t bb = kv_.layout().block_bytes();
  std::vector<transport::rma_segment> segments;
  segments.reserve(pull->ranges.size());
  for (const auto& r : pull->ranges) {
    const int kv_i = r.is_value ? 1 : 0;
    const size_t src = static_cast<size_t>(r.layer) * d.layer_stride_bytes +
                       static_cast<size_t>(d.block_ids[static_cast<size_t>(r.block_index)]) * bb;
    const auto dst = static_cast<size_t>(reinterpret_cast<std::byte*>(r.data) - pools_[kv_i].data);
    segments.push_back({pools_[kv_i], dst, pull->remotes[kv_i], src, bb});
  }
  std::sort(segments.begin(), segments.end(), [](const auto& a, const auto& b) {
    return a.remote.id != b.remote.id ? a.remote.id < b.remote.id
                                      : a.remote_offset_bytes < b.remote_offset_bytes;
  });
  std::vector<transport::rma_segment> merged;
  for (const auto& s : segments) {
    if (!merged.empty()) {
      auto& last = merged.back();
      if (last.remote.id == s.remote.id &&
          last.remote_offset_bytes + last.size_bytes == s.remote_offset_bytes &&
          last.local.id == s.local.id &&
          last.local_offset_bytes + last.size_bytes == s.local_offset_bytes) {
        last.size_bytes += s.size_bytes;
        continue;
      }
    }
    merged.push_back(s);
  }

  const uint64_t left_ms = d.info.lease_deadline_ms - now - config_.deadline_margin_ms;
  transport::transfer_options opts;
  opts.timeout_ms =
      static_cast<uint32_t>(std::min<uint64_t>(left_ms, std::numeric_limits<uint32_t>::max()));

  const uint64_t id = next_pull_++;
  auto state = std::make_shared<pull_state>();
  state->pull_id = id;
  state->on_done = std::move(on_done);
  pull->state = state;

  transport::rma_batch_request batch{pull->peer, merged, opts};
  auto t = transport::get_all(*engine_, batch,
                              [state](const transport::completion& c) { state->fire(c); });
  if (!t) {
    drop_pending(*pull);
    // A dead peer stays dead: the next descriptor from its address connects afresh.
    if (t.error().code == transport::status_code::peer_unreachable) forget_peer(pull->peer);
    return from_transport(t.error(), "kv_importer: starting the transfer");
  }
  pull->transfers = std::move(*t);
  spdlog::debug("kv_importer: pull {} of request {} started: {} bytes in {} segments, {} ms left",
                id, pull->request_id, pull->size_bytes, merged.size(), left_ms);
  pending_.emplace(id, std::move(pull));
  return id;
}

result<kv_pull_result> kv_importer::finish(uint64_t pull_id) {
  auto it = pending_.find(pull_id);
  if (it == pending_.end())
    return make_error(errc::not_found, "kv_importer: unknown pull " + std::to_string(pull_id));
  pending_pull& p = *it->second;
  if (!p.state->is_done()) {
    return make_error(errc::invalid_argument,
                      "kv_importer: pull " + std::to_string(pull_id) + " is still in flight");
  }
  const transport::completion c = p.state->result;
  std::unique_ptr<pending_pull> owned = std::move(it->second);
  pending_.erase(it);
  if (!c.result.ok()) {
    if (c.result.code == transport::status_code::peer_unreachable) {
      forget_peer(owned->peer);
      owned->remotes[0] = owned->remotes[1] = {};  // gone with the peer
    }
    spdlog::info("kv_importer: pull {} of request {} failed ({}); seq {} freed", pull_id,
                 owned->request_id, c.result.to_string(), owned->seq);
    drop_pending(*owned);
    return from_transport(c.result,
                          "kv_importer: pulling request " + std::to_string(owned->request_id));
  }
  kv_pull_result out;
  if (owned->checksum != 0) {
    const uint64_t sum = kv_checksum(owned->ranges, owned->tokens);
    if (sum != owned->checksum) {
      spdlog::warn("kv_importer: pull {} of request {}: checksum mismatch; seq {} freed", pull_id,
                   owned->request_id, owned->seq);
      drop_pending(*owned);
      return make_error(errc::malformed, "kv_importer: checksum mismatch after pulling request " +
                                             std::to_string(owned->request_id));
    }
    out.checksum_verified = true;
  }
  if (auto st = kv_.commit(owned->seq, owned->tokens); !st.ok()) {
    drop_pending(*owned);
    return from_gpu(st, "kv_importer: committing the pulled tokens");
  }
  out.seq = owned->seq;
  owned->seq = 0;  // the caller owns it now
  drop_pending(*owned);
  out.request_id = owned->request_id;
  out.lease_id = owned->lease_id;
  out.n_tokens = static_cast<int64_t>(owned->tokens.size());
  out.size_bytes = owned->size_bytes;
  return out;
}

status kv_importer::cancel(uint64_t pull_id) {
  auto it = pending_.find(pull_id);
  if (it == pending_.end())
    return make_error(errc::not_found, "kv_importer: unknown pull " + std::to_string(pull_id));
  for (const auto& t : it->second->transfers) (void)engine_->cancel(t);
  return {};
}

result<kv_pull_result> kv_importer::pull(const envelope& descriptor, uint64_t now_ms) {
  auto id = start(descriptor, {}, now_ms);
  if (!id) return id.error();
  wait_done(*pending_.at(*id)->state);
  return finish(*id);
}

}  // namespace weft::serve
