#include "gpu/train/sft_data.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>

namespace weft::gpu::train {

namespace {

using json = nlohmann::json;

status bad(const std::string& why) {
  return {status_code::invalid_argument, why};
}

void append(sft_example& ex, const std::vector<token_id>& ids, bool loss) {
  for (token_id id : ids) {
    ex.tokens.push_back(static_cast<int32_t>(id));
    ex.in_loss.push_back(loss ? 1 : 0);
  }
}

result<sft_example> encode_messages(const json& msgs, const tokenizer& tok,
                                    const chat_template* chat) {
  if (chat == nullptr) return bad("'messages' needs a chat template, and the model has none");
  if (!msgs.is_array() || msgs.empty()) return bad("'messages' must be a non-empty array");
  std::vector<chat_message> ms;
  for (const auto& m : msgs) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
        !m["content"].is_string()) {
      return bad("every message needs a string 'role' and a string 'content'");
    }
    ms.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  sft_example ex;
  std::string done;  // Text already encoded.
  bool first = true;
  bool any_assistant = false;
  auto emit = [&](std::string_view text, bool loss) {
    append(ex, tok.encode(text, first ? add_special::yes : add_special::no, parse_special::yes),
           loss);
    first = false;
  };
  for (size_t i = 0; i < ms.size(); ++i) {
    if (ms[i].role != "assistant") continue;
    any_assistant = true;
    auto prefix = chat->apply(std::span(ms.data(), i), generation_prompt::add);
    auto full = chat->apply(std::span(ms.data(), i + 1), generation_prompt::omit);
    if (!prefix) return prefix.error();
    if (!full) return full.error();
    if (!prefix->starts_with(done) || !full->starts_with(*prefix)) {
      return bad("the chat template does not render this conversation turn by turn");
    }
    emit(std::string_view(*prefix).substr(done.size()), false);
    emit(std::string_view(*full).substr(prefix->size()), true);
    done = std::move(*full);
  }
  if (!any_assistant) return bad("no assistant message: nothing to learn");
  return ex;
}

result<sft_example> encode_completion(const json& j, const tokenizer& tok) {
  if (!j["prompt"].is_string() || !j.contains("completion") || !j["completion"].is_string()) {
    return bad("'prompt' and 'completion' must both be strings");
  }
  sft_example ex;
  append(ex, tok.encode(j["prompt"].get<std::string>(), add_special::yes), false);
  append(ex, tok.encode(j["completion"].get<std::string>(), add_special::no), true);
  if (auto eos = tok.eos(); eos) append(ex, {*eos}, true);
  return ex;
}

}  // namespace

result<sft_example> encode_sft_line(std::string_view line, const tokenizer& tok,
                                    const chat_template* chat, const sft_data_config& config) {
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) return bad("not valid JSON");
  if (!j.is_object()) return bad("a line must be a JSON object");
  result<sft_example> ex = bad("needs 'messages' or 'prompt' and 'completion'");
  if (j.contains("messages")) {
    ex = encode_messages(j["messages"], tok, chat);
  } else if (j.contains("prompt")) {
    ex = encode_completion(j, tok);
  }
  if (!ex) return ex;
  if (static_cast<int64_t>(ex->tokens.size()) > config.max_seq_tokens) {
    ex->tokens.resize(static_cast<size_t>(config.max_seq_tokens));
    ex->in_loss.resize(ex->tokens.size());
    ex->truncated = true;
  }
  // tokens[0] is never predicted.
  if (!ex->in_loss.empty()) ex->in_loss[0] = 0;
  if (std::count(ex->in_loss.begin(), ex->in_loss.end(), 1) == 0) {
    return bad("no token in the loss within the first " + std::to_string(config.max_seq_tokens) +
               " tokens");
  }
  return ex;
}

result<sft_dataset> load_sft_jsonl(const std::filesystem::path& path, const tokenizer& tok,
                                   const chat_template* chat, const sft_data_config& config) {
  std::ifstream in(path);
  if (!in) return status{status_code::not_found, "cannot read training data " + path.string()};
  sft_dataset data;
  std::string line, errors;
  int64_t n_bad = 0;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (std::all_of(line.begin(), line.end(), [](unsigned char c) { return std::isspace(c); }))
      continue;
    auto ex = encode_sft_line(line, tok, chat, config);
    if (!ex) {
      if (++n_bad <= 20) {
        errors +=
            "\n  " + path.string() + ":" + std::to_string(line_no) + ": " + ex.error().message();
      }
      continue;
    }
    ex->line = line_no;
    const auto full = std::count(ex->in_loss.begin(), ex->in_loss.end(), 1);
    if (ex->truncated) ++data.truncated;
    data.tokens += static_cast<int64_t>(ex->tokens.size());
    data.loss_tokens += full;
    data.examples.push_back(std::move(*ex));
  }
  if (n_bad > 0) {
    return bad(std::to_string(n_bad) + " bad line(s) in " + path.string() + ":" + errors);
  }
  if (data.examples.empty()) return bad("no examples in " + path.string());
  return data;
}

sft_sampler::sft_sampler(const sft_dataset& data, uint64_t seed, int64_t step_tokens,
                         int64_t micro_batch_tokens)
    : data_(&data),
      seed_(seed),
      step_tokens_(std::max<int64_t>(1, step_tokens)),
      micro_tokens_(std::max<int64_t>(1, micro_batch_tokens)) {}

std::vector<int64_t> sft_sampler::permutation(int64_t epoch) const {
  const auto n = static_cast<int64_t>(data_->examples.size());
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  // Fisher–Yates with splitmix64: the same order on every platform and standard library.
  uint64_t state = seed_ ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(epoch + 1));
  auto next = [&state] {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  };
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(next() % static_cast<uint64_t>(i + 1));
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(j)]);
  }
  return p;
}

std::vector<train_batch> sft_sampler::next_step() {
  return next_step(0, 1, nullptr);
}

std::vector<train_batch> sft_sampler::next_step(int rank, int world, int64_t* step_tokens) {
  return std::move(next_step_shares(rank, 1, world, step_tokens).front());
}

std::vector<std::vector<train_batch>> sft_sampler::next_step_shares(int first, int count, int total,
                                                                    int64_t* step_tokens) {
  const auto n = static_cast<int64_t>(data_->examples.size());
  std::vector<const sft_example*> chosen;
  int64_t used = 0;
  while (used < step_tokens_) {
    if (cursor_.index >= n) {
      if (!chosen.empty()) break;  // A step never crosses an epoch boundary.
      ++cursor_.epoch;
      cursor_.index = 0;
    }
    if (perm_epoch_ != cursor_.epoch) {
      perm_ = permutation(cursor_.epoch);
      perm_epoch_ = cursor_.epoch;
    }
    const sft_example& ex =
        data_->examples[static_cast<size_t>(perm_[static_cast<size_t>(cursor_.index)])];
    const auto size = static_cast<int64_t>(ex.tokens.size());
    if (!chosen.empty() && used + size > step_tokens_) break;
    chosen.push_back(&ex);
    used += size;
    ++cursor_.index;
  }
  if (step_tokens != nullptr) *step_tokens = used;
  // Balance the shares' tokens: longest example first to the least-loaded share (ties: the lower
  // share), every rank computing the same split; each share keeps its examples in step order.
  std::vector<size_t> order(chosen.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return chosen[a]->tokens.size() > chosen[b]->tokens.size();
  });
  std::vector<int64_t> load(static_cast<size_t>(std::max(total, 1)), 0);
  std::vector<int> owner(chosen.size(), 0);
  for (size_t i : order) {
    const auto r = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = static_cast<int>(r);
    load[r] += static_cast<int64_t>(chosen[i]->tokens.size());
  }
  std::vector<std::vector<train_batch>> shares(static_cast<size_t>(std::max(count, 0)));
  for (size_t i = 0; i < chosen.size(); ++i) {
    const int share = owner[i] - first;
    if (share < 0 || share >= count) continue;
    auto& micro = shares[static_cast<size_t>(share)];
    const sft_example* ex = chosen[i];
    if (micro.empty() ||
        micro.back().n_tokens() + static_cast<int64_t>(ex->tokens.size()) > micro_tokens_) {
      micro.emplace_back();
    }
    micro.back().add(ex->tokens, ex->in_loss);
  }
  return shares;
}

}  // namespace weft::gpu::train
