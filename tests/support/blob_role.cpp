// The "blob" role: registered bytes that other nodes pull over the data plane. Descriptors travel
// in Cap'n Proto messages; the bytes move through transport/ (UCX between processes).

#include <spdlog/spdlog.h>
#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <map>

#include "actors/atoms.hpp"
#include "actors/auth.hpp"
#include "actors/roles.hpp"
#include "schema/caf_bridge.hpp"
#include "transport/checksum.hpp"
#include "transport/engine.hpp"

namespace weft::actors {

namespace {

using namespace schema;
using done_atom = caf::atom_constant<caf::atom("w_xdone")>;

struct pending_pull {
  caf::response_promise promise;
  uint64_t transfer_id = 0;
  uint64_t expected_checksum = 0;
  uint64_t size_bytes = 0;
  std::chrono::steady_clock::time_point started;
  transport::peer_handle peer;
  transport::remote_region remote;
};

struct blob_state {
  std::shared_ptr<transport::engine> engine;
  transport::region buffer;
  uint64_t checksum = 0;
  std::string node_id;
  uint64_t next_local_id = 1;
  std::map<uint64_t, pending_pull> pending;
  static inline const char* name = "weft.blob";
  ~blob_state() {
    if (engine && buffer.id != 0) engine->release_memory(buffer);
  }
};

using blob_ptr = caf::stateful_actor<blob_state>*;

kj::ArrayPtr<const kj::byte> as_capnp(const transport::bytes& b) {
  return {reinterpret_cast<const kj::byte*>(b.data()), b.size()};
}

std::span<const std::byte> as_span(capnp::Data::Reader d) {
  return {reinterpret_cast<const std::byte*>(d.begin()), d.size()};
}

envelope transfer_reply(uint64_t id, const error& err, uint64_t checksum, uint64_t elapsed_us) {
  return envelope::build<wire::TransferReply>([&](wire::TransferReply::Builder b) {
    b.setTransferId(id);
    b.setOk(err.ok());
    b.setChecksum(checksum);
    b.setElapsedUs(elapsed_us);
    if (!err.ok()) {
      b.initError().setCode(to_wire(err.code));
      b.getError().setMessage(err.message);
    }
  });
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
    case transport::status_code::corrupt:
      return errc::malformed;
    default:
      return errc::internal;
  }
}

caf::behavior blob_actor(blob_ptr self, std::shared_ptr<transport::engine> engine,
                         transport::region buffer, std::string node_id) {
  self->state.engine = std::move(engine);
  self->state.buffer = buffer;
  self->state.node_id = std::move(node_id);
  self->state.checksum = transport::checksum(buffer.data, buffer.size_bytes);
  return {
      [self](region_atom) -> envelope {
        auto& st = self->state;
        auto address = st.engine->local_address();
        auto desc = st.engine->describe(st.buffer);
        if (!address || !desc) {
          return make_error_envelope(make_error(errc::internal, "cannot describe the blob region"));
        }
        return envelope::build<wire::TransferRequest>([&](wire::TransferRequest::Builder b) {
          auto src = b.initSource();
          src.setEngine(st.engine->caps().name);
          src.setOwnerNodeId(st.node_id);
          src.setPeerAddress(as_capnp(*address));
          src.setRemoteAddress(reinterpret_cast<uint64_t>(st.buffer.data));
          src.setRemoteKey(as_capnp(*desc));
          src.setSizeBytes(st.buffer.size_bytes);
          b.setSizeBytes(st.buffer.size_bytes);
          b.setChecksum(st.checksum);
          b.setLayout("blob:u8");
          b.setVersion(1);
        });
      },
      [self](transfer_atom, const envelope& env) -> caf::result<envelope> {
        auto& st = self->state;
        auto req = env.read<wire::TransferRequest>();
        if (!req) return make_error_envelope(req.error());
        auto r = req->get();
        uint64_t id = r.getTransferId();
        uint64_t size = r.getSizeBytes();
        if (std::string(r.getLayout().cStr()) != "blob:u8") {
          return transfer_reply(
              id,
              make_error(errc::version_mismatch,
                         std::string{"layout '"} + r.getLayout().cStr() + "' is not blob:u8"),
              0, 0);
        }
        if (size > st.buffer.size_bytes || size > r.getSource().getSizeBytes()) {
          return transfer_reply(
              id, make_error(errc::invalid_argument, "transfer larger than a region"), 0, 0);
        }
        auto peer = st.engine->connect(as_span(r.getSource().getPeerAddress()));
        if (!peer)
          return transfer_reply(id, make_error(errc::unavailable, peer.error().to_string()), 0, 0);
        auto remote = st.engine->import_remote(*peer, as_span(r.getSource().getRemoteKey()));
        if (!remote) {
          return transfer_reply(id, make_error(errc::invalid_argument, remote.error().to_string()),
                                0, 0);
        }
        uint64_t now = now_ms();
        uint32_t timeout_ms =
            r.getDeadlineMs() > now ? static_cast<uint32_t>(r.getDeadlineMs() - now) : 30'000;
        uint64_t local_id = st.next_local_id++;
        pending_pull p;
        p.promise = self->make_response_promise();
        p.transfer_id = id;
        p.expected_checksum = r.getChecksum();
        p.size_bytes = size;
        p.started = std::chrono::steady_clock::now();
        p.peer = *peer;
        p.remote = *remote;
        transport::rma_request rma;
        rma.peer = *peer;
        rma.local = st.buffer;
        rma.remote = *remote;
        rma.size_bytes = size;
        rma.options.timeout_ms = timeout_ms;
        caf::actor me = caf::actor_cast<caf::actor>(self);
        // The completion runs on the transport's progress thread: hand it back to the actor.
        auto started = st.engine->get(rma, [me, local_id](const transport::completion& c) {
          caf::anon_send(me, done_atom::value, local_id, static_cast<uint16_t>(c.result.code),
                         c.result.message);
        });
        if (!started) {
          st.engine->release_remote(*remote);
          return transfer_reply(
              id, make_error(from_transport(started.error().code), started.error().to_string()), 0,
              0);
        }
        st.pending.emplace(local_id, std::move(p));
        return caf::delegated<envelope>{};
      },
      [self](done_atom, uint64_t local_id, uint16_t code, const std::string& message) {
        auto& st = self->state;
        auto it = st.pending.find(local_id);
        if (it == st.pending.end()) return;
        auto p = std::move(it->second);
        st.pending.erase(it);
        st.engine->release_remote(p.remote);
        auto elapsed_us =
            static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::microseconds>(
                                      std::chrono::steady_clock::now() - p.started)
                                      .count());
        auto tcode = static_cast<transport::status_code>(code);
        if (tcode != transport::status_code::ok) {
          p.promise.deliver(transfer_reply(
              p.transfer_id, make_error(from_transport(tcode), message), 0, elapsed_us));
          return;
        }
        uint64_t sum = transport::checksum(st.buffer.data, p.size_bytes);
        if (p.expected_checksum != 0 && sum != p.expected_checksum) {
          p.promise.deliver(transfer_reply(
              p.transfer_id, make_error(errc::malformed, "checksum mismatch after transfer"), sum,
              elapsed_us));
          return;
        }
        st.checksum = sum;
        p.promise.deliver(transfer_reply(p.transfer_id, {}, sum, elapsed_us));
      },
  };
}

}  // namespace

result<caf::actor> spawn_blob_role(caf::actor_system& sys, const role_context& ctx) {
  if (!ctx.engine) {
    return make_error(errc::unavailable, "blob: node " + ctx.node_id + " has no data-plane engine");
  }
  auto cfg =
      nlohmann::json::parse(ctx.config_json.empty() ? "{}" : ctx.config_json, nullptr, false);
  if (cfg.is_discarded() || !cfg.is_object()) {
    return make_error(errc::invalid_argument, "blob: config is not a JSON object");
  }
  uint64_t size = cfg.value("size_bytes", uint64_t{1} << 20);
  uint64_t seed = cfg.value("seed", uint64_t{0});
  if (size == 0 || size > (uint64_t{4} << 30)) {
    return make_error(errc::invalid_argument, "blob: size_bytes must be in (0, 4 GiB]");
  }
  auto buffer = ctx.engine->allocate_memory(size);
  if (!buffer) return make_error(errc::unavailable, "blob: " + buffer.error().to_string());
  // Deterministic content from the seed (seed 0 = zeros, a blank target).
  auto* words = reinterpret_cast<uint64_t*>(buffer->data);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < size / 8; ++i) {
    if (seed == 0) {
      words[i] = 0;
      continue;
    }
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    words[i] = x;
  }
  for (uint64_t i = size / 8 * 8; i < size; ++i) buffer->data[i] = std::byte(seed & 0xFF);
  return sys.spawn(blob_actor, ctx.engine, *buffer, ctx.node_id);
}

}  // namespace weft::actors
