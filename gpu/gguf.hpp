#pragma once
/// Reader for GGUF model files (versions 2 and 3): header, typed metadata, tensor descriptors and
/// zero-copy access to tensor data in a read-only memory map.
///
/// Every field read from the file is validated before use (see docs/model-files.md): a malformed
/// or truncated file gives a `status` (code bad_model) naming the problem, the key or the tensor,
/// never a crash and never an allocation larger than the file justifies.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <variant>
#include <vector>

#include "gpu/ggml_types.hpp"
#include "gpu/status.hpp"

namespace weft::gpu {

// -- metadata values ----------------------------------------------------------------------------

/// GGUF metadata value types (ids as written in the file).
enum class gguf_value_type : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

/// Name of a value type ("u32", "string", "array", ...).
std::string_view value_type_name(gguf_value_type type);

struct gguf_value;

/// A GGUF array: element type plus the elements, stored as a vector of the element type
/// (bool arrays as std::vector<bool>, nested arrays as std::vector<gguf_value>).
struct gguf_array {
  using storage = std::variant<std::vector<uint8_t>, std::vector<int8_t>, std::vector<uint16_t>,
                               std::vector<int16_t>, std::vector<uint32_t>, std::vector<int32_t>,
                               std::vector<float>, std::vector<bool>, std::vector<std::string>,
                               std::vector<gguf_value>, std::vector<uint64_t>, std::vector<int64_t>,
                               std::vector<double>>;
  storage items;  ///< Alternative index == element type id.

  gguf_value_type element_type() const { return static_cast<gguf_value_type>(items.index()); }
  size_t size() const;
};

/// One metadata value (owning). The variant index is the GGUF value type id.
struct gguf_value {
  using storage = std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool,
                               std::string, gguf_array, uint64_t, int64_t, double>;
  storage v;

  gguf_value() = default;
  template <class T>
  requires std::is_constructible_v<storage, T&&> gguf_value(T&& value)
      : v(std::forward<T>(value)) {}                // NOLINT implicit
  gguf_value(const char* s) : v(std::string(s)) {}  // NOLINT implicit

  gguf_value_type type() const { return static_cast<gguf_value_type>(v.index()); }
  const std::string* as_string() const { return std::get_if<std::string>(&v); }
  const gguf_array* as_array() const { return std::get_if<gguf_array>(&v); }
};

/// Convenience: an array value from a vector of one element type.
template <class T>
gguf_value make_array(std::vector<T> items) {
  return gguf_value{gguf_array{gguf_array::storage(std::move(items))}};
}

// -- tensors ------------------------------------------------------------------------------------

/// Maximum number of dimensions of a GGUF tensor.
inline constexpr uint32_t gguf_max_dims = 4;
/// Maximum length of a tensor name in bytes (ggml's limit).
inline constexpr size_t gguf_max_name_bytes = 64;
/// Alignment used when general.alignment is absent.
inline constexpr uint32_t gguf_default_alignment = 32;

/// Descriptor of one tensor in a mapped GGUF file. `data` points into the file mapping and stays
/// valid as long as the gguf_file lives (moving the gguf_file keeps it valid).
struct gguf_tensor {
  std::string name;
  ggml_type type = ggml_type::f32;
  uint32_t n_dims = 0;
  std::array<int64_t, gguf_max_dims> ne{1, 1, 1, 1};  ///< ne[0] varies fastest (row length).
  int64_t n_elements = 0;
  size_t size_bytes = 0;
  uint64_t offset = 0;  ///< Relative to the start of the data section.
  const std::byte* data = nullptr;

  /// Number of rows (n_elements / ne[0]).
  int64_t n_rows() const { return ne[0] == 0 ? 0 : n_elements / ne[0]; }
  /// Bytes of one row (ne[0] elements).
  size_t row_size_bytes() const {
    return ne[0] == 0 ? 0 : size_bytes / static_cast<size_t>(n_rows());
  }
};

// -- the file -----------------------------------------------------------------------------------

/// What the reader accepts beyond the validated structure.
enum class tensor_type_policy {
  supported_only,  ///< Tensors of types weft cannot compute with are an error (default).
  any_known,       ///< Accept every known ggml type (for inspection tools); unknown ids still fail.
};

/// Where an opened file's bytes live.
enum class gguf_memory {
  /// A private read-only mapping of the file: pages load on first touch and are shared with other
  /// processes through the page cache (llama.cpp's default).
  mmap,
  /// A private copy in anonymous memory backed by 2 MiB transparent huge pages: streaming the
  /// weights every decode step takes ~500x fewer TLB misses (+3-8 % batch-1 decode on the CPU
  /// backend, docs/engine.md), at the cost of the file's size in private memory per process. When
  /// the kernel has transparent huge pages disabled, open logs it and maps the file instead.
  huge_pages,
};

/// Parses "mmap" / "huge-pages" (CLI spelling); nullopt otherwise.
std::optional<gguf_memory> parse_gguf_memory(std::string_view name);

/// Options of gguf_file::open / gguf_file::parse.
struct gguf_open_config {
  tensor_type_policy type_policy = tensor_type_policy::supported_only;
  /// Maximum nesting depth of arrays in metadata (an array of scalars has depth 1).
  uint32_t max_array_depth = 4;
  /// open only (parse always copies).
  gguf_memory memory = gguf_memory::mmap;
  /// open only: read every page before returning (mmap: touch each page; huge_pages: the copy is
  /// the read), so the first forward pass does not stall on page faults.
  bool load_now = false;
  /// Called with (bytes read, total) a few times while `load_now` reads the file.
  std::function<void(size_t done, size_t total)> progress = nullptr;
};

/// A parsed, validated GGUF file. Move-only; immutable after open, so const access is thread-safe.
class gguf_file {
 public:
  /// Maps `path` read-only and parses it. Blocking (reads the header; tensor pages load lazily).
  static result<gguf_file> open(const std::filesystem::path& path,
                                const gguf_open_config& config = {});

  /// Parses a copy of an in-memory image (tests, fuzzing, files received over the network).
  static result<gguf_file> parse(std::span<const std::byte> bytes,
                                 const gguf_open_config& config = {});

  gguf_file(gguf_file&&) noexcept;
  gguf_file& operator=(gguf_file&&) noexcept;
  gguf_file(const gguf_file&) = delete;
  gguf_file& operator=(const gguf_file&) = delete;
  ~gguf_file();

  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  /// Offset of the tensor data section from the start of the file.
  uint64_t data_offset() const { return data_offset_; }
  /// Size of the whole file in bytes.
  size_t size_bytes() const;
  /// Whole file image (e.g. for hashing).
  std::span<const std::byte> bytes() const;
  /// Writable pointer to tensor `t`'s data when the image is an owned copy (a file made by parse);
  /// null when it maps a file read-only. Whoever writes must keep readers out meanwhile (the
  /// model's weights are updated between forward passes, docs/rl.md).
  std::byte* mutable_tensor_data(const gguf_tensor& t);

  // -- metadata ---------------------------------------------------------------------------------

  /// Keys and values in file order.
  const std::vector<std::pair<std::string, gguf_value>>& metadata() const { return metadata_; }
  /// The value of `key`, or nullptr.
  const gguf_value* find(std::string_view key) const;
  bool contains(std::string_view key) const { return find(key) != nullptr; }

  /// Typed getters: an error names the key when it is missing or has another type. Integer getters
  /// accept any integer type whose value fits; float getters accept f32 and f64.
  result<uint32_t> get_u32(std::string_view key) const;
  result<uint64_t> get_u64(std::string_view key) const;
  result<int32_t> get_i32(std::string_view key) const;
  result<int64_t> get_i64(std::string_view key) const;
  result<float> get_f32(std::string_view key) const;
  result<bool> get_bool(std::string_view key) const;
  result<std::string_view> get_string(std::string_view key) const;
  /// An array of strings (e.g. tokenizer.ggml.tokens).
  result<std::span<const std::string>> get_string_array(std::string_view key) const;
  /// An array whose elements have exactly type T (uint8_t ... double; bool arrays: use find()).
  template <class T>
  result<std::span<const T>> get_array(std::string_view key) const;

  /// general.architecture ("llama", ...); empty when absent.
  std::string_view architecture() const;

  // -- tensors ----------------------------------------------------------------------------------

  /// Tensors in file order.
  std::span<const gguf_tensor> tensors() const { return tensors_; }
  /// The tensor called `name`, or nullptr.
  const gguf_tensor* find_tensor(std::string_view name) const;
  /// The tensor called `name`, or an error naming it.
  result<const gguf_tensor*> tensor(std::string_view name) const;

 private:
  struct mapping;
  gguf_file();
  friend class gguf_parser;

  std::unique_ptr<mapping> map_;
  uint32_t version_ = 0;
  uint32_t alignment_ = gguf_default_alignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, gguf_value>> metadata_;
  std::unordered_map<std::string_view, size_t> metadata_index_;
  std::vector<gguf_tensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

template <class T>
result<std::span<const T>> gguf_file::get_array(std::string_view key) const {
  const gguf_value* v = find(key);
  if (v == nullptr)
    return status{status_code::not_found, "metadata key '" + std::string(key) + "' not found"};
  const gguf_array* a = v->as_array();
  if (a == nullptr) {
    return status{status_code::bad_model, "metadata key '" + std::string(key) + "' has type " +
                                              std::string(value_type_name(v->type())) +
                                              ", expected array"};
  }
  const auto* items = std::get_if<std::vector<T>>(&a->items);
  if (items == nullptr) {
    return status{status_code::bad_model, "metadata key '" + std::string(key) +
                                              "' is an array of " +
                                              std::string(value_type_name(a->element_type())) +
                                              ", not of the requested type"};
  }
  return std::span<const T>(*items);
}

}  // namespace weft::gpu
