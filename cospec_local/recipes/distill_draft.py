"""Distil a small draft for a llama-architecture GGUF target (SmolLM2-135M-Instruct by default)
and write it as a GGUF with the target's tokenizer.

    python -m cospec_local.recipes.distill_draft --out OUT [--layers 2] [--train-prompts 2000] [--threads 2]

Recipe (stages, each writing into OUT; a later invocation with --stages resumes, and an
interrupted generate stage rerun with the same arguments continues from its last saved batch,
of prompts or of answers):
1. generate: the target (dequantized into torch, `--precision`) answers `--train-prompts` chat prompts
   (cospec_local.recipes.distill_prompts "train" split, rendered with the target's own chat template)
   and `--self-prompts` prompts it wrote itself (see self_prompts), greedily, batched, up to
   `--max-new` tokens. A logits processor records the target's top-k
   logits at every answer position, so the data are the target's own greedy continuations
   with soft labels, at no extra cost.
2. train: the draft starts as the target's (tied) embedding, its first `--layers` blocks and its
   final norm. The embedding/output head stays frozen (it is 85% of the draft's weights and is
   shared with the target byte for byte); the blocks and the norm learn from
   0.5 x cross-entropy on the target's greedy token + 0.5 x cross-entropy on the target's top-k
   distribution, on answer positions only. Early stopping on the per-token agreement with
   the target on 5% of the prompts held back from training.
3. gguf: the target GGUF's metadata (tokenizer included, so the engine's vocabulary check
   passes) with block_count = layers; token_embd copied raw from the target; blocks in Q8_0.
4. measure (llama.cpp, through the engine): on "heldout" prompts (templates and topics never
   used for distillation) the target's greedy continuation is generated, then the draft's
   teacher-forced per-token agreement with it is scored; tokens/s of draft-only vs
   target-only, and sps acceptance on the same prompts, in the same run (in a process of its own,
   away from the train stage's torch threads).

`--precision auto` (the default) generates in bf16 and trains under bf16 autocast where the CPU
multiplies bf16 natively (AVX512-BF16 / AMX: on an Intel Xeon, 2 threads, 1.7x float32's speed in
generation and 1.8x in an 8-block training step) and in float32 elsewhere (on AVX2 only, bf16
generation runs at a fifth of float32's speed).

`--device auto` (the default) generates and trains on a CUDA device where torch sees one (in bf16
where it multiplies bf16), else on the CPU. What made the data (target file, arithmetic, device)
is saved with it, so an interrupted run never resumes on answers another device computed.

More data later: a second OUT generated with `--with-data OUT1 --seed 1` (new self-written prompts,
none of OUT1's asked again) trains on both sets together; `--init OUT1/draft_blocks.pt` goes on
from the blocks trained on the first.

Everything is logged to OUT/distill_log.json with wall times.
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..command_line import REQUIRED, comma_list, option, parse_config
from ..train.device import resolve_device

TOP_K = 16


def log_update(out: Path, log_name: str = "distill_log.json", **entries) -> dict:
    path = out / log_name
    log = json.loads(path.read_text()) if path.is_file() else {}
    log.update(entries)
    path.write_text(json.dumps(log, indent=1))
    return log


# ----------------------------------------------------------------------------- data


def render_prompts(target_gguf: Path, prompts: list[str]) -> list[list[int]]:
    """Chat-templated token ids of each prompt, by the engine (the target's own template and tokenizer)."""
    from cospec_local import Engine

    with Engine(target_gguf, n_ctx=512, n_threads=1) as engine:
        return [engine.render_chat([{"role": "user", "content": p}]) for p in prompts]


PRECISIONS = ("auto", "bf16", "float32")  # --precision's choices (checked before torch loads)


def resolve_precision(precision: str, device=None) -> str:
    """"bf16" or "float32": `auto` picks bf16 where oneDNN runs bf16 products natively (AVX512-BF16,
    AMX), since elsewhere (AVX2 only) they are emulated and 5x slower than float32, and on a CUDA
    device that supports it."""
    import torch

    if precision == "auto":
        if device is not None and device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "float32"
        return "bf16" if torch.ops.mkldnn._is_mkldnn_bf16_supported() else "float32"
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return precision


def load_generator(target_gguf: Path, precision: str, device=None):
    """The target in torch for generation, in `precision` (see resolve_precision). Measured, 2
    threads, batch 128, SmolLM2-135M: float32 211 tok/s and bf16 40 on AMD EPYC (AVX2); bf16
    1.7x float32 on an Intel Xeon with AMX. llama.cpp's own batched decoding of the Q4_1 GGUF
    reached 130 tok/s on the EPYC."""
    import torch

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf

    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return load_llama_gguf(target_gguf).to(device or "cpu", dtype).eval()


def _left_padded(rows: list[list[int]], pad: int, torch):
    width = max(len(r) for r in rows)
    x = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros_like(x)
    for r, row in enumerate(rows):
        x[r, width - len(row):] = torch.tensor(row)
        mask[r, width - len(row):] = 1
    return x, mask


def text_digest(texts) -> str:
    """A short name for a list of texts (prompts, topics), for recipes and saved progress."""
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]


def made_by(target_gguf: Path, model) -> dict:
    """What generated something, as saved beside it: the target file and the arithmetic (bf16 and
    float32 outputs differ at near ties, and so do a GPU's kernels and the CPU's)."""
    weight = next(model.parameters())
    return {"target": str(Path(target_gguf).resolve()), "dtype": str(weight.dtype), "device": weight.device.type}


def self_prompts(target_gguf: Path, model, n: int, seed: int, batch: int, exclude: list[str],
                 known: list[str] = (), progress: Path | None = None) -> tuple[list[str], dict]:
    """User prompts written by the target itself: it is given only its chat template's opening of
    a user turn and samples the rest (the Magpie recipe), so the prompts cover what the model
    expects to be asked, beyond the templates' topics. Kept: complete, 3 to 60 words, distinct
    (from each other and from `known`, prompts an earlier data set has), and naming none of the
    `exclude` topics (the held-out ones stay unseen).

    Each sampled batch draws its seed from one generator seeded by `seed`, and the prompts kept so
    far are saved to `progress` after every batch: a rerun with the same arguments goes on from
    the last saved batch and ends with the same prompts as an uninterrupted run."""
    import torch

    from cospec_local import Engine

    marker = "\u2063USER\u2063"
    eos = model.config.eos_token_id
    blocked = [t.lower() for t in exclude]
    maker = made_by(target_gguf, model) | {"seed": seed, "batch": batch,
                                           "threads": torch.get_num_threads(),  # bf16 sums can round by thread count
                                           "known": text_digest(known), "exclude": text_digest(exclude)}
    kept, batches, sampled, wall_before = [], 0, 0, 0.0
    if progress is not None and progress.exists():
        saved = json.loads(progress.read_text())
        if saved.get("maker") == maker:
            kept, batches, sampled, wall_before = saved["kept"], saved["batches"], saved["sampled"], saved["wall_s"]
            print(f"[self-prompts] {len(kept)} kept of {sampled} sampled, from {progress}", flush=True)
    seen = {p.lower() for p in known} | {p.lower() for p in kept}
    t0 = time.time()
    gen = torch.Generator().manual_seed(seed)
    for _ in range(batches):  # the batches already sampled drew these seeds
        torch.randint(0, 2**31 - 1, (1,), generator=gen)
    with Engine(target_gguf, n_ctx=512, n_threads=1) as engine:  # its tokenizer, for the template's opening and the text
        text = engine.detokenize(engine.render_chat([{"role": "user", "content": marker}]), render_special=True)
        opening = engine.tokenize(text[:text.index(marker)], add_special=False, parse_special=True)
        while len(kept) < n:
            torch.manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
            x = torch.tensor([opening] * batch, device=model.device)
            with torch.no_grad():
                out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=64,
                                     do_sample=True, temperature=1.0, top_p=0.95, eos_token_id=eos, pad_token_id=eos)
            sampled += batch
            batches += 1
            for row in out[:, len(opening):].tolist():
                if eos not in row:
                    continue  # cut off: not a whole prompt
                prompt = engine.detokenize(row[:row.index(eos)]).strip()
                key = prompt.lower()
                if 3 <= len(prompt.split()) <= 60 and key not in seen and not any(t in key for t in blocked):
                    seen.add(key)
                    kept.append(prompt)
            if progress is not None:
                tmp = progress.with_suffix(".tmp")
                tmp.write_text(json.dumps({"maker": maker, "batches": batches, "sampled": sampled,
                                           "wall_s": wall_before + time.time() - t0, "kept": kept}))
                tmp.replace(progress)
            print(f"[self-prompts] {len(kept)}/{n} kept of {sampled} sampled", flush=True)
            if len(kept) < n and sampled >= 20 * n + batch:  # SmolLM2 keeps ~4 in 5: a model that never does would loop forever
                raise ValueError(f"{target_gguf.name}: only {len(kept)} usable prompts of {sampled} sampled; "
                                 "it does not write whole user turns after its chat template's opening")
    return kept[:n], {"self_prompts": n, "sampled": sampled, "wall_s": wall_before + time.time() - t0}


def generate_data(target_gguf: Path, model, prompts: list[str], max_new: int, batch: int, out: Path) -> dict:
    """Greedy answers of the target with its top-k logits at every answer position.

    Each batch is saved as it finishes (OUT/generate_parts/), and a rerun on the same prompts and
    settings reuses the saved batches: an interrupted hour of generation resumes where it stopped."""
    import torch
    from transformers import LogitsProcessor, LogitsProcessorList

    eos, pad = model.config.eos_token_id, 0
    rendered = render_prompts(target_gguf, prompts)
    order = sorted(range(len(prompts)), key=lambda i: len(rendered[i]))  # little padding per batch
    parts = out / "generate_parts"
    parts.mkdir(exist_ok=True)

    class RecordTopK(LogitsProcessor):
        def __init__(self):
            self.steps = []

        def __call__(self, input_ids, scores):
            v, i = scores.float().topk(TOP_K, dim=-1)
            self.steps.append((v.to(torch.float16), i.to(torch.int32)))
            return scores

    # What a saved batch must have been made by to be reused: the same target file, in the same
    # arithmetic, with the same answer length.
    maker = made_by(target_gguf, model) | {"max_new": max_new}

    def saved_batch(path: Path, idx: list[int]):
        """The batch saved at `path` if `maker` answered exactly these prompts."""
        if not path.exists():
            return None
        with np.load(path) as npz:
            d = {k: npz[k] for k in npz.files}
        same = (d["idx"].tolist() == idx and all(k in d and d[k].item() == v for k, v in maker.items())
                and all(d["tokens"][a:a + p].tolist() == rendered[i]
                        for i, a, p in zip(idx, np.concatenate([[0], np.cumsum(d["lens"])[:-1]]), d["prompt_lens"])))
        return d if same else None

    done = []
    t0 = time.time()
    n_new = n_reused = 0
    for b in range(0, len(order), batch):
        idx = order[b:b + batch]
        path = parts / f"batch-{b // batch:05d}.npz"
        d = saved_batch(path, idx)
        if d is None:
            x, mask = (t.to(model.device) for t in _left_padded([rendered[i] for i in idx], pad, torch))
            rec = RecordTopK()
            with torch.no_grad():
                gen = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=max_new, do_sample=False,
                                     eos_token_id=eos, pad_token_id=pad, logits_processor=LogitsProcessorList([rec]))
            new = gen[:, x.shape[1]:]
            v = torch.stack([s[0] for s in rec.steps], 1).cpu()  # (batch, steps, k)
            ix = torch.stack([s[1] for s in rec.steps], 1).cpu()
            seqs, top_v, top_i = [], [], []
            for r, i in enumerate(idx):
                answer = new[r].tolist()
                n = answer.index(eos) + 1 if eos in answer else len(answer)  # keep EOS: the draft must predict it
                seqs.append(rendered[i] + answer[:n])
                top_v.append(v[r, :n].numpy())
                top_i.append(ix[r, :n].numpy())
            d = {"idx": np.array(idx), **{k: np.array(v) for k, v in maker.items()}, "tokens": np.concatenate(seqs).astype(np.int32),
                 "lens": np.array([len(q) for q in seqs]), "prompt_lens": np.array([len(rendered[i]) for i in idx]),
                 "top_v": np.concatenate(top_v), "top_i": np.concatenate(top_i)}
            np.savez(path.with_suffix(".tmp.npz"), **d)
            path.with_suffix(".tmp.npz").replace(path)  # a batch is saved whole or not at all
            n_new += len(d["top_i"])
        else:
            n_reused += len(d["top_i"])
        done.append(d)
        rate = n_new / (time.time() - t0)
        print(f"[generate] {min(b + batch, len(order))}/{len(order)} prompts, {n_new + n_reused} answer tokens "
              f"({n_reused} from an earlier run), {rate:.0f} tok/s", flush=True)
    np.savez_compressed(out / "distill_data.npz", **{k: np.concatenate([d[k] for d in done])
                                                      for k in ("tokens", "lens", "prompt_lens", "top_v", "top_i")})
    for f in parts.glob("batch-*.npz"):
        f.unlink()
    parts.rmdir()
    wall = time.time() - t0
    return {"prompts": len(prompts), "answer_tokens": int(n_new + n_reused), "reused_answer_tokens": int(n_reused),
            "wall_s": wall, "tokens_per_s": n_new / wall, "max_new": max_new, "top_k": TOP_K}


def load_data(out: Path):
    with np.load(out / "distill_data.npz") as npz:
        d = {k: npz[k] for k in npz.files}  # each npz[k] decompresses anew: read every array once
    starts = np.concatenate([[0], np.cumsum(d["lens"])[:-1]])
    ans_starts = np.concatenate([[0], np.cumsum(d["lens"] - d["prompt_lens"])[:-1]])
    items = []
    for s, n, p, a in zip(starts, d["lens"], d["prompt_lens"], ans_starts):
        items.append({"tokens": d["tokens"][s:s + n], "prompt_len": int(p),
                      "top_v": d["top_v"][a:a + n - p], "top_i": d["top_i"][a:a + n - p]})
    return items


# ----------------------------------------------------------------------------- training


def saved_prompts(data: Path) -> dict | None:
    """A data set's distill_prompts.json ({"recipe": {..., "seed"}, "prompts": [...]}), or None where
    it is missing or in the older format without a recipe."""
    saved = data / "distill_prompts.json"
    kept = json.loads(saved.read_text()) if saved.exists() else None
    return kept if isinstance(kept, dict) and "seed" in kept.get("recipe", {}) else None


def split_seed(data: Path, fallback: int) -> int:
    """The seed a data set's dev split is drawn with: the one its prompts were drawn with (its
    distill_prompts.json), whatever seed trains on it later, so blocks trained on it never meet
    its dev sequences in another run. `fallback` for data made without that file."""
    kept = saved_prompts(data)
    return int(kept["recipe"]["seed"]) if kept is not None else fallback


def dev_digest(items) -> str:
    """Names a dev split by its sequences, for the log (and to check that a split stayed put)."""
    h = hashlib.sha256()
    for it in items:
        h.update(it["tokens"].astype(np.int32).tobytes() + b"|")
    return h.hexdigest()[:16]


def make_batch(items, torch, device=None):
    """Right-padded inputs; targets only at answer positions: row j of an item's labels is the
    target's choice for the token at prompt_len + j, predicted from position prompt_len + j - 1.
    Built on the CPU and moved to `device` (the model's)."""
    width = max(len(it["tokens"]) for it in items) - 1
    x = torch.zeros((len(items), width), dtype=torch.long)
    mask = torch.zeros((len(items), width), dtype=torch.long)
    pos, hard, soft_v, soft_i = [], [], [], []
    for r, it in enumerate(items):
        t = torch.from_numpy(it["tokens"].astype(np.int64))
        x[r, :len(t) - 1] = t[:-1]
        mask[r, :len(t) - 1] = 1
        p = it["prompt_len"]
        n = len(t) - p
        pos.append(torch.stack([torch.full((n,), r), torch.arange(p - 1, p - 1 + n)], 1))
        hard.append(t[p:])
        soft_v.append(torch.from_numpy(it["top_v"].astype(np.float32)))
        soft_i.append(torch.from_numpy(it["top_i"].astype(np.int64)))
    batch = (x, mask, torch.cat(pos), torch.cat(hard), torch.cat(soft_v), torch.cat(soft_i))
    return tuple(t.to(device) for t in batch) if device is not None else batch


def answer_logits(model, x, mask, pos, torch):
    hidden = model.model(input_ids=x, attention_mask=mask).last_hidden_state
    h = hidden[pos[:, 0], pos[:, 1]]
    return model.lm_head(h).float()


def agreement(model, items, torch, batch: int = 16) -> float:
    model.eval()
    hit = total = 0
    with torch.no_grad():
        for b in range(0, len(items), batch):
            x, mask, pos, hard, _, _ = make_batch(items[b:b + batch], torch, model.device)
            pred = answer_logits(model, x, mask, pos, torch).argmax(-1)
            hit += int((pred == hard).sum())
            total += len(hard)
    model.train()
    return hit / total


def _is_embedding(name: str) -> bool:
    return "embed_tokens" in name or "lm_head" in name


def load_blocks(model, init: Path, what: str) -> None:
    """Go on from an earlier run's draft_blocks.pt (blocks and final norm; the embedding stays the
    target's), refusing blocks of another shape."""
    import torch

    missing, unexpected = model.load_state_dict(torch.load(init, map_location="cpu", weights_only=True), strict=False)
    untrained = [k for k in missing if not _is_embedding(k)]
    if untrained or unexpected:
        raise SystemExit(f"{init} does not fit {what}: missing {untrained[:3]}, unexpected {unexpected[:3]}")


def block_optimizer(model, lr: float):
    """(trainable parameters, AdamW over them) with the embedding and output head frozen: a draft
    GGUF takes both from the target (tied in SmolLM2; an untied head trained here would be thrown
    away when the GGUF is written)."""
    import torch

    model.model.embed_tokens.weight.requires_grad_(False)
    model.lm_head.weight.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)


def lr_at(lr: float, step: int, steps: int, warmup: int) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    return lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / steps)))


def save_blocks(model, path: Path) -> None:
    """The trained part of a draft (blocks and final norm), which write_draft_gguf reads."""
    import torch

    torch.save({k: v.cpu() for k, v in model.state_dict().items() if not _is_embedding(k)}, path)


def train_draft(target_gguf: Path, layers: int, out: Path, epochs: float, lr: float, batch: int, seed: int,
                precision: str, init: Path | None = None, more_data: list[Path] = (), device=None) -> dict:
    """float32 master weights; with precision "bf16" the forward runs under bf16 autocast.
    init: a previous run's draft_blocks.pt to go on from (each data set's dev split follows its
    own seed, split_seed, so those blocks never train on the dev sequences they are scored on).
    more_data: earlier OUT directories whose distill_data.npz is trained on too."""
    import torch

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf

    # Each data set keeps the dev split of its own seed (split_seed), so blocks trained on one
    # set (--init) never meet its dev sequences in training when more sets join.
    dev, train, digests = [], [], []
    for data in [out, *more_data]:
        items = load_data(data)
        perm = np.random.default_rng(split_seed(data, seed)).permutation(len(items))
        n_dev = max(8, len(items) // 20)
        dev += [items[i] for i in perm[:n_dev]]
        train += [items[i] for i in perm[n_dev:]]
        digests.append(dev_digest([items[i] for i in perm[:n_dev]]))
    n_dev = len(dev)
    rng = np.random.default_rng(seed)  # the training order
    model = load_llama_gguf(target_gguf, n_layers=layers).to(device or "cpu")
    if init is not None:
        load_blocks(model, init, f"a {layers}-block draft of {target_gguf.name}")
    params, opt = block_optimizer(model, lr)
    steps = int(epochs * len(train) / batch)
    warmup = max(1, steps // 20)
    start = agreement(model, dev, torch)
    print(f"[train] {len(train)} sequences, {n_dev} dev; {steps} steps; initial dev agreement {start:.1%}", flush=True)
    # The starting blocks count as a candidate: a run from --init that never improves on dev
    # must leave them as they were, not its last step.
    curve, best = [{"step": 0, "dev_agreement": start}], start
    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t0 = time.time()
    eval_every = max(1, steps // 12)
    order = []
    for step in range(steps):
        if not order:
            order = list(rng.permutation(len(train)))
        chunk = [train[order.pop()] for _ in range(min(batch, len(order)))]
        for g in opt.param_groups:
            g["lr"] = lr_at(lr, step, steps, warmup)
        x, mask, pos, hard, soft_v, soft_i = make_batch(chunk, torch, model.device)
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = answer_logits(model, x, mask, pos, torch)  # .float() inside: the losses in float32
        logp = torch.log_softmax(logits, -1)
        hard_loss = -logp.gather(1, hard[:, None]).mean()
        soft_loss = -(torch.softmax(soft_v, -1) * logp.gather(1, soft_i)).sum(-1).mean()
        loss = 0.5 * hard_loss + 0.5 * soft_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            acc = agreement(model, dev, torch)
            curve.append({"step": step + 1, "wall_s": round(time.time() - t0, 1), "loss": loss.item(), "dev_agreement": acc})
            print(f"[train] step {step + 1}/{steps} {time.time() - t0:.0f} s loss {loss.item():.3f} "
                  f"dev agreement {acc:.1%}", flush=True)
            if acc > best:
                best, best_state = acc, {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    save_blocks(model, out / "draft_blocks.pt")
    return {"layers": layers, "sequences": len(train), "dev_sequences": n_dev, "steps": steps, "batch": batch, "lr": lr,
            "epochs": epochs, "precision": precision, "device": model.device.type, "init": str(init) if init else None,
            "more_data": [str(d) for d in more_data], "dev_digests": digests, "initial_dev_agreement": start, "best_dev_agreement": best, "curve": curve,
            "wall_s": time.time() - t0}


# ----------------------------------------------------------------------------- GGUF


def write_draft_gguf(target_gguf: Path, out: Path, layers: int, dst: Path, name: str | None = None) -> Path:
    """The target's metadata and embedding, the trained blocks (Q8_0) and final norm (F32);
    general.name is the target's followed by `name` (default: distilled draft)."""
    import gguf
    import torch

    from cospec_local.formats.gguf_edit import architecture, open_gguf, rewrite_gguf
    from cospec_local.formats.llama_gguf_writer import _LAYER_TENSORS, permute_qk

    state = torch.load(out / "draft_blocks.pt")
    reader = open_gguf(target_gguf)
    arch = architecture(reader)
    n_head = int(reader.get_field(f"{arch}.attention.head_count").contents())
    n_head_kv = int(reader.get_field(f"{arch}.attention.head_count_kv").contents())

    def kv_edit(key, value):
        if key == f"{arch}.block_count":
            return layers
        if key == gguf.Keys.General.NAME:
            return f"{value} {name or f'distilled draft ({layers} blocks)'}"
        if key == gguf.Keys.General.FILE_TYPE:
            return int(gguf.LlamaFileType.MOSTLY_Q8_0)
        return value

    def trained_tensors():
        for hf_name, w in state.items():
            w = w.float().numpy()
            if hf_name == "model.norm.weight":
                yield "output_norm.weight", w, None
                continue
            _, _, layer, rest = hf_name.split(".", 3)
            name = f"blk.{int(layer)}.{_LAYER_TENSORS[rest]}"
            if name.endswith("attn_q.weight"):
                w = permute_qk(w, n_head)
            elif name.endswith("attn_k.weight"):
                w = permute_qk(w, n_head_kv)
            if w.ndim == 1:
                yield name, w, None
            else:
                q8 = gguf.GGMLQuantizationType.Q8_0
                yield name, gguf.quants.quantize(w, q8), q8

    return rewrite_gguf(reader, dst, kv_edit, keep_tensor=lambda name: name == "token_embd.weight",
                        add_tensors=trained_tensors())


# ----------------------------------------------------------------------------- measurement


def measure(target_gguf: Path, draft_gguf: Path, prompts: list[str], max_new: int, threads: int) -> dict:
    """llama.cpp: teacher-forced agreement of the draft with the target's greedy continuation on
    unseen prompts; draft-only vs target-only tokens/s and sps acceptance, interleaved per prompt."""
    from cospec_local import Engine

    hit = total = 0
    engine_mode = {"target-only": "target-only", "draft-only": "draft-only", "sps": "speculative"}  # label: mode
    tps = {label: [0, 0.0] for label in engine_mode}
    drafted = accepted = 0
    t0 = time.time()
    with Engine(target_gguf, draft_gguf, n_ctx=1024, n_threads=threads) as engine:
        for p in prompts:
            prompt = engine.render_chat([{"role": "user", "content": p}])
            ref = engine.generate(prompt, mode="target-only", max_tokens=max_new)
            answer = list(ref.tokens)
            logits = engine.score(prompt + answer, "draft")
            pred = logits[len(prompt) - 1:len(prompt) - 1 + len(answer)].argmax(-1)
            hit += int((pred == np.array(answer)).sum())
            total += len(answer)
            for label, mode in engine_mode.items():
                r = engine.generate(prompt, mode=mode, max_tokens=max_new, ignore_eos=True, adaptive_draft=False,
                                    draft_max=3)
                tps[label][0] += r.stats.predicted_n
                tps[label][1] += r.stats.predicted_ms
                if label == "sps":
                    drafted += r.stats.draft_n
                    accepted += r.stats.draft_n_matched
    speed = {m: 1000.0 * n / ms for m, (n, ms) in tps.items()}
    return {"heldout_prompts": len(prompts), "answer_tokens": total, "agreement": hit / total,
            "tokens_per_s": speed, "draft_speedup": speed["draft-only"] / speed["target-only"],
            "sps_speedup_k3": speed["sps"] / speed["target-only"], "sps_acceptance_k3": accepted / drafted,
            "threads": threads, "wall_s": time.time() - t0}


# ----------------------------------------------------------------------------- main


@dataclass
class DistillConfig:
    """A draft distilled from the target's own replies (distill_draft.py's command line)."""

    out: Path = option(REQUIRED, "Folder of the run: its data, draft_blocks.pt, the draft GGUF and its log.")
    target: Path | None = option(None, "Target GGUF (default: SmolLM2-135M-Instruct).", ("-m", "--model"))
    stages: str = option("generate,train,gguf,measure", "Which stages to run, comma-separated.")
    layers: int = option(2, "Transformer blocks of the draft (the target's first ones to start from).")
    train_prompts: int = option(2000, "Template prompts (distill_prompts' 'train' split).")
    self_prompts: int = option(0, "And this many prompts the target writes itself (held-out topics excluded).")
    heldout_prompts: int = option(60, "Measure stage: the first N held-out prompts (seed 0).")
    max_new: int = option(160, "Most tokens of each generated reply.")
    gen_batch: int = option(128, "Replies generated per batch.")
    epochs: float = option(2.0, "Training epochs.")
    lr: float = option(1e-3, "Learning rate.")
    batch: int = option(16, "Sequences per training step.")
    seed: int = option(0, "Seed of prompts, generation and training.")
    threads: int = option(1, "torch threads.")
    with_data: str = option("", "Earlier OUT directories, comma-separated: the train stage trains on their data too, "
                                "and the generate stage does not ask their prompts again (give this data set another "
                                "--seed).")
    init: Path | None = option(None, "Train stage: go on from this draft_blocks.pt (a previous run's blocks) instead "
                                     "of the target's first blocks.")
    precision: str = option("auto", "Generation and training arithmetic: auto = bf16 where the CPU has native bf16 "
                                    "products, or on a CUDA device that has them; bf16; float32.")
    device: str = option("auto", "Where generation and training run: auto (a CUDA device where torch sees one, else "
                                 "the CPU), cpu or cuda[:N]; the measure stage runs llama.cpp as the engine is built.")


def earlier_prompts(with_data: list[Path], out: Path, target: Path) -> list[str]:
    """The prompts of earlier data sets (--with-data), not to be asked again: each must have been
    made by this target, and each named once."""
    if out.resolve() in with_data or len(set(with_data)) < len(with_data):
        raise SystemExit("--with-data: name each earlier data set once, and not --out itself")
    known = []
    for d in with_data:
        if not (d / "distill_data.npz").exists() or not (d / "distill_prompts.json").exists():
            raise SystemExit(f"--with-data {d}: no distill_data.npz and distill_prompts.json there (run its generate stage first)")
        saved = saved_prompts(d)
        if saved is None:
            raise SystemExit(f"--with-data {d}: its distill_prompts.json has no recipe: the seed of its dev split "
                             "and the target that made it are unknown")
        maker = saved["recipe"].get("target")
        if maker is None or Path(maker).resolve() != Path(target).resolve():
            raise SystemExit(f"--with-data {d}: its data were made by {maker}, not by the target {target}")
        known += saved["prompts"]
    return known


def generate_stage(args: DistillConfig, target: Path, known: list[str], with_data: list[Path], precision: str,
                   device) -> None:
    """The prompts (task prompts, then the target's own), and the target's replies to them as
    the draft's training data. A rerun of the same recipe reuses the prompts it sampled."""
    from .distill_prompts import build_prompts, heldout_topics

    model = load_generator(target, precision, device)
    known_keys = {p.lower() for p in known}
    prompts = [p for p in build_prompts("train", args.train_prompts, args.seed) if p.lower() not in known_keys]
    recipe = {"train_prompts": args.train_prompts, "self_prompts": args.self_prompts, "seed": args.seed,
              "target": str(target)}
    if with_data:  # which prompts were not to be asked again, by content: a regenerated set is another set
        recipe |= {"with_data": [str(d) for d in with_data], "known": text_digest(known)}
    saved = args.out / "distill_prompts.json"
    written = {}
    previous = json.loads(saved.read_text()) if saved.exists() else None
    if isinstance(previous, dict) and previous.get("recipe") == recipe:
        prompts = previous["prompts"]  # a rerun: the self-written prompts were sampled already
        written = previous.get("self_prompts", {})
        print(f"[generate] {len(prompts)} prompts from {saved}", flush=True)
    elif args.self_prompts:
        extra, written = self_prompts(target, model, args.self_prompts, args.seed, args.gen_batch,
                                      heldout_topics(), known, args.out / "self_prompts_progress.json")
        prompts += extra
    saved.write_text(json.dumps({"recipe": recipe, "self_prompts": written, "prompts": prompts}, indent=0))
    (args.out / "self_prompts_progress.json").unlink(missing_ok=True)  # distill_prompts.json holds them now
    log_update(args.out, self_prompts=written,
               generate=generate_data(target, model, prompts, args.max_new, args.gen_batch, args.out))


def measure_stage(args: DistillConfig, target: Path, draft_path: Path) -> None:
    """The draft's acceptance and speed on held-out prompts, in a process of its own: llama.cpp
    decoded 2.5x slower in a process where torch had run multi-threaded work (the train stage),
    and unevenly: the speed ratios were off."""
    from .distill_prompts import build_prompts

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        # The held-out prompts do not follow --seed: every draft is scored on the same ones.
        result = pool.submit(measure, target, draft_path, build_prompts("heldout", args.heldout_prompts, 0),
                             args.max_new, args.threads).result()
    log_update(args.out, measure=result)
    print(json.dumps(result, indent=1))


def main(argv: list[str] | None = None) -> None:
    from cospec_local.models import find_smollm2_gguf

    args = parse_config(DistillConfig, argv, __doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    if args.precision not in PRECISIONS:
        raise SystemExit(f"--precision must be one of {', '.join(PRECISIONS)}")

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)  # refused before anything is written
    precision = resolve_precision(args.precision, device)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.target or find_smollm2_gguf()
    stages = comma_list(args.stages)
    with_data = [Path(d).resolve() for d in comma_list(args.with_data)]
    known = earlier_prompts(with_data, args.out, target)
    log_update(args.out, args=asdict(args) | {"out": str(args.out), "target": str(target), "init": str(args.init) if args.init else None,
                                          "with_data": [str(d) for d in with_data], "precision_used": precision,
                                          "device_used": str(device)})
    draft_path = args.out / "smollm2-135m-draft-q8_0.gguf"
    if "generate" in stages:
        generate_stage(args, target, known, with_data, precision, device)
    if "train" in stages:
        log_update(args.out, train=train_draft(target, args.layers, args.out, args.epochs, args.lr, args.batch, args.seed,
                                                    precision, args.init, with_data, device))
    if "gguf" in stages:
        write_draft_gguf(target, args.out, args.layers, draft_path)
        log_update(args.out, gguf={"path": draft_path.name, "bytes": draft_path.stat().st_size})
        print(f"[gguf] {draft_path} ({draft_path.stat().st_size / 2**20:.1f} MiB)")
    if "measure" in stages:
        measure_stage(args, target, draft_path)


if __name__ == "__main__":
    main()
