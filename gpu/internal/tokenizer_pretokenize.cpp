#include "gpu/internal/tokenizer_pretokenize.hpp"

#include "gpu/internal/tokenizer_unicode.hpp"

namespace weft::gpu::internal {

namespace {

// Code point access limited to one fragment [begin, end): outside it there is "no code point",
// which belongs to no class (so lookaheads stop at fragment boundaries).
class fragment_view {
 public:
  fragment_view(std::span<const uint32_t> cpts, size_t begin, size_t end)
      : cpts_(cpts), begin_(begin), end_(end) {}

  uint32_t cpt(size_t pos) const { return pos >= begin_ && pos < end_ ? cpts_[pos] : no_cpt; }
  bool in_range(size_t pos) const { return pos >= begin_ && pos < end_; }
  bool is(size_t pos, cpt_class c) const { return in_range(pos) && classify(cpts_[pos]) == c; }
  bool letter(size_t pos) const { return is(pos, cpt_class::letter); }
  bool number(size_t pos) const { return is(pos, cpt_class::number); }
  bool space(size_t pos) const { return is(pos, cpt_class::whitespace); }
  // [^\s\p{L}\p{N}]: any code point in range that is none of the three.
  bool other(size_t pos) const { return is(pos, cpt_class::other); }

 private:
  std::span<const uint32_t> cpts_;
  size_t begin_;
  size_t end_;
};

uint32_t ascii_lower(uint32_t c) {
  return c >= 'A' && c <= 'Z' ? c + 32 : c;
}

// Length of a contraction ('s 't 'm 'd 're 've 'll) at pos, or 0.
size_t contraction_length(const fragment_view& v, size_t pos, bool ignore_case) {
  if (v.cpt(pos) != '\'') return 0;
  const auto low = [&](size_t p) {
    const uint32_t c = v.cpt(p);
    return ignore_case ? ascii_lower(c) : c;
  };
  const uint32_t c1 = low(pos + 1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  const uint32_t c2 = low(pos + 2);
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

template <class Matcher>
fragments split_each(std::span<const uint32_t> cpts, const fragments& in, Matcher&& match) {
  fragments out;
  out.reserve(in.size());
  size_t begin = 0;
  for (size_t len : in) {
    const size_t end = begin + len;
    const fragment_view v(cpts, begin, end);
    size_t pos = begin;
    while (pos < end) {
      const size_t next = match(v, pos);
      out.push_back(next - pos);
      pos = next;
    }
    begin = end;
  }
  return out;
}

// Shared tail of both matchers: whitespace runs. Returns the end of the match at pos.
size_t match_whitespace_run(const fragment_view& v, size_t pos) {
  size_t n = 0;
  while (v.space(pos + n)) ++n;
  if (n > 1 && v.in_range(pos + n)) return pos + n - 1;  // \s+(?!\S): leave one for the next word
  if (n > 0) return pos + n;                             // \s+
  return pos + 1;                                        // no rule matched: a single code point
}

}  // namespace

fragments split_gpt2(std::span<const uint32_t> cpts, const fragments& in) {
  return split_each(cpts, in, [](const fragment_view& v, size_t pos) -> size_t {
    if (size_t n = contraction_length(v, pos, false)) return pos + n;
    const size_t start = v.cpt(pos) == ' ' ? pos + 1 : pos;  // optional leading space
    if (v.letter(start)) {
      size_t p = start;
      while (v.letter(p)) ++p;
      return p;
    }
    if (v.number(start)) {
      size_t p = start;
      while (v.number(p)) ++p;
      return p;
    }
    if (v.other(start)) {
      size_t p = start;
      while (v.other(p)) ++p;
      return p;
    }
    return match_whitespace_run(v, pos);
  });
}

fragments split_each_number(std::span<const uint32_t> cpts, const fragments& in) {
  return split_each(cpts, in, [](const fragment_view& v, size_t pos) -> size_t {
    if (v.number(pos)) return pos + 1;
    size_t p = pos;
    while (v.in_range(p) && !v.number(p)) ++p;
    return p;
  });
}

fragments split_llama3(std::span<const uint32_t> cpts, const fragments& in, size_t max_digits) {
  return split_each(cpts, in, [max_digits](const fragment_view& v, size_t pos) -> size_t {
    if (size_t n = contraction_length(v, pos, true)) return pos + n;
    const uint32_t c = v.cpt(pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (c != '\r' && c != '\n' && !v.number(pos) && (v.letter(pos) || v.letter(pos + 1))) {
      size_t p = pos + 1;
      while (v.letter(p)) ++p;
      return p;
    }
    // \p{N}{1,max_digits}
    if (v.number(pos)) {
      size_t p = pos;
      while (v.number(p) && p - pos < max_digits) ++p;
      return p;
    }
    // ' '?[^\s\p{L}\p{N}]+[\r\n]*
    const size_t start = c == ' ' ? pos + 1 : pos;
    if (v.other(start)) {
      size_t p = start;
      while (v.other(p)) ++p;
      while (v.cpt(p) == '\r' || v.cpt(p) == '\n') ++p;
      return p;
    }
    // \s*[\r\n]+ : the whitespace run up to and including its last \r or \n.
    size_t n = 0;
    size_t last_newline_end = 0;
    while (v.space(pos + n)) {
      const uint32_t w = v.cpt(pos + n);
      ++n;
      if (w == '\r' || w == '\n') last_newline_end = pos + n;
    }
    if (last_newline_end != 0) return last_newline_end;
    return match_whitespace_run(v, pos);
  });
}

}  // namespace weft::gpu::internal
