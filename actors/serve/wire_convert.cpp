#include "actors/serve/wire_convert.hpp"

#include <cmath>

namespace weft::serve {

namespace wire = schema::wire;

namespace {
constexpr size_t kMaxGrammarBytes = 256 * 1024;
}  // namespace

schema::envelope to_wire(const generate_spec& s) {
  return schema::envelope::build<wire::GenerateRequest>([&](wire::GenerateRequest::Builder b) {
    b.setRequestId(s.request_id);
    b.setTraceId(s.trace_id);
    auto prompt = b.initPrompt(static_cast<unsigned>(s.prompt.size()));
    for (size_t i = 0; i < s.prompt.size(); ++i) prompt.set(static_cast<unsigned>(i), s.prompt[i]);
    auto resume = b.initResumeTokens(static_cast<unsigned>(s.resume.size()));
    for (size_t i = 0; i < s.resume.size(); ++i) resume.set(static_cast<unsigned>(i), s.resume[i]);
    auto p = b.initParams();
    p.setTemperature(s.params.temperature);
    p.setTopK(s.params.top_k);
    p.setTopP(s.params.top_p);
    p.setMinP(s.params.min_p);
    p.setRepetitionPenalty(s.params.repetition_penalty);
    p.setPresencePenalty(s.params.presence_penalty);
    p.setFrequencyPenalty(s.params.frequency_penalty);
    p.setSeed(s.params.seed);
    p.setMaxTokens(s.params.max_tokens);
    auto st = p.initStopTokens(static_cast<unsigned>(s.params.stop_tokens.size()));
    for (size_t i = 0; i < s.params.stop_tokens.size(); ++i)
      st.set(static_cast<unsigned>(i), s.params.stop_tokens[i]);
    auto ss = p.initStopStrings(static_cast<unsigned>(s.params.stop_strings.size()));
    for (size_t i = 0; i < s.params.stop_strings.size(); ++i)
      ss.set(static_cast<unsigned>(i), s.params.stop_strings[i]);
    p.setNLogprobs(s.params.n_logprobs);
    p.setWantLogprobs(s.want_logprobs);
    if (!s.params.grammar.empty()) p.setGrammar(s.params.grammar);
    p.setPooling(static_cast<uint8_t>(s.params.pooling));
    p.setPriority(s.params.priority);
    if (!s.params.logit_bias.empty()) {
      const auto n = static_cast<unsigned>(s.params.logit_bias.size());
      auto toks = p.initLogitBiasTokens(n);
      auto vals = p.initLogitBiasValues(n);
      for (unsigned i = 0; i < n; ++i) {
        toks.set(i, s.params.logit_bias[i].first);
        vals.set(i, s.params.logit_bias[i].second);
      }
    }
    b.setDeadlineMs(s.deadline_ms);
    b.setAttempt(s.attempt);
    b.setHandoff(s.handoff);
    if (!s.kv_source.empty()) {
      b.setKvSource(kj::ArrayPtr<const kj::byte>(
          reinterpret_cast<const kj::byte*>(s.kv_source.data()), s.kv_source.size()));
    }
    if (!s.pool_plan.empty()) {
      auto l = b.initPoolPlan(static_cast<unsigned>(s.pool_plan.size()));
      for (size_t i = 0; i < s.pool_plan.size(); ++i) {
        auto e = l[static_cast<unsigned>(i)];
        e.setKey(s.pool_plan[i].key);
        e.setRead(s.pool_plan[i].read);
        e.setHome(s.pool_plan[i].home);
      }
    }
  });
}

result<generate_spec> from_wire(wire::GenerateRequest::Reader r) {
  auto bad = [](const std::string& what) {
    return make_error(errc::invalid_argument, "GenerateRequest: " + what);
  };
  generate_spec s;
  s.request_id = r.getRequestId();
  s.trace_id = r.getTraceId().cStr();
  for (int32_t t : r.getPrompt()) s.prompt.push_back(t);
  for (int32_t t : r.getResumeTokens()) s.resume.push_back(t);
  if (s.prompt.empty()) return bad("empty prompt");
  auto p = r.getParams();
  auto finite = [](float v) { return std::isfinite(v); };
  if (!finite(p.getTemperature()) || !finite(p.getTopP()) || !finite(p.getMinP()) ||
      !finite(p.getRepetitionPenalty()) || !finite(p.getPresencePenalty()) ||
      !finite(p.getFrequencyPenalty())) {
    return bad("non-finite sampling value");
  }
  if (p.getTopP() <= 0.0f || p.getTopP() > 1.0f) return bad("top_p out of (0, 1]");
  if (p.getMinP() < 0.0f || p.getMinP() > 1.0f) return bad("min_p out of [0, 1]");
  if (p.getRepetitionPenalty() <= 0.0f) return bad("repetition_penalty must be > 0");
  if (p.getTopK() < 0) return bad("top_k must be >= 0");
  if (p.getMaxTokens() < 1) return bad("max_tokens must be >= 1");
  if (p.getNLogprobs() < 0 || p.getNLogprobs() > 20) return bad("n_logprobs out of [0, 20]");
  s.params.temperature = p.getTemperature();
  s.params.top_k = p.getTopK();
  s.params.top_p = p.getTopP();
  s.params.min_p = p.getMinP();
  s.params.repetition_penalty = p.getRepetitionPenalty();
  s.params.presence_penalty = p.getPresencePenalty();
  s.params.frequency_penalty = p.getFrequencyPenalty();
  s.params.seed = p.getSeed();
  s.params.max_tokens = p.getMaxTokens();
  for (int32_t t : p.getStopTokens()) s.params.stop_tokens.push_back(t);
  for (auto t : p.getStopStrings()) s.params.stop_strings.emplace_back(t.cStr());
  s.params.n_logprobs = p.getNLogprobs();
  if (p.getGrammar().size() > kMaxGrammarBytes) return bad("grammar longer than 256 KiB");
  s.params.grammar = p.getGrammar().cStr();
  if (p.getPooling() > static_cast<uint8_t>(gpu::pooling_type::last))
    return bad("pooling " + std::to_string(p.getPooling()) + " is not 0, 1 or 2");
  s.params.pooling = static_cast<gpu::pooling_type>(p.getPooling());
  s.params.priority = p.getPriority();
  const auto bias_toks = p.getLogitBiasTokens();
  const auto bias_vals = p.getLogitBiasValues();
  if (bias_toks.size() != bias_vals.size())
    return bad("logit bias tokens and values differ in length");
  if (bias_toks.size() > gpu::kMaxLogitBias) return bad("more logit biases than the API allows");
  for (unsigned i = 0; i < bias_toks.size(); ++i) {
    const float v = bias_vals[i];
    if (bias_toks[i] < 0 || !std::isfinite(v) || v < -100.0f || v > 100.0f)
      return bad("logit bias " + std::to_string(i) + " out of range");
    s.params.logit_bias.emplace_back(bias_toks[i], v);
  }
  if (s.params.pooling != gpu::pooling_type::none && !s.params.grammar.empty())
    return bad("an embedding request has no grammar");
  s.want_logprobs = p.getWantLogprobs();
  s.deadline_ms = r.getDeadlineMs();
  s.attempt = r.getAttempt();
  s.handoff = r.getHandoff();
  auto src = r.getKvSource();
  s.kv_source.assign(reinterpret_cast<const std::byte*>(src.begin()),
                     reinterpret_cast<const std::byte*>(src.end()));
  if (s.handoff && !s.kv_source.empty())
    return bad("a request cannot both hand off and import its KV");
  if (!s.kv_source.empty() && s.resume.empty())
    return bad("a KV import needs the generated tokens (resumeTokens)");
  auto plan = r.getPoolPlan();
  if (plan.size() > s.prompt.size()) return bad("pool plan longer than the prompt");
  for (auto e : plan) {
    if (e.getKey() == 0 || e.getRead().size() == 0 || e.getHome().size() == 0 ||
        e.getRead().size() > 256 || e.getHome().size() > 256)
      return bad("pool plan entry without key or shard names");
    s.pool_plan.push_back({e.getKey(), e.getRead().cStr(), e.getHome().cStr()});
  }
  return s;
}

schema::envelope to_wire(const kv_handoff& h) {
  return schema::envelope::build<wire::KvHandoff>([&](wire::KvHandoff::Builder b) {
    b.setRequestId(h.request_id);
    b.setAttempt(h.attempt);
    b.setStage(h.stage);
    b.setLeaseId(h.lease_id);
    b.setWorker(h.worker);
    if (!h.descriptor.empty()) {
      b.setDescriptor(kj::ArrayPtr<const kj::byte>(
          reinterpret_cast<const kj::byte*>(h.descriptor.data()), h.descriptor.size()));
    }
    b.setBytes(h.bytes);
    b.setMicros(h.micros);
    if (!h.err.ok()) {
      b.initError().setCode(schema::to_wire(h.err.code));
      b.getError().setMessage(h.err.message);
    }
  });
}

result<kv_handoff> from_wire(wire::KvHandoff::Reader r) {
  kv_handoff h;
  h.request_id = r.getRequestId();
  h.attempt = r.getAttempt();
  h.stage = r.getStage();
  h.lease_id = r.getLeaseId();
  h.worker = r.getWorker().cStr();
  auto d = r.getDescriptor();
  h.descriptor.assign(reinterpret_cast<const std::byte*>(d.begin()),
                      reinterpret_cast<const std::byte*>(d.end()));
  h.bytes = r.getBytes();
  h.micros = r.getMicros();
  if (r.hasError())
    h.err = make_error(schema::from_wire(r.getError().getCode()), r.getError().getMessage().cStr());
  if (h.stage == wire::KvHandoffStage::OFFERED && h.descriptor.empty()) {
    return make_error(errc::invalid_argument, "KvHandoff: an offer without a descriptor");
  }
  if (h.stage == wire::KvHandoffStage::FAILED && h.err.ok())
    h.err = make_error(errc::internal, "KV handoff failed");
  return h;
}

}  // namespace weft::serve
