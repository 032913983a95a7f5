// The same behaviour checked on every engine that can run here: inproc, UCX over tcp, UCX over
// shm. Every transfer is verified by checksum.

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "tests/unit/transport/engine_pair.hpp"

namespace weft::transport::testing {
namespace {

struct engine_case {
  std::string label;
  std::string name;
  std::map<std::string, std::string> params;
};

std::ostream& operator<<(std::ostream& os, const engine_case& c) {
  return os << c.label;
}

class transport_conformance : public ::testing::TestWithParam<engine_case> {
 protected:
  void SetUp() override {
    engine_config cfg;
    cfg.params = GetParam().params;
    cfg.default_timeout_ms = 20'000;
    p_ = make_engine_pair(GetParam().name, cfg);
    ASSERT_TRUE(p_.a && p_.b);
  }

  region alloc(engine& e, std::size_t n) {
    auto r = e.allocate_memory(n);
    EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
    return r.ok() ? *r : region{};
  }

  void put_and_get(std::size_t size, bool target_allocated) {
    std::vector<std::byte> src_mem(size), target_mem(size), back_mem(size);
    fill_pattern(src_mem, size);
    auto src = p_.a->register_memory(src_mem.data(), size);
    auto back = p_.a->register_memory(back_mem.data(), size);
    ASSERT_TRUE(src.ok() && back.ok());
    region target =
        target_allocated ? alloc(*p_.b, size) : *p_.b->register_memory(target_mem.data(), size);
    std::memset(target.data, 0, size);
    remote_region rr = import_region(*p_.b, target, *p_.a, p_.a_to_b);
    ASSERT_NE(rr.id, 0u);
    ASSERT_EQ(rr.size_bytes, size);

    std::atomic<int> callbacks{0};
    auto t = p_.a->put({.peer = p_.a_to_b, .local = *src, .remote = rr, .size_bytes = size},
                       [&](const completion& c) {
                         EXPECT_TRUE(c.result.ok()) << c.result.to_string();
                         ++callbacks;
                       });
    ASSERT_TRUE(t.ok()) << t.error().to_string();
    completion c = p_.a->wait(*t);
    ASSERT_TRUE(c.result.ok()) << c.result.to_string();
    EXPECT_EQ(c.size_bytes, size);
    EXPECT_EQ(callbacks.load(), 1);
    EXPECT_EQ(checksum_of(target, 0, size), checksum(src_mem));

    auto g = p_.a->get({.peer = p_.a_to_b, .local = *back, .remote = rr, .size_bytes = size}, {});
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    c = p_.a->wait(*g);
    ASSERT_TRUE(c.result.ok()) << c.result.to_string();
    EXPECT_EQ(checksum(back_mem), checksum(src_mem));

    EXPECT_TRUE(p_.a->release_remote(rr).ok());
    EXPECT_TRUE(p_.b->release_memory(target).ok());
    EXPECT_TRUE(p_.a->release_memory(*src).ok());
    EXPECT_TRUE(p_.a->release_memory(*back).ok());
  }

  engine_pair p_;
};

TEST_P(transport_conformance, reports_capabilities) {
  capabilities c = p_.a->caps();
  EXPECT_EQ(c.name, GetParam().name);
  EXPECT_TRUE(c.one_sided);
  EXPECT_TRUE(c.tagged);
}

TEST_P(transport_conformance, put_get_1mib_into_allocated_memory) {
  put_and_get(1 << 20, true);
}
TEST_P(transport_conformance, put_get_1mib_into_registered_memory) {
  put_and_get(1 << 20, false);
}
TEST_P(transport_conformance, put_get_64mib_into_allocated_memory) {
  put_and_get(64 << 20, true);
}

TEST_P(transport_conformance, put_at_offsets) {
  const std::size_t n = 1 << 16;
  region src = alloc(*p_.a, n);
  region dst = alloc(*p_.b, 4 * n);
  fill_pattern({src.data, n}, 7);
  std::memset(dst.data, 0, 4 * n);
  remote_region rr = import_region(*p_.b, dst, *p_.a, p_.a_to_b);
  auto t = p_.a->put({.peer = p_.a_to_b,
                      .local = src,
                      .local_offset_bytes = 100,
                      .remote = rr,
                      .remote_offset_bytes = 3 * n,
                      .size_bytes = n - 100},
                     {});
  ASSERT_TRUE(t.ok());
  ASSERT_TRUE(p_.a->wait(*t).result.ok());
  EXPECT_EQ(checksum_of(dst, 3 * n, n - 100), checksum_of(src, 100, n - 100));
  EXPECT_EQ(checksum_of(dst, 0, 3 * n), checksum(std::vector<std::byte>(3 * n).data(), 3 * n));
}

TEST_P(transport_conformance, batched_put_and_get_of_scattered_blocks) {
  // 16 blocks of 64 KiB from scattered source offsets into scattered target offsets, as the KV
  // blocks of one request would move.
  const std::size_t block = 64 << 10, n_blocks = 16, pool = 64 * block;
  region src = alloc(*p_.a, pool);
  region back = alloc(*p_.a, pool);
  region dst = alloc(*p_.b, pool);
  fill_pattern({src.data, pool}, 21);
  std::memset(dst.data, 0, pool);
  std::memset(back.data, 0, pool);
  remote_region rr = import_region(*p_.b, dst, *p_.a, p_.a_to_b);
  rma_batch_request batch{.peer = p_.a_to_b};
  for (std::size_t i = 0; i < n_blocks; ++i) {
    batch.segments.push_back({.local = src,
                              .local_offset_bytes = (i * 5 % 64) * block,
                              .remote = rr,
                              .remote_offset_bytes = (i * 3 + 1) * block,
                              .size_bytes = block});
  }
  auto t = p_.a->put_batch(batch, {});
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  completion c = p_.a->wait(*t);
  ASSERT_TRUE(c.result.ok()) << c.result.to_string();
  EXPECT_EQ(c.size_bytes, n_blocks * block);
  for (const rma_segment& sg : batch.segments) {
    EXPECT_EQ(checksum_of(dst, sg.remote_offset_bytes, block),
              checksum_of(src, sg.local_offset_bytes, block));
  }
  // Read them back into other offsets.
  for (auto& sg : batch.segments) sg.local = back;
  auto g = p_.a->get_batch(batch, {});
  ASSERT_TRUE(g.ok()) << g.error().to_string();
  ASSERT_TRUE(p_.a->wait(*g).result.ok());
  for (const rma_segment& sg : batch.segments) {
    EXPECT_EQ(checksum_of(back, sg.local_offset_bytes, block),
              checksum_of(dst, sg.remote_offset_bytes, block));
  }
}

TEST_P(transport_conformance, batch_with_one_bad_segment_moves_nothing) {
  const std::size_t block = 4096;
  region src = alloc(*p_.a, 8 * block);
  region dst = alloc(*p_.b, 8 * block);
  fill_pattern({src.data, 8 * block}, 4);
  std::memset(dst.data, 0, 8 * block);
  remote_region rr = import_region(*p_.b, dst, *p_.a, p_.a_to_b);
  rma_batch_request batch{.peer = p_.a_to_b};
  for (std::size_t i = 0; i < 8; ++i) {
    batch.segments.push_back({.local = src,
                              .local_offset_bytes = i * block,
                              .remote = rr,
                              .remote_offset_bytes = i * block,
                              .size_bytes = block});
  }
  batch.segments[5].remote_offset_bytes = 8 * block;  // one past the end
  auto t = p_.a->put_batch(batch, {});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, status_code::invalid_argument);
  EXPECT_EQ(checksum_of(dst, 0, 8 * block),
            checksum(std::vector<std::byte>(8 * block).data(), 8 * block));
  EXPECT_EQ(p_.a->put_batch({.peer = p_.a_to_b}, {}).error().code, status_code::invalid_argument);
}

TEST_P(transport_conformance, tagged_send_recv_1mib_and_64mib) {
  for (std::size_t size : {std::size_t{1} << 20, std::size_t{64} << 20}) {
    region src = alloc(*p_.a, size);
    region dst = alloc(*p_.b, size);
    fill_pattern({src.data, size}, size + 1);
    std::memset(dst.data, 0, size);
    auto r = p_.b->recv({.tag = 0x42, .local = dst, .size_bytes = size}, {});
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    auto s = p_.a->send({.peer = p_.a_to_b, .tag = 0x42, .local = src, .size_bytes = size}, {});
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    EXPECT_TRUE(p_.a->wait(*s).result.ok());
    completion c = p_.b->wait(*r);
    ASSERT_TRUE(c.result.ok()) << c.result.to_string();
    EXPECT_EQ(c.size_bytes, size);
    EXPECT_EQ(c.tag, 0x42u);
    EXPECT_EQ(checksum_of(dst, 0, size), checksum_of(src, 0, size));
    EXPECT_TRUE(p_.a->release_memory(src).ok());
    EXPECT_TRUE(p_.b->release_memory(dst).ok());
  }
}

TEST_P(transport_conformance, recv_matches_by_tag_and_mask) {
  region src = alloc(*p_.a, 64);
  region dst1 = alloc(*p_.b, 64);
  region dst2 = alloc(*p_.b, 64);
  std::memset(src.data, 1, 64);
  // Sent before any receive is posted: the message waits as unexpected.
  auto s1 = p_.a->send({.peer = p_.a_to_b, .tag = 0x1007, .local = src, .size_bytes = 10}, {});
  ASSERT_TRUE(s1.ok());
  ASSERT_TRUE(p_.a->wait(*s1).result.ok());
  auto r2 = p_.b->recv({.tag = 0x2000, .tag_mask = 0xff00, .local = dst2, .size_bytes = 64}, {});
  auto r1 = p_.b->recv({.tag = 0x1000, .tag_mask = 0xff00, .local = dst1, .size_bytes = 64}, {});
  ASSERT_TRUE(r1.ok() && r2.ok());
  completion c1 = p_.b->wait(*r1);
  ASSERT_TRUE(c1.result.ok()) << c1.result.to_string();
  EXPECT_EQ(c1.tag, 0x1007u);
  EXPECT_EQ(c1.size_bytes, 10u);
  EXPECT_FALSE(r2->done());
  EXPECT_TRUE(p_.b->cancel(*r2).ok());
  completion c2 = p_.b->wait(*r2);
  EXPECT_EQ(c2.result.code, status_code::canceled) << c2.result.to_string();
}

TEST_P(transport_conformance, recv_without_sender_times_out) {
  region dst = alloc(*p_.b, 256);
  auto start = clock::now();
  auto r =
      p_.b->recv({.tag = 9, .local = dst, .size_bytes = 256, .options = {.timeout_ms = 50}}, {});
  ASSERT_TRUE(r.ok());
  completion c = p_.b->wait(*r);
  EXPECT_EQ(c.result.code, status_code::timeout) << c.result.to_string();
  EXPECT_GE(clock::now() - start, std::chrono::milliseconds(50));
  // The region is free again once the timed-out receive is gone.
  EXPECT_TRUE(p_.b->release_memory(dst).ok());
}

TEST_P(transport_conformance, message_larger_than_receive_buffer_is_an_error) {
  region src = alloc(*p_.a, 4096);
  region dst = alloc(*p_.b, 4096);
  auto r = p_.b->recv({.tag = 5, .local = dst, .size_bytes = 100}, {});
  auto s = p_.a->send({.peer = p_.a_to_b, .tag = 5, .local = src, .size_bytes = 4096}, {});
  ASSERT_TRUE(r.ok() && s.ok());
  completion c = p_.b->wait(*r);
  EXPECT_FALSE(c.result.ok());
  p_.a->wait(*s);
}

TEST_P(transport_conformance, out_of_bounds_requests_are_rejected) {
  region src = alloc(*p_.a, 1024);
  region dst = alloc(*p_.b, 512);
  remote_region rr = import_region(*p_.b, dst, *p_.a, p_.a_to_b);
  auto t = p_.a->put({.peer = p_.a_to_b, .local = src, .remote = rr, .size_bytes = 1024}, {});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, status_code::invalid_argument);
  t = p_.a->put({.peer = p_.a_to_b,
                 .local = src,
                 .local_offset_bytes = 1000,
                 .remote = rr,
                 .size_bytes = 100},
                {});
  EXPECT_EQ(t.error().code, status_code::invalid_argument);
  t = p_.a->put({.peer = p_.a_to_b,
                 .local = src,
                 .remote = rr,
                 .remote_offset_bytes = ~0ull,
                 .size_bytes = 1},
                {});
  EXPECT_EQ(t.error().code, status_code::invalid_argument);
  t = p_.a->put({.peer = peer_handle{999}, .local = src, .remote = rr, .size_bytes = 1}, {});
  EXPECT_EQ(t.error().code, status_code::invalid_argument);
  t = p_.a->get({.peer = p_.a_to_b, .local = region{}, .remote = rr, .size_bytes = 1}, {});
  EXPECT_EQ(t.error().code, status_code::invalid_argument);
  EXPECT_EQ(p_.a->release_memory(region{12345}).code, status_code::invalid_argument);
}

TEST_P(transport_conformance, malformed_address_and_descriptor_bytes_are_rejected) {
  region dst = alloc(*p_.b, 4096);
  auto desc = p_.b->describe(dst);
  auto addr = p_.b->local_address();
  ASSERT_TRUE(desc.ok() && addr.ok());

  std::vector<bytes> bad;
  bad.push_back({});
  bad.push_back(bytes(3, std::byte{0xff}));
  bytes random(desc->size());
  fill_pattern(random, 99);
  bad.push_back(random);
  bytes truncated(desc->begin(), desc->end() - 9);
  bad.push_back(truncated);
  for (std::size_t i = 0; i < desc->size(); i += 7) {
    bytes flipped = *desc;
    flipped[i] ^= std::byte{0x5a};
    bad.push_back(flipped);
  }
  for (const bytes& b : bad) {
    auto rr = p_.a->import_remote(p_.a_to_b, b);
    ASSERT_FALSE(rr.ok());
    EXPECT_EQ(rr.error().code, status_code::invalid_argument);
    auto peer = p_.a->connect(b);
    ASSERT_FALSE(peer.ok());
    EXPECT_EQ(peer.error().code, status_code::invalid_argument);
  }
  // An address is not a descriptor and vice versa.
  EXPECT_EQ(p_.a->import_remote(p_.a_to_b, *addr).error().code, status_code::invalid_argument);
  EXPECT_EQ(p_.a->connect(*desc).error().code, status_code::invalid_argument);
  // The engine still works afterwards.
  EXPECT_TRUE(p_.a->import_remote(p_.a_to_b, *desc).ok());
}

TEST_P(transport_conformance, callbacks_may_start_new_transfers) {
  region src = alloc(*p_.a, 4096);
  region dst = alloc(*p_.b, 4096);
  fill_pattern({src.data, 4096}, 3);
  remote_region rr = import_region(*p_.b, dst, *p_.a, p_.a_to_b);
  std::atomic<int> chain{0};
  transfer second;
  std::mutex m;
  auto t = p_.a->put({.peer = p_.a_to_b, .local = src, .remote = rr, .size_bytes = 2048},
                     [&](const completion&) {
                       auto t2 = p_.a->put({.peer = p_.a_to_b,
                                            .local = src,
                                            .local_offset_bytes = 2048,
                                            .remote = rr,
                                            .remote_offset_bytes = 2048,
                                            .size_bytes = 2048},
                                           [&](const completion&) { ++chain; });
                       std::lock_guard<std::mutex> lock(m);
                       if (t2.ok()) second = *t2;
                       ++chain;
                     });
  ASSERT_TRUE(t.ok());
  p_.a->wait(*t);
  transfer t2;
  {
    std::lock_guard<std::mutex> lock(m);
    t2 = second;
  }
  ASSERT_TRUE(t2.valid());
  EXPECT_TRUE(p_.a->wait(t2).result.ok());
  EXPECT_EQ(chain.load(), 2);
  EXPECT_EQ(checksum_of(dst, 0, 4096), checksum_of(src, 0, 4096));
}

INSTANTIATE_TEST_SUITE_P(
    engines, transport_conformance,
    ::testing::Values(engine_case{"inproc", "inproc", {}},
                      engine_case{"ucx_tcp", "ucx", {{"ucx.tls", "tcp"}}},
                      engine_case{"ucx_shm", "ucx", {{"ucx.tls", "shm"}}},
                      // The decorator with an empty policy must be invisible.
                      engine_case{"fault_inproc", "fault:inproc", {}},
                      engine_case{"fault_ucx_shm", "fault:ucx", {{"ucx.tls", "shm"}}}),
    [](const ::testing::TestParamInfo<engine_case>& info) { return info.param.label; });

}  // namespace
}  // namespace weft::transport::testing
