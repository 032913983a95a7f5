// Weight versions on the wire (actors/rl/weight_image): an image filled from named tensors, offered
// and pulled by a receiver in buckets, checksummed; hostile offers are refused with an error.

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "actors/rl/weight_image.hpp"
#include "transport/registry.hpp"

namespace weft::rl {
namespace {

namespace wire = schema::wire;

struct tensors {
  std::vector<float> a, b;
  std::vector<gpu::rl::named_weights> views() const {
    return {{"blk.0.attn_q.weight", a}, {"output_norm.weight", b}};
  }
};

tensors make(float base, size_t n) {
  tensors t;
  for (size_t i = 0; i < n; ++i) t.a.push_back(base + static_cast<float>(i) * 0.5f);
  for (size_t i = 0; i < 7; ++i) t.b.push_back(-base - static_cast<float>(i));
  return t;
}

/// An offer of `img` with one field of the tensor table changed.
schema::envelope tampered(const weight_image& img, uint64_t offset, uint64_t count) {
  auto env = img.offer(5'000);
  EXPECT_TRUE(env.ok());
  auto r = env->read<wire::WeightOffer>();
  EXPECT_TRUE(r.ok());
  return schema::envelope::build<wire::WeightOffer>([&](wire::WeightOffer::Builder b) {
    b.setVersion(r->get().getVersion());
    b.setAddress(r->get().getAddress());
    b.setRegion(r->get().getRegion());
    b.setImageBytes(r->get().getImageBytes());
    b.setChecksum(r->get().getChecksum());
    b.setBucketBytes(r->get().getBucketBytes());
    b.setTimeoutMs(r->get().getTimeoutMs());
    auto list = b.initTensors(1);
    list[0].setName("blk.0.attn_q.weight");
    list[0].setOffset(offset);
    list[0].setCount(count);
  });
}

TEST(weight_image, versions_are_pulled_bucket_by_bucket_and_arrive_bit_for_bit) {
  auto src = transport::make_engine("inproc");
  auto dst = transport::make_engine("inproc");
  ASSERT_TRUE(src.ok() && dst.ok());
  // 5 MiB of the first tensor: several 1 MiB buckets of the pull's smallest size and a tail.
  const size_t n = (5u << 20) / sizeof(float) + 3;
  tensors v1 = make(1.0f, n);
  auto img = weight_image::create(**src, v1.views());
  ASSERT_TRUE(img.ok()) << img.error().message;
  weight_receiver rx(**dst);
  for (int version = 1; version <= 2; ++version) {
    tensors v = make(static_cast<float>(version), n);
    ASSERT_TRUE((*img)->fill(version, v.views()).ok());
    auto env = (*img)->offer(5'000);
    ASSERT_TRUE(env.ok());
    auto offer = env->read<wire::WeightOffer>();
    ASSERT_TRUE(offer.ok());
    EXPECT_EQ(offer->get().getVersion(), version);
    auto got = rx.pull(offer->get());
    ASSERT_TRUE(got.ok()) << got.error().message;
    ASSERT_EQ(got->size(), 2u);
    EXPECT_EQ((*got)[0].name, "blk.0.attn_q.weight");
    ASSERT_EQ((*got)[0].values.size(), v.a.size());
    EXPECT_EQ(std::memcmp((*got)[0].values.data(), v.a.data(), v.a.size() * sizeof(float)), 0);
    ASSERT_EQ((*got)[1].values.size(), v.b.size());
    EXPECT_EQ(std::memcmp((*got)[1].values.data(), v.b.data(), v.b.size() * sizeof(float)), 0);
  }
}

TEST(weight_image, a_layout_that_does_not_match_is_refused) {
  auto src = transport::make_engine("inproc");
  ASSERT_TRUE(src.ok());
  tensors v = make(1.0f, 16);
  auto img = weight_image::create(**src, v.views());
  ASSERT_TRUE(img.ok());
  tensors other = make(1.0f, 17);
  EXPECT_FALSE((*img)->fill(1, other.views()).ok());
  EXPECT_FALSE((*img)->fill(1, std::span<const gpu::rl::named_weights>{}).ok());
}

TEST(weight_image, hostile_offers_are_refused_with_an_error) {
  auto src = transport::make_engine("inproc");
  auto dst = transport::make_engine("inproc");
  ASSERT_TRUE(src.ok() && dst.ok());
  tensors v = make(1.0f, 64);
  auto img = weight_image::create(**src, v.views());
  ASSERT_TRUE(img.ok());
  ASSERT_TRUE((*img)->fill(1, v.views()).ok());
  weight_receiver rx(**dst);
  const uint64_t bytes = (*img)->bytes();
  // A tensor beyond the image's end, one that overflows, one misaligned.
  for (auto [offset, count] :
       {std::pair<uint64_t, uint64_t>{bytes, 1}, std::pair<uint64_t, uint64_t>{8, ~uint64_t{0} / 2},
        std::pair<uint64_t, uint64_t>{2, 4}}) {
    auto env = tampered(**img, offset, count);
    auto offer = env.read<wire::WeightOffer>();
    ASSERT_TRUE(offer.ok());
    auto got = rx.pull(offer->get());
    EXPECT_FALSE(got.ok()) << offset << " " << count;
    if (!got.ok()) {
      EXPECT_EQ(got.error().code, errc::malformed);
    }
  }
  // A checksum that does not match the bytes: the pull happens, the version is refused.
  auto env = (*img)->offer(5'000);
  ASSERT_TRUE(env.ok());
  auto good = env->read<wire::WeightOffer>();
  ASSERT_TRUE(good.ok());
  auto bad = schema::envelope::build<wire::WeightOffer>([&](wire::WeightOffer::Builder b) {
    b.setVersion(1);
    b.setAddress(good->get().getAddress());
    b.setRegion(good->get().getRegion());
    b.setImageBytes(good->get().getImageBytes());
    b.setChecksum(good->get().getChecksum() ^ 1);
    b.setTimeoutMs(5'000);
    b.setTensors(good->get().getTensors());
  });
  auto offer = bad.read<wire::WeightOffer>();
  ASSERT_TRUE(offer.ok());
  auto got = rx.pull(offer->get());
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.error().message.find("checksum"), std::string::npos) << got.error().message;
  // Garbage address and region bytes: an error, no crash.
  auto junk = schema::envelope::build<wire::WeightOffer>([&](wire::WeightOffer::Builder b) {
    b.setVersion(2);
    const capnp::byte noise[5] = {1, 2, 3, 4, 5};
    b.setAddress(kj::arrayPtr(noise, 5));
    b.setRegion(kj::arrayPtr(noise, 5));
    b.setImageBytes(64);
    b.setTimeoutMs(200);
  });
  auto j = junk.read<wire::WeightOffer>();
  ASSERT_TRUE(j.ok());
  EXPECT_FALSE(rx.pull(j->get()).ok());
}

}  // namespace
}  // namespace weft::rl
