#pragma once
// Two connected engines in one process, each holding the other's address and one region of the
// other imported: the fixture every transport test starts from.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "transport/checksum.hpp"
#include "transport/registry.hpp"

namespace weft::transport::testing {

struct engine_pair {
  std::unique_ptr<engine> a;
  std::unique_ptr<engine> b;
  peer_handle a_to_b;
  peer_handle b_to_a;
};

/// Makes two engines of `name` with `config` and connects them both ways.
inline engine_pair make_engine_pair(const std::string& name, const engine_config& config) {
  engine_pair p;
  auto a = make_engine(name, config);
  auto b = make_engine(name, config);
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.error().to_string());
  EXPECT_TRUE(b.ok()) << (b.ok() ? "" : b.error().to_string());
  if (!a.ok() || !b.ok()) return p;
  p.a = std::move(*a);
  p.b = std::move(*b);
  auto addr_a = p.a->local_address();
  auto addr_b = p.b->local_address();
  EXPECT_TRUE(addr_a.ok() && addr_b.ok());
  auto ab = p.a->connect(*addr_b);
  auto ba = p.b->connect(*addr_a);
  EXPECT_TRUE(ab.ok()) << (ab.ok() ? "" : ab.error().to_string());
  EXPECT_TRUE(ba.ok()) << (ba.ok() ? "" : ba.error().to_string());
  if (ab.ok()) p.a_to_b = *ab;
  if (ba.ok()) p.b_to_a = *ba;
  return p;
}

/// Imports region `r` of `owner` into `user` over `peer` (user's handle for owner).
inline remote_region import_region(engine& owner, const region& r, engine& user, peer_handle peer) {
  auto desc = owner.describe(r);
  EXPECT_TRUE(desc.ok());
  auto rr = user.import_remote(peer, *desc);
  EXPECT_TRUE(rr.ok()) << (rr.ok() ? "" : rr.error().to_string());
  return rr.ok() ? *rr : remote_region{};
}

inline std::uint64_t checksum_of(const region& r, std::size_t offset, std::size_t size) {
  return checksum(r.data + offset, size);
}

}  // namespace weft::transport::testing
