#!/usr/bin/env python3
"""Oracle test: weft's tokenizer must give the same token ids as llama.cpp (python package
llama_cpp, vocab-only load) on a mixed corpus, with and without parsing special tokens, for the
model's pre-tokenizer and every other pre-tokenizer name weft accepts; decoding and the set of
end-of-generation tokens are compared too.

Exit codes: 0 pass, 1 mismatch, 77 skipped (llama_cpp missing or model missing).
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile

MODEL_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Every tokenizer.ggml.pre name weft accepts that llama.cpp knows too ("gpt2" is weft's alias).
PRE_NAMES = ("gpt-2", "phi-2", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de",
             "llama-bpe", "llama3", "llama-v3", "falcon3", "smaug-bpe",
             "qwen2", "deepseek-r1-qwen", "stablelm2")

CORPUS = [
    "Hello world",
    "Hello, world! How are you doing today?",
    " leading space",
    "  two leading spaces",
    "trailing spaces   ",
    "I'm sure they'll say we've done what's right, and he'd agree. DON'T SHOUT, it's LOUD.",
    "The year 2024 had 366 days; pi ~ 3.14159 and 1,000,000 people.",
    "x = 12345678901234567890",
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { printf(\"%d\\n\", i); }",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size(); }",
    "<html><body class=\"main\">Hi &amp; bye</body></html>",
    "\t\tindented with tabs\n\n\nthree newlines\r\nwindows line\rcarriage",
    "   \n   \n",
    "   ",
    "\n",
    "a\u00a0b\u2003c\u3000d",  # no-break space, em space, ideographic space
    "你好，世界！今天天气很好。",
    "机器学习是人工智能的一个分支。",
    "日本語のテキストとカタカナ、ひらがな。",
    "한국어 텍스트입니다.",
    "Привет, мир! Как дела?",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "Ελληνικά γράμματα",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich.",
    "café naïve résumé coöperate",
    "Emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️",
    "math: ∑ x² ≤ ∞, α+β=γ, √2 ≈ 1.414",
    "½ ¾ ① Ⅻ ٣ ৩",  # other number categories
    "mixed123abc456def",
    "email@example.com https://example.org/path?q=1&r=2#frag",
    "$$$ %%% ^^^ ~~~ ||| \\\\ // ** ++",
    "'s 't 're 've 'm 'll 'd 'S 'RE",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>text after<|im_end|><|im_start|>",
    "<|im_start|",
    "<filename>main.py<file_sep>code<gh_stars>100",
    "a" * 300,
    "The quick brown fox jumps over the lazy dog. " * 20,
    "",
]


def random_corpus(n, seed):
    rng = random.Random(seed)
    pieces = ["the", " cat", "Ünïcödé", "日本", "😀", "123", "4567", " ", "  ", "\n", "\t", "'s", "'ll",
              "<|im_end|>", "<|im_start|>", "!!", "?", "...", "\u00a0", "x", "ß", "Σ", "\r\n", "٣", "中文",
              "--", "==", "()", "{}", "\u200d", "é", "e\u0301", "ﬁ", "İ", "K"]
    out = []
    for _ in range(n):
        out.append("".join(rng.choice(pieces) for _ in range(rng.randint(1, 25))))
    return out


def find_model():
    if os.environ.get("WEFT_MODEL") and os.path.exists(os.environ["WEFT_MODEL"]):
        return os.environ["WEFT_MODEL"]
    cache = os.environ.get("WEFT_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "weft"))
    path = os.path.join(cache, "models", MODEL_NAME)
    return path if os.path.exists(path) else None


def run_tool(tool, model, texts, parse_special):
    args = [tool, model] + (["--parse-special"] if parse_special else [])
    res = subprocess.run(args, input=json.dumps(texts).encode(), capture_output=True, check=False)
    if res.returncode != 0:
        sys.stderr.write(res.stderr.decode(errors="replace"))
        raise SystemExit(1)
    return json.loads(res.stdout)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--random", type=int, default=400)
    args = ap.parse_args()
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return skipped("python package llama_cpp is not installed (pip install llama-cpp-python)")
    model = args.model or find_model()
    if not model:
        return skipped("default model not found (run scripts/setup.sh or set WEFT_MODEL)")
    texts = CORPUS + random_corpus(args.random, 20261122)
    failures = 0
    total = 0
    # The model's own pre-tokenizer, then the same vocabulary re-labelled with the other
    # pre-tokenizers weft implements (written by weft's GGUF writer, read by llama.cpp).
    with tempfile.TemporaryDirectory() as tmp:
        for pre in (None,) + PRE_NAMES:
            path = model
            if pre is not None:
                path = os.path.join(tmp, "vocab-%s.gguf" % pre)
                subprocess.run([args.tool, model, "--vocab-copy", path, "--pre", pre], check=True)
            f, n = compare(llama_cpp, args.tool, path, texts, pre or "model")
            failures += f
            total += n
    print("tokenizer oracle: %d/%d tokenizations identical to llama.cpp (llama_cpp %s)"
          % (total - failures, total, llama_cpp.__version__))
    chat = compare_chat(args.tool, model)
    if failures:
        return 1
    if chat is None:  # the chat-template half could not run: the whole test is not a pass
        return skipped("jinja2 is not installed (pip install jinja2)")
    return 1 if chat else 0


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a joke.\nA short one."}],
    [{"role": "system", "content": ""}, {"role": "user", "content": "  spaces  "}],
    [],
]


def skipped(why):
    """Exit code for a reference that is absent: 77 (CTest: skipped) locally, 1 under CI=true,
    where the oracle tier must really run."""
    if os.environ.get("CI", "") not in ("", "0", "false"):
        print(f"FAIL: CI=true and the oracle cannot run: {why}")
        return 1
    print(f"SKIP: {why}")
    return 77


def compare_chat(tool, model):
    """weft's native rendering of the model's chat template against jinja2 running the template."""
    try:
        import jinja2
    except ImportError:
        return None
    source = gguf_string(model, "tokenizer.chat_template")
    env = jinja2.Environment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
    template = env.from_string(source)
    failures = 0
    for add_prompt in (True, False):
        args = [tool, model, "--chat"] + ([] if add_prompt else ["--no-generation-prompt"])
        res = subprocess.run(args, input=json.dumps(CONVERSATIONS).encode(), capture_output=True, check=True)
        got = json.loads(res.stdout)
        for conv, text in zip(CONVERSATIONS, got):
            ref = template.render(messages=conv, add_generation_prompt=add_prompt, bos_token="", eos_token="")
            if ref != text:
                failures += 1
                print("CHAT MISMATCH (add_generation_prompt=%s) for %r\n  jinja2: %r\n  weft:   %r"
                      % (add_prompt, conv, ref, text))
    print("chat template oracle: %d/%d prompts identical to jinja2"
          % (2 * len(CONVERSATIONS) - failures, 2 * len(CONVERSATIONS)))
    return failures


def gguf_string(path, wanted):
    """Reads one string value from a GGUF file's metadata (independent of weft's reader)."""
    import struct
    with open(path, "rb") as f:
        data = f.read(64 << 20)
    off = 24
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    def read_str(o):
        n = struct.unpack_from("<Q", data, o)[0]
        return data[o + 8:o + 8 + n].decode("utf-8"), o + 8 + n

    def skip(t, o):
        if t == 8:
            return read_str(o)[1]
        if t == 9:
            et, n = struct.unpack_from("<IQ", data, o)
            o += 12
            if et in sizes:
                return o + sizes[et] * n
            for _ in range(n):
                o = skip(et, o)
            return o
        return o + sizes[t]

    for _ in range(n_kv):
        key, off = read_str(off)
        t = struct.unpack_from("<I", data, off)[0]
        off += 4
        if key == wanted and t == 8:
            return read_str(off)[0]
        off = skip(t, off)
    raise KeyError(wanted)


# llama.cpp also ends generation on fill-in-the-middle control tokens it detects by name; weft's
# set is EOS, EOT and the end-of-turn tokens. Any other difference is a failure.
FIM_TEXTS = {"<repo_name>", "<reponame>", "<file_sep>", "<fim_pad>", "<|fim_pad|>", "<|repo_name|>",
             "<|file_sep|>", "<fim_rep>", "<fim_sep>"}


def compare_eog(llama_cpp, llm, weft_eog):
    vocab = llama_cpp.llama_model_get_vocab(llm._model.model)
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    ref = {i for i in range(n) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    got = set(weft_eog)
    extra_ref = {i for i in ref - got
                 if llm.detokenize([i], special=True).decode("utf-8", "replace") not in FIM_TEXTS}
    if got - ref or extra_ref:
        print("EOG MISMATCH: llama.cpp %s, weft %s" % (sorted(ref), sorted(got)))
        return 1
    return 0


def compare(llama_cpp, tool, model, texts, label):
    llm = llama_cpp.Llama(model_path=model, vocab_only=True, verbose=False)
    failures = 0
    for parse_special in (False, True):
        weft = run_tool(tool, model, texts, parse_special)
        for i, text in enumerate(texts):
            ref = llm.tokenize(text.encode("utf-8"), add_bos=True, special=parse_special)
            got = weft["tokens"][i]
            if got != ref:
                failures += 1
                if failures <= 10:
                    print("MISMATCH (pre=%s, parse_special=%s) for %r\n  llama.cpp: %s\n  weft:      %s"
                          % (label, parse_special, text[:120], ref[:40], got[:40]))
            # Decoding (special tokens rendered) agrees with llama.cpp's detokenizer ...
            ref_text = llm.detokenize(got, special=True).decode("utf-8", "replace")
            if weft["decoded"][i] != ref_text:
                failures += 1
                print("DECODE MISMATCH for %r\n  llama.cpp: %r\n  weft:      %r"
                      % (text[:80], ref_text[:80], weft["decoded"][i][:80]))
            # ... and gives the text back (weft's own round trip).
            if parse_special and weft["decoded"][i] != text:
                failures += 1
                print("ROUND TRIP FAILED for %r: %r" % (text[:80], weft["decoded"][i][:80]))
        if not parse_special:
            failures += compare_eog(llama_cpp, llm, weft["eog"])
    print("pre=%s: %d mismatches in %d tokenizations" % (label, failures, 2 * len(texts)))
    return failures, 2 * len(texts)


if __name__ == "__main__":
    sys.exit(main())
