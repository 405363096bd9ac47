"""Train an EAGLE-3 head for a llama-architecture GGUF target (SmolLM2-135M-Instruct by default)
and write it as a GGUF that llama.cpp (and this engine, `-md HEAD.gguf`) opens as an `eagle3` model.

    python -m cospec_local.recipes.eagle3_head --out OUT [--stages generate,features,train,gguf,measure]

Stages, each writing into OUT and each resumable (a rerun skips what is saved, and an interrupted
generate or features stage goes on from its last saved batch):
1. generate: the target's own greedy replies to chat prompts, with its top-k logits at every reply
   position (distill_draft's generate stage, the same files: distill_data.npz).
2. features: the target, dequantized into torch, reads each prompt + reply once; the inputs of the
   three layers the head reads (`--layers`, default EAGLE-3's low, middle and high: 2, n/2, n-3)
   are saved per token in float16 (features.f16, a memory map).
3. train: the head as EAGLE-3 trains it. At step 0 position p reads (token p+1, g_p), g_p = fc of
   the three hidden states at p, and predicts token p+2; "training-time test" then runs
   `--ttt-steps` - 1 more steps in which position p+j reads (token p+j+1, the head's own output
   state of the step before) and attends to the true entries up to p and its own earlier steps,
   exactly what a draft of j + 1 tokens sees in llama.cpp. Loss: cross-entropy on the target's
   greedy token + on its top-k distribution, reply positions only, over a reduced draft
   vocabulary (`--draft-vocab` most frequent reply tokens; d2t maps it back). The decoder layer's
   MLP and norms start from the target's last block, the output head from the target's
   embedding rows; the token embedding is the target's, read from the target at run time.
4. gguf: an EAGLE-3 checkpoint in the published layout (fc, midlayer.*, norm, lm_head, d2t)
   converted by the vendored llama.cpp converter, the target's tokenizer copied in.
5. measure: through the engine (llama.cpp), in a process of its own: on held-out chat prompts,
   target-only against the head at K = 1..8, greedy; acceptance, mean accepted length per block,
   speed ratio in the same run, and whether every output equals target-only's.

Everything is logged to OUT/eagle3_log.json with wall times.
"""
from __future__ import annotations

import json
import math
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..command_line import REQUIRED, comma_list, option, parse_config
from .distill_draft import load_data, log_update

LOG = "eagle3_log.json"


def default_layers(n_layer: int) -> list[int]:
    """EAGLE-3's choice, as llama.cpp's converter derives it where a config names none."""
    return [2, n_layer // 2, n_layer - 3]


# ----------------------------------------------------------------------------- features


def features_stage(target: Path, out: Path, layers: list[int], batch: int) -> dict:
    """The inputs of `layers` for every token of every saved sequence, float16, in sequence order.
    llama.cpp's layer input il is Hugging Face's hidden_states[il]."""
    import torch

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf

    items = load_data(out)
    lens = np.array([len(it["tokens"]) for it in items])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    model = load_llama_gguf(target).eval()
    hidden = model.config.hidden_size
    path = out / "features.f16"
    progress = out / "features_progress.json"
    shape = (int(lens.sum()), len(layers) * hidden)
    recipe = {"layers": layers, "tokens": int(lens.sum()), "target": str(Path(target).resolve())}
    done = json.loads(progress.read_text()) if progress.exists() else {}
    if done.get("recipe") != recipe or not path.exists():
        done = {"recipe": recipe, "items": 0}
        np.lib.format.open_memmap(path, mode="w+", dtype=np.float16, shape=shape).flush()
    feats = np.lib.format.open_memmap(path, mode="r+")
    t0 = time.time()
    first = done["items"]
    for b in range(first, len(items), batch):
        rows = items[b:b + batch]
        width = max(len(it["tokens"]) for it in rows)
        x = torch.zeros((len(rows), width), dtype=torch.long)
        mask = torch.zeros_like(x)
        for r, it in enumerate(rows):
            x[r, :len(it["tokens"])] = torch.from_numpy(it["tokens"].astype(np.int64))
            mask[r, :len(it["tokens"])] = 1
        with torch.no_grad():
            hs = model.model(input_ids=x, attention_mask=mask, output_hidden_states=True).hidden_states
        fused = torch.cat([hs[i] for i in layers], -1).to(torch.float16).numpy()
        for r, it in enumerate(rows):
            s = starts[b + r]
            feats[s:s + len(it["tokens"])] = fused[r, :len(it["tokens"])]
        feats.flush()
        done["items"] = b + len(rows)
        progress.write_text(json.dumps(done))
        print(f"[features] {done['items']}/{len(items)} sequences, {time.time() - t0:.0f} s", flush=True)
    return {"tokens": shape[0], "layers": layers, "bytes": path.stat().st_size, "wall_s": time.time() - t0,
            "resumed_at": first}


# ----------------------------------------------------------------------------- the head


def build_head(config: dict, torch):
    """The EAGLE-3 decoder as llama.cpp's eagle3 graph computes it (src/models/eagle3.cpp)."""
    nn = torch.nn
    H, hd = config["hidden_size"], config["head_dim"]
    nh, nkv = config["num_attention_heads"], config["num_key_value_heads"]

    class RMSNorm(nn.Module):
        def __init__(self, n, eps):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            eps = config["rms_norm_eps"]
            self.fc = nn.Linear(len(config["eagle_aux_hidden_state_layer_ids"]) * config["target_hidden_size"], H, bias=False)
            self.input_layernorm, self.hidden_norm = RMSNorm(H, eps), RMSNorm(H, eps)
            self.q_proj = nn.Linear(2 * H, nh * hd, bias=False)
            self.k_proj = nn.Linear(2 * H, nkv * hd, bias=False)
            self.v_proj = nn.Linear(2 * H, nkv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, H, bias=False)
            self.post_attention_layernorm = RMSNorm(H, eps)
            ffn = config["intermediate_size"]
            self.gate_proj, self.up_proj = nn.Linear(H, ffn, bias=False), nn.Linear(H, ffn, bias=False)
            self.down_proj = nn.Linear(ffn, H, bias=False)
            self.norm = RMSNorm(H, eps)
            self.lm_head = nn.Linear(H, config["draft_vocab_size"], bias=False)
            inv = 1.0 / (config["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
            self.register_buffer("inv_freq", inv, persistent=False)

        def rope(self, x, pos):  # x (B, h, T, hd), pos (T,): Hugging Face's rotate-half order
            f = pos[:, None].float() * self.inv_freq[None, :]
            emb = torch.cat([f, f], -1)
            cos, sin = emb.cos(), emb.sin()
            x1, x2 = x[..., :hd // 2], x[..., hd // 2:]
            return x * cos + torch.cat([-x2, x1], -1) * sin

        def qkv(self, tok_emb, g, pos):
            B, T, _ = g.shape
            h = torch.cat([self.input_layernorm(tok_emb), self.hidden_norm(g)], -1)
            q = self.q_proj(h).view(B, T, nh, hd).transpose(1, 2)
            k = self.k_proj(h).view(B, T, nkv, hd).transpose(1, 2)
            v = self.v_proj(h).view(B, T, nkv, hd).transpose(1, 2)
            q, k = self.rope(q, pos), self.rope(k, pos)
            rep = nh // nkv
            return q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)

        def step(self, tok_emb, g, j, cache, key_mask):
            """Step j of training-time test: chain p sits at position p + j; it attends to step 0's
            entries at positions <= p (key_mask) and to its own entries of steps 1..j."""
            B, T, _ = g.shape
            pos = torch.arange(T) + j
            q, k, v = self.qkv(tok_emb, g, pos)
            cache.append((k, v))
            scale = 1.0 / math.sqrt(hd)
            k0, v0 = cache[0]
            s0 = (q @ k0.transpose(-1, -2)) * scale
            s0 = s0.masked_fill(~key_mask, float("-inf"))
            own = [((q * ki).sum(-1, keepdim=True) * scale) for ki, _ in cache[1:]]
            s = torch.cat([s0, *own], -1) if own else s0
            p = torch.softmax(s, -1)
            out = p[..., :T] @ v0
            for i, (_, vi) in enumerate(cache[1:]):
                out = out + p[..., T + i:T + i + 1] * vi
            out = out.transpose(1, 2).reshape(B, T, nh * hd)
            ffn_inp = self.o_proj(out) + g  # the residual is the raw g (norm_before_residual false)
            x = self.post_attention_layernorm(ffn_inp)
            return ffn_inp + self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

    return Head()


def head_config(target_config, layers: list[int], draft_vocab: int) -> dict:
    c = target_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": c.hidden_size,
            "intermediate_size": c.intermediate_size, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": head_dim, "num_hidden_layers": 1,
            "rms_norm_eps": c.rms_norm_eps, "rope_theta": float(getattr(c, "rope_theta", None) or c.rope_parameters["rope_theta"]),
            "max_position_embeddings": c.max_position_embeddings, "vocab_size": c.vocab_size,
            "draft_vocab_size": draft_vocab, "target_hidden_size": c.hidden_size, "hidden_act": "silu",
            "eagle_aux_hidden_state_layer_ids": layers, "tie_word_embeddings": False,
            "bos_token_id": c.bos_token_id, "eos_token_id": c.eos_token_id}


def draft_vocabulary(items, size: int, n_vocab: int, eos: int) -> np.ndarray:
    """The `size` tokens the target writes most often in its replies (EOS always in), by count."""
    counts = np.zeros(n_vocab, dtype=np.int64)
    for it in items:
        np.add.at(counts, it["tokens"][it["prompt_len"]:], 1)
    counts[eos] = counts.max() + 1
    order = np.argsort(-counts, kind="stable")[:size]
    return np.sort(order)


# ----------------------------------------------------------------------------- training


def _batch(items, idx, starts, feats, t2d, torch):
    """Right-padded tokens and features; per position, the draft-vocabulary label of the token the
    target wrote there (-1: not a reply token, or outside the draft vocabulary) and its top-k."""
    rows = [items[i] for i in idx]
    T = max(len(it["tokens"]) for it in rows)
    B = len(rows)
    x = torch.zeros((B, T), dtype=torch.long)
    f = torch.zeros((B, T, feats.shape[1]), dtype=torch.float32)
    label = torch.full((B, T), -1, dtype=torch.long)
    k = rows[0]["top_i"].shape[1]
    soft_i = torch.full((B, T, k), -1, dtype=torch.long)
    soft_v = torch.zeros((B, T, k), dtype=torch.float32)
    valid = torch.zeros((B, T), dtype=torch.bool)
    for r, (i, it) in enumerate(zip(idx, rows)):
        n, p = len(it["tokens"]), it["prompt_len"]
        x[r, :n] = torch.from_numpy(it["tokens"].astype(np.int64))
        f[r, :n] = torch.from_numpy(np.asarray(feats[starts[i]:starts[i] + n], dtype=np.float32))
        label[r, p:n] = torch.from_numpy(t2d[it["tokens"][p:]])
        soft_i[r, p:n] = torch.from_numpy(t2d[it["top_i"].astype(np.int64)])
        soft_v[r, p:n] = torch.from_numpy(it["top_v"].astype(np.float32))
        valid[r, :n] = True
    return x, f, label, soft_i, soft_v, valid


def head_loss(head, embed, batch, steps: int, torch):
    """Mean loss over steps and per-step top-1 agreement with the target's token."""
    F = torch.nn.functional
    x, f, label, soft_i, soft_v, valid = batch
    B, T = x.shape
    Tp = T - 1  # chains p = 0..T-2: step 0 at p reads (token p+1, g_p)
    g = head.fc(f[:, :Tp])
    key_mask = torch.tril(torch.ones(Tp, Tp, dtype=torch.bool)) & valid[:, None, None, 1:T]
    cache, total, hits, counts = [], 0.0, [], []
    for j in range(steps):
        tok = torch.zeros((B, Tp), dtype=torch.long)
        tok[:, :Tp - j] = x[:, 1 + j:T]
        out = head.step(embed(tok), g, j, cache, key_mask)
        tgt = torch.full((B, Tp), -1, dtype=torch.long)  # the token at p + j + 2
        tgt[:, :max(0, Tp - j - 1)] = label[:, 2 + j:T]
        si = torch.full((B, Tp, soft_i.shape[-1]), -1, dtype=torch.long)
        sv = torch.zeros((B, Tp, soft_i.shape[-1]))
        si[:, :max(0, Tp - j - 1)] = soft_i[:, 2 + j:T]
        sv[:, :max(0, Tp - j - 1)] = soft_v[:, 2 + j:T]
        sel = tgt >= 0
        if sel.any():
            logits = head.lm_head(head.norm(out[sel])).float()
            logp = F.log_softmax(logits, -1)
            hard = F.nll_loss(logp, tgt[sel])
            # the target's top-k, restricted to the draft vocabulary and renormalised
            ii, vv = si[sel], sv[sel]
            vv = vv.masked_fill(ii < 0, float("-inf"))
            w = torch.softmax(vv, -1)
            soft = -(w * logp.gather(1, ii.clamp(min=0))).sum(-1).mean()
            total = total + (0.5 * hard + 0.5 * soft) * (0.8 ** j)  # later steps weigh less, as in EAGLE-3
            hits.append(int((logits.argmax(-1) == tgt[sel]).sum()))
            counts.append(int(sel.sum()))
        g = out  # the next step reads this step's output state
    return total, hits, counts


def train_stage(target: Path, out: Path, layers: list[int], draft_vocab: int, steps: int, epochs: float, lr: float,
                batch: int, seed: int, threads: int) -> dict:
    import torch

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf

    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    items = load_data(out)
    lens = np.array([len(it["tokens"]) for it in items])
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    feats = np.load(out / "features.f16", mmap_mode="r")
    target_model = load_llama_gguf(target).eval()
    tc = target_model.config
    eos = tc.eos_token_id if isinstance(tc.eos_token_id, int) else tc.eos_token_id[0]
    vocab = draft_vocabulary(items, draft_vocab, tc.vocab_size, eos)
    t2d = np.full(tc.vocab_size, -1, dtype=np.int64)
    t2d[vocab] = np.arange(len(vocab))
    n_reply = sum(len(it["tokens"]) - it["prompt_len"] for it in items)
    covered = sum(int((t2d[it["tokens"][it["prompt_len"]:]] >= 0).sum()) for it in items) / n_reply
    config = head_config(tc, layers, len(vocab))
    head = build_head(config, torch)
    with torch.no_grad():  # a warm start from the target's last block, final norm and embedding rows
        last = target_model.model.layers[-1]
        head.post_attention_layernorm.weight.copy_(last.post_attention_layernorm.weight)
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(head, name).weight.copy_(getattr(last.mlp, name).weight)
        head.norm.weight.copy_(target_model.model.norm.weight)
        head.lm_head.weight.copy_(target_model.lm_head.weight[torch.from_numpy(vocab)])
    embed = target_model.model.embed_tokens.requires_grad_(False)
    del target_model.model.layers  # only the embedding is needed from here

    rng = np.random.default_rng(seed)
    order = rng.permutation(len(items))
    n_dev = min(max(16, len(items) // 40), len(items) // 4)  # 2.5% held back, 16 at least, a quarter at most
    dev, train = order[:n_dev], order[n_dev:]
    ckpt = out / "head_train.pt"
    state = {"step": 0, "best": -1.0, "curve": []}
    opt = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.0)
    if ckpt.exists():
        saved = torch.load(ckpt, weights_only=False)
        if saved["config"] == config and saved["seed"] == seed:
            head.load_state_dict(saved["head"])
            opt.load_state_dict(saved["opt"])
            state = saved["state"]
            print(f"[train] resumed at step {state['step']}", flush=True)
    # Batches of similar length: little padding.
    train = train[np.argsort(lens[train], kind="stable")]
    chunks = [train[i:i + batch] for i in range(0, len(train), batch)]
    per_epoch = len(chunks)
    total_steps = int(per_epoch * epochs)
    if total_steps < 1:
        raise SystemExit(f"train: {len(train)} training sequences in batches of {batch} for {epochs} epochs is no step")
    warmup = max(1, total_steps // 20)
    eval_every = max(1, per_epoch // 3)

    def evaluate() -> list[float]:
        head.eval()
        hit, cnt = np.zeros(steps), np.zeros(steps)
        with torch.no_grad():
            for i in range(0, len(dev), batch):
                _, h, c = head_loss(head, embed, _batch(items, dev[i:i + batch], starts, feats, t2d, torch), steps, torch)
                hit[:len(h)] += h
                cnt[:len(c)] += c
        head.train()
        return (hit / np.maximum(cnt, 1)).tolist()

    t0 = time.time()
    head.train()
    while state["step"] < total_steps:
        epoch_rng = np.random.default_rng(seed + state["step"] // per_epoch)
        perm = epoch_rng.permutation(per_epoch)
        for ci in perm[state["step"] % per_epoch:]:
            s = state["step"]
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total_steps)))
            loss, _, _ = head_loss(head, embed, _batch(items, chunks[ci], starts, feats, t2d, torch), steps, torch)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
            opt.step()
            state["step"] += 1
            if state["step"] % 20 == 0:
                print(f"[train] step {state['step']}/{total_steps} loss {float(loss.detach()):.3f} {time.time() - t0:.0f} s", flush=True)
            if state["step"] % eval_every == 0 or state["step"] == total_steps:
                acc = evaluate()
                # the expected accepted length of a 1 + steps block, if each step's chance were independent
                score = sum(np.cumprod(acc))
                state["curve"].append({"step": state["step"], "agreement": acc, "expected_length": score,
                                       "wall_s": time.time() - t0})
                print(f"[train] step {state['step']}: agreement by step {[round(a, 3) for a in acc]}", flush=True)
                if score > state["best"]:
                    state["best"] = score
                    torch.save({"head": head.state_dict(), "config": config, "vocab": vocab}, out / "head_best.pt")
                torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "state": state, "config": config,
                            "seed": seed}, ckpt)
            if state["step"] >= total_steps:
                break
    return {"draft_vocab": len(vocab), "reply_tokens_covered": covered, "steps": total_steps, "ttt_steps": steps,
            "curve": state["curve"], "best_expected_length": state["best"], "wall_s": time.time() - t0,
            "train_sequences": len(train), "dev_sequences": len(dev)}


# ----------------------------------------------------------------------------- gguf


OUTTYPES = ("q8_0", "f16", "f32")


def gguf_stage(target: Path, out: Path, dst: Path, name: str, outtype: str) -> Path:
    """The trained head in the layout of published EAGLE-3 checkpoints, converted by llama.cpp's
    converter with the target's tokenizer copied from its GGUF."""
    import shutil

    import torch
    from safetensors.torch import save_file

    from cospec_local.formats import tiny_models
    from cospec_local.formats.gguf_llama_reader import gguf_llama_config

    src = tiny_models.llama_cpp_source()
    for module in [m for m in sys.modules if m == "gguf" or m.startswith("gguf.")]:
        del sys.modules[module]  # the installed package, which knows no eagle3 architecture
    sys.path.insert(0, str(src / "gguf-py"))
    sys.path.insert(0, str(src))
    import conversion
    import gguf

    saved = torch.load(out / "head_best.pt", weights_only=False)
    config, sd, vocab = saved["config"], saved["head"], saved["vocab"]
    hf_dir, target_dir = out / ".head-hf", out / ".target-config"
    hf_dir.mkdir(exist_ok=True)
    (hf_dir / "config.json").write_text(json.dumps(config, indent=1))
    gguf_llama_config(gguf.GGUFReader(target)).save_pretrained(target_dir)
    names = {"fc.weight": "fc.weight", "norm.weight": "norm.weight", "lm_head.weight": "lm_head.weight"}
    for k in ("input_layernorm", "hidden_norm", "post_attention_layernorm"):
        names[f"{k}.weight"] = f"midlayer.{k}.weight"
    for k in ("q_proj", "k_proj", "v_proj", "o_proj"):
        names[f"{k}.weight"] = f"midlayer.self_attn.{k}.weight"
    for k in ("gate_proj", "up_proj", "down_proj"):
        names[f"{k}.weight"] = f"midlayer.mlp.{k}.weight"
    tensors = {hf: sd[ours].contiguous() for ours, hf in names.items()}
    tensors["d2t"] = torch.from_numpy(vocab - np.arange(len(vocab)))  # offsets, as published heads store them
    save_file(tensors, hf_dir / "model.safetensors", metadata={"format": "pt"})
    hparams = conversion.ModelBase.load_hparams(hf_dir, False)
    model_class = conversion.get_model_class(conversion.get_model_architecture(hparams, conversion.ModelType.TEXT))
    partial = dst.with_name(f".{dst.name}.partial")
    ftype = {"q8_0": gguf.LlamaFileType.MOSTLY_Q8_0, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "f32": gguf.LlamaFileType.ALL_F32}[outtype]
    instance = model_class(hf_dir, ftype, partial, hparams=hparams, model_name=name,
                           target_model_dir=target_dir)
    instance.set_vocab = lambda: tiny_models.copy_vocabulary(instance.gguf_writer, target)
    instance.write()
    partial.replace(dst)
    shutil.rmtree(hf_dir)
    shutil.rmtree(target_dir)
    return dst


def load_head_gguf(path: Path):
    """The torch head (build_head) with the dequantized weights of an EAGLE-3 GGUF this recipe
    wrote, its config and its draft vocabulary (target ids): the converter's output read back,
    q/k rows returned from llama.cpp's rope order to the rotate-half one the head trains in."""
    import gguf
    import torch

    from cospec_local.formats.gguf_llama_reader import unpermute_qk

    reader = gguf.GGUFReader(Path(path), "r")

    def field(key):
        f = reader.get_field(f"eagle3.{key}")
        return f.contents() if f is not None else None

    tensors = {t.name: t for t in reader.tensors}
    H, nh, nkv = field("embedding_length"), field("attention.head_count"), field("attention.head_count_kv")
    vocab = np.asarray(tensors["d2t"].data, dtype=np.int64).reshape(-1)
    config = {"hidden_size": H, "head_dim": field("attention.key_length"), "num_attention_heads": nh,
              "num_key_value_heads": nkv, "rms_norm_eps": field("attention.layer_norm_rms_epsilon"),
              "eagle_aux_hidden_state_layer_ids": list(field("target_layers")),
              "target_hidden_size": field("target_hidden_size"), "intermediate_size": field("feed_forward_length"),
              "draft_vocab_size": len(vocab), "rope_theta": field("rope.freq_base")}
    ours = {"fc.weight": "fc.weight", "output.weight": "lm_head.weight", "output_norm.weight": "norm.weight",
            "blk.0.attn_norm.weight": "input_layernorm.weight", "blk.0.attn_norm_2.weight": "hidden_norm.weight",
            "blk.0.ffn_norm.weight": "post_attention_layernorm.weight", "blk.0.attn_q.weight": "q_proj.weight",
            "blk.0.attn_k.weight": "k_proj.weight", "blk.0.attn_v.weight": "v_proj.weight",
            "blk.0.attn_output.weight": "o_proj.weight", "blk.0.ffn_gate.weight": "gate_proj.weight",
            "blk.0.ffn_up.weight": "up_proj.weight", "blk.0.ffn_down.weight": "down_proj.weight"}
    state = {}
    for name, key in ours.items():
        t = tensors[name]
        w = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
        if key == "q_proj.weight":
            w = unpermute_qk(w, nh)
        elif key == "k_proj.weight":
            w = unpermute_qk(w, nkv)
        state[key] = torch.from_numpy(np.ascontiguousarray(w))
    head = build_head(config, torch)
    head.load_state_dict(state)
    return head.eval(), config, vocab


def first_step_predictions(target: Path, head, config: dict, vocab: np.ndarray, tokens: list[int]) -> np.ndarray:
    """The head's step-0 prediction at every chain p of `tokens` (the token at p + 2, in the
    target's vocabulary) from the target's own hidden states: what a K = 1 block drafts there."""
    import torch

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf

    model = load_llama_gguf(target).eval()
    x = torch.tensor([tokens])
    with torch.no_grad():
        hs = model.model(input_ids=x, output_hidden_states=True).hidden_states
        f = torch.cat([hs[i] for i in config["eagle_aux_hidden_state_layer_ids"]], -1)
        T = len(tokens) - 1
        mask = torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]
        out = head.step(model.model.embed_tokens(x[:, 1:]), head.fc(f[:, :T]), 0, [], mask)
        pred = head.lm_head(head.norm(out)).argmax(-1)[0].numpy()
    return vocab[pred]


# ----------------------------------------------------------------------------- measure


def measure(target: Path, head: Path, prompts: list[str], max_new: int, threads: int, ks: list[int]) -> dict:
    """Target-only against the head at each K, alternating, greedy, on chat prompts."""
    from cospec_local import Engine

    result = {"prompts": len(prompts), "max_new": max_new, "threads": threads, "by_k": {}}
    with Engine(target, head, n_ctx=1024, n_threads=threads, calibration=None) as engine:
        rendered = [[{"role": "user", "content": p}] for p in prompts]
        engine.chat(rendered[0], max_tokens=8, spec_type="none")  # warm-up
        base_tokens, base_s, base_n = [], 0.0, 0
        for msgs in rendered:
            t = time.perf_counter()
            r = engine.chat(msgs, max_tokens=max_new, spec_type="none")
            base_s += time.perf_counter() - t
            base_n += len(r.tokens)
            base_tokens.append(r.tokens)
        for k in ks:
            s_tot, n_tot, same, blocks, drafted, matched = 0.0, 0, 0, 0, 0, 0
            for msgs, ref in zip(rendered, base_tokens):
                t = time.perf_counter()
                r = engine.chat(msgs, max_tokens=max_new, spec_type="draft-eagle3", draft_max=k, adaptive_draft=False)
                s_tot += time.perf_counter() - t
                n_tot += len(r.tokens)
                same += r.tokens == ref
                blocks += r.stats.blocks_head
                drafted += r.stats.draft_n_head
                matched += r.stats.draft_n_matched_head
            result["by_k"][k] = {"identical": same, "acceptance": matched / max(1, drafted),
                                 "accepted_per_block": matched / max(1, blocks), "blocks": blocks,
                                 "tok_s": n_tot / s_tot, "speedup": (n_tot / s_tot) / (base_n / base_s)}
            print(f"[measure] K={k}: {result['by_k'][k]}", flush=True)
        result["target_only_tok_s"] = base_n / base_s
    return result


# ----------------------------------------------------------------------------- command line


@dataclass
class Eagle3Config:
    """An EAGLE-3 head trained on the target's own replies (eagle3_head.py's command line)."""

    out: Path = option(REQUIRED, "Folder of the run: data, features, checkpoints, the head GGUF and its log.")
    target: Path | None = option(None, "Target GGUF (default: SmolLM2-135M-Instruct).", ("-m", "--model"))
    stages: str = option("generate,features,train,gguf,measure", "Which stages to run, comma-separated.")
    layers: str = option("", "Target layers the head reads, comma-separated (default: 2, n/2, n-3).")
    train_prompts: int = option(2000, "Generate stage: template prompts (distill_prompts' 'train' split).")
    max_new: int = option(160, "Most tokens of each generated reply (and of each measured one).")
    gen_batch: int = option(128, "Generate stage: replies per batch.")
    feature_batch: int = option(16, "Features stage: sequences per forward pass.")
    draft_vocab: int = option(8192, "Size of the head's output vocabulary (the most frequent reply tokens).")
    ttt_steps: int = option(3, "Training-time test: draft steps trained per position.")
    epochs: float = option(2.0, "Training epochs.")
    lr: float = option(1e-3, "Peak learning rate (warm-up, cosine decay).")
    batch: int = option(8, "Sequences per training step.")
    seed: int = option(0, "Seed of prompts and training.")
    threads: int = option(2, "torch and llama.cpp threads.")
    heldout_prompts: int = option(40, "Measure stage: the first N held-out prompts (seed 0).")
    draft_max: str = option("1,2,4,6", "Measure stage: block lengths K.")
    name: str = option("smollm2-135m-eagle3", "The head's model name (its GGUF file is NAME-OUTTYPE.gguf).")
    outtype: str = option("q8_0", "The head GGUF's weight type: q8_0, f16 or f32 (norms stay f32).")


def main(argv: list[str] | None = None) -> None:
    from cospec_local.models import find_smollm2_gguf

    args = parse_config(Eagle3Config, argv, __doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.target or find_smollm2_gguf()
    stages = comma_list(args.stages)
    import gguf

    n_layer = int(gguf.GGUFReader(target).get_field("llama.block_count").contents())
    layers = [int(x) for x in comma_list(args.layers)] or default_layers(n_layer)
    if len(layers) != 3 or not all(0 <= x < n_layer for x in layers):
        raise SystemExit(f"--layers: three target layers in 0..{n_layer - 1}, not {layers}")
    # Every invocation's settings, in order: a resumed stage's are the ones it ran with.
    runs = json.loads((args.out / LOG).read_text()).get("runs", []) if (args.out / LOG).is_file() else []
    log_update(args.out, LOG, runs=runs + [asdict(args) | {"out": str(args.out), "target": str(target),
                                                            "layers_used": layers, "started": time.time()}])
    if args.outtype not in OUTTYPES:
        raise SystemExit(f"--outtype: one of {', '.join(OUTTYPES)}")
    head_path = args.out / f"{args.name}-{args.outtype}.gguf"
    if "generate" in stages:
        from .distill_draft import main as distill_main

        distill_main(["--out", str(args.out), "--model", str(target), "--stages", "generate", "--train-prompts",
                      str(args.train_prompts), "--max-new", str(args.max_new), "--gen-batch", str(args.gen_batch),
                      "--seed", str(args.seed), "--threads", str(args.threads), "--device", "cpu"])
        log_update(args.out, LOG, generate=json.loads((args.out / "distill_log.json").read_text())["generate"])
    if "features" in stages:
        import torch

        torch.set_num_threads(args.threads)
        log_update(args.out, LOG, features=features_stage(target, args.out, layers, args.feature_batch))
    if "train" in stages:
        log_update(args.out, LOG, train=train_stage(target, args.out, layers, args.draft_vocab, args.ttt_steps, args.epochs,
                                                    args.lr, args.batch, args.seed, args.threads))
    if "gguf" in stages:
        # In a process of its own: the converter needs the vendored gguf-py in place of the
        # installed gguf package.
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            pool.submit(gguf_stage, target, args.out, head_path, args.name, args.outtype).result()
        log_update(args.out, LOG, gguf={"path": head_path.name, "bytes": head_path.stat().st_size})
        print(f"[gguf] {head_path} ({head_path.stat().st_size / 2**20:.1f} MiB)")
    if "measure" in stages:
        from .distill_prompts import build_prompts

        ks = [int(k) for k in comma_list(args.draft_max)]
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            result = pool.submit(measure, target, head_path, build_prompts("heldout", args.heldout_prompts, 0),
                                 args.max_new, args.threads, ks).result()
        log_update(args.out, LOG, measure=result)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
