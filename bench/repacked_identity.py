"""How often llama.cpp's repacked CPU kernels change greedy tokens: per prompt, target-only with
weight repacking off and on, and speculative decoding (fixed blocks of --draft-max) beside
target-only with repacking on; each first difference scored as a near tie or not (the target's
two tokens within half a logit in a teacher-forced pass, as the tests judge them).

    python bench/repacked_identity.py -m gemma3-270m -md smollm2-135m --chat-template gemma \\
        -n 64 -t 2 --out bench/repacked_identity/gemma3-smollm2

Prompts: bench/heldout_chat_prompts.txt through the target's chat template (or --chat-template).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_report import command, report  # noqa: E402

NEAR_TIE = 0.5  # logits: the tests' rule


def first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def near_tie(engine, prompt: list[int], reference: list[int], other: list[int], at: int) -> bool:
    row = engine.score(prompt + reference[:at])[-1]
    return bool(row.max() - row[other[at]] < NEAR_TIE and row.max() - row[reference[at]] < NEAR_TIE)


def main(argv=None) -> int:
    from cospec_local import Engine
    from cospec_local.evaluation.machine import OtherLoad
    from cospec_local.models import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-md", "--model-draft", default=None)
    ap.add_argument("--chat-template", default=None)
    ap.add_argument("--prompts", type=Path, default=REPO / "bench" / "heldout_chat_prompts.txt")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--draft-max", type=int, default=4)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    a = ap.parse_args(argv)
    questions = [q for q in a.prompts.read_text(encoding="utf-8").splitlines() if q.strip()][: a.limit]
    target, draft = resolve_model(a.model), resolve_model(a.model_draft) if a.model_draft else None
    options = dict(n_ctx=2048, n_threads=a.threads, chat_template=a.chat_template, calibration=None)
    spec = dict(spec_type="draft" if draft else "ngram", adaptive_draft=False, draft_max=a.draft_max)
    rows = []
    with OtherLoad() as load, Engine(target, draft, repack=False, **options) as plain_engine, \
            Engine(target, draft, repack=True, **options) as engine:
        repacked = engine.repacked_bytes["target"]
        for q in questions:
            prompt = engine.render_chat([{"role": "user", "content": q}])
            plain = plain_engine.generate(prompt, mode="target-only", max_tokens=a.n, ignore_eos=True).tokens
            packed = engine.generate(prompt, mode="target-only", max_tokens=a.n, ignore_eos=True).tokens
            drafted = engine.generate(prompt, max_tokens=a.n, ignore_eos=True, **spec).tokens
            row = {"prompt": q}
            for name, (ref, other, judge) in {"repacked_vs_plain": (plain, packed, plain_engine),
                                              "speculative_vs_target_only": (packed, drafted, engine)}.items():
                at = first_difference(ref, other)
                row[name] = {"at": at, "near_tie": None if at is None else near_tie(judge, prompt, ref, other, at)}
            rows.append(row)
            print(f"{len(rows):2d} repacked/plain {row['repacked_vs_plain']}  speculative/target-only "
                  f"{row['speculative_vs_target_only']}", flush=True)
    summary = {}
    for name in ("repacked_vs_plain", "speculative_vs_target_only"):
        differ = [r[name] for r in rows if r[name]["at"] is not None]
        summary[name] = {"identical": len(rows) - len(differ), "near_ties": sum(bool(d["near_tie"]) for d in differ),
                         "other": sum(not d["near_tie"] for d in differ)}
    cmd = command("repacked_identity.py", argv)
    lines = [f"# Greedy tokens under repacked kernels: {a.model}" + (f" <- {a.model_draft}" if draft else ""), "",
             f"`{' '.join(cmd)}`", "",
             f"{len(rows)} chat prompts, {a.n} tokens each (end ignored), {a.threads} threads; "
             f"{repacked / 2**20:.1f} MB of the target's weights repacked; speculative: fixed blocks of "
             f"{a.draft_max} from {spec['spec_type']}.", "",
             "| comparison | identical | first difference at a near tie | other differences |", "|---|---|---|---|"]
    lines += [f"| {name.replace('_', ' ')} | {s['identical']} of {len(rows)} | {s['near_ties']} | {s['other']} |"
              for name, s in summary.items()]
    report(lines, cmd, a.out, load.share, model=a.model, draft=a.model_draft, n=a.n, threads=a.threads,
           draft_max=a.draft_max, repacked_bytes=repacked, summary=summary, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
