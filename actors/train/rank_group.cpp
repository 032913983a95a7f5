#include "actors/train/rank_group.hpp"

#include <unistd.h>
#include <caf/all.hpp>

#include "actors/train/train_atoms.hpp"
#include "schema/caf_bridge.hpp"

namespace weft::train {

using schema::envelope;
namespace wire = schema::wire;

void rank_shared::offer_group(const envelope& env) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (group) return;
    group = env;
  }
  cv.notify_all();
}

result<joined_group> join_group(transport::engine& engine, rank_shared& shared,
                                const caf::actor& self, const caf::actor& coordinator, int rank,
                                int world, uint32_t timeout_ms) {
  auto address = engine.local_address();
  if (!address) return make_error(errc::unavailable, "transport: " + address.error().message);
  caf::send_as(self, coordinator, t_hello_atom::value,
               envelope::build<wire::TrainerHello>([&](wire::TrainerHello::Builder b) {
                 b.setRank(static_cast<uint32_t>(rank));
                 b.setWorld(static_cast<uint32_t>(world));
                 b.setAddress(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(address->data()),
                                           address->size()));
                 b.setPid(static_cast<uint32_t>(::getpid()));
               }));
  envelope group_env;
  {
    std::unique_lock<std::mutex> lock(shared.mu);
    shared.cv.wait(lock, [&] { return shared.abort || shared.group.has_value(); });
    if (shared.abort) return joined_group{};
    group_env = *shared.group;
  }
  auto g = group_env.read<wire::TrainerGroup>();
  if (!g) return g.error();
  joined_group out;
  out.generation = g->get().getGeneration();
  out.resume = g->get().getResume();
  std::vector<transport::bytes> addresses;
  for (auto a : g->get().getAddresses()) {
    const auto* p = reinterpret_cast<const std::byte*>(a.begin());
    addresses.emplace_back(p, p + a.size());
  }
  if (addresses.size() != static_cast<size_t>(world)) {
    return make_error(errc::malformed, "the group has " + std::to_string(addresses.size()) +
                                           " members, this run " + std::to_string(world));
  }
  transport::group_options go;
  go.timeout_ms = timeout_ms;
  go.generation = out.generation;
  auto peers = transport::peer_group::connect(engine, rank, addresses, go);
  if (!peers) return make_error(errc::unavailable, peers.error().to_string());
  out.peers = std::move(*peers);
  std::lock_guard<std::mutex> lock(shared.mu);
  if (shared.abort) return joined_group{};
  shared.peers = out.peers.get();
  return out;
}

void run_beside(caf::local_actor* self, std::shared_ptr<rank_shared> shared,
                std::function<void()> loop) {
  auto thread = std::make_shared<std::thread>(std::move(loop));
  self->attach_functor([shared, thread](const caf::error&) {
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->abort = true;
      if (shared->peers != nullptr) shared->peers->abort();
    }
    shared->cv.notify_all();
    if (thread->joinable()) thread->join();
  });
}

}  // namespace weft::train
