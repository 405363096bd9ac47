"""Does a learned arbiter stay quiet on general chat? Greedy replies to held-out chat prompts,
target-only against speculative decoding with the arbiter, through the target's chat template:
the share of replies that are token for token the same, and where they differ, how many draft
tokens the arbiter kept and whether its domain gate had admitted the prompt. Plain speculative
decoding (the target as arbiter) runs beside them: where the arbiter keeps nothing, the replies
that differ from target-only differ because the target's batched verification rounds otherwise
than its one-token steps (docs/lossless-output.md), and SpS's share says how many that is.

    python bench/chat_identity.py -m smollm2-135m -md smollm2-135m-arith-draft --arbiter smollm2-arith \\
        --prompts 100 -n 128 -t 2 --out OUT.json

A draft of another family reads each prompt in its own format (its GGUF's template, or
--chat-template-draft-file); --chat-template-file gives the target another (Gemma 3 270M, a base
model: cospec_local/data/gemma3-smollm2/qa.jinja).

Prompts: bench/heldout_chat_prompts.txt, then the distillation prompts' "heldout" split
(templates and topics no SmolLM2 draft was distilled on), up to --prompts. Only tokens are
compared (no timing), so machine load does not matter.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from cospec_local import Engine
from cospec_local.params import GenerationParams
from cospec_local.recipes.distill_prompts import build_prompts

PROMPTS_FILE = Path(__file__).with_name("heldout_chat_prompts.txt")


def chat_prompts(n: int) -> list[str]:
    own = [line.strip() for line in PROMPTS_FILE.read_text(encoding="utf-8").splitlines() if line.strip()]
    return (own + [p for p in build_prompts("heldout", max(n, 1), 0) if p not in own])[:n]


def compare(engine: Engine, prompts: list[str], arbiter: str, max_tokens: int) -> dict:
    params = GenerationParams(temperature=0.0, max_tokens=max_tokens, repeat_penalty=1.0)
    rows = []
    for prompt in prompts:
        messages = [{"role": "user", "content": prompt}]
        tokens = engine.render_chat(messages)
        engine.reset()
        target = engine.generate(tokens, params, mode="target-only")
        engine.reset()
        cospec = engine.generate(tokens, params, mode="speculative", arbiter=arbiter,
                                 draft_prompt=engine.render_draft_chat(messages))
        engine.reset()
        sps = engine.generate(tokens, params, mode="speculative", arbiter="target",
                              draft_prompt=engine.render_draft_chat(messages))
        rows.append({"prompt": prompt, "identical": list(target.tokens) == list(cospec.tokens),
                     "sps_identical": list(target.tokens) == list(sps.tokens),
                     "same_as_sps": list(sps.tokens) == list(cospec.tokens),
                     "kept": cospec.stats.arbiter_keeps,
                     "abstained": cospec.stats.arbiter_abstained, "target_tokens": len(target.tokens)})
    same = sum(r["identical"] for r in rows)
    return {"prompts": len(rows), "identical": same, "identical_share": same / len(rows) if rows else 0.0,
            "sps_identical": sum(r["sps_identical"] for r in rows), "same_as_sps": sum(r["same_as_sps"] for r in rows),
            "abstained": sum(r["abstained"] for r in rows), "kept_tokens": sum(r["kept"] for r in rows),
            "differing": [r for r in rows if not r["identical"]], "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True, help="target (named model or GGUF)")
    ap.add_argument("-md", "--model-draft", required=True, help="the draft the arbiter was made for")
    ap.add_argument("--arbiter", required=True, help="learned arbiter (named, installed or a folder)")
    ap.add_argument("--prompts", type=int, default=100)
    ap.add_argument("-n", "--max-tokens", type=int, default=128)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--chat-template-file", type=Path, default=None, help="the target's chat template instead of its own")
    ap.add_argument("--chat-template-draft-file", type=Path, default=None,
                    help="a draft of another family: its chat template instead of its own")
    ap.add_argument("--out", type=Path, default=None, help="JSON file for the result, every prompt included")
    args = ap.parse_args(argv)
    templates = {key: path.read_text(encoding="utf-8") if path else None for key, path in
                 (("chat_template", args.chat_template_file), ("draft_chat_template", args.chat_template_draft_file))}
    with Engine(args.model, args.model_draft, n_ctx=1024, n_threads=args.threads, **templates) as engine:
        result = compare(engine, chat_prompts(args.prompts), args.arbiter, args.max_tokens)
    result["command"] = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print(f"{result['identical']}/{result['prompts']} replies identical to target-only "
          f"({100 * result['identical_share']:.1f}%); gate abstained on {result['abstained']}; "
          f"{result['kept_tokens']} draft tokens kept in all; SpS: {result['sps_identical']}/{result['prompts']} identical "
          f"to target-only, {result['same_as_sps']} the same as the arbiter's")
    for r in result["differing"]:
        print(f"  differs: {r['prompt'][:70]!r} (kept {r['kept']}, abstained {r['abstained']})")


if __name__ == "__main__":
    main()
