// Transfers through the fault-injecting transport between node processes: a dropped or corrupted
// transfer is reported to the requester as an explicit error — never silently lost or accepted.

#include "tests/support/local_cluster.hpp"

namespace weft::testing {
namespace {

schema::envelope pull(local_cluster& cluster, uint64_t deadline_ms) {
  auto& sys = cluster.system();
  auto src = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "blob", "src",
                                      R"({"size_bytes": 1048576, "seed": 3})");
  auto dst = actors::spawn_on_cluster(sys, cluster.head(), cluster.secret(), "blob", "dst",
                                      R"({"size_bytes": 1048576})");
  if (!src.ok() || !dst.ok()) throw std::runtime_error("spawn failed");
  caf::scoped_actor self{sys};
  schema::envelope descriptor, reply;
  self->request(*src, std::chrono::seconds(10), actors::region_atom::value)
      .receive([&](schema::envelope e) { descriptor = std::move(e); }, [&](caf::error&) {});
  auto d = descriptor.read<schema::wire::TransferRequest>();
  if (!d.ok()) throw std::runtime_error(d.error().to_string());
  auto req = schema::envelope::build<schema::wire::TransferRequest>([&](auto b) {
    b.setTransferId(9);
    b.setSource(d->get().getSource());
    b.setSizeBytes(d->get().getSizeBytes());
    b.setChecksum(d->get().getChecksum());
    b.setLayout("blob:u8");
    b.setDeadlineMs(actors::now_ms() + deadline_ms);
  });
  self->request(*dst, std::chrono::seconds(30), actors::transfer_atom::value, req)
      .receive([&](schema::envelope e) { reply = std::move(e); }, [&](caf::error&) {});
  return reply;
}

TEST(transfer_faults, a_dropped_transfer_times_out_at_its_deadline) {
  local_cluster cluster({.nodes = 2,
                         .extra_args = {"--transport", "fault:ucx", "--ucx-tls", "tcp",
                                        "--transport-param", "fault.drop_probability=1"}});
  auto t0 = std::chrono::steady_clock::now();
  auto reply = pull(cluster, 1500);
  auto ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0)
          .count();
  auto r = reply.read<schema::wire::TransferReply>();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_FALSE(r->get().getOk());
  EXPECT_EQ(r->get().getError().getCode(), schema::wire::ErrorCode::TIMEOUT);
  EXPECT_LT(ms, 10'000) << "the deadline bounds the wait";
}

TEST(transfer_faults, a_corrupted_transfer_is_caught_by_the_checksum) {
  local_cluster cluster({.nodes = 2,
                         .extra_args = {"--transport", "fault:ucx", "--ucx-tls", "tcp",
                                        "--transport-param", "fault.corrupt_probability=1"}});
  auto reply = pull(cluster, 10'000);
  auto r = reply.read<schema::wire::TransferReply>();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_FALSE(r->get().getOk());
  EXPECT_NE(std::string(r->get().getError().getMessage().cStr()).find("checksum"),
            std::string::npos);
}

TEST(transfer_faults, a_healthy_transfer_through_the_decorator_succeeds) {
  local_cluster cluster({.nodes = 2,
                         .extra_args = {"--transport", "fault:ucx", "--ucx-tls", "tcp",
                                        "--transport-param", "fault.delay_ms=50"}});
  auto reply = pull(cluster, 10'000);
  auto r = reply.read<schema::wire::TransferReply>();
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_TRUE(r->get().getOk()) << r->get().getError().getMessage().cStr();
}

}  // namespace
}  // namespace weft::testing
