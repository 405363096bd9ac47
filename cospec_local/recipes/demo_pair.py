"""Reproduce the bundled demo pair: a SentencePiece tokenizer, a target and a draft
LlamaForCausalLM trained from scratch on the generated task families, and both as GGUF.

    python -m cospec_local.recipes.demo_pair --out OUT --minutes-target 20 --minutes-draft 8 --seed 0 --threads 1

(the published pair's exact invocations are in cospec_local/data/demo/README.md)

Writes to OUT:
  tokenizer.model                    SentencePiece BPE (vocab 512, digits split), trained once
  target/, draft/                    best checkpoints (config.json + model.safetensors + tokenizer.model)
  demo-target-<type>.gguf, demo-draft-<type>.gguf
                                     llama-architecture GGUF: q8_0 when its llama.cpp dev accuracy is
                                     within --gguf-tolerance of an f32 GGUF's, else f16 (same rule)
  train_log.json                     settings, dev accuracy over time, wall times, FLOPs, GGUF checks
                                     (rewritten after every evaluation, so a running job can be watched)

Conventions (the same in training, in the dev evaluation here and when the models are used):
- the model input is BOS + problem.prompt + "\\n"; the target text is problem.solution + EOS (</s>);
  greedy generation stops at EOS or at the family's stop strings ("\\n\\n" for arith).
- the tokenizer is trained on whole lines (`split_lines=True`), so "\\n" is always its own token:
  the input is exactly the tokens of the prompt plus the newline, and answers start on a fresh token.
  The loss covers the answer tokens, EOS, and that newline (a model given the bare prompt
  therefore writes the newline itself); the prompt's own tokens carry no loss.

Recipe. The data are the "train" split of the families in each model's mix (arith and pyfunc,
in different proportions for the two models; a pyfunc question may repeat with new example values,
its question space being a few thousand per split); the dev accuracy is greedy decoding in torch (fp32) on the first
`--dev-problems` dev problems of the default difficulty, scored by the family scorer.
AdamW (betas 0.9/0.95, weight decay 0.1 on matrices), linear warm-up then cosine decay to 10%,
bf16 autocast on CPU (fp32 master weights; `--no-bf16` trains in float32, 12x faster on CPUs
without native bf16), batch 32, sequences grouped by length. `--init-draft DIR` (or
`--init-target`) continues a checkpoint instead of starting fresh, e.g. on a mix that gives the
draft more practice at one skill (`arith/sub_weight=20`: the published draft's last step). The number
of optimizer steps is fixed before training: a short calibration (a few timed steps and one
timed dev evaluation, then the model is rebuilt from its seed) turns the `--minutes-*` budget
into steps, which the log records; `--steps-target/--steps-draft` replay a run exactly on the
same machine. The best dev checkpoint is kept; training ends at the planned step, after
`--patience` evaluations without improvement (counted from 40% of the schedule), at
`--stop-acc-*` if given, or at 1.15x the time budget (a safety stop, recorded in the log).

Why target and draft differ, as real pairs do (no label is corrupted, no error is hand-made):
- capacity: target dim 256 x 4 layers (ffn 768), draft dim 128 x 2 layers (ffn 256),
  so the draft costs under 1/8 of the target's FLOPs per token;
- training length: the draft gets a smaller budget and can be stopped at an accuracy cap
  (`--stop-acc-draft`, or `--draft-gap`: the target's best dev accuracy minus a gap; the
  target is trained first);
- seed: different initialisation and data order (target: seed, draft: seed + 1);
- data mix: each model has its own `--*-mix`; by default the draft sees over three times the
  share of pyfunc (0.3 against 0.09), as a code-heavier small model would. The target's pyfunc
  accuracy is steep in its share (test accuracy 60% at 0.06, 84% at 0.09, 86% at 0.15).

Threads: everything runs on `--threads` threads, so wall times are those of that many cores of
this machine. When a training stage ran, the GGUF stage runs in a fresh interpreter: llama.cpp
decoded 14x slower in the process that had just trained with torch.
"""
from __future__ import annotations

import json
import math
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from cospec_local.command_line import REQUIRED, comma_list, config_args, option, parse_config
from cospec_local.tasks import FAMILY_STOPS  # where each family's answer ends, as in eval

from cospec_local.formats.spm_tokenizer import BOS_ID, EOS_ID, load_tokenizer, train_tokenizer

PAD_ID = 0  # <unk>; padded positions are masked and carry no loss
IGNORE = -100
NEWLINE = "\n"
# The demo models answer one task prompt at a time: chat renders the latest user message and the
# newline the models were trained to see after a prompt (BOS comes from the tokenizer).
CHAT_TEMPLATE = ("{%- set ns = namespace(prompt='') -%}"
                 "{%- for m in messages if m['role'] == 'user' -%}{%- set ns.prompt = m['content'] -%}{%- endfor -%}"
                 "{{ ns.prompt }}{{ '\\n' }}")


@dataclass
class Arch:
    dim: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    max_len: int = 512

    @classmethod
    def from_config(cls, cfg: dict) -> "Arch":
        """The architecture of a checkpoint's config.json (Hugging Face Llama keys)."""
        return cls(dim=cfg["hidden_size"], layers=cfg["num_hidden_layers"], heads=cfg["num_attention_heads"],
                   kv_heads=cfg["num_key_value_heads"], ffn=cfg["intermediate_size"],
                   max_len=cfg["max_position_embeddings"])

    @classmethod
    def parse(cls, text: str, base: "Arch") -> "Arch":
        """'dim=256,layers=4,heads=8,kv_heads=4,ffn=768' (keys not given keep `base`'s values)."""
        values = asdict(base)
        for item in filter(None, (s.strip() for s in text.split(","))):
            key, _, value = item.partition("=")
            if key not in values:
                raise SystemExit(f"unknown architecture key {key!r}; known: {', '.join(values)}")
            values[key] = int(value)
        return cls(**values)


TARGET_ARCH = Arch(dim=256, layers=4, heads=8, kv_heads=4, ffn=768)
DRAFT_ARCH = Arch(dim=128, layers=2, heads=4, kv_heads=2, ffn=256)


@dataclass
class MixItem:
    family: str
    difficulty: dict
    weight: float

    @property
    def label(self) -> str:
        return self.family + "".join(f"/{k}={v}" for k, v in sorted(self.difficulty.items()))


def parse_mix(text: str) -> list[MixItem]:
    """'arith=1' or 'arith=0.8,pyfunc=0.2' or 'arith/steps=2=0.3,arith=0.7' (family[/key=value...]=weight)."""
    from cospec_local.tasks import TASKS, TRAIN_FAMILIES

    items = []
    for part in filter(None, (s.strip() for s in text.split(","))):
        spec, _, weight = part.rpartition("=")
        if not spec:
            spec, weight = weight, "1"
        family, *diffs = spec.split("/")
        if family not in TASKS:
            raise SystemExit(f"unknown task family {family!r}")
        if family not in TRAIN_FAMILIES:
            raise SystemExit(f"{family!r} is kept apart for transfer tests and is never trained on")
        difficulty = {}
        for d in diffs:
            k, _, v = d.partition("=")
            difficulty[k] = int(v)
        TASKS[family].difficulty(difficulty)  # validates the keys
        items.append(MixItem(family, difficulty, float(weight)))
    if not items or sum(i.weight for i in items) <= 0:
        raise SystemExit(f"empty data mix {text!r}")
    return items


# ----------------------------------------------------------------------------- data


def problems_for(items: list[MixItem], split: str, n_total: int) -> dict[str, list]:
    from cospec_local.tasks import TASKS

    total = sum(i.weight for i in items)
    # Training pools may repeat a question (pyfunc has a few thousand per split and level); the
    # split of every question is still checked, so no dev/test question enters training.
    return {i.label: TASKS[i.family].generate(split, max(1, round(n_total * i.weight / total)), i.difficulty or None,
                                              distinct=split != "train")
            for i in items}


def encode_example(sp, prompt: str, solution: str) -> tuple[list[int], int] | None:
    """(token ids, index of the first token with loss) or None when the tokens of
    prompt + "\\n" are not a prefix of those of the whole text (then it is skipped)."""
    head = sp.encode(prompt)
    full = sp.encode(prompt + NEWLINE + solution)
    nl = sp.encode(prompt + NEWLINE)
    if full[:len(nl)] != nl or nl[:len(head)] != head:
        return None
    return [BOS_ID] + full + [EOS_ID], 1 + len(head)


@dataclass
class Dataset:
    ids: list[np.ndarray]
    loss_from: np.ndarray
    skipped: int
    per_item: dict

    @property
    def n(self) -> int:
        return len(self.ids)


def build_dataset(sp, pools: dict[str, list], max_len: int) -> Dataset:
    ids, starts, skipped, per_item = [], [], 0, {}
    for label, problems in pools.items():
        kept = 0
        for p in problems:
            enc = encode_example(sp, p.prompt, p.solution)
            if enc is None or len(enc[0]) > max_len:
                skipped += 1
                continue
            ids.append(np.asarray(enc[0], dtype=np.int16))
            starts.append(enc[1])
            kept += 1
        per_item[label] = kept
    return Dataset(ids, np.asarray(starts), skipped, per_item)


def batches(data: Dataset, batch_size: int, rng: np.random.Generator, group: int = 64):
    """Endless batches: each epoch is shuffled, cut into groups of `group` batches, sorted by
    length inside a group (less padding) and the batches of a group shuffled again."""
    lengths = np.asarray([len(x) for x in data.ids])
    while True:
        order = rng.permutation(data.n)
        for g in range(0, len(order), batch_size * group):
            chunk = order[g:g + batch_size * group]
            chunk = chunk[np.argsort(lengths[chunk], kind="stable")]
            parts = [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
            for j in rng.permutation(len(parts)):
                if len(parts[j]) == batch_size:
                    yield parts[j]


def collate(data: Dataset, index, torch):
    width = max(len(data.ids[i]) for i in index)
    x = torch.full((len(index), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(index), width), dtype=torch.long)
    labels = torch.full((len(index), width), IGNORE, dtype=torch.long)
    for row, i in enumerate(index):
        seq = torch.from_numpy(data.ids[i].astype(np.int64))
        x[row, :len(seq)] = seq
        mask[row, :len(seq)] = 1
        start = int(data.loss_from[i])
        labels[row, start:len(seq)] = seq[start:]
    return x, mask, labels


# ----------------------------------------------------------------------------- model helpers


def per_token_flops(arch: Arch, vocab: int, context: int = 0) -> float:
    """Forward FLOPs (2 x multiply-adds) of one token: the weight matrices incl. the output head,
    plus attention over `context` earlier positions."""
    head_dim = arch.dim // arch.heads
    attn = arch.dim * head_dim * (2 * arch.heads + 2 * arch.kv_heads)
    mlp = 3 * arch.dim * arch.ffn
    macs = arch.layers * (attn + mlp) + arch.dim * vocab + arch.layers * 2 * context * arch.heads * head_dim
    return 2.0 * macs


def make_model(arch: Arch, vocab: int, seed: int):
    from cospec_local.recipes.demo_models import build_model, llama_config

    cfg = llama_config(vocab, arch.dim, arch.layers, arch.heads, arch.kv_heads, arch.ffn, arch.max_len)
    cfg._attn_implementation = "eager"  # faster than sdpa on CPU for training these sizes
    model = build_model(cfg, seed=seed)
    model.generation_config.pad_token_id = PAD_ID
    model.generation_config.eos_token_id = EOS_ID
    model.generation_config.bos_token_id = BOS_ID
    return model


def make_optimizer(model, lr: float, torch):
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95), eps=1e-8)


def lr_at(step: int, total: int, peak: float, warmup: int, floor: float = 0.1) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * t)))


def greedy_answers(model, sp, problems, torch, batch_size: int = 128, max_new: int | None = None) -> list[str]:
    """Greedy completions in fp32 for BOS + prompt + "\\n", cut at EOS and the family's stop strings."""
    model.eval()
    texts = []
    with torch.no_grad():
        for b in range(0, len(problems), batch_size):
            chunk = problems[b:b + batch_size]
            prompts = [[BOS_ID] + sp.encode(p.prompt + NEWLINE) for p in chunk]
            width = max(len(p) for p in prompts)
            new = max_new or max(len(sp.encode(p.solution)) for p in chunk) + 16
            x = torch.full((len(chunk), width), PAD_ID, dtype=torch.long)
            mask = torch.zeros_like(x)
            for i, p in enumerate(prompts):  # left padding
                x[i, width - len(p):] = torch.tensor(p)
                mask[i, width - len(p):] = 1
            out = model.generate(input_ids=x, attention_mask=mask, max_new_tokens=new, do_sample=False,
                                 eos_token_id=EOS_ID, pad_token_id=PAD_ID)
            for i, p in enumerate(chunk):
                ids = out[i, width:].tolist()
                if EOS_ID in ids:
                    ids = ids[:ids.index(EOS_ID)]
                text = sp.decode(ids)
                for s in FAMILY_STOPS.get(p.family, []):
                    if s in text:
                        text = text[:text.index(s)]
                texts.append(text)
    return texts


def dev_accuracy(model, sp, dev, torch) -> tuple[float, list[bool]]:
    from cospec_local.tasks import score

    texts = greedy_answers(model, sp, dev, torch)
    ok = [bool(score(p, t)) for p, t in zip(dev, texts)]
    return sum(ok) / len(ok), ok


# ----------------------------------------------------------------------------- training


@dataclass
class RunConfig:
    name: str
    arch: Arch
    mix: str
    lr: float
    batch: int
    minutes: float
    steps: int | None
    seed: int
    stop_acc: float | None
    eval_points: int
    patience: int
    init: str | None = None  # a checkpoint folder to continue training from, instead of a fresh model
    bf16: bool = True  # bf16 autocast (fp32 master weights); off on CPUs without native bf16


@dataclass
class RunLog:
    config: dict
    params: int = 0
    params_non_embedding: int = 0
    flops_per_token: float = 0.0
    flops_per_token_ctx128: float = 0.0
    data: dict = field(default_factory=dict)
    calibration: dict = field(default_factory=dict)
    planned_steps: int = 0
    eval_every: int = 0
    curve: list = field(default_factory=list)
    best: dict = field(default_factory=dict)
    stop_reason: str = ""
    wall_s: float = 0.0
    train_s: float = 0.0
    eval_s: float = 0.0


def starting_model(rc: RunConfig, vocab: int, torch):
    """A fresh model from the run's seed, or the checkpoint it continues (--init-*)."""
    if not rc.init:
        return make_model(rc.arch, vocab, rc.seed)
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(rc.init, dtype=torch.float32)
    model.config._attn_implementation = "eager"
    if model.config.vocab_size != vocab:
        raise SystemExit(f"{rc.init}: vocabulary {model.config.vocab_size}, the tokenizer's {vocab}")
    return model


def describe_run(log: RunLog, model, rc: RunConfig, vocab: int, data: Dataset) -> None:
    """The model's size and FLOPs a token, and the data it trains on, into the run's log."""
    log.params = sum(p.numel() for p in model.parameters())
    log.params_non_embedding = log.params - sum(p.numel() for n, p in model.named_parameters()
                                                 if "embed_tokens" in n or "lm_head" in n)
    log.flops_per_token = per_token_flops(rc.arch, vocab)
    log.flops_per_token_ctx128 = per_token_flops(rc.arch, vocab, 128)
    log.data = {"examples": data.n, "skipped": data.skipped, "per_item": data.per_item,
                "mean_tokens": float(np.mean([len(x) for x in data.ids])),
                "mean_loss_tokens": float(np.mean([len(x) - s for x, s in zip(data.ids, data.loss_from)]))}


def optimizer_step(data: Dataset, rc: RunConfig, torch):
    """One optimizer step on a batch at a learning rate: returns the batch's loss."""
    def step_fn(model, opt, index, lr):
        for g in opt.param_groups:
            g["lr"] = lr
        x, mask, labels = collate(data, index, torch)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=rc.bf16):
            loss = model(input_ids=x, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step_fn


def calibrated_steps(rc: RunConfig, data: Dataset, sp, dev, vocab: int, step_fn, spent_before: float,
                     torch) -> tuple[int, dict]:
    """The optimizer steps that fit the time budget, from a throw-away copy: timed steps and one
    timed dev evaluation."""
    t_start = time.time() - spent_before
    probe = make_model(rc.arch, vocab, rc.seed)
    probe.train()
    popt = make_optimizer(probe, rc.lr, torch)
    pit = batches(data, rc.batch, np.random.default_rng(10_000 + rc.seed))
    for _ in range(2):
        step_fn(probe, popt, next(pit), rc.lr * 0.1)
    n_probe = 24
    t0 = time.time()
    for _ in range(n_probe):
        step_fn(probe, popt, next(pit), rc.lr * 0.1)
    step_s = (time.time() - t0) / n_probe
    t0 = time.time()
    dev_accuracy(probe, sp, dev, torch)  # untrained: runs to the token limit, an upper bound
    eval_s = time.time() - t0
    del probe, popt
    spent = time.time() - t_start
    steps = max(50, int((rc.minutes * 60.0 - spent - (rc.eval_points + 1) * eval_s) / step_s))
    return steps, {"step_s": step_s, "eval_s": eval_s, "calibration_s": spent}


def train_one(rc: RunConfig, data: Dataset, sp, dev, out_dir: Path, tok_path: Path, save_log, torch) -> RunLog:
    """Train one model; `save_log(log)` is called after every evaluation."""
    from cospec_local.recipes.demo_models import save_model

    vocab = sp.vocab_size()
    log = RunLog(config={**asdict(rc), "arch": asdict(rc.arch)})
    model = starting_model(rc, vocab, torch)
    describe_run(log, model, rc, vocab, data)
    t_start = time.time()
    budget = rc.minutes * 60.0
    step_fn = optimizer_step(data, rc, torch)
    if rc.steps is None:
        steps, log.calibration = calibrated_steps(rc, data, sp, dev, vocab, step_fn, time.time() - t_start, torch)
    else:
        steps = rc.steps
    log.planned_steps = steps
    log.eval_every = max(1, steps // rc.eval_points)
    warmup = min(200, max(10, steps // 20))

    torch.manual_seed(rc.seed)
    model.train()
    opt = make_optimizer(model, rc.lr, torch)
    it = batches(data, rc.batch, np.random.default_rng(rc.seed))
    best_acc, since_best = -1.0, 0
    losses, seqs, toks = [], 0, 0
    t_train = 0.0
    t_eval = 0.0
    log.stop_reason = "planned steps"
    for step in range(steps):
        index = next(it)
        t0 = time.time()
        losses.append(step_fn(model, opt, index, lr_at(step, steps, rc.lr, warmup)))
        t_train += time.time() - t0
        seqs += len(index)
        toks += int(sum(len(data.ids[i]) for i in index))
        done = step + 1
        if done % log.eval_every and done != steps:
            continue
        t0 = time.time()
        acc, ok = dev_accuracy(model, sp, dev, torch)
        model.train()
        t_eval += time.time() - t0
        improved = acc >= best_acc
        if improved:
            best_acc, since_best = acc, 0
            save_model(model, out_dir / rc.name, tokenizer_model=tok_path)
            log.best = {"step": done, "dev_acc": acc, "train_s": t_train, "wall_s": time.time() - t_start,
                        "dev_correct": "".join("1" if o else "0" for o in ok)}
        elif done >= 0.4 * steps:
            since_best += 1
        log.curve.append({"step": done, "train_s": round(t_train, 1), "wall_s": round(time.time() - t_start, 1),
                          "sequences": seqs, "tokens": toks, "lr": lr_at(step, steps, rc.lr, warmup),
                          "loss": float(np.mean(losses)), "dev_acc": acc})
        losses = []
        log.wall_s, log.train_s, log.eval_s = time.time() - t_start, t_train, t_eval
        print(f"[{rc.name}] step {done}/{steps} train {t_train / 60:.1f} min wall {log.wall_s / 60:.1f} min "
              f"loss {log.curve[-1]['loss']:.4f} dev {acc:.1%} (best {best_acc:.1%})", flush=True)
        save_log(log)
        if rc.stop_acc is not None and acc >= rc.stop_acc:
            log.stop_reason = f"dev accuracy reached {rc.stop_acc:.0%}"
            break
        if rc.patience and since_best >= rc.patience:
            log.stop_reason = f"no improvement in {rc.patience} evaluations"
            break
        if rc.steps is None and time.time() - t_start > 1.15 * budget:
            log.stop_reason = "time budget exceeded (safety stop)"
            break
    log.wall_s, log.train_s, log.eval_s = time.time() - t_start, t_train, t_eval
    save_log(log)
    return log


# ----------------------------------------------------------------------------- GGUF


def engine_check(gguf_path: Path, dev, sp, threads: int) -> dict:
    """Greedy target-only decoding of the dev problems in llama.cpp: accuracy, tokens/s and
    whether llama.cpp tokenizes the prompts exactly as SentencePiece does."""
    from cospec_local.engine import Engine
    from cospec_local.tasks import score

    ok, n_tok, ms, tok_mismatch = [], 0, 0.0, 0
    with Engine(str(gguf_path), n_threads=threads, n_threads_batch=threads, n_ctx=1024) as eng:
        for p in dev:
            text = p.prompt + NEWLINE
            if eng.tokenize(text) != [BOS_ID] + sp.encode(text):
                tok_mismatch += 1
            r = eng.generate(text, mode="target-only", max_tokens=256, stop=FAMILY_STOPS.get(p.family))
            ok.append(bool(score(p, r.text)))
            n_tok += r.stats.predicted_n
            ms += r.stats.predicted_ms
    return {"dev_acc": sum(ok) / len(ok), "dev_correct": "".join("1" if o else "0" for o in ok),
            "tokens_per_s": 1000.0 * n_tok / ms if ms else 0.0, "tokenizer_mismatches": tok_mismatch}


def write_ggufs(out: Path, names: list[str], runs: dict, check_problems, sp, threads: int, gguf_type: str,
                tol: float) -> dict:
    """Write each model as GGUF. With `gguf_type` "auto": an f32 GGUF is the reference, and q8_0
    is kept when its llama.cpp accuracy on `check_problems` is at most `tol` below the f32 one,
    else f16 under the same rule, else f32. Only the chosen file stays."""
    from cospec_local.formats.llama_gguf_writer import convert

    result = {}
    for name in names:
        hf_dir = out / name
        info = {"torch_dev_acc": runs.get(name, {}).get("best", {}).get("dev_acc")}
        order = ["f32", "q8_0", "f16"] if gguf_type == "auto" else [gguf_type]
        for t in order:
            path = out / f"demo-{name}-{t}.gguf"
            convert(hf_dir, out / "tokenizer.model", path, t, name=f"cospec-demo-{name}", chat_template=CHAT_TEMPLATE)
            check = engine_check(path, check_problems, sp, threads)
            info[t] = {"path": path.name, "bytes": path.stat().st_size, **check}
            print(f"[{name}] {path.name}: {path.stat().st_size / 2**20:.2f} MiB, llama.cpp accuracy "
                  f"{check['dev_acc']:.1%} on {len(check_problems)} dev problems, {check['tokens_per_s']:.0f} tok/s",
                  flush=True)
            if t == "f32" and gguf_type == "auto":
                continue
            if gguf_type != "auto" or check["dev_acc"] >= info["f32"]["dev_acc"] - tol:
                info["chosen"] = t
                break
        info.setdefault("chosen", "f32")
        for stale in out.glob(f"demo-{name}-*.gguf"):
            if stale.name != info[info["chosen"]]["path"]:
                stale.unlink()
        result[name] = info
    return result


# ----------------------------------------------------------------------------- the command


@dataclass
class DemoPairConfig:
    """The demo pair's recipe: the settings of both models, then each model's own (the flags keep
    the spellings of the published invocations in data/demo/README.md)."""
    out: Path = option(REQUIRED, "output folder")
    seed: int = option(0, "target seed; the draft uses seed + 1")
    threads: int = option(1, "threads of torch and llama.cpp: wall times are those of that many cores")
    stages: str = option("tokenizer,target,draft,gguf",
                         "comma-separated subset of tokenizer,target,draft,gguf, run in that order (later stages reuse OUT)")
    batch_size: int = option(32, "sequences a step")
    bf16: bool = option(True, "bf16 autocast; --no-bf16 trains in float32: on CPUs without native bf16 (AVX2 "
                              "only) bf16 autocast runs several times slower")
    patience: int = option(5, "evaluations without improvement before stopping (0: never)")
    eval_points: int = option(16, "dev evaluations per run")
    train_problems: int = option(200_000, "size of each model's training pool")
    tokenizer_problems: int = option(30_000, "problems the tokenizer is trained on")
    vocab_size: int = option(512, "the tokenizer's vocabulary")
    dev_family: str = option("arith", "the task family of the dev evaluations")
    dev_problems: int = option(100, "dev problems of each evaluation during training")
    gguf_type: str = option("auto", "auto: q8_0 unless its llama.cpp dev accuracy falls more than --gguf-tolerance "
                                    "below that of an f32 GGUF (then f16 under the same rule)",
                            choices=("auto", "q8_0", "f16"))
    gguf_tolerance: float = option(0.02, "the accuracy a GGUF type may lose against f32")
    gguf_check_problems: int = option(300, "dev problems for the GGUF type check")
    # the target's run
    minutes_target: float = option(20.0, "time budget of the target (incl. evaluations)")
    steps_target: int | None = option(None, "fixed number of optimizer steps (replaces the time calibration)")
    target_arch: str = option("", "overrides, e.g. 'dim=256,layers=4,heads=8,kv_heads=4,ffn=768'")
    target_mix: str = option("arith=0.91,pyfunc=0.09", "training mix, e.g. 'arith=0.9,pyfunc=0.1'")
    init_target: Path | None = option(None, "continue training this checkpoint folder instead of a fresh model")
    lr_target: float = option(1e-3, "peak learning rate")
    stop_acc_target: float | None = option(None, "stop once the dev accuracy reaches this fraction")
    # the draft's run
    minutes_draft: float = option(8.0, "time budget of the draft (incl. evaluations)")
    steps_draft: int | None = option(None, "fixed number of optimizer steps (replaces the time calibration)")
    draft_arch: str = option("", "overrides, e.g. 'dim=128,layers=2,heads=4,kv_heads=2,ffn=256'")
    draft_mix: str = option("arith=0.7,pyfunc=0.3", "training mix")
    init_draft: Path | None = option(None, "the same for the draft (e.g. to give it more practice at one skill)")
    lr_draft: float = option(2e-3, "peak learning rate")
    stop_acc_draft: float | None = option(None, "stop once the dev accuracy reaches this fraction")
    draft_gap: float | None = option(None, "stop the draft once its dev accuracy reaches the target's best minus "
                                           "this (e.g. 0.15)")

    def stage_list(self) -> list[str]:
        stages = comma_list(self.stages)
        unknown = set(stages) - set(STAGES)
        if unknown:
            raise SystemExit(f"unknown stages: {', '.join(sorted(unknown))}")
        return stages

    def model_run(self, name: str, stop_acc: float | None) -> RunConfig:
        """One model's run from its own settings (`name`: target or draft) and the shared ones."""
        if name == "target":
            own = dict(arch=self.target_arch, mix=self.target_mix, lr=self.lr_target, minutes=self.minutes_target,
                       steps=self.steps_target, init=self.init_target, base=TARGET_ARCH, seed=self.seed)
        else:
            own = dict(arch=self.draft_arch, mix=self.draft_mix, lr=self.lr_draft, minutes=self.minutes_draft,
                       steps=self.steps_draft, init=self.init_draft, base=DRAFT_ARCH, seed=self.seed + 1)
        init = own["init"]
        arch = (Arch.from_config(json.loads((init / "config.json").read_text())) if init is not None
                else Arch.parse(own["arch"], own["base"]))
        return RunConfig(name=name, arch=arch, mix=own["mix"], lr=own["lr"], batch=self.batch_size,
                         minutes=own["minutes"], steps=own["steps"], seed=own["seed"], stop_acc=stop_acc,
                         eval_points=self.eval_points, patience=self.patience,
                         init=str(init) if init is not None else None, bf16=self.bf16)


STAGES = ("tokenizer", "target", "draft", "gguf")


class RecipeLog:
    """train_log.json: the settings, the runs and their curves, rewritten after every evaluation
    (so a running job can be watched), each invocation of the command recorded."""

    def __init__(self, out: Path, argv: list[str], versions: dict):
        self.path = out / "train_log.json"
        self.state = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.state.setdefault("runs", {})
        self.state["invocations"] = self.state.get("invocations", []) + [{
            "argv": argv, "started": time.strftime("%Y-%m-%d %H:%M:%S"), "python": platform.python_version(),
            **versions, "machine": platform.machine(), "cpu": _cpu_name()}]
        self.invocation = len(self.state["invocations"]) - 1
        self.started = time.time()

    def save(self) -> None:
        self.state["wall_s_this_invocation"] = time.time() - self.started
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.state, indent=1))
        tmp.replace(self.path)

    def reload(self) -> None:
        """Read what a child process wrote, this invocation's entry kept."""
        self.state = json.loads(self.path.read_text())

    def finish(self) -> None:
        self.state["invocations"][self.invocation]["wall_s"] = time.time() - self.started
        self.save()


def start_torch(threads: int, seed: int):
    """torch and transformers on `threads` threads, seeded, quiet."""
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    import torch
    import transformers

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    return torch, transformers


def tokenizer_stage(config: DemoPairConfig, mixes: dict, tok_path: Path, log: RecipeLog) -> None:
    """A SentencePiece tokenizer on whole lines of the train split of both models' mixes."""
    t0 = time.time()
    items = {i.label: i for m in mixes.values() for i in m}
    docs = [p.prompt + NEWLINE + p.solution
            for ps in problems_for(list(items.values()), "train", config.tokenizer_problems).values() for p in ps]
    train_tokenizer(docs, tok_path, config.vocab_size, split_lines=True, num_threads=config.threads)
    log.state["tokenizer"] = {"vocab_size": load_tokenizer(tok_path).vocab_size(), "documents": len(docs),
                              "mixes": sorted(items), "split_lines": True, "wall_s": time.time() - t0}
    log.save()


def draft_stop_accuracy(config: DemoPairConfig, log: RecipeLog) -> float | None:
    """Where the draft's training stops: --stop-acc-draft, or the target's best less --draft-gap."""
    stop_acc = config.stop_acc_draft
    if config.draft_gap is None:
        return stop_acc
    target_acc = log.state["runs"].get("target", {}).get("best", {}).get("dev_acc")
    if target_acc is None:
        raise SystemExit("--draft-gap needs the target trained first (stage 'target' in this or an earlier run)")
    stop_acc = min(stop_acc if stop_acc is not None else 1.0, target_acc - config.draft_gap)
    print(f"[draft] stops once its dev accuracy reaches {stop_acc:.0%} "
          f"(target {target_acc:.0%} - {config.draft_gap:.0%})", flush=True)
    return stop_acc


def model_stage(config: DemoPairConfig, name: str, mixes: dict, datasets: dict, sp, dev, log: RecipeLog, torch) -> None:
    """Train the target or the draft; the two share a training pool when their mixes are the same."""
    t0 = time.time()
    rc = config.model_run(name, config.stop_acc_target if name == "target" else draft_stop_accuracy(config, log))
    key = (tuple(i.label for i in mixes[name]), tuple(i.weight for i in mixes[name]), rc.arch.max_len)
    if key not in datasets:
        datasets[key] = build_dataset(sp, problems_for(mixes[name], "train", config.train_problems), rc.arch.max_len)
    data = datasets[key]
    print(f"[{name}] {data.n} training examples ({data.skipped} skipped) in {time.time() - t0:.0f} s", flush=True)
    data_s = time.time() - t0

    def save_run_log(run: RunLog):
        log.state["runs"][name] = {**asdict(run), "data_s": data_s}
        log.save()

    train_one(rc, data, sp, dev, config.out, config.out / "tokenizer.model", save_run_log, torch)


def pair_summary(log: RecipeLog) -> None:
    """The pair on the same dev problems: each model's accuracy, their union, what only the draft
    solves, and the FLOPs ratio."""
    runs = log.state["runs"]
    if "target" not in runs or "draft" not in runs:
        return
    t_ok = runs["target"]["best"].get("dev_correct", "")
    d_ok = runs["draft"]["best"].get("dev_correct", "")
    if not t_ok or len(t_ok) != len(d_ok):
        return
    n = len(t_ok)
    pair = log.state["pair"] = {
        "dev_target": t_ok.count("1") / n, "dev_draft": d_ok.count("1") / n,
        "dev_union": sum(a == "1" or b == "1" for a, b in zip(t_ok, d_ok)) / n,
        "dev_draft_only": sum(a == "0" and b == "1" for a, b in zip(t_ok, d_ok)),
        "flops_ratio": runs["target"]["flops_per_token"] / runs["draft"]["flops_per_token"],
        "flops_ratio_ctx128": runs["target"]["flops_per_token_ctx128"] / runs["draft"]["flops_per_token_ctx128"],
    }
    log.save()
    print(f"[pair] dev target {pair['dev_target']:.1%} draft {pair['dev_draft']:.1%} "
          f"union {pair['dev_union']:.1%}; FLOPs ratio {pair['flops_ratio']:.1f}", flush=True)


def gguf_stage(config: DemoPairConfig, sp, log: RecipeLog) -> None:
    """Both checkpoints as GGUF of the type chosen by llama.cpp's own dev accuracy, and the
    pair's speed ratio in llama.cpp."""
    from cospec_local.tasks import load_task

    out = config.out
    names = [n for n in ("target", "draft") if (out / n / "model.safetensors").is_file()]
    check = load_task(config.dev_family, "dev", max(config.dev_problems, config.gguf_check_problems))
    g = log.state["gguf"] = write_ggufs(out, names, log.state["runs"], check, sp, config.threads, config.gguf_type,
                                       config.gguf_tolerance)
    if "target" in g and "draft" in g:
        tt = g["target"][g["target"]["chosen"]]["tokens_per_s"]
        dt = g["draft"][g["draft"]["chosen"]]["tokens_per_s"]
        log.state.setdefault("pair", {})["llama_cpp_speed_ratio"] = dt / tt if tt else None
    log.save()


def gguf_stage_in_fresh_process(config: DemoPairConfig, log: RecipeLog) -> None:
    """llama.cpp decoded 14x slower in the process that had just trained with torch (measured:
    573 vs 8063 tok/s for the draft), so after training the GGUF checks and speeds come from a
    fresh interpreter."""
    log.save()
    module = __spec__.name if __spec__ else "cospec_local.recipes.demo_pair"
    subprocess.run([sys.executable, "-m", module, *config_args(replace(config, stages="gguf"))], check=True)
    log.reload()


def main(argv: list[str] | None = None) -> None:
    config = parse_config(DemoPairConfig, argv, description=__doc__.split("\n\n")[0],
                          epilog=__doc__.split("\n\n", 1)[1])
    stages = config.stage_list()
    torch, transformers = start_torch(config.threads, config.seed)
    config.out.mkdir(parents=True, exist_ok=True)
    log = RecipeLog(config.out, sys.argv[1:] if argv is None else argv,
                    {"torch": torch.__version__, "transformers": transformers.__version__})

    from cospec_local.tasks import load_task

    mixes = {"target": parse_mix(config.target_mix), "draft": parse_mix(config.draft_mix)}
    tok_path = config.out / "tokenizer.model"
    if "tokenizer" in stages:
        tokenizer_stage(config, mixes, tok_path, log)
    sp = load_tokenizer(tok_path)
    dev = load_task(config.dev_family, "dev", config.dev_problems)
    datasets: dict = {}
    trained = [name for name in ("target", "draft") if name in stages]
    for name in trained:
        model_stage(config, name, mixes, datasets, sp, dev, log, torch)
    pair_summary(log)
    if "gguf" in stages:
        if trained:
            gguf_stage_in_fresh_process(config, log)
        else:
            gguf_stage(config, sp, log)
    log.finish()
    print(f"done in {(time.time() - log.started) / 60:.1f} min; log: {log.path}", flush=True)


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
