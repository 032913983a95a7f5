// The training loop's parts (gpu/train/): SFT data encoding and loss masks, bad lines named by
// number, the deterministic sampler, exact checkpoints (round trip, corruption refused, fallback),
// bit-identical resume (mid-epoch, at an epoch boundary, right after a checkpoint), learning on a
// tiny task, and GGUF export loaded back by the serving engine.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <set>

#include "gpu/chat_template.hpp"
#include "gpu/device.hpp"
#include "gpu/gguf.hpp"
#include "gpu/gguf_writer.hpp"
#include "gpu/kv_cache.hpp"
#include "gpu/model.hpp"
#include "gpu/tiny_model.hpp"
#include "gpu/tokenizer.hpp"
#include "gpu/train/checkpoint.hpp"
#include "gpu/train/export.hpp"
#include "gpu/train/sft_data.hpp"
#include "gpu/train/sft_trainer.hpp"

namespace {

using namespace weft::gpu;
using namespace weft::gpu::train;
namespace fs = std::filesystem;

tiny_model_config tiny_cfg() {
  tiny_model_config c;
  c.n_layers = 2;
  c.n_embd = 32;
  c.n_head = 4;
  c.n_head_kv = 2;
  c.n_ff = 64;
  c.n_vocab = 384;
  return c;
}

gguf_file tiny_file() {
  auto img = make_tiny_model(tiny_cfg());
  EXPECT_TRUE(img.ok());
  auto f = gguf_file::parse(*img);
  EXPECT_TRUE(f.ok());
  return std::move(f.value());
}

struct fixture {
  gguf_file file = tiny_file();
  tokenizer tok = std::move(tokenizer::from_gguf(file).value());
  chat_template chat = std::move(chat_template::from_gguf(file).value());
};

fs::path temp_dir(const std::string& name) {
  auto d = fs::temp_directory_path() / ("weft-train-" + name + "-" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string loss_text(const sft_example& ex, const tokenizer& tok) {
  std::vector<token_id> ids;
  for (size_t i = 0; i < ex.tokens.size(); ++i) {
    if (ex.in_loss[i]) ids.push_back(ex.tokens[i]);
  }
  return tok.decode(ids, render_special::yes);
}

TEST(sft_data, messages_put_only_assistant_turns_in_the_loss) {
  fixture fx;
  const std::string line =
      R"({"messages": [{"role": "user", "content": "Say hi"}, {"role": "assistant", "content": "Hi there"},)"
      R"( {"role": "user", "content": "Again"}, {"role": "assistant", "content": "Hello"}]})";
  auto ex = encode_sft_line(line, fx.tok, &fx.chat, {});
  ASSERT_TRUE(ex.ok()) << ex.error().to_string();
  EXPECT_EQ(loss_text(*ex, fx.tok), "Hi there<|im_end|>\nHello<|im_end|>\n");
  // The tokens are those of the whole rendered conversation.
  std::vector<chat_message> ms = {
      {"user", "Say hi"}, {"assistant", "Hi there"}, {"user", "Again"}, {"assistant", "Hello"}};
  auto text = fx.chat.apply(ms, generation_prompt::omit);
  ASSERT_TRUE(text.ok());
  std::vector<token_id> ids(ex->tokens.begin(), ex->tokens.end());
  EXPECT_EQ(fx.tok.decode(ids, render_special::yes), *text);
}

TEST(sft_data, prompt_completion_learns_the_completion_and_the_end) {
  fixture fx;
  auto ex = encode_sft_line(R"({"prompt": "2+2=", "completion": "4"})", fx.tok, &fx.chat, {});
  ASSERT_TRUE(ex.ok()) << ex.error().to_string();
  EXPECT_EQ(loss_text(*ex, fx.tok), "4<|im_end|>");
  EXPECT_EQ(ex->in_loss[0], 0);
  sft_data_config tight;
  tight.max_seq_tokens = 3;
  auto cut = encode_sft_line(R"({"prompt": "a long prompt here", "completion": "x"})", fx.tok,
                             &fx.chat, tight);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.error().message().find("no token in the loss"), std::string::npos);
}

TEST(sft_data, bad_lines_are_named_by_number_and_the_run_refuses) {
  fixture fx;
  const auto dir = temp_dir("bad");
  const auto path = dir / "train.jsonl";
  {
    std::ofstream out(path);
    out << R"({"prompt": "a", "completion": "b"})"
        << "\n";
    out << "{not json\n\n";
    out << R"({"messages": [{"role": "user", "content": "only a question"}]})"
        << "\n";
    out << R"({"prompt": 3, "completion": "b"})"
        << "\n";
  }
  auto d = load_sft_jsonl(path, fx.tok, &fx.chat, {});
  ASSERT_FALSE(d.ok());
  const auto& msg = d.error().message();
  EXPECT_NE(msg.find("3 bad line(s)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.jsonl:2: not valid JSON"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.jsonl:4: no assistant message"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.jsonl:5: 'prompt' and 'completion' must both be strings"),
            std::string::npos)
      << msg;
  EXPECT_FALSE(load_sft_jsonl(dir / "missing.jsonl", fx.tok, &fx.chat, {}).ok());
  fs::remove_all(dir);
}

sft_dataset arithmetic(const fixture& fx, int n) {
  sft_dataset d;
  for (int i = 0; i < n; ++i) {
    const int a = i % 7, b = (i * 3) % 5;
    const std::string line = R"({"prompt": ")" + std::to_string(a) + "+" + std::to_string(b) +
                             R"(=", "completion": ")" + std::to_string(a + b) + R"("})";
    auto ex = encode_sft_line(line, fx.tok, &fx.chat, {});
    EXPECT_TRUE(ex.ok());
    d.tokens += static_cast<int64_t>(ex->tokens.size());
    d.examples.push_back(std::move(*ex));
  }
  return d;
}

TEST(sft_sampler, deterministic_epochs_and_token_budgets) {
  fixture fx;
  const auto data = arithmetic(fx, 10);
  const int64_t size = static_cast<int64_t>(data.examples[0].tokens.size());
  sft_sampler a(data, 7, 3 * size, 2 * size), b(data, 7, 3 * size, 2 * size),
      c(data, 8, 3 * size, 2 * size);
  EXPECT_EQ(a.permutation(0), b.permutation(0));
  EXPECT_NE(a.permutation(0), a.permutation(1));
  EXPECT_NE(a.permutation(0), c.permutation(0));
  auto p = a.permutation(0);
  EXPECT_EQ(std::set<int64_t>(p.begin(), p.end()).size(), 10u);
  int64_t seen = 0;
  for (int s = 0; s < 3; ++s) {
    auto micro = a.next_step();
    int64_t tokens = 0;
    for (const auto& m : micro) {
      EXPECT_LE(m.n_tokens(), 2 * size + 2);
      tokens += m.n_tokens();
      seen += m.seqs.n_seqs();
    }
    EXPECT_LE(tokens, 3 * size + 2);
  }
  EXPECT_EQ(a.cursor().epoch, 0);
  EXPECT_EQ(a.cursor().index, seen);
  // A sampler set to the same cursor continues identically.
  b.set_cursor(a.cursor());
  auto x = a.next_step(), y = b.next_step();
  ASSERT_EQ(x.size(), y.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(x[i].tokens, y[i].tokens);
}

checkpoint_state sample_state() {
  checkpoint_state s;
  s.step = 12;
  s.cursor = {1, 3};
  s.seed = 99;
  s.adam_steps = 12;
  s.names = {"a", "b"};
  s.values = {{1.5f, -2.0f}, {3.25f}};
  s.m = {{0.1f, 0.2f}, {0.3f}};
  s.v = {{0.01f, 0.02f}, {0.03f}};
  s.history = {{1, 2.5, 1e-3, 0.7, 64}, {2, 2.25, 1e-3, 0.6, 64}};
  return s;
}

TEST(checkpoint, round_trip_corruption_and_fallback) {
  const auto dir = temp_dir("ckpt");
  auto s = sample_state();
  ASSERT_TRUE(write_checkpoint(dir, s).ok());
  auto r = read_checkpoint(checkpoint_path(dir, 12));
  ASSERT_TRUE(r.ok()) << r.error().to_string();
  EXPECT_EQ(r->values, s.values);
  EXPECT_EQ(r->m, s.m);
  EXPECT_EQ(r->v, s.v);
  EXPECT_EQ(r->history, s.history);
  EXPECT_EQ(r->cursor, s.cursor);
  EXPECT_EQ(r->seed, 99u);
  // A newer checkpoint with a flipped byte, and a truncated one: refused by name; the loader falls
  // back to step 12.
  s.step = 13;
  ASSERT_TRUE(write_checkpoint(dir, s).ok());
  s.step = 14;
  ASSERT_TRUE(write_checkpoint(dir, s).ok());
  {
    std::fstream f(checkpoint_path(dir, 13), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-12, std::ios::end);
    f.put('\x7f');
  }
  fs::resize_file(checkpoint_path(dir, 14), fs::file_size(checkpoint_path(dir, 14)) - 5);
  auto bad = read_checkpoint(checkpoint_path(dir, 13));
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("step-00000013.ckpt"), std::string::npos);
  EXPECT_NE(bad.error().message().find("checksum"), std::string::npos);
  std::vector<std::string> skipped;
  auto latest = load_latest_checkpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(latest->step, 12);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_NE(skipped[0].find("step-00000014.ckpt"), std::string::npos);
  EXPECT_NE(skipped[0].find("truncated"), std::string::npos) << skipped[0];
  // Pruning keeps the newest files.
  prune_checkpoints(dir, 1);
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 12)));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 14)));
  EXPECT_FALSE(load_latest_checkpoint(temp_dir("empty")).ok());
  fs::remove_all(dir);
}

TEST(checkpoint, async_writer_writes_in_the_background_and_keeps_the_newest) {
  const auto dir = temp_dir("async");
  {
    async_checkpointer w(dir, 2);
    for (int i = 1; i <= 4; ++i) {
      auto s = sample_state();
      s.step = i;
      ASSERT_TRUE(w.save(std::move(s)).ok());
    }
    ASSERT_TRUE(w.wait().ok());
  }
  EXPECT_FALSE(fs::exists(checkpoint_path(dir, 2)));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 3)));
  EXPECT_TRUE(fs::exists(checkpoint_path(dir, 4)));
  fs::remove_all(dir);
}

sft_config small_run(int64_t step_tokens) {
  sft_config c;
  c.seed = 5;
  c.step_tokens = step_tokens;
  c.micro_batch_tokens = step_tokens / 2 + 1;
  c.schedule.peak = 3e-3;
  c.schedule.warmup_steps = 2;
  c.schedule.total_steps = 8;
  c.adamw.weight_decay = 0.01;
  return c;
}

std::unique_ptr<trainable_model<float>> fresh_model(const gguf_file& f) {
  auto m = trainable_model<float>::load(f);
  EXPECT_TRUE(m.ok());
  return std::move(m.value());
}

/// Runs `total` steps straight, and again with a stop after `cut` steps, a checkpoint written and
/// read back, a new model and trainer; weights and loss curves must be bit-identical.
void expect_exact_resume(int64_t cut, int64_t total, int n_examples, int parallel = 1) {
  fixture fx;
  const auto data = arithmetic(fx, n_examples);
  const auto size = static_cast<int64_t>(data.examples[0].tokens.size());
  auto cfg = small_run(4 * size);
  cfg.parallel = parallel;
  auto straight = fresh_model(fx.file);
  sft_trainer a(*straight, data, cfg);
  for (int64_t i = 0; i < total; ++i) ASSERT_TRUE(a.step().ok());

  const auto dir = temp_dir("resume");
  {
    auto first = fresh_model(fx.file);
    sft_trainer b(*first, data, cfg);
    for (int64_t i = 0; i < cut; ++i) ASSERT_TRUE(b.step().ok());
    auto snap = b.snapshot();
    ASSERT_TRUE(snap.ok());
    ASSERT_TRUE(write_checkpoint(dir, *snap).ok());
  }
  auto second = fresh_model(fx.file);
  sft_trainer c(*second, data, cfg);
  auto s = load_latest_checkpoint(dir);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE(c.restore(*s).ok());
  EXPECT_EQ(c.steps_done(), cut);
  for (int64_t i = cut; i < total; ++i) ASSERT_TRUE(c.step().ok());
  EXPECT_EQ(c.steps_done(), total);
  EXPECT_EQ(c.history(), a.history());
  for (size_t i = 0; i < straight->parameters().size(); ++i) {
    EXPECT_EQ(second->parameters()[i].value, straight->parameters()[i].value)
        << straight->parameters()[i].name;
  }
  fs::remove_all(dir);
}

TEST(sft_trainer, resume_mid_epoch_is_bit_identical) {
  expect_exact_resume(3, 6, 10);
}

TEST(sft_trainer, resume_at_an_epoch_boundary_is_bit_identical) {
  // 8 examples, 4 per step: step 2 ends the first epoch exactly.
  expect_exact_resume(2, 5, 8);
}

TEST(sft_trainer, resume_with_parallel_shares_is_bit_identical) {
  expect_exact_resume(3, 6, 10, /*parallel=*/3);
}

/// Shares of a step computed on threads: the same bits on every run, and the same training as one
/// thread up to float summation order.
TEST(sft_trainer, parallel_shares_repeat_bit_for_bit_and_track_one_thread) {
  fixture fx;
  const auto data = arithmetic(fx, 24);
  const auto size = static_cast<int64_t>(data.examples[0].tokens.size());
  auto run = [&](int parallel) {
    auto m = fresh_model(fx.file);
    auto cfg = small_run(8 * size);
    cfg.parallel = parallel;
    sft_trainer t(*m, data, cfg);
    for (int i = 0; i < 5; ++i) EXPECT_TRUE(t.step().ok());
    std::vector<std::vector<float>> w;
    for (const auto& p : m->parameters()) w.push_back(p.value);
    return std::make_pair(t.history(), w);
  };
  const auto one = run(1);
  const auto two = run(2);
  const auto again = run(2);
  EXPECT_EQ(two.first, again.first);
  EXPECT_EQ(two.second, again.second);
  ASSERT_EQ(one.first.size(), two.first.size());
  for (size_t i = 0; i < one.first.size(); ++i) {
    EXPECT_NEAR(one.first[i].loss, two.first[i].loss, 1e-4 * std::abs(one.first[i].loss)) << i;
    EXPECT_EQ(one.first[i].tokens, two.first[i].tokens);
  }
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(sft_trainer, a_live_checkpoint_has_the_bytes_of_a_snapshot) {
  fixture fx;
  const auto data = arithmetic(fx, 12);
  const auto size = static_cast<int64_t>(data.examples[0].tokens.size());
  auto model = fresh_model(fx.file);
  sft_trainer t(*model, data, small_run(4 * size));
  const auto staged = temp_dir("staged"), live = temp_dir("live");
  async_checkpointer w(live, 3);
  ASSERT_TRUE(t.step().ok());
  // A background save pending when the live one is written: write_now waits for it first.
  ASSERT_TRUE(w.save([&](checkpoint_state& s) { return t.snapshot_into(s); }).ok());
  ASSERT_TRUE(t.step().ok());
  auto snap = t.snapshot();
  ASSERT_TRUE(snap.ok());
  ASSERT_TRUE(write_checkpoint(staged, *snap).ok());
  checkpoint_state meta;
  auto view = t.live_checkpoint(meta);
  ASSERT_TRUE(view.ok());
  EXPECT_TRUE(meta.values.empty());  // the tensors are borrowed, not copied
  ASSERT_TRUE(w.write_now(*view).ok());
  EXPECT_TRUE(fs::exists(checkpoint_path(live, 1)));
  const auto a = file_bytes(checkpoint_path(staged, 2)), b = file_bytes(checkpoint_path(live, 2));
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  auto back = read_checkpoint(checkpoint_path(live, 2));
  ASSERT_TRUE(back.ok()) << back.error().to_string();
  EXPECT_EQ(back->values, snap->values);
  EXPECT_EQ(back->v, snap->v);
  fs::remove_all(staged);
  fs::remove_all(live);
}

TEST(sft_trainer, resume_refuses_another_seed) {
  fixture fx;
  const auto data = arithmetic(fx, 6);
  auto m = fresh_model(fx.file);
  auto cfg = small_run(64);
  sft_trainer a(*m, data, cfg);
  ASSERT_TRUE(a.step().ok());
  auto snap = a.snapshot();
  ASSERT_TRUE(snap.ok());
  cfg.seed = 6;
  sft_trainer b(*m, data, cfg);
  auto st = b.restore(*snap);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("seed"), std::string::npos);
}

TEST(sft_trainer, learns_a_tiny_task) {
  fixture fx;
  const auto data = arithmetic(fx, 12);
  auto m = fresh_model(fx.file);
  auto cfg = small_run(1 << 20);  // every example in every step
  cfg.schedule.peak = 1e-2;
  cfg.schedule.total_steps = 40;
  sft_trainer t(*m, data, cfg);
  double first = 0, last = 0;
  for (int i = 0; i < 40; ++i) {
    auto r = t.step();
    ASSERT_TRUE(r.ok());
    if (i == 0) first = r->loss;
    last = r->loss;
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(evaluate_loss, is_the_training_loss_of_the_same_examples_and_changes_nothing) {
  fixture fx;
  const auto data = arithmetic(fx, 12);
  auto m = fresh_model(fx.file);
  const auto before = m->parameters()[0].value;
  auto whole = evaluate_loss(*m, data, 1 << 20);
  auto alone = evaluate_loss(*m, data, 1);  // every example in a batch of its own
  ASSERT_TRUE(whole.ok() && alone.ok());
  EXPECT_EQ(whole->examples, 12);
  int64_t in_loss = 0;
  for (const auto& ex : data.examples) {
    for (size_t i = 1; i < ex.in_loss.size(); ++i) in_loss += ex.in_loss[i];
  }
  EXPECT_EQ(whole->tokens, in_loss);
  // The sum a group of ranks adds up, exactly what the mean was divided from.
  EXPECT_EQ(whole->loss, whole->nll_sum / static_cast<double>(whole->tokens));
  EXPECT_GT(whole->nll_sum, 0.0);
  EXPECT_NEAR(alone->loss, whole->loss, 1e-6 * whole->loss);
  EXPECT_EQ(m->parameters()[0].value, before);
  // A step over every example starts from the same weights: its loss is the evaluation's.
  sft_trainer t(*m, data, small_run(1 << 20));
  auto r = t.step();
  ASSERT_TRUE(r.ok());
  EXPECT_NEAR(r->loss, whole->loss, 1e-5 * whole->loss);
  auto after = evaluate_loss(*m, data, 1 << 20);
  ASSERT_TRUE(after.ok());
  EXPECT_LT(after->loss, whole->loss);
  EXPECT_FALSE(evaluate_loss(*m, sft_dataset{}, 64).ok());  // nothing in the loss
}

TEST(export_gguf, the_engine_serves_what_the_trainer_trained) {
  fixture fx;
  auto m = fresh_model(fx.file);
  const auto data = arithmetic(fx, 4);
  sft_trainer t(*m, data, small_run(1 << 20));
  ASSERT_TRUE(t.step().ok());
  const auto dir = temp_dir("export");
  for (auto type : {ggml_type::f32, ggml_type::f16, ggml_type::bf16, ggml_type::q8_0}) {
    const auto path = dir / (std::string{type_name(type)} + ".gguf");
    ASSERT_TRUE(export_gguf(fx.file, *m, type, path).ok());
    auto f = gguf_file::open(path);
    ASSERT_TRUE(f.ok()) << f.error().to_string();
    EXPECT_EQ(f->find_tensor("blk.0.attn_q.weight")->type, type);
    EXPECT_EQ(f->find_tensor("blk.0.attn_norm.weight")->type, ggml_type::f32);
    EXPECT_TRUE(f->contains("tokenizer.ggml.tokens"));
    EXPECT_EQ(*f->get_u32("general.file_type"), llama_file_type(type));
    // Loaded back by the trainer: the same weights (exact for f32).
    auto back = trainable_model<float>::load(*f);
    ASSERT_TRUE(back.ok());
    if (type == ggml_type::f32) {
      for (size_t i = 0; i < m->parameters().size(); ++i) {
        EXPECT_EQ((*back)->parameters()[i].value, m->parameters()[i].value);
      }
    }
  }
  // The engine serves the f32 and the bf16 export with the logits of the trainer holding the
  // same weights (the bf16 ones exactly as the file has them).
  for (const char* name : {"f32", "bf16"}) {
    SCOPED_TRACE(name);
    auto dev = device_registry::instance().create("cpu", device_config{1, 0});
    const auto path = dir / (std::string{name} + ".gguf");
    auto tf = gguf_file::open(path);
    ASSERT_TRUE(tf.ok());
    auto ref = trainable_model<float>::load(*tf);
    ASSERT_TRUE(ref.ok());
    auto f = gguf_file::open(path);
    auto em = model::load(std::move(*f), **dev);
    ASSERT_TRUE(em.ok()) << em.error().to_string();
    kv_cache_config kc;
    kc.layout = (*em)->kv_layout_for(4);
    kc.n_blocks = 16;
    auto kv = kv_cache::create(**dev, kc);
    const std::vector<int32_t> toks = {5, 77, 120, 9};
    forward_batch fb;
    fb.add((*kv)->create_sequence(), toks, true);
    forward_output out;
    ASSERT_TRUE((*em)->forward(fb, **kv, out).ok());
    train_batch tb;
    tb.add(toks, std::vector<uint8_t>(toks.size(), 1));
    auto tl = (*ref)->logits(tb);
    ASSERT_TRUE(tl.ok());
    // The engine keeps K/V in fp16: agreement to that precision, relative to the logits' scale.
    const int64_t vocab = m->hparams().n_vocab;
    double max_abs = 0, max_diff = 0;
    for (int64_t j = 0; j < vocab; ++j) {
      const double e = out.logits[static_cast<size_t>(j)];
      max_abs = std::max(max_abs, std::abs(e));
      max_diff = std::max(max_diff, std::abs(e - (*tl)[3 * vocab + j]));
    }
    std::cout << "[trainer vs engine, " << name << "] max |logit| " << max_abs
              << ", max difference " << max_diff << "\n";
    EXPECT_GT(max_abs, 0.1);
    EXPECT_LE(max_diff, 2e-3 * std::max(1.0, max_abs));
  }
  fs::remove_all(dir);
}

}  // namespace
