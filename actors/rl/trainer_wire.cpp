#include "actors/rl/trainer_wire.hpp"

namespace weft::rl {

namespace wire = schema::wire;
using gpu::train::train_batch;

namespace {

template <class List, class V>
void put(List list, const V& values) {
  for (size_t i = 0; i < values.size(); ++i) list.set(static_cast<unsigned>(i), values[i]);
}

}  // namespace

gpu::status group_sum(transport::peer_group& g, std::span<const std::span<float>> grads,
                      std::span<double> scalars, gpu::train::overlapped_reducer* overlapped) {
  if (overlapped != nullptr) {
    double unused_loss = 0.0;
    int64_t unused_tokens = 0;
    if (auto st = overlapped->finish(unused_loss, unused_tokens); !st) return st;
  } else if (auto s = g.all_reduce_sum(grads); !s.ok()) {
    return {gpu::status_code::internal, "gradient all-reduce: " + s.to_string()};
  }
  if (auto s = g.all_reduce_sum(scalars); !s.ok()) {
    return {gpu::status_code::internal, "loss all-reduce: " + s.to_string()};
  }
  return {};
}

gpu::status device_group_sum(transport::device_group& devices, transport::peer_group& g,
                             std::span<const std::span<float>> grads, std::span<double> scalars) {
  if (auto s = devices.all_reduce_sum(grads); !s.ok()) {
    return {gpu::status_code::internal, "gradient all-reduce on the GPUs: " + s.to_string()};
  }
  if (auto s = g.all_reduce_sum(scalars); !s.ok()) {
    return {gpu::status_code::internal, "loss all-reduce: " + s.to_string()};
  }
  return {};
}

transport::status broadcast_state(transport::peer_group& g,
                                  std::span<const std::span<float>> state) {
  constexpr size_t piece_floats = (64u << 20) / sizeof(float);
  for (size_t i = 0; i < state.size();) {
    size_t j = i, floats = 0;
    while (j < state.size() && (j == i || floats + state[j].size() <= piece_floats)) {
      floats += state[j].size();
      ++j;
    }
    if (auto s = g.all_reduce_sum(state.subspan(i, j - i)); !s.ok()) return s;
    i = j;
  }
  return {};
}

void write_batch(wire::TrainBatch::Builder b, const train_batch& x, bool policy) {
  const auto n = static_cast<unsigned>(x.tokens.size());
  put(b.initTokens(n), x.tokens);
  put(b.initTargets(n), x.targets);
  put(b.initStarts(static_cast<unsigned>(x.seqs.starts.size())), x.seqs.starts);
  put(b.initPrefix(static_cast<unsigned>(x.seqs.prefix.size())), x.seqs.prefix);
  if (!policy) return;
  const auto p = static_cast<unsigned>(x.policy.size());
  auto lp = b.initBehaviourLogp(p);
  auto adv = b.initAdvantage(p);
  auto w = b.initWeight(p);
  auto s = b.initSample(p);
  auto ref = b.initRefLogp(p);
  for (unsigned i = 0; i < p; ++i) {
    lp.set(i, x.policy[i].behaviour_logp);
    adv.set(i, x.policy[i].advantage);
    w.set(i, x.policy[i].weight);
    s.set(i, x.policy[i].sample);
    ref.set(i, x.policy[i].ref_logp);
  }
  if (!x.routes.empty()) {
    put(b.initRoutes(static_cast<unsigned>(x.routes.size())), x.routes);
    b.setRouteWidth(static_cast<uint32_t>(x.route_width));
  }
}

result<train_batch> read_batch(wire::TrainBatch::Reader r, int64_t vocab) {
  auto bad = [](const std::string& why) {
    return make_error(errc::malformed, "a TrainBatch " + why);
  };
  train_batch x;
  const auto tokens = r.getTokens();
  const auto targets = r.getTargets();
  const size_t n = tokens.size();
  if (targets.size() != n) return bad("has targets and tokens of different lengths");
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab) return bad("has a token outside the vocabulary");
    x.tokens.push_back(t);
  }
  for (int32_t t : targets) {
    if (t < -1 || t >= vocab) return bad("has a target outside the vocabulary");
    x.targets.push_back(t);
  }
  auto starts = r.getStarts();
  if (starts.size() < 1 || starts[0] != 0 || starts[starts.size() - 1] != static_cast<int64_t>(n)) {
    return bad("has sequence starts that do not cover its tokens");
  }
  x.seqs.starts.clear();
  for (unsigned i = 0; i < starts.size(); ++i) {
    if (i > 0 && starts[i] <= starts[i - 1]) return bad("has an empty or reversed sequence");
    x.seqs.starts.push_back(starts[i]);
  }
  const auto n_seqs = static_cast<int64_t>(starts.size()) - 1;
  auto prefix = r.getPrefix();
  if (prefix.size() != 0 && static_cast<int64_t>(prefix.size()) != n_seqs) {
    return bad("has a prefix list of the wrong length");
  }
  for (unsigned s = 0; s < prefix.size(); ++s) {
    const int64_t p = prefix[s];
    if (p < -1 || p >= static_cast<int64_t>(s) ||
        (p >= 0 && prefix[static_cast<unsigned>(p)] != -1)) {
      return bad("has a sequence continuing a prefix that is not an earlier prefix");
    }
    x.seqs.prefix.push_back(p);
  }
  // Each list once: every get of a list counts against the message's traversal limit.
  const auto lp = r.getBehaviourLogp();
  const auto adv = r.getAdvantage();
  const auto w = r.getWeight();
  const auto smp = r.getSample();
  const auto ref = r.getRefLogp();
  const size_t p = lp.size();
  if ((p != 0 && p != n) || adv.size() != p || w.size() != p || smp.size() != p ||
      ref.size() != p) {
    return bad("has policy inputs that do not match its tokens");
  }
  x.policy.resize(p);
  for (unsigned i = 0; i < p; ++i) {
    x.policy[i].behaviour_logp = lp[i];
    x.policy[i].advantage = adv[i];
    x.policy[i].weight = w[i];
    x.policy[i].sample = smp[i];
    x.policy[i].ref_logp = ref[i];
  }
  // Routing replay: whole positions of the batch; which experts fit the model is the trainer's
  // check (trainable_model refuses the batch with a message).
  const auto routes = r.getRoutes();
  const uint32_t width = r.getRouteWidth();
  if (routes.size() != 0) {
    if (width == 0 || width > 4096 || routes.size() % width != 0 || routes.size() / width > n) {
      return bad("has routes that are not whole positions of its tokens");
    }
    for (int16_t e : routes) {
      if (e < -1 || e > 255) return bad("has a route to an expert out of range");
      x.routes.push_back(e);
    }
    x.route_width = width;
  }
  return x;
}

}  // namespace weft::rl
