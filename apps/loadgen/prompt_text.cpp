#include "apps/loadgen/prompt_text.hpp"

#include <array>
#include <random>
#include <string_view>

#include "apps/loadgen/distributions.hpp"

namespace weft::apps::loadgen {

namespace {

// Short, frequent words: one token each (with their leading space) in common BPE vocabularies.
constexpr std::array<std::string_view, 160> words = {
    "the",    "of",      "and",     "to",     "in",      "is",     "that",   "for",     "it",
    "as",     "with",    "was",     "on",     "be",      "by",     "at",     "this",    "from",
    "or",     "an",      "are",     "not",    "have",    "but",    "had",    "they",    "his",
    "which",  "one",     "you",     "were",   "her",     "all",    "she",    "there",   "would",
    "their",  "we",      "him",     "been",   "has",     "when",   "who",    "will",    "more",
    "no",     "if",      "out",     "so",     "said",    "what",   "up",     "its",     "about",
    "into",   "than",    "them",    "can",    "only",    "other",  "new",    "some",    "could",
    "time",   "these",   "two",     "may",    "then",    "do",     "first",  "any",     "my",
    "now",    "such",    "like",    "our",    "over",    "man",    "me",     "even",    "most",
    "made",   "after",   "also",    "did",    "many",    "before", "must",   "through", "back",
    "years",  "where",   "much",    "your",   "way",     "well",   "down",   "should",  "because",
    "each",   "just",    "those",   "people", "how",     "too",    "little", "state",   "good",
    "very",   "make",    "world",   "still",  "own",     "see",    "men",    "work",    "long",
    "get",    "here",    "between", "both",   "life",    "being",  "under",  "never",   "day",
    "same",   "another", "know",    "while",  "last",    "might",  "us",     "great",   "old",
    "year",   "off",     "come",    "since",  "against", "go",     "came",   "right",   "used",
    "take",   "three",   "small",   "house",  "water",   "city",   "light",  "school",  "family",
    "number", "order",   "power",   "music",  "party",   "story",  "river",
};

}  // namespace

void append_words(std::string& out, uint64_t seed, int64_t n_words) {
  std::mt19937_64 rng{mix_seed(seed, 0x7e47)};
  std::uniform_int_distribution<size_t> pick{0, words.size() - 1};
  for (int64_t i = 0; i < n_words; ++i) {
    out += ' ';
    out += words[pick(rng)];
  }
}

std::string make_words(uint64_t seed, int64_t n_words) {
  std::string s;
  append_words(s, seed, n_words);
  return s;
}

}  // namespace weft::apps::loadgen
