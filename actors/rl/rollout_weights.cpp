/// The weight versions of `weft rl --agents N`, the controller's side: offers of the current
/// version to the rollout agents — from the controller's image, or from a peer agent that holds it
/// (a restarted agent; the --weight-fanout tree) — their acknowledgements, and publish().
#include <spdlog/spdlog.h>
#include <caf/send.hpp>

#include <algorithm>
#include <chrono>

#include "actors/rl/remote_rollouts_impl.hpp"
#include "actors/rl/rl_atoms.hpp"

namespace weft::rl {

namespace wire = schema::wire;
using rollouts_detail::clock_type;

void remote_rollouts::impl::offer_to(int i, bool from_peer) {
  int peer = -1;
  for (size_t j = 0; from_peer && j < agents.size(); ++j) {
    if (static_cast<int>(j) != i && holds_current(static_cast<int>(j))) {
      peer = static_cast<int>(j);
      break;
    }
  }
  offer_from(i, peer);
}

bool remote_rollouts::impl::holds_current(int j) const {
  const agent_slot& p = agents[static_cast<size_t>(j)];
  return p.alive && (p.ready || p.holding) && image != nullptr &&
         p.source_version == image->version() && !p.source_address.empty() &&
         !p.source_region.empty();
}

int remote_rollouts::impl::pulls_from(int source) const {
  int n = 0;
  for (const auto& a : agents) n += a.alive && !a.ready && !a.queued && a.pulling_from == source;
  return n;
}

void remote_rollouts::impl::relay() {
  if (cfg.weight_fanout <= 0 || image == nullptr) return;
  for (size_t i = 0; i < agents.size(); ++i) {
    agent_slot& a = agents[i];
    if (!a.alive || !a.queued) continue;
    int source = -2, busy = 0;
    if (controller_offers < cfg.weight_fanout) {
      source = -1;
    } else {
      for (size_t j = 0; j < agents.size(); ++j) {
        if (j == i || !holds_current(static_cast<int>(j))) continue;
        const int n = pulls_from(static_cast<int>(j));
        if (n < cfg.weight_fanout && (source == -2 || n < busy)) {
          source = static_cast<int>(j);
          busy = n;
        }
      }
      if (source == -2 && !any_pull_running() && !any_holder()) source = -1;
    }
    if (source == -2) return;  // every source busy: the next acknowledgement frees one
    a.queued = false;
    if (source == -1) ++controller_offers;
    offer_from(static_cast<int>(i), source);
    if (!failure.empty()) return;
  }
}

bool remote_rollouts::impl::any_pull_running() const {
  for (const auto& a : agents) {
    if (a.alive && !a.ready && !a.queued) return true;
  }
  return false;
}

bool remote_rollouts::impl::any_holder() const {
  for (size_t j = 0; j < agents.size(); ++j) {
    if (holds_current(static_cast<int>(j))) return true;
  }
  return false;
}

void remote_rollouts::impl::offer_from(int i, int peer) {
  agent_slot& a = agents[static_cast<size_t>(i)];
  a.holding = false;  // its buffer is about to be overwritten
  auto env = peer >= 0 ? image->offer(cfg.weight_timeout_ms,
                                      &agents[static_cast<size_t>(peer)].source_address,
                                      &agents[static_cast<size_t>(peer)].source_region)
                       : image->offer(cfg.weight_timeout_ms);
  if (!env) {
    failure = "weight offer: " + env.error().message;
    return;
  }
  a.ready = false;
  a.pulling_from = peer;
  if (peer >= 0) {
    ++st.peer_weight_pulls;
    if (cfg.weight_fanout <= 0) {
      spdlog::info("rollout agent {} pulls weight version {} from rollout agent {}", i,
                   image->version(), peer);
    } else {
      spdlog::debug("rollout agent {} pulls weight version {} from rollout agent {}", i,
                    image->version(), peer);
    }
  } else {
    ++st.controller_weight_pulls;
  }
  caf::send_as(controller, a.who, r_offer_atom::value, std::move(*env));
}

void remote_rollouts::impl::on_ack(const event& e) {
  const int i = slot_of(e.from);
  if (i < 0) return;
  auto k = e.env.read<wire::WeightAck>();
  if (!k) {
    spdlog::warn("rollout agent {} sent a malformed weight acknowledgement ({}); restarting it", i,
                 k.error().message);
    stop_agent(i);
    return;
  }
  agent_slot& a = agents[static_cast<size_t>(i)];
  const bool current = image != nullptr && k->get().getVersion() == image->version();
  if (k->get().getError().size() != 0) {
    if (!current) return;  // an older offer failed; the current one is on its way
    if (a.pulling_from >= 0) {
      spdlog::warn(
          "rollout agent {} could not pull weight version {} from rollout agent {} "
          "({}); pulling it from the controller",
          i, k->get().getVersion(), a.pulling_from, k->get().getError().cStr());
      offer_to(i, false);
      return;
    }
    spdlog::warn("rollout agent {} could not take weight version {}: {}; restarting it", i,
                 k->get().getVersion(), k->get().getError().cStr());
    stop_agent(i);
    return;
  }
  a.source_address.assign(reinterpret_cast<const std::byte*>(k->get().getAddress().begin()),
                          reinterpret_cast<const std::byte*>(k->get().getAddress().end()));
  a.source_region.assign(reinterpret_cast<const std::byte*>(k->get().getRegion().begin()),
                         reinterpret_cast<const std::byte*>(k->get().getRegion().end()));
  a.source_version = k->get().getVersion();
  if (!current) return;  // an older offer
  if (k->get().getPulled()) {
    // Pulled and verified, being applied: a source for its peers now, rollouts once applied.
    a.holding = true;
    a.pulling_from = no_pull;
    return;
  }
  a.ready = true;
  a.pulling_from = -1;
  st.last_pull_s = std::max(st.last_pull_s, k->get().getPullSeconds());
}

gpu::status remote_rollouts::publish(int64_t version,
                                     std::span<const gpu::rl::named_weights> tensors) {
  const auto t0 = clock_type::now();
  if (d_->image == nullptr) {
    auto img = weight_image::create(*d_->transport, tensors);
    if (!img) return gpu::status{gpu::status_code::internal, img.error().message};
    d_->image = std::move(*img);
  }
  if (auto st = d_->image->fill(version, tensors); !st.ok()) {
    return gpu::status{gpu::status_code::internal, st.message};
  }
  d_->version = version;
  d_->st.last_pull_s = 0.0;
  d_->controller_offers = 0;
  for (size_t i = 0; i < d_->agents.size(); ++i) {
    auto& a = d_->agents[i];
    if (!a.alive) continue;
    if (d_->cfg.weight_fanout > 0) {
      a.ready = false;  // takes no rollout until it holds the version
      a.queued = true;
    } else {
      d_->offer_to(static_cast<int>(i), false);
    }
  }
  d_->relay();
  const auto deadline = t0 + std::chrono::milliseconds(d_->cfg.weight_timeout_ms);
  for (;;) {
    d_->drain();
    if (!d_->failure.empty()) return gpu::status{gpu::status_code::internal, d_->failure};
    bool all = true;
    for (const auto& a : d_->agents) all = all && (!a.alive || a.ready);
    if (all) break;
    if (clock_type::now() > deadline) {
      for (size_t i = 0; i < d_->agents.size(); ++i) {
        auto& a = d_->agents[i];
        if (!a.alive || a.ready) continue;
        spdlog::warn("rollout agent {} did not take weight version {} within {} s; restarting it",
                     i, version, d_->cfg.weight_timeout_ms / 1000);
        d_->stop_agent(static_cast<int>(i));
      }
      break;
    }
    d_->wait_a_little();
  }
  return {};
}

}  // namespace weft::rl
