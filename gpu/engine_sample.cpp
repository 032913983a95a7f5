// The second half of engine::step: the rows whose logits came back are sampled and become their
// requests' outputs (stop tokens and strings, length, grammar masks, text).
#include <algorithm>
#include <chrono>
#include <limits>
#include <optional>

#include "gpu/engine.hpp"

namespace weft::gpu {

bool engine::mask_by_grammar(request& r, std::span<const float>& logits,
                             std::vector<request_output>& outputs) {
  // Structured outputs: only tokens that keep the text a valid prefix of the grammar.
  const auto& bits = r.cons->bits();
  const size_t n_bits = bits.size() * 64;
  r.masked.assign(logits.begin(), logits.end());
  bool any = false;
  constexpr float kNever = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < r.masked.size(); ++i) {
    if (i < n_bits && ((bits[i >> 6] >> (i & 63)) & 1u) != 0) {
      any = true;
    } else {
      r.masked[i] = kNever;
    }
  }
  if (r.cons->can_end()) {
    for (int32_t e : r.cons->end_tokens()) {
      if (e >= 0 && static_cast<size_t>(e) < r.masked.size()) {
        r.masked[static_cast<size_t>(e)] = logits[static_cast<size_t>(e)];
        any = true;
      }
    }
  } else {
    for (int32_t e : r.cons->end_tokens()) {
      if (e >= 0 && static_cast<size_t>(e) < r.masked.size())
        r.masked[static_cast<size_t>(e)] = kNever;
    }
  }
  if (!any) {
    fail(r.id,
         r.cons->state().accepting()
             ? "grammar: the output is complete, but the request has no stop token to end it"
             : "grammar: no token of the vocabulary continues the output",
         outputs);
    return false;
  }
  logits = r.masked;
  return true;
}

void engine::sample_rows(const forward_batch& batch, const forward_output& fout,
                         const std::vector<request_id>& in_batch,
                         std::vector<request_output>& outputs, std::vector<request_id>& finished) {
  // Each row belongs to its own request, whose sampler is its own: rows without a grammar (whose
  // mask caches are shared) are sampled on the device's host threads first, then everything else
  // runs in row order as before. The tokens do not depend on it.
  const auto sample_t0 = std::chrono::steady_clock::now();
  std::vector<std::optional<sample_result>> sampled(fout.token_index.size());
  model_.dev().parallel_host(static_cast<int64_t>(sampled.size()), [&](int64_t row) {
    const int32_t si = batch.seq_index[static_cast<size_t>(fout.token_index[row])];
    request& r = *requests_.at(in_batch[static_cast<size_t>(si)]);
    if (r.cons) return;
    sampled[static_cast<size_t>(row)] =
        r.smp.sample(std::span<const float>(fout.logits.data() + row * fout.n_vocab,
                                            static_cast<size_t>(fout.n_vocab)),
                     r.tokens);
  });
  // (Rows with a grammar are sampled below, in row order, and count as scheduling.)
  counters_.sample_s +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - sample_t0).count();
  for (size_t row = 0; row < fout.token_index.size(); ++row) {
    const int32_t si = batch.seq_index[static_cast<size_t>(fout.token_index[row])];
    request& r = *requests_.at(in_batch[static_cast<size_t>(si)]);
    std::span<const float> logits(fout.logits.data() + row * fout.n_vocab,
                                  static_cast<size_t>(fout.n_vocab));
    if (r.cons && !mask_by_grammar(r, logits, outputs)) continue;
    if (!r.routes_error.empty()) {
      // Its routes would be short or wrong: an explicit error rather than a silent replay gap.
      fail(r.id, r.routes_error, outputs);
      continue;
    }
    sample_result s = sampled[row] ? std::move(*sampled[row]) : r.smp.sample(logits, r.tokens);
    request_output out;
    out.id = r.id;
    out.cached_prompt_tokens = r.n_cached;
    r.ph = phase::decode;
    ++r.n_generated;
    r.expedited = false;
    const auto& p = r.smp.params();
    if (std::find(p.stop_tokens.begin(), p.stop_tokens.end(), s.token) != p.stop_tokens.end()) {
      out.finish = finish_reason::stop_token;
      out.stop_sample = std::move(s);
    } else {
      if (r.cons && !r.cons->accept(config_.vocab->piece(s.token))) {
        fail(r.id, "grammar: sampled token " + std::to_string(s.token) + " was refused", outputs);
        continue;
      }
      r.tokens.push_back(s.token);
      out.new_tokens.push_back(s.token);
      out.samples.push_back(std::move(s));
      if (config_.detokenize) {
        r.text += config_.detokenize(out.new_tokens.back());
        for (const auto& stop : p.stop_strings) {
          if (stop.empty()) continue;
          const size_t from = r.text_emitted;
          const size_t pos = r.text.find(stop, from);
          if (pos != std::string::npos) {
            r.text.resize(pos);
            out.finish = finish_reason::stop_string;
          }
        }
      }
      if (out.finish == finish_reason::none &&
          (r.n_generated >= p.max_tokens ||
           (model_.hparams().n_ctx_train > 0 &&
            static_cast<int64_t>(r.tokens.size()) >= model_.hparams().n_ctx_train))) {
        out.finish = finish_reason::length;
      }
    }
    if (config_.detokenize) finish_text(r, out, out.finish != finish_reason::none);
    if (out.finish != finish_reason::none) {
      finished.push_back(r.id);
      if (config_.record_routes) out.routes = std::move(r.routes);
    }
    outputs.push_back(std::move(out));
  }
}

}  // namespace weft::gpu
