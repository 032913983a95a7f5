#include "transport/internal/envelope.hpp"

#include "transport/checksum.hpp"

namespace weft::transport::internal {

namespace {

constexpr std::uint32_t magic = 0x58544657;  // "WFTX"
constexpr std::uint16_t version = 1;
constexpr std::size_t header_bytes = 4 + 2 + 2 + 4;
constexpr std::size_t trailer_bytes = 8;

template <class T>
T load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

bytes seal(envelope_kind kind, std::span<const std::byte> payload) {
  byte_writer w;
  auto k = static_cast<std::uint16_t>(kind);
  auto n = static_cast<std::uint32_t>(payload.size());
  w.raw(&magic, 4);
  w.raw(&version, 2);
  w.raw(&k, 2);
  w.raw(&n, 4);
  w.raw(payload.data(), payload.size());
  std::uint64_t sum = checksum(w.out().data(), w.out().size());
  w.raw(&sum, 8);
  return std::move(w.out());
}

result<std::span<const std::byte>> open(envelope_kind kind, std::span<const std::byte> sealed) {
  auto bad = [&](const std::string& why) {
    return make_status(
        status_code::invalid_argument,
        "malformed transport envelope (" + std::to_string(sealed.size()) + " bytes): " + why);
  };
  if (sealed.size() < header_bytes + trailer_bytes) return bad("too short");
  const std::byte* p = sealed.data();
  if (load<std::uint32_t>(p) != magic) return bad("bad magic");
  if (load<std::uint16_t>(p + 4) != version) return bad("unsupported version");
  auto k = load<std::uint16_t>(p + 6);
  if (k != static_cast<std::uint16_t>(kind)) {
    return bad("kind " + std::to_string(k) + ", expected " +
               std::to_string(static_cast<std::uint16_t>(kind)));
  }
  auto n = load<std::uint32_t>(p + 8);
  if (n != sealed.size() - header_bytes - trailer_bytes) return bad("payload size mismatch");
  auto sum = load<std::uint64_t>(p + header_bytes + n);
  if (sum != checksum(p, header_bytes + n)) return bad("checksum mismatch");
  return sealed.subspan(header_bytes, n);
}

}  // namespace weft::transport::internal
