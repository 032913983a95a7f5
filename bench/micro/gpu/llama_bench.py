#!/usr/bin/env python3
"""llama.cpp side of weft's engine benchmark (same GGUF, same thread count, same workload).

Usage: llama_bench.py MODEL THREADS PROMPT_LEN DECODE_STEPS BATCH[,BATCH...]
Prints one JSON object: {"version": ..., "results": [{"batch": B, "prefill_tok_s": .., "decode_tok_s": ..}]}.
Prefill: B prompts of PROMPT_LEN tokens in ubatches of 512 tokens; decode: B sequences advance one
token per llama_decode call for DECODE_STEPS steps (continuous batching at batch B).
"""
import ctypes
import json
import sys
import time

import llama_cpp as L


def main():
    model_path, threads, plen, steps, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), [
        int(b) for b in sys.argv[5].split(",")]
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    model = L.llama_model_load_from_file(model_path.encode(), mp)
    results = []
    for B in batches:
        cp = L.llama_context_default_params()
        cp.n_ctx = B * (plen + steps) + 256
        cp.n_batch = 512
        cp.n_ubatch = 512
        cp.n_seq_max = B
        cp.n_threads = threads
        cp.n_threads_batch = threads
        cp.flash_attn = False
        ctx = L.llama_init_from_model(model, cp)
        batch = L.llama_batch_init(512, 0, B)

        def run(items):
            # items: list of (token, pos, seq, logits)
            for off in range(0, len(items), 512):
                chunk = items[off:off + 512]
                batch.n_tokens = len(chunk)
                for i, (t, p, s, lg) in enumerate(chunk):
                    batch.token[i] = t
                    batch.pos[i] = p
                    batch.n_seq_id[i] = 1
                    batch.seq_id[i][0] = s
                    batch.logits[i] = 1 if lg else 0
                rc = L.llama_decode(ctx, batch)
                if rc != 0:
                    raise RuntimeError(f"llama_decode failed: {rc}")
            L.llama_synchronize(ctx)

        prompt = [(100 + (7 * i) % 1000) for i in range(plen)]
        items = [(prompt[i], i, s, i == plen - 1) for s in range(B) for i in range(plen)]
        t0 = time.perf_counter()
        run(items)
        t1 = time.perf_counter()
        for k in range(steps):
            run([(200 + k, plen + k, s, True) for s in range(B)])
        t2 = time.perf_counter()
        results.append({"batch": B, "prefill_tok_s": B * plen / (t1 - t0), "decode_tok_s": B * steps / (t2 - t1)})
        L.llama_batch_free(batch)
        L.llama_free(ctx)
    L.llama_model_free(model)
    print(json.dumps({"version": L.__version__, "results": results}))


if __name__ == "__main__":
    main()
