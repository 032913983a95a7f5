// POST /v1/embeddings: reading the request and rendering the answer (docs/serving.md).
#include "actors/serve/openai_embeddings.hpp"

#include <openssl/evp.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace weft::serve {

using ojson = nlohmann::ordered_json;

namespace {

api_error bad(std::string message, std::string param, std::string code = "") {
  return api_error{400, "invalid_request_error", std::move(message), std::move(param),
                   std::move(code)};
}

/// A list of token ids; false when `j` is not one (or holds an id outside [0, n_vocab)).
bool token_list(const ojson& j, int64_t n_vocab, std::vector<int32_t>& out, std::string& why) {
  if (!j.is_array() || j.empty()) return false;
  for (const auto& t : j) {
    if (!t.is_number_integer()) return false;
    const auto v = t.get<int64_t>();
    if (v < 0 || v >= n_vocab) {
      why = "token id " + std::to_string(v) + " is outside the vocabulary (0.." +
            std::to_string(n_vocab - 1) + ")";
      return false;
    }
    out.push_back(static_cast<int32_t>(v));
  }
  return true;
}

std::string base64_of(const std::vector<float>& v) {
  static_assert(sizeof(float) == 4);
  std::vector<unsigned char> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());  // little-endian hosts only (x86-64, arm64)
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), bytes.data(),
                                static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

}  // namespace

embeddings_parse parse_embeddings_request(std::string_view body, const gpu::tokenizer& tok,
                                          const embeddings_limits& limits) {
  embeddings_parse out;
  auto fail = [&](api_error e) {
    out.error = std::move(e);
    return out;
  };
  auto j = ojson::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return fail(bad("the body is not a JSON object", ""));
  embeddings_request r;
  if (auto m = j.find("model"); m != j.end() && !m->is_null()) {
    if (!m->is_string()) return fail(bad("'model' must be a string", "model"));
    r.model = m->get<std::string>();
  }
  if (auto f = j.find("encoding_format"); f != j.end() && !f->is_null()) {
    if (!f->is_string() || (*f != "float" && *f != "base64"))
      return fail(bad("'encoding_format' must be \"float\" or \"base64\"", "encoding_format"));
    r.base64 = *f == "base64";
  }
  if (auto n = j.find("normalize"); n != j.end() && !n->is_null()) {
    if (!n->is_boolean()) return fail(bad("'normalize' must be a boolean", "normalize"));
    r.normalize = n->get<bool>();
  }
  if (auto d = j.find("dimensions"); d != j.end() && !d->is_null()) {
    if (!d->is_number_integer() || d->get<int64_t>() != limits.n_embd) {
      return fail(bad("this model's embeddings have " + std::to_string(limits.n_embd) +
                          " dimensions; 'dimensions' can only be that",
                      "dimensions"));
    }
  }
  auto in = j.find("input");
  if (in == j.end() || in->is_null()) return fail(bad("'input' is required", "input"));
  const int64_t n_vocab = tok.n_vocab();
  std::string why;
  auto add_text = [&](const ojson& t) -> bool {
    const auto& s = t.get_ref<const std::string&>();
    if (s.empty()) return false;
    r.inputs.push_back(tok.encode(s, gpu::add_special::yes, gpu::parse_special::no));
    return true;
  };
  const char* shape =
      "'input' must be a non-empty string, a list of non-empty strings, a list of token ids or a "
      "list of lists of token ids";
  if (in->is_string()) {
    if (!add_text(*in)) return fail(bad("'input' must not be empty", "input"));
  } else if (in->is_array() && !in->empty() && (*in)[0].is_number_integer()) {
    std::vector<int32_t> ids;
    if (!token_list(*in, n_vocab, ids, why)) return fail(bad(why.empty() ? shape : why, "input"));
    r.inputs.push_back(std::move(ids));
  } else if (in->is_array() && !in->empty()) {
    if (in->size() > limits.max_inputs) {
      return fail(bad("at most " + std::to_string(limits.max_inputs) + " inputs per request, got " +
                          std::to_string(in->size()),
                      "input"));
    }
    for (size_t i = 0; i < in->size(); ++i) {
      const auto& e = (*in)[i];
      if (e.is_string()) {
        if (!add_text(e))
          return fail(bad("input " + std::to_string(i) + " is an empty string", "input"));
        continue;
      }
      std::vector<int32_t> ids;
      if (!token_list(e, n_vocab, ids, why)) {
        return fail(bad(why.empty() ? shape : "input " + std::to_string(i) + ": " + why, "input"));
      }
      r.inputs.push_back(std::move(ids));
    }
  } else {
    return fail(bad(shape, "input"));
  }
  if (limits.max_tokens > 0) {
    for (size_t i = 0; i < r.inputs.size(); ++i) {
      const auto n = static_cast<int64_t>(r.inputs[i].size());
      if (n > limits.max_tokens) {
        return fail(bad("input " + std::to_string(i) + " has " + std::to_string(n) +
                            " tokens; this server's context is " +
                            std::to_string(limits.max_tokens),
                        "input", "context_length_exceeded"));
      }
    }
  }
  out.request = std::move(r);
  return out;
}

void l2_normalize(std::vector<float>& v) {
  double ss = 0.0;
  for (float x : v) ss += static_cast<double>(x) * x;
  if (ss <= 0.0) return;
  const double inv = 1.0 / std::sqrt(ss);
  for (float& x : v) x = static_cast<float>(x * inv);
}

std::string render_embeddings(const std::string& model, const std::vector<std::vector<float>>& vecs,
                              bool base64, int64_t prompt_tokens) {
  ojson data = ojson::array();
  for (size_t i = 0; i < vecs.size(); ++i) {
    ojson e{{"object", "embedding"}, {"index", i}};
    if (base64) {
      e["embedding"] = base64_of(vecs[i]);
    } else {
      e["embedding"] = vecs[i];
    }
    data.push_back(std::move(e));
  }
  ojson out{{"object", "list"},
            {"data", std::move(data)},
            {"model", model},
            {"usage", {{"prompt_tokens", prompt_tokens}, {"total_tokens", prompt_tokens}}}};
  return json_text(out);
}

std::optional<gpu::pooling_type> parse_pooling(std::string_view name) {
  if (name == "mean") return gpu::pooling_type::mean;
  if (name == "last") return gpu::pooling_type::last;
  return std::nullopt;
}

}  // namespace weft::serve
