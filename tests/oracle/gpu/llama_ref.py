#!/usr/bin/env python3
"""Reference outputs from llama.cpp (python package llama-cpp-python) for weft's engine oracle test.

Usage: llama_ref.py MODEL.gguf PROMPTS.json OUT.json [--tokens N] [--threads T]
PROMPTS.json: {"prompts": ["text", ...]}. For each prompt, writes the llama.cpp tokenization, the
greedy continuation (argmax of llama.cpp's logits, N tokens) and, for teacher forcing over
prompt + continuation, the per-position argmax and the gap between its two best logits.
Exit code 3 when llama_cpp is not installed (the test then skips).
"""
import json
import sys

try:
    import llama_cpp
    import numpy as np
except ImportError as e:  # pragma: no cover
    print(f"llama_cpp not available: {e}", file=sys.stderr)
    sys.exit(3)


def main():
    args = sys.argv[1:]
    n_new = 64
    threads = 2
    if "--tokens" in args:
        i = args.index("--tokens"); n_new = int(args[i + 1]); del args[i:i + 2]
    if "--threads" in args:
        i = args.index("--threads"); threads = int(args[i + 1]); del args[i:i + 2]
    model_path, prompts_path, out_path = args
    prompts = json.load(open(prompts_path))["prompts"]
    llm = llama_cpp.Llama(model_path=model_path, n_ctx=1024, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, logits_all=True, verbose=False, flash_attn=False)
    results = []
    for text in prompts:
        toks = llm.tokenize(text.encode(), add_bos=False, special=True)
        llm.reset()
        llm.eval(toks)
        gen = []
        for _ in range(n_new):
            logits = np.asarray(llm.scores[llm.n_tokens - 1])
            t = int(np.argmax(logits))
            gen.append(t)
            llm.eval([t])
        # Teacher forcing: one batch over the whole sequence, every position's logits.
        seq = toks + gen
        llm.reset()
        llm.eval(seq)
        scores = np.asarray(llm.scores[:len(seq)])
        top2 = np.sort(scores, axis=1)[:, -2:]
        results.append({
            "prompt": text,
            "prompt_tokens": toks,
            "greedy": gen,
            "tf_argmax": [int(x) for x in np.argmax(scores, axis=1)],
            "tf_margin": [float(x) for x in (top2[:, 1] - top2[:, 0])],
        })
    json.dump({"model": model_path, "llama_cpp_version": llama_cpp.__version__, "results": results},
              open(out_path, "w"))


if __name__ == "__main__":
    main()
