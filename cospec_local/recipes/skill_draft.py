"""Teach a draft one skill the target lacks: a task's worked solutions, as a user's small
domain-tuned model has learned its domain.

    python -m cospec_local.recipes.skill_draft --out OUT --task arith [-md smollm2-135m-draft] [--steps 900]

Stages (each writing into OUT; `--stages` reruns some of them on what earlier ones wrote):
1. train: the draft (a GGUF, dequantized into torch) learns to answer the task's train-split
   prompts with their worked solutions (`Problem.solution`), each rendered as one exchange in
   the target's chat template (the prompt exactly as `eval --chat` and `arbiter train --chat`
   give it, the answer ended by the template's end of turn). Cross-entropy on answer tokens only.
   The embedding and output head stay frozen: they are the target's, byte for byte, and the
   GGUF takes them from the target. Teacher-forced token accuracy on dev-split solutions is
   scored along the way and the best blocks are kept.
2. gguf: `draft.gguf`, the whole draft (the target's metadata and embedding, the trained blocks
   in Q8_0), and `blocks.gguf`, the same without the embedding: what the repository ships for a
   named model, grafted onto the target's embedding on first use (gguf_edit.graft_embedding).

Measure the result with the runtime itself, e.g.
`cospec-local eval --task arith --split dev --chat -m TARGET -md OUT/draft.gguf --runs target-only,draft-only`.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..command_line import REQUIRED, option, parse_config
from ..train.device import resolve_device
from .distill_draft import PRECISIONS, block_optimizer, load_blocks, log_update, lr_at, resolve_precision, save_blocks

LOG = "skill_log.json"


def exchange_tokens(engine, prompt: str, answer: str) -> tuple[list[int], int]:
    """(tokens of prompt + answer + end of turn, prompt length): the prompt as the target's chat
    template renders a user message for generation, the answer as the template renders the
    assistant's reply after it, cut after its first end-of-generation token."""
    head = engine.render_chat([{"role": "user", "content": prompt}])
    whole = engine.render_chat([{"role": "user", "content": prompt}, {"role": "assistant", "content": answer}],
                               add_generation_prompt=False)
    if whole[:len(head)] != head:
        raise ValueError("the chat template renders a reply that does not start with the generation prompt")
    reply = whole[len(head):]
    end = next((i for i, t in enumerate(reply) if engine.is_eog(t)), None)
    if end is None:
        raise ValueError("the chat template ends an assistant reply with no end-of-generation token")
    return head + reply[:end + 1], len(head)


def build_rows(target_gguf: Path, task: str, split: str, n: int) -> list[dict]:
    from cospec_local import Engine
    from cospec_local.tasks import load_task

    problems = load_task(task, split, n)
    unsolved = [p.id for p in problems if not p.solution.strip()]
    if unsolved:
        raise SystemExit(f"{task}: {len(unsolved)} {split} problems have no worked solution to learn from "
                         f"(e.g. {unsolved[0]}); a task file needs a 'solution' field")
    if not problems:
        raise SystemExit(f"{task}: no {split} problems")
    with Engine(target_gguf, n_ctx=512, n_threads=1) as engine:
        rows = []
        for p in problems:
            tokens, prompt_len = exchange_tokens(engine, p.prompt, p.solution)
            rows.append({"tokens": np.asarray(tokens, dtype=np.int32), "prompt_len": prompt_len})
    return rows


def make_batch(rows, torch, device):
    """Right-padded inputs and (row, position) of every answer token's prediction, with its label."""
    width = max(len(r["tokens"]) for r in rows) - 1
    x = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(x)
    pos, labels = [], []
    for i, r in enumerate(rows):
        t = torch.from_numpy(r["tokens"].astype(np.int64))
        x[i, :len(t) - 1] = t[:-1]
        mask[i, :len(t) - 1] = 1
        p, n = r["prompt_len"], len(t) - r["prompt_len"]
        pos.append(torch.stack([torch.full((n,), i), torch.arange(p - 1, p - 1 + n)], 1))
        labels.append(t[p:])
    return x.to(device), mask.to(device), torch.cat(pos).to(device), torch.cat(labels).to(device)


def answer_logits(model, x, mask, pos):
    # The output head only where an answer token is predicted: it is most of the draft's cost.
    hidden = model.model(input_ids=x, attention_mask=mask).last_hidden_state
    return model.lm_head(hidden[pos[:, 0], pos[:, 1]]).float()


def token_accuracy(model, rows, torch, batch: int = 32) -> float:
    model.eval()
    hit = total = 0
    with torch.no_grad():
        for b in range(0, len(rows), batch):
            x, mask, pos, labels = make_batch(rows[b:b + batch], torch, model.device)
            hit += int((answer_logits(model, x, mask, pos).argmax(-1) == labels).sum())
            total += len(labels)
    model.train()
    return hit / total


def train(draft_gguf: Path, train_rows, dev_rows, out: Path, steps: int, lr: float, batch: int, seed: int,
          precision: str, device, init: Path | None = None) -> dict:
    import torch

    from cospec_local.formats.gguf_llama_reader import load_llama_gguf

    model = load_llama_gguf(draft_gguf).to(device)
    if init is not None:
        load_blocks(model, init, draft_gguf.name)
    params, opt = block_optimizer(model, lr)
    rng = np.random.default_rng(seed)
    warmup = max(1, steps // 20)
    start = token_accuracy(model, dev_rows, torch)
    print(f"[train] {len(train_rows)} solutions, {len(dev_rows)} dev; {steps} steps; "
          f"dev token accuracy {start:.1%} at the start", flush=True)
    curve, best = [{"step": 0, "dev_token_accuracy": start}], start
    best_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    eval_every, order, t0 = max(1, steps // 10), [], time.time()
    for step in range(steps):
        if len(order) < batch:
            order = list(rng.permutation(len(train_rows)))
        chunk = [train_rows[order.pop()] for _ in range(batch)]
        for g in opt.param_groups:
            g["lr"] = lr_at(lr, step, steps, warmup)
        x, mask, pos, labels = make_batch(chunk, torch, model.device)
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = answer_logits(model, x, mask, pos)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            acc = token_accuracy(model, dev_rows, torch)
            curve.append({"step": step + 1, "wall_s": round(time.time() - t0, 1), "loss": loss.item(),
                          "dev_token_accuracy": acc})
            print(f"[train] step {step + 1}/{steps} {time.time() - t0:.0f} s loss {loss.item():.3f} "
                  f"dev token accuracy {acc:.1%}", flush=True)
            if acc > best:
                best, best_state = acc, {k: v.detach().clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    save_blocks(model, out / "draft_blocks.pt")
    return {"steps": steps, "batch": batch, "lr": lr, "precision": precision, "device": model.device.type,
            "init": str(init) if init else None, "solutions": len(train_rows), "dev_solutions": len(dev_rows),
            "initial_dev_token_accuracy": start, "best_dev_token_accuracy": best, "curve": curve,
            "wall_s": round(time.time() - t0, 1), "layers": model.config.num_hidden_layers}


@dataclass
class SkillDraftConfig:
    """A draft taught one skill from a task's worked solutions (skill_draft.py's command line)."""

    out: Path = option(REQUIRED, "Folder of the run: draft_blocks.pt, draft.gguf, blocks.gguf, skill_log.json.")
    task: str = option("arith", "A task family or a jsonl file with worked solutions ({prompt, answer, solution}).")
    target: str = option("smollm2-135m", "The target (named model or GGUF): its chat template, embedding and "
                                         "metadata.", ("-m", "--model"))
    draft: str = option("smollm2-135m-draft", "The draft to start from (named model or GGUF).",
                        ("-md", "--model-draft"))
    init: Path | None = option(None, "Go on from this draft_blocks.pt (an earlier run's) instead of the draft's own "
                                     "blocks.")
    stages: str = option("train,gguf", "Which stages to run, comma-separated.")
    train_problems: int = option(20000, "Training problems (exchanges).")
    dev_problems: int = option(200, "Dev problems.")
    steps: int = option(900, "Optimizer steps.")
    lr: float = option(5e-4, "Learning rate.")
    batch: int = option(32, "Exchanges per step.")
    seed: int = option(0, "Seed of initialisation and data order.")
    threads: int = option(2, "torch threads.")
    precision: str = option("auto", "auto (bf16 autocast where the CPU or CUDA device multiplies bf16 natively), "
                                    "bf16 or float32.")
    device: str = option("auto", "auto (CUDA where torch sees one, else the CPU), cpu or cuda[:N].")


def main(argv: list[str] | None = None) -> None:
    from cospec_local.formats.gguf_edit import strip_embedding
    from cospec_local.models import resolve_model

    from .distill_draft import write_draft_gguf

    args = parse_config(SkillDraftConfig, argv, __doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1])
    if args.precision not in PRECISIONS:
        sys.exit(f"--precision must be one of {', '.join(PRECISIONS)}")

    import torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    device = resolve_device(args.device)
    precision = resolve_precision(args.precision, device)
    target, draft = resolve_model(args.target), resolve_model(args.draft)
    args.out.mkdir(parents=True, exist_ok=True)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    log_update(args.out, LOG, args=asdict(args) | {"out": str(args.out), "init": str(args.init) if args.init else None, "target_file": str(target), "draft_file": str(draft),
                                          "precision_used": precision, "device_used": str(device)})
    if "train" in stages:
        t0 = time.time()
        train_rows = build_rows(target, args.task, "train", args.train_problems)
        dev_rows = build_rows(target, args.task, "dev", args.dev_problems)
        print(f"[data] {len(train_rows)} + {len(dev_rows)} exchanges in {time.time() - t0:.0f} s, "
              f"{np.mean([len(r['tokens']) for r in train_rows]):.0f} tokens each on average", flush=True)
        log_update(args.out, LOG, train=train(draft, train_rows, dev_rows, args.out, args.steps, args.lr, args.batch,
                                         args.seed, precision, device, args.init))
    if "gguf" in stages:
        layers = json.loads((args.out / LOG).read_text())["train"]["layers"]
        whole = write_draft_gguf(target, args.out, layers, args.out / "draft.gguf",
                                 name=f"{args.task} draft ({layers} blocks)")
        blocks = strip_embedding(whole, args.out / "blocks.gguf")
        log_update(args.out, LOG, gguf={"draft": whole.name, "draft_bytes": whole.stat().st_size,
                                   "blocks": blocks.name, "blocks_bytes": blocks.stat().st_size})
        print(f"[gguf] {whole} ({whole.stat().st_size / 2**20:.1f} MiB), {blocks} "
              f"({blocks.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
