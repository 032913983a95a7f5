#include "gpu/gguf_writer.hpp"

#include <cstring>
#include <limits>
#include <system_error>
#include <type_traits>

#include "gpu/direct_file.hpp"

namespace weft::gpu {

namespace {

class byte_sink {
 public:
  explicit byte_sink(std::vector<std::byte>& out) : out_(out) {}

  template <class T>
  requires std::is_trivially_copyable_v<T>
  void put(const T& v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    put_raw(s.data(), s.size());
  }
  void put_raw(const void* p, size_t n) {
    const size_t at = out_.size();
    out_.resize(at + n);
    if (n != 0) std::memcpy(out_.data() + at, p, n);
  }
  void pad_to(uint64_t alignment) {
    while (out_.size() % alignment != 0) out_.push_back(std::byte{0});
  }
  size_t size() const { return out_.size(); }

 private:
  std::vector<std::byte>& out_;
};

status put_array(byte_sink& sink, const gguf_array& a, const std::string& key);

status put_value(byte_sink& sink, const gguf_value& v, const std::string& key) {
  return std::visit(
      [&](const auto& x) -> status {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<X, std::string>) {
          sink.put_string(x);
        } else if constexpr (std::is_same_v<X, gguf_array>) {
          return put_array(sink, x, key);
        } else if constexpr (std::is_same_v<X, bool>) {
          sink.put<uint8_t>(x ? 1 : 0);
        } else {
          sink.put(x);
        }
        return {};
      },
      v.v);
}

status put_array(byte_sink& sink, const gguf_array& a, const std::string& key) {
  sink.put<uint32_t>(static_cast<uint32_t>(a.element_type()));
  sink.put<uint64_t>(a.size());
  return std::visit(
      [&](const auto& items) -> status {
        using E = typename std::decay_t<decltype(items)>::value_type;
        if constexpr (std::is_same_v<E, gguf_value>) {
          for (const auto& item : items) {
            const gguf_array* inner = item.as_array();
            if (inner == nullptr) {
              return status{
                  status_code::invalid_argument,
                  "gguf_writer: key '" + key + "': an array of arrays holds a non-array element"};
            }
            if (auto s = put_array(sink, *inner, key); !s) return s;
          }
        } else if constexpr (std::is_same_v<E, bool>) {
          for (bool b : items) sink.put<uint8_t>(b ? 1 : 0);
        } else if constexpr (std::is_same_v<E, std::string>) {
          for (const auto& s : items) sink.put_string(s);
        } else {
          sink.put_raw(items.data(), items.size() * sizeof(E));
        }
        return {};
      },
      a.items);
}

}  // namespace

gguf_writer::gguf_writer(gguf_writer_config config) : config_(config) {}

void gguf_writer::set(const std::string& key, gguf_value value) {
  for (auto& [k, v] : metadata_) {
    if (k == key) {
      v = std::move(value);
      return;
    }
  }
  metadata_.emplace_back(key, std::move(value));
}

status gguf_writer::add_tensor(const std::string& name, ggml_type type, std::span<const int64_t> ne,
                               std::span<const std::byte> data) {
  return add_tensor_bytes(name, type, ne, std::vector<std::byte>(data.begin(), data.end()));
}

status gguf_writer::add_tensor_bytes(const std::string& name, ggml_type type,
                                     std::span<const int64_t> ne, std::vector<std::byte> data) {
  const auto bad = [&](const std::string& what) {
    return status{status_code::invalid_argument, "gguf_writer: tensor '" + name + "': " + what};
  };
  if (name.empty() || name.size() > gguf_max_name_bytes) return bad("name must have 1 to 64 bytes");
  for (const auto& t : tensors_) {
    if (t.name == name) return bad("duplicate name");
  }
  if (!find_type_traits(static_cast<uint32_t>(type))) return bad("unknown type");
  if (ne.empty() || ne.size() > gguf_max_dims) return bad("needs 1 to 4 dimensions");
  int64_t n = 1;
  for (int64_t d : ne) {
    if (d <= 0 || n > std::numeric_limits<int64_t>::max() / d) return bad("invalid dimensions");
    n *= d;
  }
  const auto row = row_size_bytes(type, ne[0]);
  if (!row)
    return bad("row length is not a multiple of the block size of " + std::string(type_name(type)));
  const size_t expected = *row * static_cast<size_t>(n / ne[0]);
  if (data.size() != expected) {
    return bad("has " + std::to_string(data.size()) + " bytes of data, expected " +
               std::to_string(expected));
  }
  tensors_.push_back(
      pending_tensor{name, type, std::vector<int64_t>(ne.begin(), ne.end()), std::move(data)});
  return {};
}

status gguf_writer::add_tensor_from_f32(const std::string& name, ggml_type type,
                                        std::span<const int64_t> ne,
                                        std::span<const float> values) {
  if (ne.empty() || ne[0] <= 0) {
    return status{status_code::invalid_argument,
                  "gguf_writer: tensor '" + name + "': invalid dimensions"};
  }
  const auto row = row_size_bytes(type, ne[0]);
  if (!row || values.size() % static_cast<size_t>(ne[0]) != 0) {
    return status{status_code::invalid_argument, "gguf_writer: tensor '" + name +
                                                     "': row length does not fit type " +
                                                     std::string(type_name(type))};
  }
  const size_t n_rows = values.size() / static_cast<size_t>(ne[0]);
  std::vector<std::byte> bytes(*row * n_rows);
  for (size_t r = 0; r < n_rows; ++r) {
    const auto st = quantize_row(type, values.data() + r * static_cast<size_t>(ne[0]),
                                 bytes.data() + r * *row, ne[0]);
    if (st != row_status::ok) {
      return status{
          status_code::unsupported,
          "gguf_writer: tensor '" + name + "': cannot quantize to " + std::string(type_name(type))};
    }
  }
  return add_tensor_bytes(name, type, ne, std::move(bytes));
}

result<std::vector<std::byte>> gguf_writer::head_bytes() const {
  const uint32_t alignment = config_.alignment;
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return status{status_code::invalid_argument, "gguf_writer: alignment must be a power of two"};
  }
  auto metadata = metadata_;
  bool has_alignment_key = false;
  for (const auto& [k, v] : metadata) {
    if (k != "general.alignment") continue;
    has_alignment_key = true;
    const auto* a = std::get_if<uint32_t>(&v.v);
    if (a == nullptr || *a != alignment) {
      return status{
          status_code::invalid_argument,
          "gguf_writer: general.alignment must be a u32 equal to the configured alignment"};
    }
  }
  if (!has_alignment_key && alignment != gguf_default_alignment) {
    metadata.emplace_back("general.alignment", gguf_value{alignment});
  }

  std::vector<std::byte> out;
  byte_sink sink(out);
  sink.put<uint32_t>(0x46554747u);  // "GGUF"
  sink.put<uint32_t>(3);
  sink.put<uint64_t>(tensors_.size());
  sink.put<uint64_t>(metadata.size());
  for (const auto& [k, v] : metadata) {
    if (k.empty()) return status{status_code::invalid_argument, "gguf_writer: empty metadata key"};
    sink.put_string(k);
    sink.put<uint32_t>(static_cast<uint32_t>(v.type()));
    if (auto s = put_value(sink, v, k); !s) return s;
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    sink.put_string(t.name);
    sink.put<uint32_t>(static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) sink.put<uint64_t>(static_cast<uint64_t>(d));
    sink.put<uint32_t>(static_cast<uint32_t>(t.type));
    sink.put<uint64_t>(offset);
    offset += (t.data.size() + alignment - 1) / alignment * alignment;
  }
  if (!tensors_.empty()) sink.pad_to(alignment);
  return out;
}

size_t gguf_writer::padded(size_t n) const {
  return (n + config_.alignment - 1) / config_.alignment * config_.alignment;
}

result<std::vector<std::byte>> gguf_writer::to_bytes() const {
  auto out = head_bytes();
  if (!out) return out;
  size_t total = out->size();
  for (const auto& t : tensors_) total += padded(t.data.size());
  out->reserve(total);
  for (const auto& t : tensors_) {
    out->insert(out->end(), t.data.begin(), t.data.end());
    out->resize(out->size() + padded(t.data.size()) - t.data.size());
  }
  return out;
}

status gguf_writer::write_file(const std::filesystem::path& path) const {
  // The head, then each tensor's bytes from where they are (no image of the whole file).
  auto head = head_bytes();
  if (!head) return head.error();
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    // Past the page cache where the file system takes it (gpu/direct_file.hpp), synced.
    const std::vector<std::byte> zeros(config_.alignment);
    direct_file f;
    status st = f.open(tmp);
    if (st.ok()) st = f.append(head->data(), head->size());
    for (size_t i = 0; st.ok() && i < tensors_.size(); ++i) {
      const auto& d = tensors_[i].data;
      st = f.append(d.data(), d.size());
      if (st.ok()) st = f.append(zeros.data(), padded(d.size()) - d.size());
    }
    if (st.ok()) st = f.finish();
    if (!st.ok()) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      return status{st.code(), "gguf_writer: " + st.message()};
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec)
    return status{status_code::internal,
                  "gguf_writer: cannot rename to '" + path.string() + "': " + ec.message()};
  return {};
}

uint32_t llama_file_type(ggml_type t) {
  switch (t) {
    case ggml_type::f32:
      return 0;
    case ggml_type::f16:
      return 1;
    case ggml_type::q4_0:
      return 2;
    case ggml_type::q4_1:
      return 3;
    case ggml_type::q8_0:
      return 7;
    case ggml_type::bf16:
      return 32;
    default:
      return 0;
  }
}

}  // namespace weft::gpu
