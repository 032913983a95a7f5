#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include <cmath>
#include <random>
#include <vector>

#include "gguf_test_util.hpp"
#include "gpu/gguf.hpp"
#include "gpu/gguf_writer.hpp"

namespace weft::gpu {
namespace {

std::vector<float> ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(static_cast<float>(i) * 0.37f) * 1.5f;
  return v;
}

gguf_writer metadata_of_every_type(gguf_writer_config cfg = {}) {
  gguf_writer w(cfg);
  w.set("t.u8", uint8_t{200});
  w.set("t.i8", int8_t{-100});
  w.set("t.u16", uint16_t{60000});
  w.set("t.i16", int16_t{-30000});
  w.set("t.u32", uint32_t{4000000000u});
  w.set("t.i32", int32_t{-2000000000});
  w.set("t.f32", 1.25f);
  w.set("t.bool", true);
  w.set("t.string", "héllo wörld");
  w.set("t.u64", uint64_t{1} << 60);
  w.set("t.i64", int64_t{-(int64_t{1} << 60)});
  w.set("t.f64", 2.5);
  w.set("t.arr_u8", make_array(std::vector<uint8_t>{1, 2, 3}));
  w.set("t.arr_i32", make_array(std::vector<int32_t>{-1, 0, 1}));
  w.set("t.arr_f32", make_array(std::vector<float>{0.5f, -0.25f}));
  w.set("t.arr_bool", make_array(std::vector<bool>{true, false, true}));
  w.set("t.arr_str", make_array(std::vector<std::string>{"a", "", "ccc"}));
  w.set("t.arr_f64", make_array(std::vector<double>{1e300}));
  w.set("t.arr_u64", make_array(std::vector<uint64_t>{}));
  w.set("t.nested", make_array(std::vector<gguf_value>{make_array(std::vector<int16_t>{7, 8}),
                                                       make_array(std::vector<std::string>{"x"})}));
  return w;
}

TEST(gguf_roundtrip, metadata_of_every_type) {
  auto w = metadata_of_every_type();
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes) << bytes.error().message();
  auto f = gguf_file::parse(*bytes);
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->metadata().size(), 20u);
  EXPECT_EQ(f->metadata()[0].first, "t.u8");
  EXPECT_EQ(f->get_u32("t.u8").value(), 200u);
  EXPECT_EQ(f->get_i32("t.i8").value(), -100);
  EXPECT_EQ(f->get_u32("t.u16").value(), 60000u);
  EXPECT_EQ(f->get_i32("t.i16").value(), -30000);
  EXPECT_EQ(f->get_u32("t.u32").value(), 4000000000u);
  EXPECT_EQ(f->get_i64("t.i32").value(), -2000000000);
  EXPECT_EQ(f->get_f32("t.f32").value(), 1.25f);
  EXPECT_EQ(f->get_bool("t.bool").value(), true);
  EXPECT_EQ(f->get_string("t.string").value(), "héllo wörld");
  EXPECT_EQ(f->get_u64("t.u64").value(), uint64_t{1} << 60);
  EXPECT_EQ(f->get_i64("t.i64").value(), -(int64_t{1} << 60));
  EXPECT_EQ(f->get_f32("t.f64").value(), 2.5f);
  EXPECT_EQ(f->find("t.f64")->type(), gguf_value_type::f64);
  EXPECT_EQ(f->get_array<uint8_t>("t.arr_u8")->size(), 3u);
  EXPECT_EQ(f->get_array<int32_t>("t.arr_i32").value()[0], -1);
  EXPECT_EQ(f->get_array<float>("t.arr_f32").value()[1], -0.25f);
  const auto* bools = std::get_if<std::vector<bool>>(&f->find("t.arr_bool")->as_array()->items);
  ASSERT_NE(bools, nullptr);
  EXPECT_EQ(*bools, (std::vector<bool>{true, false, true}));
  auto strs = f->get_string_array("t.arr_str");
  ASSERT_TRUE(strs);
  EXPECT_EQ(strs->size(), 3u);
  EXPECT_EQ((*strs)[2], "ccc");
  EXPECT_EQ(f->get_array<double>("t.arr_f64").value()[0], 1e300);
  EXPECT_EQ(f->get_array<uint64_t>("t.arr_u64")->size(), 0u);
  const auto* nested = f->find("t.nested")->as_array();
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->element_type(), gguf_value_type::array);
  const auto& inner = std::get<std::vector<gguf_value>>(nested->items);
  ASSERT_EQ(inner.size(), 2u);
  EXPECT_EQ(std::get<std::vector<int16_t>>(inner[0].as_array()->items),
            (std::vector<int16_t>{7, 8}));
  // Getter errors name the key and the types.
  EXPECT_EQ(f->get_u32("missing").error().code(), status_code::not_found);
  EXPECT_NE(f->get_u32("missing").error().message().find("missing"), std::string::npos);
  EXPECT_NE(f->get_u32("t.string").error().message().find("string"), std::string::npos);
  EXPECT_FALSE(f->get_u32("t.i8"));   // negative
  EXPECT_FALSE(f->get_i32("t.u32"));  // out of range
  EXPECT_FALSE(f->get_array<float>("t.arr_i32"));
  EXPECT_FALSE(f->get_string_array("t.u8"));
}

class gguf_tensor_roundtrip : public ::testing::TestWithParam<std::tuple<ggml_type, uint32_t>> {};

TEST_P(gguf_tensor_roundtrip, tensors_of_every_supported_type) {
  const auto [type, alignment] = GetParam();
  gguf_writer w(gguf_writer_config{alignment});
  w.set("general.architecture", "test");
  const std::vector<int64_t> ne2{64, 3};
  const std::vector<int64_t> ne4{32, 2, 2, 2};
  const auto v2 = ramp(64 * 3), v4 = ramp(32 * 8);
  ASSERT_TRUE(w.add_tensor_from_f32("a", type, ne2, v2));
  ASSERT_TRUE(w.add_tensor_from_f32("b.weight", type, ne4, v4));
  ASSERT_TRUE(w.add_tensor_from_f32("norm", ggml_type::f32, std::vector<int64_t>{5}, ramp(5)));
  auto bytes = w.to_bytes();
  ASSERT_TRUE(bytes) << bytes.error().message();
  auto f = gguf_file::parse(*bytes);
  ASSERT_TRUE(f) << f.error().message();
  EXPECT_EQ(f->alignment(), alignment);
  EXPECT_EQ(f->data_offset() % alignment, 0u);
  ASSERT_EQ(f->tensors().size(), 3u);
  const gguf_tensor* a = f->find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, type);
  EXPECT_EQ(a->n_dims, 2u);
  EXPECT_EQ(a->ne[0], 64);
  EXPECT_EQ(a->ne[1], 3);
  EXPECT_EQ(a->n_elements, 192);
  EXPECT_EQ(a->n_rows(), 3);
  EXPECT_EQ(a->size_bytes, *row_size_bytes(type, 192));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a->data) % alignment, 0u);
  const gguf_tensor* b = f->find_tensor("b.weight");
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(b->n_dims, 4u);
  EXPECT_EQ(b->ne[3], 2);
  // Data survives the round trip: dequantized file data == dequantize(quantize(values)).
  std::vector<std::byte> q(*row_size_bytes(type, 64 * 3));
  ASSERT_EQ(quantize_row(type, v2.data(), q.data(), 64 * 3), row_status::ok);
  EXPECT_EQ(std::memcmp(q.data(), a->data, q.size()), 0);
  std::vector<float> back(64 * 3);
  ASSERT_EQ(dequantize_row(type, a->data, back.data(), 64 * 3), row_status::ok);
  for (size_t i = 0; i < back.size(); ++i) EXPECT_NEAR(back[i], v2[i], 0.2f);
  const gguf_tensor* norm = f->find_tensor("norm");
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(reinterpret_cast<const float*>(norm->data)[4], ramp(5)[4]);
  EXPECT_EQ(f->tensor("zzz").error().code(), status_code::not_found);
}

INSTANTIATE_TEST_SUITE_P(types, gguf_tensor_roundtrip,
                         ::testing::Combine(::testing::Values(ggml_type::f32, ggml_type::f16,
                                                              ggml_type::bf16, ggml_type::q8_0,
                                                              ggml_type::q4_0, ggml_type::q4_1),
                                            ::testing::Values(32u, 64u, 4096u)));

TEST(gguf_roundtrip, file_on_disk_is_mapped_and_moves_keep_pointers) {
  gguf_writer w;
  ASSERT_TRUE(w.add_tensor_from_f32("x", ggml_type::f32, std::vector<int64_t>{4},
                                    std::vector<float>{1, 2, 3, 4}));
  const auto path = std::filesystem::temp_directory_path() /
                    ("weft_gguf_rt_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_TRUE(w.write_file(path));
  auto f = gguf_file::open(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(f) << f.error().message();
  const std::byte* data = f->find_tensor("x")->data;
  gguf_file moved = std::move(f).value();
  EXPECT_EQ(moved.find_tensor("x")->data, data);
  EXPECT_EQ(reinterpret_cast<const float*>(data)[3], 4.0f);
}

TEST(gguf_roundtrip, both_memory_modes_read_the_same_bytes_and_report_progress) {
  gguf_writer w;
  std::vector<float> values(3000);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 0.5f;
  ASSERT_TRUE(w.add_tensor_from_f32(
      "x", ggml_type::f32, std::vector<int64_t>{static_cast<int64_t>(values.size())}, values));
  const auto path = std::filesystem::temp_directory_path() /
                    ("weft_gguf_mem_" + std::to_string(::getpid()) + ".gguf");
  ASSERT_TRUE(w.write_file(path));
  std::ifstream thp{"/sys/kernel/mm/transparent_hugepage/enabled"};
  std::string thp_modes;
  std::getline(thp, thp_modes);
  const bool huge_pages_possible =
      !thp_modes.empty() && thp_modes.find("[never]") == std::string::npos;
  for (const auto memory : {gguf_memory::mmap, gguf_memory::huge_pages}) {
    SCOPED_TRACE(memory == gguf_memory::mmap ? "mmap" : "huge-pages");
    std::vector<std::pair<size_t, size_t>> reports;
    gguf_open_config config;
    config.memory = memory;
    config.load_now = true;
    config.progress = [&](size_t done, size_t total) { reports.emplace_back(done, total); };
    auto f = gguf_file::open(path, config);
    ASSERT_TRUE(f) << f.error().message();
    EXPECT_EQ(f->size_bytes(), std::filesystem::file_size(path));
    ASSERT_GE(reports.size(), 2u);
    EXPECT_EQ(reports.front(), std::make_pair(size_t{0}, f->size_bytes()));
    EXPECT_EQ(reports.back(), std::make_pair(f->size_bytes(), f->size_bytes()));
    const auto* x = reinterpret_cast<const float*>(f->find_tensor("x")->data);
    EXPECT_TRUE(std::equal(values.begin(), values.end(), x));
    if (memory == gguf_memory::huge_pages && huge_pages_possible) {
      // The private copy starts on a 2 MiB boundary so the kernel can back it with huge pages.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(f->bytes().data()) % (uintptr_t{2} << 20), 0u);
    }
  }
  std::filesystem::remove(path);
  EXPECT_EQ(parse_gguf_memory("huge-pages"), gguf_memory::huge_pages);
  EXPECT_EQ(parse_gguf_memory("mmap"), gguf_memory::mmap);
  EXPECT_FALSE(parse_gguf_memory("hugepages"));
}

TEST(gguf_roundtrip, writer_rejects_inconsistent_tensors) {
  gguf_writer w;
  const std::vector<std::byte> ten(10);
  EXPECT_FALSE(
      w.add_tensor("x", ggml_type::f32, std::vector<int64_t>{4}, ten));  // 16 bytes expected
  EXPECT_FALSE(w.add_tensor("", ggml_type::f32, std::vector<int64_t>{1}, std::span(ten).first(4)));
  EXPECT_FALSE(
      w.add_tensor("q", ggml_type::q4_1, std::vector<int64_t>{16}, ten));  // not a block multiple
  EXPECT_TRUE(w.add_tensor("ok", ggml_type::f32, std::vector<int64_t>{1}, std::span(ten).first(4)));
  EXPECT_FALSE(
      w.add_tensor("ok", ggml_type::f32, std::vector<int64_t>{1}, std::span(ten).first(4)));
}

TEST(gguf_roundtrip, version_2_files_read_like_version_3) {
  // v2 and v3 share the layout (v3 only allowed big-endian files): relabel a v3 image as v2.
  auto bytes = metadata_of_every_type().to_bytes().value();
  bytes[4] = std::byte{2};
  auto f = gguf_file::parse(bytes);
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->version(), 2u);
  EXPECT_EQ(f->get_string("t.string").value(), "héllo wörld");
}

TEST(gguf_roundtrip, missing_file_is_not_found) {
  auto f = gguf_file::open("/nonexistent/dir/model.gguf");
  ASSERT_FALSE(f);
  EXPECT_EQ(f.error().code(), status_code::not_found);
}

}  // namespace
}  // namespace weft::gpu
