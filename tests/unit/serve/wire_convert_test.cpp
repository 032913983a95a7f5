// The router -> worker request on the wire: what goes in comes out, and a peer's out-of-range
// sampling values are refused by name rather than reaching a sampler.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "actors/serve/wire_convert.hpp"

namespace {

using namespace weft;
using namespace weft::serve;
namespace wire = schema::wire;

generate_spec spec_with_bias() {
  generate_spec s;
  s.request_id = 7;
  s.prompt = {1, 2, 3};
  s.params.temperature = 0.5f;
  s.params.max_tokens = 4;
  s.params.logit_bias = {{2, -100.0f}, {9, 3.5f}};
  return s;
}

result<generate_spec> round_trip(const schema::envelope& e) {
  auto v = e.read<wire::GenerateRequest>();
  if (!v) return v.error();
  return from_wire(v->get());
}

TEST(wire_convert, logit_bias_round_trips) {
  auto back = round_trip(to_wire(spec_with_bias()));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->params.logit_bias, spec_with_bias().params.logit_bias);
  generate_spec none = spec_with_bias();
  none.params.logit_bias.clear();
  auto plain = round_trip(to_wire(none));
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE(plain->params.logit_bias.empty());
}

TEST(wire_convert, a_peers_bad_logit_bias_is_refused) {
  auto with = [](auto edit) {
    return schema::envelope::build<wire::GenerateRequest>([&](wire::GenerateRequest::Builder b) {
      b.initPrompt(1).set(0, 1);
      auto p = b.initParams();
      p.setMaxTokens(1);
      edit(p);
    });
  };
  auto refused = [](const schema::envelope& e, const char* what) {
    auto r = round_trip(e);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().to_string().find(what), std::string::npos) << r.error().to_string();
  };
  refused(with([](wire::SamplingParams::Builder p) {
            p.initLogitBiasTokens(2);
            p.initLogitBiasValues(1);
          }),
          "differ in length");
  for (float v : {101.0f, -100.5f, std::numeric_limits<float>::quiet_NaN()}) {
    refused(with([v](wire::SamplingParams::Builder p) {
              p.initLogitBiasTokens(1).set(0, 3);
              p.initLogitBiasValues(1).set(0, v);
            }),
            "out of range");
  }
  refused(with([](wire::SamplingParams::Builder p) {
            p.initLogitBiasTokens(1).set(0, -1);
            p.initLogitBiasValues(1).set(0, 1.0f);
          }),
          "out of range");
  refused(with([](wire::SamplingParams::Builder p) {
            const auto n = static_cast<unsigned>(gpu::kMaxLogitBias + 1);
            p.initLogitBiasTokens(n);
            p.initLogitBiasValues(n);
          }),
          "more logit biases");
}

}  // namespace
