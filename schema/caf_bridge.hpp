#pragma once
/// Makes a weft::schema::envelope the body of a CAF message.
///
/// In a process CAF passes message elements by reference count, so an envelope travels without any
/// copy of its bytes. Across processes CAF's serializer writes (kind, size, bytes) and the
/// receiving side reads them back into word-aligned storage; a size above the hard limit is skipped
/// in chunks and arrives as kind::oversize, so a hostile peer cannot make a node allocate. Decoding
/// and validation happen later, in envelope::read<T>(), so the handler can answer with an error
/// reply.
///
/// Include this header in every TU that sends or receives envelopes through CAF (inspect must be
/// visible), and call add_message_types() on every actor_system_config.

#include <caf/actor_system_config.hpp>
#include <caf/deserializer.hpp>
#include <caf/meta/type_name.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>

#include <array>
#include <type_traits>

#include "schema/envelope.hpp"

namespace weft::schema {

/// Bytes of one envelope that a node accepts from the wire at most.
inline constexpr uint32_t max_wire_envelope_bytes = 4u << 20;

/// Registers weft's message types with CAF; call on every node's config (STACK_NOTES: unannounced
/// types connect but fail at send time).
void add_message_types(caf::actor_system_config& cfg);

template <class Inspector>
typename std::enable_if<Inspector::reads_state, typename Inspector::result_type>::type inspect(
    Inspector& f, envelope& x) {
  if constexpr (std::is_base_of_v<caf::serializer, Inspector>) {
    auto k = static_cast<uint16_t>(x.what());
    auto bytes = x.to_bytes();
    auto size = static_cast<uint32_t>(bytes.size());
    if (auto err = f(k, size)) return err;
    return size > 0 ? f.apply_raw(size, bytes.data()) : caf::error{};
  } else {
    // Stringification (to_string, logs): kind and size only.
    std::string desc =
        std::string{to_string(x.what())} + "(" + std::to_string(x.size_bytes()) + " B)";
    return f(caf::meta::type_name("weft.envelope"), desc);
  }
}

template <class Inspector>
typename std::enable_if<Inspector::writes_state, typename Inspector::result_type>::type inspect(
    Inspector& f, envelope& x) {
  static_assert(std::is_base_of_v<caf::deserializer, Inspector>,
                "envelopes are loaded only by CAF deserializers");
  uint16_t k = 0;
  uint32_t size = 0;
  if (auto err = f(k, size)) return err;
  if (size > max_wire_envelope_bytes) {
    // Skip the bytes without storing them; the handler sees kind::oversize and answers an error.
    std::array<std::byte, 4096> scratch{};
    for (uint32_t left = size; left > 0;) {
      uint32_t n = left < scratch.size() ? left : static_cast<uint32_t>(scratch.size());
      if (auto err = f.apply_raw(n, scratch.data())) return err;
      left -= n;
    }
    x = envelope::oversize(size);
    return caf::error{};
  }
  std::vector<std::byte> bytes(size);
  if (size > 0) {
    if (auto err = f.apply_raw(size, bytes.data())) return err;
  }
  x = envelope::from_bytes(static_cast<kind>(k), bytes);
  return caf::error{};
}

}  // namespace weft::schema
