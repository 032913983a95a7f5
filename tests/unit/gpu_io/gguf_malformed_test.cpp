#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "gguf_test_util.hpp"
#include "gpu/gguf.hpp"
#include "gpu/gguf_writer.hpp"

namespace weft::gpu {
namespace {

using test::raw_gguf;

// Parses `bytes` and expects an error whose message contains `needle`.
void expect_error(const std::vector<std::byte>& bytes, const std::string& needle,
                  const gguf_open_config& cfg = {}) {
  auto f = gguf_file::parse(bytes, cfg);
  ASSERT_FALSE(f) << "expected an error containing '" << needle << "'";
  EXPECT_EQ(f.error().code(), status_code::bad_model);
  EXPECT_NE(f.error().message().find(needle), std::string::npos) << f.error().message();
}

std::vector<std::byte> valid_file() {
  gguf_writer w;
  w.set("general.architecture", "llama");
  w.set("a.list", make_array(std::vector<std::string>{"one", "two", "three"}));
  w.set("a.nested", make_array(std::vector<gguf_value>{make_array(std::vector<uint32_t>{1, 2})}));
  w.set("a.flag", false);
  EXPECT_TRUE(w.add_tensor_from_f32("w", ggml_type::q4_1, std::vector<int64_t>{64, 2},
                                    std::vector<float>(128, 0.5f)));
  EXPECT_TRUE(w.add_tensor_from_f32("n", ggml_type::f32, std::vector<int64_t>{3},
                                    std::vector<float>{1, 2, 3}));
  return w.to_bytes().value();
}

TEST(gguf_malformed, every_truncation_is_an_error) {
  const auto full = valid_file();
  auto parsed = gguf_file::parse(full);
  ASSERT_TRUE(parsed);
  // Padding after the last tensor's data is optional: every cut before its end is an error.
  size_t end = 0;
  for (const auto& t : parsed->tensors())
    end = std::max<size_t>(end, parsed->data_offset() + t.offset + t.size_bytes);
  ASSERT_GT(end, 300u);
  for (size_t n = 0; n < end; ++n) {
    std::vector<std::byte> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    auto f = gguf_file::parse(cut);
    ASSERT_FALSE(f) << "truncated at " << n << " parsed";
    ASSERT_FALSE(f.error().message().empty());
  }
}

TEST(gguf_malformed, random_byte_flips_never_crash) {
  const auto full = valid_file();
  std::mt19937 rng(1234);
  int errors = 0;
  for (int i = 0; i < 3000; ++i) {
    auto bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) bytes[rng() % bytes.size()] = static_cast<std::byte>(rng());
    auto f = gguf_file::parse(bytes);
    if (!f) {
      ++errors;
      continue;
    }
    for (const auto& t : f->tensors()) {  // accepted tensors must lie inside the image
      ASSERT_GE(t.data, f->bytes().data());
      ASSERT_LE(t.data + t.size_bytes, f->bytes().data() + f->bytes().size());
    }
  }
  EXPECT_GT(errors, 100);
}

TEST(gguf_malformed, header) {
  expect_error({}, "too small");
  expect_error(raw_gguf{}.u32(0x12345678).u32(3).u64(0).u64(0).bytes, "bad magic");
  expect_error(raw_gguf{}.u32(0x47475546).u32(3).bytes, "big-endian");
  expect_error(raw_gguf{}.header(0, 0, 1).bytes, "version 1");
  expect_error(raw_gguf{}.header(0, 0, 4).bytes, "version 4");
  expect_error(raw_gguf{}.u32(0x46554747u).u32(3).u64(0).bytes, "truncated header");
  expect_error(raw_gguf{}.header(0, uint64_t{1} << 60).bytes, "metadata count");
  expect_error(raw_gguf{}.header(~uint64_t{0}, 0).bytes, "tensor count");
  // An empty but valid file (no tensors, no metadata) parses, in both versions.
  EXPECT_TRUE(gguf_file::parse(raw_gguf{}.header(0, 0, 2).bytes));
  EXPECT_TRUE(gguf_file::parse(raw_gguf{}.header(0, 0, 3).bytes));
}

TEST(gguf_malformed, metadata) {
  expect_error(raw_gguf{}.header(0, 1).u64(uint64_t{1} << 62).zeros(16).bytes, "string length");
  expect_error(raw_gguf{}.header(0, 1).str("").u32(4).u32(1).bytes, "empty");
  expect_error(raw_gguf{}.header(0, 1).str("bad\nkey").u32(4).u32(1).bytes, "printable");
  expect_error(raw_gguf{}.header(0, 1).str("k").u32(13).u32(1).bytes, "invalid value type 13");
  expect_error(raw_gguf{}.header(0, 2).kv_u32("k", 1).kv_u32("k", 2).bytes,
               "duplicate metadata key 'k'");
  expect_error(raw_gguf{}.header(0, 1).str("k").u32(7).put<uint8_t>(2).bytes, "boolean");
  expect_error(raw_gguf{}.header(0, 1).str("k").u32(8).u64(100).zeros(10).bytes,
               "string length 100");
  // Arrays: absurd count, bad element type, deep nesting, truncated elements.
  expect_error(raw_gguf{}.header(0, 1).str("k").u32(9).u32(4).u64(uint64_t{1} << 61).zeros(8).bytes,
               "cannot fit");
  expect_error(raw_gguf{}.header(0, 1).str("k").u32(9).u32(8).u64(1000000).zeros(64).bytes,
               "cannot fit");
  expect_error(raw_gguf{}.header(0, 1).str("k").u32(9).u32(99).u64(1).zeros(8).bytes,
               "invalid element type 99");
  raw_gguf deep;
  deep.header(0, 1).str("deep").u32(9);
  for (int i = 0; i < 10; ++i) deep.u32(9).u64(1);
  deep.u32(4).u64(0);
  expect_error(deep.bytes, "nested deeper");
  expect_error(raw_gguf{}.header(0, 1).str("k").u32(9).u32(8).u64(2).str("a").u64(5).bytes,
               "string length 5");
  // general.alignment must be a u32 power of two.
  expect_error(raw_gguf{}.header(0, 1).kv_u32("general.alignment", 24).bytes, "power of two");
  expect_error(raw_gguf{}.header(0, 1).kv_u32("general.alignment", 0).bytes, "power of two");
  expect_error(raw_gguf{}.header(0, 1).str("general.alignment").u32(8).str("x").bytes,
               "expected u32");
}

raw_gguf one_tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type,
                    uint64_t offset, size_t data_bytes) {
  raw_gguf r;
  r.header(1, 0).tensor_info(name, std::move(ne), type, offset).pad(32).zeros(data_bytes);
  return r;
}

TEST(gguf_malformed, tensors) {
  EXPECT_TRUE(gguf_file::parse(one_tensor("t", {8}, 0, 0, 32).bytes));
  expect_error(one_tensor("t", {8, 1, 1, 1, 1}, 0, 0, 32).bytes, "tensor 't' has 5 dimensions");
  expect_error(one_tensor("t", {8, 0}, 0, 0, 32).bytes, "invalid dimension 1");
  expect_error(one_tensor("t", {uint64_t{1} << 63}, 0, 0, 32).bytes, "invalid dimension 0");
  expect_error(one_tensor("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, 0, 32).bytes,
               "overflows");
  expect_error(one_tensor("t", {8}, 77, 0, 32).bytes, "tensor 't' has unknown ggml type id 77");
  expect_error(one_tensor("t", {256}, 12, 0, 144).bytes,
               "tensor 't' has type q4_k, which weft does not support");
  EXPECT_TRUE(gguf_file::parse(one_tensor("t", {256}, 12, 0, 144).bytes,
                               gguf_open_config{.type_policy = tensor_type_policy::any_known}));
  expect_error(one_tensor("t", {48}, 3, 0, 64).bytes, "not a multiple of the q4_1 block size 32");
  expect_error(one_tensor("t", {8}, 0, 16, 64).bytes, "not a multiple of the alignment 32");
  expect_error(one_tensor("t", {8}, 0, 32, 32).bytes, "extends past the end");
  expect_error(one_tensor("t", {8}, 0, uint64_t{1} << 63, 32).bytes, "extends past the end");
  expect_error(one_tensor("t", {9}, 0, 0, 32).bytes, "extends past the end");
  expect_error(one_tensor("", {8}, 0, 0, 32).bytes, "empty name");
  expect_error(one_tensor(std::string(65, 'x'), {8}, 0, 0, 32).bytes, "longer than 64");
  // The data section itself must start inside the file.
  expect_error(raw_gguf{}.header(1, 0).tensor_info("t", {8}, 0, 0).bytes,
               "past the end of the file");
  raw_gguf dup;
  dup.header(2, 0).tensor_info("t", {8}, 0, 0).tensor_info("t", {8}, 0, 32).pad(32).zeros(64);
  expect_error(dup.bytes, "duplicate tensor 't'");
  raw_gguf overlap;
  overlap.header(2, 0).tensor_info("a", {16}, 0, 0).tensor_info("b", {8}, 0, 32).pad(32).zeros(96);
  expect_error(overlap.bytes, "overlap");
  raw_gguf truncated_dims;
  truncated_dims.header(1, 0).str("t").u32(2).u64(4);
  expect_error(truncated_dims.bytes, "tensor count 1 cannot fit");
}

TEST(gguf_malformed, file_errors) {
  auto dir = gguf_file::open("/");
  ASSERT_FALSE(dir);
  EXPECT_NE(dir.error().message().find("not a regular file"), std::string::npos);
}

}  // namespace
}  // namespace weft::gpu
