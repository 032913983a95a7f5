#!/usr/bin/env python3
"""PyTorch side of the trainer oracle (tests/oracle/gpu/train_oracle_test.cpp).

Hugging Face transformers loads the same GGUF the weft trainer loaded (it dequantizes it and undoes
llama.cpp's Q/K row permutation). A mixture-of-experts GGUF (llama.cpp's Mixtral layout, which
transformers 4.46 cannot load from GGUF) becomes transformers' MixtralForCausalLM: its config from the
file's metadata, its weights read with the `gguf` package (dequantized, Q/K rows un-permuted), so the
forward and autograd are Hugging Face's and PyTorch's. On the batch weft used, this script computes with PyTorch autograd:
the mean token loss and every parameter's gradient, ten AdamW steps, and the logits of the GGUF weft
exported after its own ten steps (loaded by transformers, and by llama.cpp); it compares them with
weft's numbers (written by the C++ test) and
prints one JSON object of measurements. The C++ test asserts the thresholds.

usage: train_oracle.py MODEL.gguf WORK_DIR
WORK_DIR holds batch.json, index.json, grads.bin, adam.json, logits.bin and exported.gguf from weft.
"""
import json
import os
import sys

try:
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM
except ImportError as e:  # the C++ test reports a skip (locally) or a failure (CI)
    print(f"missing Python package: {e}", file=sys.stderr)
    sys.exit(3)


def meta(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.parts[f.data[0]].tolist()[0]


def unpermute(w, n_head):
    """The inverse of `permute`: GGUF Q/K rows -> Hugging Face layout."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def load_mixtral(path):
    import gguf
    from gguf.quants import dequantize
    from transformers import MixtralConfig, MixtralForCausalLM
    r = gguf.GGUFReader(path)
    tensors = {t.name: np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
               .reshape([int(x) for x in reversed(t.shape)]) for t in r.tensors}
    tied = "output.weight" not in tensors
    heads, kv_heads = meta(r, "llama.attention.head_count"), meta(r, "llama.attention.head_count_kv")
    n_experts = meta(r, "llama.expert_count")
    cfg = MixtralConfig(
        vocab_size=tensors["token_embd.weight"].shape[0],
        hidden_size=meta(r, "llama.embedding_length"),
        intermediate_size=tensors["blk.0.ffn_gate_exps.weight"].shape[1],
        num_hidden_layers=meta(r, "llama.block_count"), num_attention_heads=heads,
        num_key_value_heads=kv_heads, num_local_experts=n_experts,
        num_experts_per_tok=meta(r, "llama.expert_used_count"),
        rms_norm_eps=meta(r, "llama.attention.layer_norm_rms_epsilon"),
        rope_theta=meta(r, "llama.rope.freq_base", 10000.0),
        max_position_embeddings=meta(r, "llama.context_length"), tie_word_embeddings=tied,
        sliding_window=None, router_jitter_noise=0.0, output_router_logits=False)
    model = MixtralForCausalLM(cfg).to(torch.float32)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for gname, (hf_names, n_head) in gguf_names(model).items():
            w = tensors[gname]
            if n_head is not None:
                w = unpermute(w, n_head)
            w = w.reshape(len(hf_names), -1, w.shape[-1]) if len(hf_names) > 1 else [w]
            for hf, part in zip(hf_names, w):
                params[hf].copy_(torch.from_numpy(np.ascontiguousarray(part)))
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.eval()
    return model


def is_moe(path):
    import gguf
    return meta(gguf.GGUFReader(path), "llama.expert_count", 0) > 0


def load(path):
    if is_moe(path):
        return load_mixtral(path)
    # A GGUF without output.weight ties the head to the embedding (SmolLM2); transformers 4.46 does
    # not infer that from the file, so say it.
    import gguf
    tied = all(t.name != "output.weight" for t in gguf.GGUFReader(path).tensors)
    model = AutoModelForCausalLM.from_pretrained(
        os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path),
        torch_dtype=torch.float32, tie_word_embeddings=tied)
    if tied:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    model.eval()  # no dropout (there is none in llama; eval keeps it explicit)
    return model


def gguf_names(model):
    """weft's (GGUF) parameter names -> (HF parameters, rows permuted like llama.cpp's converter).
    An MoE expert tensor [experts][rows][cols] is the HF experts' matrices stacked in order."""
    cfg = model.config
    m = {"token_embd.weight": (["model.embed_tokens.weight"], None),
         "output_norm.weight": (["model.norm.weight"], None)}
    if not cfg.tie_word_embeddings:
        m["output.weight"] = (["lm_head.weight"], None)
    for i in range(cfg.num_hidden_layers):
        p, h = f"blk.{i}.", f"model.layers.{i}."
        m[p + "attn_norm.weight"] = ([h + "input_layernorm.weight"], None)
        m[p + "attn_q.weight"] = ([h + "self_attn.q_proj.weight"], cfg.num_attention_heads)
        m[p + "attn_k.weight"] = ([h + "self_attn.k_proj.weight"], cfg.num_key_value_heads)
        m[p + "attn_v.weight"] = ([h + "self_attn.v_proj.weight"], None)
        m[p + "attn_output.weight"] = ([h + "self_attn.o_proj.weight"], None)
        m[p + "ffn_norm.weight"] = ([h + "post_attention_layernorm.weight"], None)
        n_experts = getattr(cfg, "num_local_experts", 0)
        if n_experts:
            moe = h + "block_sparse_moe."
            m[p + "ffn_gate_inp.weight"] = ([moe + "gate.weight"], None)
            for gname, hf in (("gate", "w1"), ("up", "w3"), ("down", "w2")):
                m[p + f"ffn_{gname}_exps.weight"] = (
                    [f"{moe}experts.{e}.{hf}.weight" for e in range(n_experts)], None)
        else:
            m[p + "ffn_gate.weight"] = ([h + "mlp.gate_proj.weight"], None)
            m[p + "ffn_up.weight"] = ([h + "mlp.up_proj.weight"], None)
            m[p + "ffn_down.weight"] = ([h + "mlp.down_proj.weight"], None)
    return m


def permute(w, n_head):
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows (HF layout -> GGUF layout)."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def batch_loss(model, batch, aux_coef=0.0):
    """Mean cross-entropy over positions with a target, each packed sequence run on its own; with
    aux_coef, one right-padded batch of all sequences (attention mask) and Mixtral's
    load-balancing loss over its tokens added, as transformers' MixtralForCausalLM does."""
    toks, targets, starts = batch["tokens"], batch["targets"], batch["starts"]
    if aux_coef:
        from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func
        seqs = [(starts[s], starts[s + 1]) for s in range(len(starts) - 1)]
        width = max(b - a for a, b in seqs)
        ids = torch.zeros((len(seqs), width), dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        y = torch.full((len(seqs), width), -1, dtype=torch.long)
        for i, (a, b) in enumerate(seqs):
            ids[i, :b - a] = torch.tensor(toks[a:b])
            mask[i, :b - a] = 1
            y[i, :b - a] = torch.tensor(targets[a:b])
        out = model(input_ids=ids, attention_mask=mask, output_router_logits=True)
        keep = y >= 0
        ce = torch.nn.functional.cross_entropy(out.logits[keep], y[keep], reduction="sum")
        aux = load_balancing_loss_func(out.router_logits, model.config.num_local_experts,
                                       model.config.num_experts_per_tok, mask)
        return ce / int(keep.sum()) + aux_coef * aux
    total, count = 0.0, 0
    for s in range(len(starts) - 1):
        a, b = starts[s], starts[s + 1]
        ids = torch.tensor([toks[a:b]])
        logits = model(input_ids=ids).logits[0]
        y = torch.tensor(targets[a:b])
        keep = y >= 0
        total = total + torch.nn.functional.cross_entropy(logits[keep], y[keep], reduction="sum")
        count += int(keep.sum())
    return total / count


def all_logits(model, batch):
    toks, starts = batch["tokens"], batch["starts"]
    with torch.no_grad():
        return torch.cat([model(input_ids=torch.tensor([toks[starts[s]:starts[s + 1]]])).logits[0]
                          for s in range(len(starts) - 1)])


def main():
    model_path, work = sys.argv[1], sys.argv[2]
    batch = json.load(open(os.path.join(work, "batch.json")))
    index = json.load(open(os.path.join(work, "index.json")))
    ours = np.fromfile(os.path.join(work, "grads.bin"), dtype=np.float32)
    out = {}

    model = load(model_path)
    params = dict(model.named_parameters())
    names = gguf_names(model)

    # 1. Loss and every gradient.
    aux_coef = index.get("router_aux_loss_coef", 0.0)
    loss = batch_loss(model, batch, aux_coef)
    loss.backward()
    out["loss_torch"] = loss.item()
    out["loss_weft"] = index["loss"]
    tensors, off = [], 0
    worst_cos, worst_err, worst_w = 1.0, 0.0, 0.0
    for t in index["tensors"]:
        hf, n_head = names[t["name"]]
        g = np.concatenate([params[n].grad.detach().numpy().reshape(-1) for n in hf])
        w = np.concatenate([params[n].detach().numpy().reshape(-1) for n in hf])
        if n_head is not None:
            shape = params[hf[0]].shape
            g = permute(g.reshape(shape), n_head)
            w = permute(w.reshape(shape), n_head)
        g = g.reshape(-1).astype(np.float64)
        mine = ours[off:off + t["size"]].astype(np.float64)
        off += t["size"]
        cos = float(np.dot(g, mine) / (np.linalg.norm(g) * np.linalg.norm(mine) + 1e-300))
        err = float(np.max(np.abs(g - mine)) / (np.max(np.abs(g)) + 1e-30))
        # Same starting weights: weft's dequantization vs transformers'.
        w = w.reshape(-1).astype(np.float64)
        werr = abs(float(np.sum(w)) - t["sum"]) + abs(float(np.sum(w * w)) - t["sum_sq"])
        werr /= max(1.0, abs(t["sum_sq"]))
        tensors.append({"name": t["name"], "cosine": cos, "max_err_rel": err, "weights": werr})
        worst_cos, worst_err, worst_w = min(worst_cos, cos), max(worst_err, err), max(worst_w, werr)
    out["tensors"] = tensors
    out["worst_cosine"], out["worst_max_err_rel"], out["worst_weight_diff"] = \
        worst_cos, worst_err, worst_w

    # 2. Ten AdamW steps on the same batch, weft's settings (decay on matrices only).
    adam = json.load(open(os.path.join(work, "adam.json")))
    model = load(model_path)
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": adam["weight_decay"]},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=adam["lr"], betas=(adam["beta1"], adam["beta2"]), eps=adam["eps"], foreach=False)
    losses = []
    for _ in range(len(adam["losses"])):
        opt.zero_grad()
        loss = batch_loss(model, batch, aux_coef)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    out["adam_losses_torch"] = losses
    out["adam_losses_weft"] = adam["losses"]
    out["adam_worst_rel"] = max(abs(a - b) / abs(a) for a, b in zip(losses, adam["losses"]))

    # 3. The GGUF weft exported after its steps, loaded by transformers: the same logits.
    exported = load(os.path.join(work, "exported.gguf"))
    theirs = all_logits(exported, batch).numpy().astype(np.float64)
    mine = np.fromfile(os.path.join(work, "logits.bin"), dtype=np.float32).astype(np.float64)
    mine = mine.reshape(theirs.shape)
    out["export_logits_max_err"] = float(np.max(np.abs(theirs - mine)))
    out["export_logits_max_abs"] = float(np.max(np.abs(theirs)))

    # 4. llama.cpp loads the same export (its KV cache is f16: agreement to that precision).
    import llama_cpp
    llm = llama_cpp.Llama(model_path=os.path.join(work, "exported.gguf"), n_ctx=256,
                          n_threads=2, logits_all=True, verbose=False)
    toks, starts = batch["tokens"], batch["starts"]
    rows = []
    for s in range(len(starts) - 1):
        llm.reset()
        llm.eval(toks[starts[s]:starts[s + 1]])
        rows.append(np.asarray(llm.scores[:starts[s + 1] - starts[s]], dtype=np.float64))
    llama = np.concatenate(rows)
    out["llama_cpp_logits_max_err"] = float(np.max(np.abs(llama - mine)))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
