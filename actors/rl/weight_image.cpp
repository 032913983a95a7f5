#include "actors/rl/weight_image.hpp"

#include <algorithm>
#include <cstring>
#include <future>

#include "transport/checksum.hpp"

namespace weft::rl {

namespace wire = schema::wire;

namespace {

std::span<const std::byte> as_bytes(capnp::Data::Reader d) {
  return {reinterpret_cast<const std::byte*>(d.begin()), d.size()};
}

error from_transport(const std::string& what, const transport::status& s) {
  return make_error(s.code == transport::status_code::timeout ? errc::timeout : errc::unavailable,
                    what + ": " + s.to_string());
}

}  // namespace

result<std::unique_ptr<weight_image>> weight_image::create(
    transport::engine& engine, std::span<const gpu::rl::named_weights> tensors) {
  std::unique_ptr<weight_image> img(new weight_image(engine));
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    img->entries_.push_back(entry{std::string(t.name), offset, t.values.size()});
    offset += t.values.size() * sizeof(float);
  }
  if (offset == 0) return make_error(errc::invalid_argument, "weight image: no tensors");
  auto r = engine.allocate_memory(offset);
  if (!r) return from_transport("weight image of " + std::to_string(offset) + " bytes", r.error());
  img->region_ = *r;
  return img;
}

weight_image::~weight_image() {
  if (region_.id != 0) (void)engine_.release_memory(region_);
}

status weight_image::fill(int64_t version, std::span<const gpu::rl::named_weights> tensors) {
  if (tensors.size() != entries_.size()) {
    return make_error(errc::invalid_argument, "weight image: " + std::to_string(tensors.size()) +
                                                  " tensors, the layout has " +
                                                  std::to_string(entries_.size()));
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const entry& e = entries_[i];
    if (tensors[i].name != e.name || tensors[i].values.size() != e.count) {
      return make_error(errc::invalid_argument, "weight image: tensor " +
                                                    std::string(tensors[i].name) +
                                                    " does not match the layout's " + e.name);
    }
    std::memcpy(region_.data + e.offset, tensors[i].values.data(), e.count * sizeof(float));
  }
  checksum_ = transport::checksum(region_.data, region_.size_bytes);
  version_ = version;
  return {};
}

result<schema::envelope> weight_image::offer(uint32_t timeout_ms,
                                             const transport::bytes* peer_address,
                                             const transport::bytes* peer_region) const {
  auto address = peer_address != nullptr ? transport::result<transport::bytes>(*peer_address)
                                         : engine_.local_address();
  if (!address) return from_transport("weight image: the engine's address", address.error());
  auto desc = peer_region != nullptr ? transport::result<transport::bytes>(*peer_region)
                                     : engine_.describe(region_);
  if (!desc) return from_transport("weight image: the region's descriptor", desc.error());
  return schema::envelope::build<wire::WeightOffer>([&](wire::WeightOffer::Builder b) {
    b.setVersion(version_);
    b.setAddress(
        kj::arrayPtr(reinterpret_cast<const capnp::byte*>(address->data()), address->size()));
    b.setRegion(kj::arrayPtr(reinterpret_cast<const capnp::byte*>(desc->data()), desc->size()));
    b.setImageBytes(region_.size_bytes);
    b.setChecksum(checksum_);
    auto list = b.initTensors(static_cast<unsigned>(entries_.size()));
    for (size_t i = 0; i < entries_.size(); ++i) {
      list[static_cast<unsigned>(i)].setName(entries_[i].name);
      list[static_cast<unsigned>(i)].setOffset(entries_[i].offset);
      list[static_cast<unsigned>(i)].setCount(entries_[i].count);
    }
    b.setBucketBytes(weight_bucket_bytes);
    b.setTimeoutMs(timeout_ms);
  });
}

transport::bytes weight_receiver::describe() const {
  if (buffer_.id == 0) return {};
  auto d = engine_.describe(buffer_);
  return d ? *d : transport::bytes{};
}

weight_receiver::~weight_receiver() {
  if (buffer_.id != 0) (void)engine_.release_memory(buffer_);
}

result<std::vector<gpu::rl::named_weights>> weight_receiver::pull(
    const wire::WeightOffer::Reader& offer) {
  const uint64_t bytes = offer.getImageBytes();
  const uint64_t bucket = std::max<uint64_t>(offer.getBucketBytes(), 1u << 20);
  if (bytes == 0 || bytes > (64ull << 30)) {
    return make_error(errc::malformed,
                      "weight offer: an image of " + std::to_string(bytes) + " bytes");
  }
  // The tensor table must lie inside the image, f32-aligned, without overlaps past its end.
  std::vector<gpu::rl::named_weights> out;
  names_.clear();
  for (auto t : offer.getTensors()) {
    const uint64_t off = t.getOffset(), n = t.getCount();
    if (off % sizeof(float) != 0 || n > bytes / sizeof(float) || off > bytes - n * sizeof(float)) {
      return make_error(errc::malformed, "weight offer: tensor " + std::string(t.getName().cStr()) +
                                             " lies outside the image");
    }
    names_.emplace_back(t.getName().cStr());
  }
  if (buffer_.id != 0 && buffer_.size_bytes != bytes) {
    (void)engine_.release_memory(buffer_);
    buffer_ = {};
  }
  if (buffer_.id == 0) {
    auto r = engine_.allocate_memory(bytes);
    if (!r)
      return from_transport("weight buffer of " + std::to_string(bytes) + " bytes", r.error());
    buffer_ = *r;
  }
  auto peer = engine_.connect(as_bytes(offer.getAddress()));
  if (!peer) return from_transport("weight source", peer.error());
  auto remote = engine_.import_remote(*peer, as_bytes(offer.getRegion()));
  if (!remote) {
    (void)engine_.disconnect(*peer);
    return from_transport("weight source's region", remote.error());
  }
  transport::rma_batch_request req;
  req.peer = *peer;
  req.options.timeout_ms = std::max<uint32_t>(offer.getTimeoutMs(), 100);
  for (uint64_t at = 0; at < bytes; at += bucket) {
    req.segments.push_back(
        transport::rma_segment{buffer_, at, *remote, at, std::min<uint64_t>(bucket, bytes - at)});
  }
  auto done = std::make_shared<std::promise<transport::completion>>();
  auto fut = done->get_future();
  auto started = transport::get_all(engine_, req,
                                    [done](const transport::completion& c) { done->set_value(c); });
  status st;
  if (!started) {
    st = from_transport("pulling the weights", started.error());
  } else {
    const transport::completion c = fut.get();
    if (!c.result.ok()) st = from_transport("pulling the weights", c.result);
  }
  (void)engine_.release_remote(*remote);
  (void)engine_.disconnect(*peer);
  if (!st.ok()) return st;
  if (transport::checksum(buffer_.data, bytes) != offer.getChecksum()) {
    return make_error(errc::malformed, "weight version " + std::to_string(offer.getVersion()) +
                                           ": checksum mismatch after the pull");
  }
  size_t i = 0;
  for (auto t : offer.getTensors()) {
    out.push_back(gpu::rl::named_weights{
        names_[i++],
        std::span<const float>(reinterpret_cast<const float*>(buffer_.data + t.getOffset()),
                               static_cast<size_t>(t.getCount()))});
  }
  return out;
}

}  // namespace weft::rl
