#include "gpu/gguf.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>

#include "gpu/internal/gguf_cursor.hpp"
#include "gpu/internal/gguf_mapping.hpp"

namespace weft::gpu {

struct gguf_file::mapping {
  internal::gguf_image image;
};

namespace {

constexpr uint32_t max_value_type_id = 12;
constexpr size_t max_key_bytes = 65535;
// Smallest encodings, used to reject absurd counts before any allocation.
constexpr uint64_t min_kv_bytes = 8 + 4 + 1;  // key length, type, 1-byte value
constexpr uint64_t min_tensor_info_bytes =
    8 + 4 + 8 + 4 + 8;  // name length, n_dims, 1 dim, type, offset

size_t fixed_value_size(gguf_value_type t) {
  switch (t) {
    case gguf_value_type::u8:
    case gguf_value_type::i8:
    case gguf_value_type::boolean:
      return 1;
    case gguf_value_type::u16:
    case gguf_value_type::i16:
      return 2;
    case gguf_value_type::u32:
    case gguf_value_type::i32:
    case gguf_value_type::f32:
      return 4;
    case gguf_value_type::u64:
    case gguf_value_type::i64:
    case gguf_value_type::f64:
      return 8;
    case gguf_value_type::string:
      return 8;  // at least its length field
    case gguf_value_type::array:
      return 12;  // at least element type + count
  }
  return 1;
}

std::string quote_name(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x20 || u >= 0x7f) {
      static constexpr char hex[] = "0123456789abcdef";
      out += "\\x";
      out += hex[u >> 4];
      out += hex[u & 15];
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string supported_type_list() {
  std::string out;
  for (uint32_t id = 0; id < 64; ++id) {
    if (auto t = find_type_traits(id); t && t->weft_supported) {
      if (!out.empty()) out += ", ";
      out += t->name;
    }
  }
  return out;
}

}  // namespace

// -- parser -------------------------------------------------------------------------------------

/// Parses and validates the image held by a gguf_file (friend of gguf_file).
class gguf_parser {
 public:
  gguf_parser(gguf_file& file, const gguf_open_config& config)
      : file_(file), config_(config), cur_(file.map_->image.data(), file.map_->image.size()) {}

  status run() {
    if (auto s = read_header(); !s) return s;
    // Counts come from the file: vectors grow with what is actually parsed instead of being
    // reserved up front (a lying count must not cost memory), and the name indexes are built
    // once the vectors stop moving.
    file_.metadata_.reserve(static_cast<size_t>(std::min<uint64_t>(n_kv_, 1024)));
    for (uint64_t i = 0; i < n_kv_; ++i) {
      if (auto s = read_kv(i); !s) return s;
    }
    for (size_t i = 0; i < file_.metadata_.size(); ++i) {
      if (!file_.metadata_index_.emplace(file_.metadata_[i].first, i).second) {
        return fail("duplicate metadata key " + quote_name(file_.metadata_[i].first));
      }
    }
    if (auto s = read_alignment(); !s) return s;
    if (n_tensors_ > cur_.remaining() / min_tensor_info_bytes) {
      return fail("tensor count " + std::to_string(n_tensors_) + " cannot fit in the remaining " +
                  std::to_string(cur_.remaining()) + " bytes");
    }
    file_.tensors_.reserve(static_cast<size_t>(std::min<uint64_t>(n_tensors_, 1024)));
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      if (auto s = read_tensor_info(i); !s) return s;
    }
    for (size_t i = 0; i < file_.tensors_.size(); ++i) {
      if (!file_.tensor_index_.emplace(file_.tensors_[i].name, i).second) {
        return fail("duplicate tensor " + quote_name(file_.tensors_[i].name));
      }
    }
    return place_tensors();
  }

 private:
  status fail(const std::string& what) const {
    return status{status_code::bad_model,
                  "GGUF: " + what + " (at byte offset " + std::to_string(cur_.offset()) + ")"};
  }

  status read_header() {
    const auto size = cur_.size();
    if (size < 4) return fail("file of " + std::to_string(size) + " bytes is too small to be GGUF");
    uint32_t magic = 0;
    (void)cur_.read(magic);
    if (magic == 0x47475546u) return fail("big-endian GGUF files are not supported");
    if (magic != 0x46554747u) return status{status_code::bad_model, "not a GGUF file (bad magic)"};
    uint32_t version = 0;
    if (!cur_.read(version)) return fail("truncated header (version)");
    if (version == 1) return fail("GGUF version 1 is not supported (only versions 2 and 3)");
    if (version != 2 && version != 3) {
      return fail("unsupported GGUF version " + std::to_string(version) +
                  " (only versions 2 and 3)");
    }
    file_.version_ = version;
    if (!cur_.read(n_tensors_)) return fail("truncated header (tensor count)");
    if (!cur_.read(n_kv_)) return fail("truncated header (metadata count)");
    if (n_kv_ > cur_.remaining() / min_kv_bytes) {
      return fail("metadata count " + std::to_string(n_kv_) + " cannot fit in the remaining " +
                  std::to_string(cur_.remaining()) + " bytes");
    }
    if (n_tensors_ > cur_.remaining() / min_tensor_info_bytes) {
      return fail("tensor count " + std::to_string(n_tensors_) + " cannot fit in the remaining " +
                  std::to_string(cur_.remaining()) + " bytes");
    }
    return {};
  }

  status read_string(std::string_view& out, const std::string& what) {
    uint64_t len = 0;
    if (!cur_.read(len)) return fail("truncated " + what + " (string length)");
    if (len > cur_.remaining()) {
      return fail(what + ": string length " + std::to_string(len) + " exceeds the remaining " +
                  std::to_string(cur_.remaining()) + " bytes");
    }
    (void)cur_.read_bytes(len, out);
    return {};
  }

  status read_kv(uint64_t index) {
    std::string_view key;
    if (auto s = read_string(key, "metadata key #" + std::to_string(index)); !s) return s;
    if (key.empty()) return fail("metadata key #" + std::to_string(index) + " is empty");
    if (key.size() > max_key_bytes)
      return fail("metadata key #" + std::to_string(index) + " is too long");
    for (char c : key) {
      const auto u = static_cast<unsigned char>(c);
      if (u < 0x20 || u >= 0x7f)
        return fail("metadata key " + quote_name(key) + " is not printable ASCII");
    }
    uint32_t type_id = 0;
    if (!cur_.read(type_id)) return fail("truncated value type of key " + quote_name(key));
    if (type_id > max_value_type_id) {
      return fail("metadata key " + quote_name(key) + " has invalid value type " +
                  std::to_string(type_id));
    }
    gguf_value value;
    const std::string key_str(key);
    if (auto s = read_value(static_cast<gguf_value_type>(type_id), value, 0, key_str); !s) return s;
    file_.metadata_.emplace_back(key_str, std::move(value));
    return {};
  }

  template <class T>
  status read_scalar(T& out, const std::string& key) {
    if (!cur_.read(out)) return fail("truncated value of key " + quote_name(key));
    return {};
  }

  status read_value(gguf_value_type type, gguf_value& out, uint32_t depth, const std::string& key) {
    switch (type) {
      case gguf_value_type::u8:
        return read_into<uint8_t>(out, key);
      case gguf_value_type::i8:
        return read_into<int8_t>(out, key);
      case gguf_value_type::u16:
        return read_into<uint16_t>(out, key);
      case gguf_value_type::i16:
        return read_into<int16_t>(out, key);
      case gguf_value_type::u32:
        return read_into<uint32_t>(out, key);
      case gguf_value_type::i32:
        return read_into<int32_t>(out, key);
      case gguf_value_type::f32:
        return read_into<float>(out, key);
      case gguf_value_type::u64:
        return read_into<uint64_t>(out, key);
      case gguf_value_type::i64:
        return read_into<int64_t>(out, key);
      case gguf_value_type::f64:
        return read_into<double>(out, key);
      case gguf_value_type::boolean: {
        uint8_t b = 0;
        if (auto s = read_scalar(b, key); !s) return s;
        if (b > 1)
          return fail("key " + quote_name(key) + ": boolean value " + std::to_string(b) +
                      " is not 0 or 1");
        out.v = (b != 0);
        return {};
      }
      case gguf_value_type::string: {
        std::string_view sv;
        if (auto s = read_string(sv, "value of key " + quote_name(key)); !s) return s;
        out.v = std::string(sv);
        return {};
      }
      case gguf_value_type::array: {
        gguf_array arr;
        if (auto s = read_array(arr, depth + 1, key); !s) return s;
        out.v = std::move(arr);
        return {};
      }
    }
    return fail("key " + quote_name(key) + ": invalid value type");
  }

  template <class T>
  status read_into(gguf_value& out, const std::string& key) {
    T v{};
    if (auto s = read_scalar(v, key); !s) return s;
    out.v = v;
    return {};
  }

  status read_array(gguf_array& arr, uint32_t depth, const std::string& key) {
    if (depth > config_.max_array_depth) {
      return fail("key " + quote_name(key) + ": arrays nested deeper than " +
                  std::to_string(config_.max_array_depth));
    }
    uint32_t elem_id = 0;
    uint64_t count = 0;
    if (!cur_.read(elem_id) || !cur_.read(count))
      return fail("truncated array header of key " + quote_name(key));
    if (elem_id > max_value_type_id) {
      return fail("key " + quote_name(key) + ": array has invalid element type " +
                  std::to_string(elem_id));
    }
    const auto elem = static_cast<gguf_value_type>(elem_id);
    if (count > cur_.remaining() / fixed_value_size(elem)) {
      return fail("key " + quote_name(key) + ": array of " + std::to_string(count) + " " +
                  std::string(value_type_name(elem)) + " elements cannot fit in the remaining " +
                  std::to_string(cur_.remaining()) + " bytes");
    }
    const auto n = static_cast<size_t>(count);
    switch (elem) {
      case gguf_value_type::u8:
        return read_pod_array<uint8_t>(arr, n, key);
      case gguf_value_type::i8:
        return read_pod_array<int8_t>(arr, n, key);
      case gguf_value_type::u16:
        return read_pod_array<uint16_t>(arr, n, key);
      case gguf_value_type::i16:
        return read_pod_array<int16_t>(arr, n, key);
      case gguf_value_type::u32:
        return read_pod_array<uint32_t>(arr, n, key);
      case gguf_value_type::i32:
        return read_pod_array<int32_t>(arr, n, key);
      case gguf_value_type::f32:
        return read_pod_array<float>(arr, n, key);
      case gguf_value_type::u64:
        return read_pod_array<uint64_t>(arr, n, key);
      case gguf_value_type::i64:
        return read_pod_array<int64_t>(arr, n, key);
      case gguf_value_type::f64:
        return read_pod_array<double>(arr, n, key);
      case gguf_value_type::boolean: {
        std::vector<bool> items(n);
        for (size_t i = 0; i < n; ++i) {
          uint8_t b = 0;
          if (auto s = read_scalar(b, key); !s) return s;
          if (b > 1)
            return fail("key " + quote_name(key) + ": boolean array element " + std::to_string(i) +
                        " is not 0 or 1");
          items[i] = b != 0;
        }
        arr.items = std::move(items);
        return {};
      }
      case gguf_value_type::string: {
        std::vector<std::string> items;
        items.reserve(
            std::min<size_t>(n, 4096));  // grows with what is parsed (n comes from the file)
        for (size_t i = 0; i < n; ++i) {
          std::string_view sv;
          if (auto s =
                  read_string(sv, "element " + std::to_string(i) + " of key " + quote_name(key));
              !s)
            return s;
          items.emplace_back(sv);
        }
        arr.items = std::move(items);
        return {};
      }
      case gguf_value_type::array: {
        std::vector<gguf_value> items;
        for (size_t i = 0; i < n; ++i) {
          gguf_array inner;
          if (auto s = read_array(inner, depth + 1, key); !s) return s;
          items.emplace_back(std::move(inner));
        }
        arr.items = std::move(items);
        return {};
      }
    }
    return fail("key " + quote_name(key) + ": invalid array element type");
  }

  template <class T>
  status read_pod_array(gguf_array& arr, size_t n, const std::string& key) {
    std::vector<T> items(n);
    std::string_view raw;
    if (!cur_.read_bytes(static_cast<uint64_t>(n) * sizeof(T), raw))
      return fail("truncated array of key " + quote_name(key));
    if (n != 0) std::memcpy(items.data(), raw.data(), n * sizeof(T));
    arr.items = std::move(items);
    return {};
  }

  status read_alignment() {
    const gguf_value* v = file_.find("general.alignment");
    if (v == nullptr) return {};
    const auto* a = std::get_if<uint32_t>(&v->v);
    if (a == nullptr) {
      return fail("general.alignment has type " + std::string(value_type_name(v->type())) +
                  ", expected u32");
    }
    if (*a == 0 || (*a & (*a - 1)) != 0) {
      return fail("general.alignment " + std::to_string(*a) + " is not a power of two");
    }
    file_.alignment_ = *a;
    return {};
  }

  status read_tensor_info(uint64_t index) {
    gguf_tensor t;
    std::string_view name;
    if (auto s = read_string(name, "name of tensor #" + std::to_string(index)); !s) return s;
    if (name.empty()) return fail("tensor #" + std::to_string(index) + " has an empty name");
    if (name.size() > gguf_max_name_bytes) {
      return fail("tensor #" + std::to_string(index) + " name " + quote_name(name.substr(0, 80)) +
                  " is longer than " + std::to_string(gguf_max_name_bytes) + " bytes");
    }
    t.name = std::string(name);
    const std::string q = "tensor " + quote_name(name);
    if (!cur_.read(t.n_dims)) return fail("truncated dimension count of " + q);
    if (t.n_dims == 0 || t.n_dims > gguf_max_dims) {
      return fail(q + " has " + std::to_string(t.n_dims) + " dimensions (1 to " +
                  std::to_string(gguf_max_dims) + " allowed)");
    }
    int64_t n_elements = 1;
    for (uint32_t d = 0; d < t.n_dims; ++d) {
      uint64_t ne = 0;
      if (!cur_.read(ne)) return fail("truncated dimensions of " + q);
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return fail(q + " has invalid dimension " + std::to_string(d) + " = " + std::to_string(ne));
      }
      t.ne[d] = static_cast<int64_t>(ne);
      if (n_elements > std::numeric_limits<int64_t>::max() / t.ne[d]) {
        return fail(q + ": element count overflows");
      }
      n_elements *= t.ne[d];
    }
    t.n_elements = n_elements;
    uint32_t type_id = 0;
    if (!cur_.read(type_id)) return fail("truncated type of " + q);
    const auto traits = find_type_traits(type_id);
    if (!traits) return fail(q + " has unknown ggml type id " + std::to_string(type_id));
    if (!traits->weft_supported && config_.type_policy == tensor_type_policy::supported_only) {
      return fail(q + " has type " + std::string(traits->name) +
                  ", which weft does not support (supported: " + supported_type_list() + ")");
    }
    t.type = traits->type;
    if (t.ne[0] % traits->block_size != 0) {
      return fail(q + ": row length ne[0] = " + std::to_string(t.ne[0]) +
                  " is not a multiple of the " + std::string(traits->name) + " block size " +
                  std::to_string(traits->block_size));
    }
    const auto row = row_size_bytes(t.type, t.ne[0]);
    const auto rows = static_cast<uint64_t>(n_elements / t.ne[0]);
    if (!row || (*row != 0 && rows > std::numeric_limits<uint64_t>::max() / *row) ||
        *row * rows > std::numeric_limits<size_t>::max()) {
      return fail(q + ": data size overflows");
    }
    t.size_bytes = static_cast<size_t>(*row * rows);
    if (!cur_.read(t.offset)) return fail("truncated data offset of " + q);
    if (t.offset % file_.alignment_ != 0) {
      return fail(q + " data offset " + std::to_string(t.offset) +
                  " is not a multiple of the alignment " + std::to_string(file_.alignment_));
    }
    file_.tensors_.push_back(std::move(t));
    return {};
  }

  status place_tensors() {
    const uint64_t header_end = cur_.offset();
    const uint64_t align = file_.alignment_;
    const uint64_t data_offset = (header_end + align - 1) / align * align;
    const uint64_t file_size = cur_.size();
    if (file_.tensors_.empty()) {
      file_.data_offset_ = std::min(data_offset, file_size);
      return {};
    }
    if (data_offset > file_size) {
      return fail("data section starts at " + std::to_string(data_offset) +
                  ", past the end of the file (" + std::to_string(file_size) + " bytes)");
    }
    file_.data_offset_ = data_offset;
    const uint64_t data_size = file_size - data_offset;
    const std::byte* base = file_.map_->image.data() + data_offset;
    for (auto& t : file_.tensors_) {
      if (t.offset > data_size || t.size_bytes > data_size - t.offset) {
        return status{status_code::bad_model, "GGUF: tensor " + quote_name(t.name) + " data [" +
                                                  std::to_string(t.offset) + ", +" +
                                                  std::to_string(t.size_bytes) +
                                                  ") extends past the end of the data section (" +
                                                  std::to_string(data_size) + " bytes)"};
      }
      t.data = base + t.offset;
    }
    std::vector<size_t> order(file_.tensors_.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return file_.tensors_[a].offset < file_.tensors_[b].offset;
    });
    for (size_t i = 1; i < order.size(); ++i) {
      const auto& prev = file_.tensors_[order[i - 1]];
      const auto& next = file_.tensors_[order[i]];
      if (prev.offset + prev.size_bytes > next.offset) {
        return status{status_code::bad_model, "GGUF: the data of tensors " + quote_name(prev.name) +
                                                  " and " + quote_name(next.name) + " overlap"};
      }
    }
    return {};
  }

  gguf_file& file_;
  const gguf_open_config& config_;
  internal::gguf_cursor cur_;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
};

// -- gguf_file ----------------------------------------------------------------------------------

std::string_view value_type_name(gguf_value_type type) {
  switch (type) {
    case gguf_value_type::u8:
      return "u8";
    case gguf_value_type::i8:
      return "i8";
    case gguf_value_type::u16:
      return "u16";
    case gguf_value_type::i16:
      return "i16";
    case gguf_value_type::u32:
      return "u32";
    case gguf_value_type::i32:
      return "i32";
    case gguf_value_type::f32:
      return "f32";
    case gguf_value_type::boolean:
      return "bool";
    case gguf_value_type::string:
      return "string";
    case gguf_value_type::array:
      return "array";
    case gguf_value_type::u64:
      return "u64";
    case gguf_value_type::i64:
      return "i64";
    case gguf_value_type::f64:
      return "f64";
  }
  return "invalid";
}

size_t gguf_array::size() const {
  return std::visit([](const auto& v) { return v.size(); }, items);
}

gguf_file::gguf_file() : map_(std::make_unique<mapping>()) {}
gguf_file::gguf_file(gguf_file&&) noexcept = default;
gguf_file& gguf_file::operator=(gguf_file&&) noexcept = default;
gguf_file::~gguf_file() = default;

std::optional<gguf_memory> parse_gguf_memory(std::string_view name) {
  if (name == "mmap") return gguf_memory::mmap;
  if (name == "huge-pages") return gguf_memory::huge_pages;
  return std::nullopt;
}

result<gguf_file> gguf_file::open(const std::filesystem::path& path,
                                  const gguf_open_config& config) {
  gguf_file file;
  std::string error;
  if (!file.map_->image.map_file(path, config.memory == gguf_memory::huge_pages, config.load_now,
                                 config.progress, error)) {
    std::error_code ec;
    const bool missing = !std::filesystem::exists(path, ec);
    return status{missing ? status_code::not_found : status_code::invalid_argument, error};
  }
  gguf_parser parser(file, config);
  if (auto s = parser.run(); !s) {
    return status{s.code(), path.filename().string() + ": " + s.message()};
  }
  spdlog::debug("gguf: opened {} (v{}, {} tensors, {} metadata keys, data at {})", path.string(),
                file.version_, file.tensors_.size(), file.metadata_.size(), file.data_offset_);
  return file;
}

result<gguf_file> gguf_file::parse(std::span<const std::byte> bytes,
                                   const gguf_open_config& config) {
  gguf_file file;
  file.map_->image.copy_from(bytes);
  gguf_parser parser(file, config);
  if (auto s = parser.run(); !s) return s;
  return file;
}

size_t gguf_file::size_bytes() const {
  return map_->image.size();
}

std::span<const std::byte> gguf_file::bytes() const {
  return {map_->image.data(), map_->image.size()};
}

std::byte* gguf_file::mutable_tensor_data(const gguf_tensor& t) {
  std::byte* base = map_->image.owned_data();
  if (base == nullptr || t.data == nullptr) return nullptr;
  return base + (t.data - map_->image.data());
}

const gguf_value* gguf_file::find(std::string_view key) const {
  const auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

namespace {

status missing_key(std::string_view key) {
  return status{status_code::not_found, "metadata key '" + std::string(key) + "' not found"};
}

status wrong_type(std::string_view key, const gguf_value& v, std::string_view expected) {
  return status{status_code::bad_model, "metadata key '" + std::string(key) + "' has type " +
                                            std::string(value_type_name(v.type())) + ", expected " +
                                            std::string(expected)};
}

template <class Int>
result<Int> get_integer(const gguf_file& f, std::string_view key, std::string_view type_name) {
  const gguf_value* v = f.find(key);
  if (v == nullptr) return missing_key(key);
  std::optional<Int> out;
  bool out_of_range = false;
  std::visit(
      [&](const auto& x) {
        using X = std::decay_t<decltype(x)>;
        if constexpr (std::is_integral_v<X> && !std::is_same_v<X, bool>) {
          if (std::in_range<Int>(x)) {
            out = static_cast<Int>(x);
          } else {
            out_of_range = true;
          }
        }
      },
      v->v);
  if (out) return *out;
  if (out_of_range) {
    return status{status_code::bad_model, "metadata key '" + std::string(key) +
                                              "' is out of range for " + std::string(type_name)};
  }
  return wrong_type(key, *v, type_name);
}

}  // namespace

result<uint32_t> gguf_file::get_u32(std::string_view key) const {
  return get_integer<uint32_t>(*this, key, "u32");
}
result<uint64_t> gguf_file::get_u64(std::string_view key) const {
  return get_integer<uint64_t>(*this, key, "u64");
}
result<int32_t> gguf_file::get_i32(std::string_view key) const {
  return get_integer<int32_t>(*this, key, "i32");
}
result<int64_t> gguf_file::get_i64(std::string_view key) const {
  return get_integer<int64_t>(*this, key, "i64");
}

result<float> gguf_file::get_f32(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* f = std::get_if<float>(&v->v)) return *f;
  if (const auto* d = std::get_if<double>(&v->v)) return static_cast<float>(*d);
  return wrong_type(key, *v, "f32");
}

result<bool> gguf_file::get_bool(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* b = std::get_if<bool>(&v->v)) return *b;
  return wrong_type(key, *v, "bool");
}

result<std::string_view> gguf_file::get_string(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr) return missing_key(key);
  if (const auto* s = v->as_string()) return std::string_view(*s);
  return wrong_type(key, *v, "string");
}

result<std::span<const std::string>> gguf_file::get_string_array(std::string_view key) const {
  return get_array<std::string>(key);
}

std::string_view gguf_file::architecture() const {
  const gguf_value* v = find("general.architecture");
  const std::string* s = v != nullptr ? v->as_string() : nullptr;
  return s != nullptr ? std::string_view(*s) : std::string_view{};
}

const gguf_tensor* gguf_file::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

result<const gguf_tensor*> gguf_file::tensor(std::string_view name) const {
  if (const gguf_tensor* t = find_tensor(name)) return t;
  return status{status_code::not_found,
                "tensor '" + std::string(name) + "' not found in the model file"};
}

}  // namespace weft::gpu
