// Example 1 (docs/embedding.md): a pipeline stage of your own in front of a pool of engine
// workers, on a local cluster, everything supervised.
//
// The "judge" stage is an actor you write: it receives a Question (your own Cap'n Proto schema,
// judge.capnp), asks the pool to answer it, then asks the pool whether that answer is correct, and
// replies with a Verdict. The pool is weft's: a router plus engine workers under a one-for-one
// supervisor. Halfway through, the example kills one engine worker: its requests migrate to the
// other worker, the supervisor restarts it, and every question still gets its verdict.
//
//   judge_pipeline [--model PATH] [--workers N] [--questions N] [--kill-after K] [--threads T]

#include <caf/all.hpp>

#include <weft/actors/auth.hpp>
#include <weft/actors/cluster_client.hpp>
#include <weft/actors/host_port.hpp>
#include <weft/actors/node.hpp>
#include <weft/actors/roles.hpp>
#include <weft/actors/runtime.hpp>
#include <weft/actors/serve/engine_pool.hpp>
#include <weft/actors/serve/engine_worker.hpp>
#include <weft/actors/serve/generate_client.hpp>
#include <weft/actors/serve/serve_atoms.hpp>
#include <weft/schema/caf_bridge.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "judge.capnp.h"

namespace {

using weft::schema::envelope;
using ask_atom = caf::atom_constant<caf::atom("j_ask")>;

// -- the stage ---------------------------------------------------------------------------------

struct pending {
  caf::response_promise reply;
  uint64_t question_id = 0;
  std::string question;
  std::string answer;
  std::vector<std::string> workers;
  bool judging = false;  // second call: the judgement
  uint32_t max_tokens = 48;
  weft::serve::generation_collector collector{0};
};

struct stage_state {
  caf::actor router;
  std::unique_ptr<weft::serve::model_host> host;  // tokenizer + chat template, no weights
  std::map<uint64_t, pending> inflight;           // by the pool's request id
};
using stage_actor = caf::stateful_actor<stage_state>;

void fail(stage_actor* self, uint64_t request_id, const weft::error& err) {
  auto it = self->state.inflight.find(request_id);
  if (it == self->state.inflight.end()) return;
  it->second.reply.deliver(weft::schema::make_error_envelope(err));
  self->state.inflight.erase(it);
}

// Sends `text` (one user turn) to the pool; the tokens come back as chunk_atom messages.
void submit(stage_actor* self, pending p, const std::string& text) {
  auto& st = self->state;
  auto ids = weft::serve::encode_user_turn(*st.host, text);
  if (!ids) {
    p.reply.deliver(weft::schema::make_error_envelope(ids.error()));
    return;
  }
  weft::gpu::sampling_params params;  // greedy
  params.max_tokens = static_cast<int32_t>(p.max_tokens);
  auto eog = st.host->tok.end_of_generation_ids();
  params.stop_tokens.assign(eog.begin(), eog.end());
  const uint64_t id = weft::serve::new_request_id();
  p.collector = weft::serve::generation_collector(id);
  st.inflight.emplace(id, std::move(p));
  self->request(st.router, std::chrono::seconds(30), weft::serve::submit_atom::value,
                weft::serve::make_generate_request(id, *ids, params))
      .then(
          [self, id](const envelope& ack) {
            if (auto err = weft::schema::error_from(ack); !err.ok()) fail(self, id, err);
          },
          [self, id](caf::error& err) {
            fail(self, id,
                 weft::make_error(weft::errc::unavailable, "pool: " + caf::to_string(err)));
          });
}

void on_chunk(stage_actor* self, const envelope& env) {
  auto& st = self->state;
  auto it = st.inflight.find(weft::serve::chunk_request_id(env));
  if (it == st.inflight.end()) return;
  const uint64_t id = it->first;
  auto& p = it->second;
  if (auto s = p.collector.add(env); !s.ok()) return fail(self, id, s);
  if (!p.collector.done()) return;
  const auto& g = p.collector.result();
  std::vector<weft::gpu::token_id> tokens(g.tokens.begin(), g.tokens.end());
  std::string text = st.host->tok.decode(tokens);
  p.workers.push_back(g.worker);
  pending next = std::move(p);
  st.inflight.erase(it);
  if (!next.judging) {
    next.answer = text;
    next.judging = true;
    next.max_tokens = 8;
    const std::string ask = "Question: " + next.question + "\nProposed answer: " + next.answer +
                            "\nIs the proposed answer correct? Reply with yes or no.";
    submit(self, std::move(next), ask);
    return;
  }
  auto verdict = envelope::build_user<judge::Verdict>([&](judge::Verdict::Builder v) {
    v.setId(next.question_id);
    v.setAnswer(next.answer);
    v.setJudgement(text);
    v.setAccepted(text.rfind("yes", 0) == 0 || text.rfind("Yes", 0) == 0);
    auto w = v.initWorkers(static_cast<unsigned>(next.workers.size()));
    for (size_t i = 0; i < next.workers.size(); ++i)
      w.set(static_cast<unsigned>(i), next.workers[i]);
  });
  next.reply.deliver(verdict);
}

caf::behavior judge_stage(stage_actor* self, std::string router_host, uint16_t router_port,
                          std::unique_ptr<weft::serve::model_host> host) {
  self->state.host = std::move(host);
  // The router may live on another node: connect to it like any published actor (mutual TLS).
  auto router = weft::actors::connect_actor(self->system(), router_host, router_port);
  if (!router) {
    self->quit(caf::make_error(caf::sec::runtime_error, router.error().message));
    return {};
  }
  self->state.router = *router;
  return {
      [self](ask_atom, const envelope& env) {
        auto reply = self->make_response_promise();
        auto q = env.read_user<judge::Question>();  // validated against judge.capnp
        if (!q) {
          reply.deliver(weft::schema::make_error_envelope(q.error()));
          return;
        }
        pending p;
        p.reply = reply;
        p.question_id = q->get().getId();
        p.question = q->get().getText().cStr();
        p.max_tokens = q->get().getMaxTokens();
        submit(self, std::move(p), q->get().getText().cStr());
      },
      [self](weft::serve::chunk_atom, const envelope& env) { on_chunk(self, env); },
  };
}

// The role a node spawns when the head places a "judge_stage" child on it. Config:
// {"router": "HOST:PORT", "model": PATH}.
weft::result<caf::actor> make_judge_stage(caf::actor_system& sys,
                                          const weft::actors::role_context& ctx) {
  auto cfg = nlohmann::json::parse(ctx.config_json, nullptr, false);
  if (cfg.is_discarded() || !cfg.contains("router") || !cfg.contains("model")) {
    return weft::make_error(weft::errc::invalid_argument,
                            "judge_stage needs {\"router\": \"HOST:PORT\", \"model\": PATH}");
  }
  auto addr = weft::actors::parse_host_port(cfg["router"].get<std::string>());
  if (!addr) return addr.error();
  weft::serve::model_host_options mo;
  mo.path = cfg["model"].get<std::string>();
  mo.load_weights = false;
  auto host = weft::serve::load_model_host(mo);
  if (!host) return host.error();
  // Detached: its own thread, so that connecting to the router may block.
  return sys.spawn<caf::detached>(judge_stage, addr->first, addr->second, std::move(*host));
}

// -- the program -------------------------------------------------------------------------------

struct options {
  std::string model;
  int workers = 2;
  int questions = 6;
  int kill_after = -1;  // -1: questions / 2; 0: never
  int threads = 0;
};

bool parse(int argc, char** argv, options& o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--help" || a == "-h") {
      std::printf(
          "judge_pipeline: a stage of your own (answer, then judge) in front of a pool of weft "
          "engine workers.\n"
          "  --model PATH     GGUF model (default: weft's default model)\n"
          "  --workers N      engine workers (default 2)\n"
          "  --questions N    questions to judge (default 6)\n"
          "  --kill-after K   kill one engine worker after K verdicts (default: half; 0: never)\n"
          "  --threads T      compute threads per worker (default: cores / workers)\n");
      std::exit(0);
    } else if ((a == "--model") && (v = value())) {
      o.model = v;
    } else if (a == "--workers" && (v = value())) {
      o.workers = std::atoi(v);
    } else if (a == "--questions" && (v = value())) {
      o.questions = std::atoi(v);
    } else if (a == "--kill-after" && (v = value())) {
      o.kill_after = std::atoi(v);
    } else if (a == "--threads" && (v = value())) {
      o.threads = std::atoi(v);
    } else {
      std::fprintf(stderr, "judge_pipeline: unknown or incomplete option %s (see --help)\n",
                   a.c_str());
      return false;
    }
  }
  if (o.workers < 1 || o.questions < 1) {
    std::fprintf(stderr, "judge_pipeline: --workers and --questions must be at least 1\n");
    return false;
  }
  if (o.kill_after < 0) o.kill_after = o.questions / 2;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  if (!parse(argc, argv, opt)) return 2;
  if (opt.model.empty()) opt.model = weft::serve::default_model_path().string();

  // 1. This process is the head of a local cluster keyed by a fresh secret. Its role table has
  //    weft's engine worker and our stage.
  auto secret = weft::actors::load_secret(weft::actors::generate_secret_hex(), "");
  if (!secret) return std::fprintf(stderr, "%s\n", secret.error().message.c_str()), 1;
  auto roles = std::make_shared<weft::actors::role_registry>();
  weft::actors::add_builtin_roles(*roles);
  weft::serve::add_serve_roles(*roles);
  roles->add("judge_stage", make_judge_stage);
  weft::actors::node_options no;
  no.node_id = "judge-example";
  no.is_head = true;
  no.head_port = 0;
  no.secret = *secret;
  no.transport = "none";  // colocated engine workers move no bulk bytes
  auto node = weft::actors::node::start(no, roles);
  if (!node) return std::fprintf(stderr, "%s\n", node.error().to_string().c_str()), 1;
  auto& sys = (*node)->system();

  // 2. weft's pool of engine workers (router + supervised workers).
  weft::serve::engine_pool_options po;
  po.model = opt.model;
  po.workers = opt.workers;
  po.threads = opt.threads;
  po.restart_delay_ms = 200;
  auto pool = weft::serve::engine_pool::start(**node, po);
  if (!pool) return std::fprintf(stderr, "%s\n", pool.error().to_string().c_str()), 1;

  // 3. Our stage, under a supervisor of its own, placed by the head like any child.
  nlohmann::json stage_cfg{{"router", (*pool)->router_address()}, {"model", opt.model}};
  auto stages = weft::actors::supervise_on_cluster(
      sys, (*node)->head(), *secret, "judge-stages", weft::actors::restart_strategy::one_for_one,
      weft::actors::restart_intensity{5, 60'000},
      weft::actors::backoff_policy{200, 2000, 2.0, 10000},
      {{"judge", "judge_stage", stage_cfg.dump(), weft::actors::restart_type::permanent}});
  if (!stages) return std::fprintf(stderr, "%s\n", stages.error().to_string().c_str()), 1;
  auto judge_actor = weft::actors::lookup_on_cluster(sys, (*node)->head(), "judge");
  if (!judge_actor) return std::fprintf(stderr, "%s\n", judge_actor.error().to_string().c_str()), 1;

  // 4. Ask every question at once; the stage interleaves them over the pool.
  const std::vector<std::string> bank = {"What is 2 + 3?",
                                         "What is the capital of France?",
                                         "How many legs has a spider?",
                                         "What is 10 - 4?",
                                         "What colour is the sky on a clear day?",
                                         "What is 3 times 3?",
                                         "Which planet is closest to the sun?",
                                         "What is 7 + 8?"};
  caf::scoped_actor self{sys};
  for (int i = 0; i < opt.questions; ++i) {
    self->send(*judge_actor, ask_atom::value,
               envelope::build_user<judge::Question>([&](judge::Question::Builder q) {
                 q.setId(static_cast<uint64_t>(i));
                 q.setText(bank[static_cast<size_t>(i) % bank.size()]);
               }));
  }
  int judged = 0, errors = 0;
  bool killed = false;
  std::string killed_name;
  while (judged + errors < opt.questions) {
    bool timed_out = false;
    self->receive(
        [&](const envelope& reply) {
          if (auto err = weft::schema::error_from(reply); !err.ok()) {
            std::printf("error: %s\n", err.to_string().c_str());
            ++errors;
            return;
          }
          auto v = reply.read_user<judge::Verdict>();
          if (!v) {
            std::printf("error: %s\n", v.error().to_string().c_str());
            ++errors;
            return;
          }
          ++judged;
          std::string workers;
          for (auto w : v->get().getWorkers())
            workers += std::string(workers.empty() ? "" : ",") + w.cStr();
          std::printf("question %llu: %s\n  answer:    %s\n  judgement: %s (%s) [%s]\n",
                      static_cast<unsigned long long>(v->get().getId()),
                      bank[v->get().getId() % bank.size()].c_str(), v->get().getAnswer().cStr(),
                      v->get().getJudgement().cStr(),
                      v->get().getAccepted() ? "accepted" : "rejected", workers.c_str());
          std::fflush(stdout);
        },
        caf::after(std::chrono::seconds(180)) >> [&] { timed_out = true; });
    if (timed_out) {
      std::fprintf(stderr, "judge_pipeline: no verdict within 180 s\n");
      break;
    }
    if (!killed && opt.kill_after > 0 && judged >= opt.kill_after) {
      // A worker dies: the router migrates its requests, its supervisor restarts it.
      killed_name = (*pool)->worker_names().front();
      auto victim = weft::actors::lookup_on_cluster(sys, (*node)->head(), killed_name);
      if (victim) {
        caf::anon_send_exit(*victim, caf::exit_reason::kill);
        std::printf("killed engine worker %s\n", killed_name.c_str());
        killed = true;
      }
    }
  }
  // The killed worker is back once it has reloaded the model and said hello again.
  int ready = (*pool)->ready_workers();
  for (int i = 0; killed && ready < opt.workers && i < 600; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ready = (*pool)->ready_workers();
  }
  std::printf(
      "judge_pipeline: %d/%d questions judged, %d errors; %s; %d/%d workers ready\n", judged,
      opt.questions, errors,
      killed ? ("worker " + killed_name + " was killed and restarted").c_str() : "no worker killed",
      ready, opt.workers);
  caf::anon_send_exit(*stages, caf::exit_reason::user_shutdown);
  (*pool)->stop();
  return judged == opt.questions && ready == opt.workers ? 0 : 1;
}
