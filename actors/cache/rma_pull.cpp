#include "actors/cache/rma_pull.hpp"

#include <spdlog/spdlog.h>

#include <string>

namespace weft::cache {

rma_puller::~rma_puller() {
  for (auto& [addr, p] : peers_) {
    for (auto& [key, r] : p.remotes) (void)engine_->release_remote(r);
    (void)engine_->disconnect(p.peer);
  }
}

result<rma_puller::peer_entry*> rma_puller::peer_for(std::span<const std::byte> address) {
  std::vector<std::byte> key(address.begin(), address.end());
  if (auto it = peers_.find(key); it != peers_.end()) return &it->second;
  auto peer = engine_->connect(address);
  if (!peer)
    return make_error(errc::unavailable, "connecting to a cache peer: " + peer.error().to_string());
  auto& e = peers_[key];
  e.peer = *peer;
  return &e;
}

void rma_puller::forget(const std::vector<std::byte>& address) {
  auto it = peers_.find(address);
  if (it == peers_.end()) return;
  for (auto& [key, r] : it->second.remotes) (void)engine_->release_remote(r);
  (void)engine_->disconnect(it->second.peer);
  peers_.erase(it);
}

result<uint64_t> rma_puller::start(std::span<const std::byte> address,
                                   const std::vector<std::vector<std::byte>>& remote_keys,
                                   const std::vector<transport::region>& locals,
                                   const std::vector<pull_piece>& pieces, uint32_t timeout_ms,
                                   pull_done_fn done) {
  if (pieces.empty()) return make_error(errc::invalid_argument, "rma pull: nothing to pull");
  auto pe = peer_for(address);
  if (!pe) return pe.error();
  peer_entry& p = **pe;
  std::vector<transport::remote_region> remotes;
  for (const auto& k : remote_keys) {
    auto it = p.remotes.find(k);
    if (it == p.remotes.end()) {
      auto r = engine_->import_remote(p.peer, k);
      if (!r) {
        const bool dead = r.error().code == transport::status_code::peer_unreachable;
        if (dead) forget(std::vector<std::byte>(address.begin(), address.end()));
        return make_error(dead ? errc::unavailable : errc::invalid_argument,
                          "rma pull: importing a remote region: " + r.error().to_string());
      }
      it = p.remotes.emplace(k, *r).first;
    }
    remotes.push_back(it->second);
  }
  std::vector<transport::rma_segment> segs;
  segs.reserve(pieces.size());
  for (const auto& pc : pieces) {
    if (pc.remote_index >= remotes.size() || pc.local_index >= locals.size() ||
        pc.size_bytes == 0 ||
        pc.remote_offset + pc.size_bytes > remotes[pc.remote_index].size_bytes ||
        pc.local_offset + pc.size_bytes > locals[pc.local_index].size_bytes) {
      return make_error(errc::invalid_argument, "rma pull: a piece lies outside its region");
    }
    segs.push_back({locals[pc.local_index], pc.local_offset, remotes[pc.remote_index],
                    pc.remote_offset, pc.size_bytes});
  }
  const uint64_t id = next_pull_++;
  transport::transfer_options opts;
  opts.timeout_ms = timeout_ms;
  auto t = transport::get_all(*engine_, transport::rma_batch_request{p.peer, segs, opts},
                              [id, done = std::move(done)](const transport::completion& c) {
                                // get_all reports the whole pull exactly once.
                                if (done) {
                                  done(id, c.result.ok(),
                                       c.result.ok() ? std::string{} : c.result.to_string());
                                }
                              });
  if (!t) {
    const bool dead = t.error().code == transport::status_code::peer_unreachable;
    if (dead) forget(std::vector<std::byte>(address.begin(), address.end()));
    return make_error(errc::unavailable,
                      "rma pull: starting the transfer: " + t.error().to_string());
  }
  pull_peer_[id] = std::vector<std::byte>(address.begin(), address.end());
  return id;
}

void rma_puller::finished(uint64_t pull_id, bool ok) {
  auto it = pull_peer_.find(pull_id);
  if (it == pull_peer_.end()) return;
  if (!ok) forget(it->second);
  pull_peer_.erase(it);
}

}  // namespace weft::cache
