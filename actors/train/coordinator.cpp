#include "actors/train/coordinator.hpp"

#include <spdlog/spdlog.h>
#include <caf/all.hpp>

#include <map>
#include <set>
#include <vector>

#include "actors/train/train_atoms.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::train {

using schema::envelope;
namespace wire = schema::wire;

namespace {

struct hello {
  caf::actor who;
  std::vector<std::byte> address;
};

struct coordinator_state {
  coordinator_config cfg;
  uint16_t generation = 0;
  std::map<int, hello> pending;     ///< ranks waiting for a group, by rank
  std::set<caf::actor_addr> used;   ///< every actor that was in a group (never again)
  std::vector<caf::actor> members;  ///< the current group by rank (empty: none)
  bool stop_requested = false;      ///< a stop reaches the groups formed after it too
  static inline const char* name = "train_coordinator";
};

using coord_ptr = caf::stateful_actor<coordinator_state>*;

/// The rank of the sender in the current group, or -1.
int member_rank(coord_ptr self) {
  const auto& s = self->current_sender();
  if (!s) return -1;
  auto& m = self->state.members;
  for (size_t r = 0; r < m.size(); ++r) {
    if (m[r].address() == s->address()) return static_cast<int>(r);
  }
  return -1;
}

void form_group(coord_ptr self) {
  auto& st = self->state;
  ++st.generation;
  const bool resume = st.generation > 1 || st.cfg.resume;
  auto env = envelope::build<wire::TrainerGroup>([&](wire::TrainerGroup::Builder b) {
    b.setGeneration(st.generation);
    b.setResume(resume);
    auto list = b.initAddresses(static_cast<unsigned>(st.pending.size()));
    unsigned i = 0;
    for (auto& [rank, h] : st.pending) {
      list.set(i++, kj::arrayPtr(reinterpret_cast<const capnp::byte*>(h.address.data()),
                                 h.address.size()));
    }
  });
  st.members.clear();
  for (auto& [rank, h] : st.pending) {
    st.members.push_back(h.who);
    st.used.insert(h.who.address());
    self->send(h.who, t_group_atom::value, env);
    if (st.stop_requested) self->send(h.who, t_stop_atom::value);
  }
  st.pending.clear();
  spdlog::info("trainer group {} formed ({} ranks{})", st.generation, st.members.size(),
               resume ? ", continuing from the newest checkpoint" : "");
  if (st.cfg.events.on_group) st.cfg.events.on_group(st.generation);
}

caf::behavior coordinator(coord_ptr self, coordinator_config cfg) {
  self->state.cfg = std::move(cfg);
  self->set_down_handler([self](const caf::down_msg& dm) {
    auto& st = self->state;
    for (auto it = st.pending.begin(); it != st.pending.end(); ++it) {
      if (it->second.who.address() == dm.source) {
        st.pending.erase(it);
        return;
      }
    }
    for (size_t r = 0; r < st.members.size(); ++r) {
      if (st.members[r].address() == dm.source) {
        spdlog::warn("trainer group {}: rank {} is gone ({}); the group restarts", st.generation, r,
                     caf::to_string(dm.reason));
        st.members.clear();
        if (st.cfg.events.on_rank_lost) st.cfg.events.on_rank_lost(static_cast<int>(r));
        return;
      }
    }
  });
  return {
      [self](t_hello_atom, const envelope& env) {
        auto& st = self->state;
        const auto& sender = self->current_sender();
        if (!sender) return;
        auto h = env.read<wire::TrainerHello>();
        if (!h) {
          spdlog::warn("train coordinator: bad hello: {}", h.error().message);
          return;
        }
        const auto rank = h->get().getRank();
        if (static_cast<int>(h->get().getWorld()) != st.cfg.world ||
            static_cast<int>(rank) >= st.cfg.world) {
          spdlog::warn("train coordinator: hello of rank {} of {} in a run of {}", rank,
                       h->get().getWorld(), st.cfg.world);
          return;
        }
        if (st.used.count(sender->address()) != 0) return;  // a member of a broken group
        auto who = caf::actor_cast<caf::actor>(sender);
        self->monitor(who);
        const auto a = h->get().getAddress();
        const auto* p = reinterpret_cast<const std::byte*>(a.begin());
        st.pending[static_cast<int>(rank)] = hello{who, {p, p + a.size()}};
        if (static_cast<int>(st.pending.size()) == st.cfg.world) form_group(self);
      },
      [self](t_started_atom, const envelope& env) {
        auto s = env.read<wire::TrainerStarted>();
        if (!s || member_rank(self) != 0 || s->get().getGeneration() != self->state.generation) {
          return;
        }
        if (self->state.cfg.events.on_started) {
          self->state.cfg.events.on_started(s->get().getFirstStep());
        }
      },
      [self](t_step_atom, const envelope& env) {
        auto s = env.read<wire::TrainerStep>();
        if (!s || member_rank(self) != 0 || s->get().getGeneration() != self->state.generation) {
          return;
        }
        gpu::train::step_record r;
        r.step = s->get().getStep();
        r.loss = s->get().getLoss();
        r.lr = s->get().getLr();
        r.grad_norm = s->get().getGradNorm();
        r.tokens = s->get().getTokens();
        if (self->state.cfg.events.on_step) {
          self->state.cfg.events.on_step(r, s->get().getSeconds(), s->get().getReduceSeconds(),
                                         s->get().getCheckpointed());
        }
      },
      [self](t_eval_atom, const envelope& env) {
        auto s = env.read<wire::TrainerEval>();
        if (!s || member_rank(self) != 0 || s->get().getGeneration() != self->state.generation) {
          return;
        }
        gpu::train::eval_record e;
        e.step = s->get().getStep();
        e.loss = s->get().getLoss();
        e.tokens = s->get().getTokens();
        e.examples = s->get().getExamples();
        e.seconds = s->get().getSeconds();
        if (self->state.cfg.events.on_eval) self->state.cfg.events.on_eval(e);
      },
      [self](t_done_atom, const envelope& env) {
        auto d = env.read<wire::TrainerDone>();
        if (!d) return;
        const int rank = member_rank(self);
        // A fatal error counts from any rank that said hello (a rank may fail before its group
        // forms, e.g. on bad data); the rest only from the current group.
        const bool fatal = d->get().getFatal();
        if (rank < 0 && !fatal) return;
        if (rank >= 0 && d->get().getGeneration() != self->state.generation) return;
        rank_done rd;
        rd.rank = static_cast<int>(d->get().getRank());
        rd.step = d->get().getStep();
        rd.first_step = d->get().getFirstStep();
        rd.stopped = d->get().getStopped();
        rd.error = d->get().getError().cStr();
        rd.fatal = fatal;
        if (self->state.cfg.events.on_done) self->state.cfg.events.on_done(rd);
      },
      [self](t_stop_atom) {
        self->state.stop_requested = true;
        for (const auto& m : self->state.members) self->send(m, t_stop_atom::value);
      },
  };
}

}  // namespace

caf::actor spawn_train_coordinator(caf::actor_system& sys, coordinator_config cfg) {
  return sys.spawn(coordinator, std::move(cfg));
}

}  // namespace weft::train
