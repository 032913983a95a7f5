// The controller of `weft rl --reference-workers` (actors/rl/remote_reference.hpp) against workers
// of the test's own: every batch is answered once with its worker's log-probs; a worker that
// answers the wrong number of log-probs, a message of another kind, or nothing within its
// deadline is stopped and its batches go to another; a worker whose model did not load, or that
// fails a batch, ends the call with its error; the worker's configuration round-trips.
#include <gtest/gtest.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include <unistd.h>

#include <string>
#include <vector>

#include "actors/rl/remote_reference.hpp"
#include "actors/rl/rl_atoms.hpp"
#include "actors/rl/trainer_wire.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::rl {
namespace {

using gpu::train::train_batch;
using schema::envelope;
namespace wire = schema::wire;

enum class manner { good, short_answer, other_kind, silent, fails, no_model };

/// A worker of the test: its "reference" gives each target t the log-prob −t / 1000, a function
/// of the batch as the real one is.
caf::behavior fake_worker(caf::event_based_actor* self, caf::actor ctrl, int worker, manner m) {
  caf::send_as(caf::actor_cast<caf::actor>(self), ctrl, rf_hello_atom::value,
               envelope::build<wire::ReferenceHello>([&](wire::ReferenceHello::Builder b) {
                 b.setWorker(static_cast<uint32_t>(worker));
                 b.setPid(static_cast<uint32_t>(::getpid()));
                 if (m == manner::no_model) b.setError("/m.gguf: no such file");
               }));
  return {[self, m](rf_work_atom, const envelope& env) {
    schema::decode_limits l;
    l.max_size_bytes = schema::max_wire_envelope_bytes;
    l.traversal_limit_words = schema::max_wire_envelope_bytes / 8;
    l.max_list_elements = schema::max_wire_envelope_bytes / 4;
    auto w = env.read<wire::ReferenceWork>(l);
    if (!w || m == manner::silent) return;
    std::vector<float> lp;
    for (int32_t t : w->get().getBatch().getTargets()) {
      if (t >= 0) lp.push_back(-static_cast<float>(t) / 1000.0f);
    }
    if (m == manner::short_answer) lp.pop_back();
    auto reply = self->current_sender();
    auto to = caf::actor_cast<caf::actor>(reply);
    if (m == manner::other_kind) {
      caf::send_as(caf::actor_cast<caf::actor>(self), to, rf_result_atom::value,
                   envelope::build<wire::ReferenceHello>([](wire::ReferenceHello::Builder) {}));
      return;
    }
    caf::send_as(caf::actor_cast<caf::actor>(self), to, rf_result_atom::value,
                 envelope::build<wire::ReferenceResult>([&](wire::ReferenceResult::Builder r) {
                   r.setId(w->get().getId());
                   if (m == manner::fails) {
                     r.setError("the forward ran out of memory");
                     return;
                   }
                   auto list = r.initLogp(static_cast<unsigned>(lp.size()));
                   for (size_t i = 0; i < lp.size(); ++i) {
                     list.set(static_cast<unsigned>(i), lp[i]);
                   }
                 }));
  }};
}

struct fixture {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<remote_reference> ref;

  fixture(const std::vector<manner>& workers, double timeout_s = 30.0) {
    schema::add_message_types(cfg);
    cfg.set("scheduler.max-threads", 2);
    sys = std::make_unique<caf::actor_system>(cfg);
    remote_reference_config rc;
    rc.workers = static_cast<int>(workers.size());
    rc.batch_timeout_s = timeout_s;
    rc.no_worker_timeout_ms = 3000;
    auto r = remote_reference::create(*sys, rc);
    EXPECT_TRUE(r.ok());
    ref = std::move(*r);
    for (size_t i = 0; i < workers.size(); ++i) {
      sys->spawn(fake_worker, ref->controller(), static_cast<int>(i), workers[i]);
    }
  }
  ~fixture() {
    ref->shutdown();
    ref.reset();
  }
};

/// `n` batches of two sequences each, with distinct targets.
std::vector<train_batch> batches(int n) {
  std::vector<train_batch> out(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> a{1, 2 + i, 3 + i, 4 + i};
    std::vector<int32_t> b{5, 6 + i, 7 + i};
    std::vector<uint8_t> la{0, 1, 1, 1}, lb{0, 0, 1};
    out[static_cast<size_t>(i)].add(a, la);
    out[static_cast<size_t>(i)].add(b, lb);
  }
  return out;
}

std::vector<const train_batch*> pointers(const std::vector<train_batch>& v) {
  std::vector<const train_batch*> p;
  for (const auto& b : v) p.push_back(&b);
  return p;
}

void expect_answers(const std::vector<train_batch>& in,
                    const std::vector<std::vector<float>>& got) {
  ASSERT_EQ(got.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    std::vector<float> want;
    for (int32_t t : in[i].targets) {
      if (t >= 0) want.push_back(-static_cast<float>(t) / 1000.0f);
    }
    EXPECT_EQ(got[i], want) << "batch " << i;
  }
}

TEST(remote_reference, spreads_batches_over_the_workers_and_answers_each_in_order) {
  fixture f({manner::good, manner::good});
  ASSERT_TRUE(f.ref->wait_ready(10'000).ok());
  auto in = batches(6);
  auto p = pointers(in);
  auto got = f.ref->logprobs(p);
  ASSERT_TRUE(got.ok()) << got.error().message();
  expect_answers(in, *got);
  EXPECT_EQ(f.ref->workers_lost(), 0);
  const std::string st = f.ref->status_json();
  EXPECT_NE(st.find("\"batches\":3"), std::string::npos) << st;
}

TEST(remote_reference, stops_a_worker_that_answers_the_wrong_count_and_resends_its_batches) {
  fixture f({manner::short_answer, manner::good});
  ASSERT_TRUE(f.ref->wait_ready(10'000).ok());
  auto in = batches(4);
  auto got = f.ref->logprobs(pointers(in));
  ASSERT_TRUE(got.ok()) << got.error().message();
  expect_answers(in, *got);
  EXPECT_EQ(f.ref->workers_lost(), 1);
  EXPECT_EQ(f.ref->batches_resent(), 2);
}

TEST(remote_reference, stops_a_worker_that_answers_a_message_of_another_kind) {
  fixture f({manner::good, manner::other_kind});
  ASSERT_TRUE(f.ref->wait_ready(10'000).ok());
  auto in = batches(4);
  auto got = f.ref->logprobs(pointers(in));
  ASSERT_TRUE(got.ok()) << got.error().message();
  expect_answers(in, *got);
  EXPECT_EQ(f.ref->workers_lost(), 1);
}

TEST(remote_reference, stops_a_silent_worker_at_its_deadline) {
  fixture f({manner::silent, manner::good}, 0.5);
  ASSERT_TRUE(f.ref->wait_ready(10'000).ok());
  auto in = batches(3);
  auto got = f.ref->logprobs(pointers(in));
  ASSERT_TRUE(got.ok()) << got.error().message();
  expect_answers(in, *got);
  EXPECT_EQ(f.ref->workers_lost(), 1);
}

TEST(remote_reference, a_failed_batch_ends_the_call_naming_the_worker_and_its_error) {
  fixture f({manner::fails});
  ASSERT_TRUE(f.ref->wait_ready(10'000).ok());
  auto in = batches(2);
  auto got = f.ref->logprobs(pointers(in));
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message().find("reference worker 0"), std::string::npos);
  EXPECT_NE(got.error().message().find("out of memory"), std::string::npos);
}

TEST(remote_reference, a_worker_without_its_model_fails_the_start_with_its_error) {
  fixture f({manner::good, manner::no_model});
  auto st = f.ref->wait_ready(10'000);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message.find("reference worker 1"), std::string::npos) << st.message;
  EXPECT_NE(st.message.find("no such file"), std::string::npos) << st.message;
}

TEST(remote_reference, without_a_live_worker_a_call_fails_after_its_wait) {
  fixture f({manner::short_answer});
  ASSERT_TRUE(f.ref->wait_ready(10'000).ok());
  auto in = batches(1);
  auto got = f.ref->logprobs(pointers(in));
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message().find("no reference worker"), std::string::npos);
}

TEST(reference_worker_config, survives_the_json_round_trip_and_refuses_bad_values) {
  reference_worker_config c;
  c.worker = 2;
  c.model_path = "/m.gguf";
  c.threads = 3;
  c.temperature = 0.7f;
  c.controller_port = 4242;
  auto back = reference_worker_config::from_json(c.to_json());
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->to_json(), c.to_json());
  auto refused = [](reference_worker_config x) {
    return !reference_worker_config::from_json(x.to_json()).ok();
  };
  auto x = c;
  x.controller_port = 0;
  EXPECT_TRUE(refused(x));
  x = c;
  x.threads = 0;
  EXPECT_TRUE(refused(x));
  x = c;
  x.temperature = 0.0f;
  EXPECT_TRUE(refused(x));
  x = c;
  x.model_path.clear();
  EXPECT_TRUE(refused(x));
  EXPECT_FALSE(reference_worker_config::from_json("[1]").ok());
}

}  // namespace
}  // namespace weft::rl
