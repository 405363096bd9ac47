"""Does a classifier domain gate admit short-answer task families it never saw? Leave-one-family-out
over the general mix's short-answer families: for each family, a gate trained on the others (and
arithmetic) against general chat, as `fit_gate --general` trains a general arbiter's gate, then the
share of the left-out family's test questions it admits in each format, and of held-out chat and
long-form prompts (templates and topics no gate trained on). The draft reads each prompt once: no generation,
so machine load does not matter.

    python bench/gate_leave_family_out.py -m gemma3-270m --chat-template gemma --out bench/gate_leave_family_out/gemma3
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from results_report import command, report  # noqa: E402

from cospec_local import Engine  # noqa: E402
from cospec_local.train.fit_gate import (FORMAT_NAMES, embeddings, general_gate, general_negatives,  # noqa: E402
                                         held_out_quiet_prompts, in_each_format, task_questions)
from cospec_local.tasks import SHORT_ANSWER_FAMILIES  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", "--model", default="gemma3-270m", help="the target (its tokenizer and chat template)")
    ap.add_argument("-md", "--model-draft", default="smollm2-135m", help="the draft, whose hidden state the gate reads")
    ap.add_argument("--chat-template", default=None, help="a chat template instead of the target's own")
    ap.add_argument("--families", default="", help="left out one at a time (default: every short-answer family)")
    ap.add_argument("--test", type=int, default=40, help="test questions of the left-out family")
    ap.add_argument("--train", type=int, default=30, help="train questions of each other family (dev: a third)")
    ap.add_argument("--negatives", type=int, default=150, help="general chat prompts, and long-form ones, to refuse")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    names = [f for f in args.families.split(",") if f] or [f.name for f in SHORT_ANSWER_FAMILIES]
    started = time.time()
    rows = []
    with Engine(args.model, args.model_draft, n_ctx=512, n_threads=1, calibration=None,
                **({"chat_template": args.chat_template} if args.chat_template else {})) as engine:
        negatives = general_negatives(engine, args.negatives)
        cache = {}  # each family's questions, read once
        quiet = {kind: {fmt: embeddings(engine, toks) for fmt, toks in in_each_format(engine, prompts).items()}
                 for kind, prompts in held_out_quiet_prompts().items()}
        for left_out in names:
            positives = [f.name for f in SHORT_ANSWER_FAMILIES if f.name != left_out] + ["arith"]
            gate = general_gate(engine, positives, negatives, args.train, max(1, args.train // 3), cache=cache)
            questions = task_questions(left_out, "test", args.test)
            row = {"left_out": left_out, "threshold": gate.threshold,
                   "admitted": {fmt: sum(map(gate.admits, toks)) / len(toks)
                                for fmt, toks in in_each_format(engine, questions).items()
                                for toks in [embeddings(engine, toks)]}}
            row["quiet_admitted"] = {kind: {fmt: sum(map(gate.admits, toks)) / len(toks) for fmt, toks in by_fmt.items()}
                                     for kind, by_fmt in quiet.items()}
            rows.append(row)
            print(left_out, json.dumps(row["admitted"]), json.dumps(row["quiet_admitted"]), file=sys.stderr, flush=True)
    cmd = command("gate_leave_family_out.py", None)
    lines = [f"# A general arbiter's gate on short-answer families it never saw: {args.model}", "",
             f"`{' '.join(cmd)}`", "",
             f"Each row: an embedding gate on {args.model_draft}'s hidden state, trained without that family (the other short-answer families and arithmetic, "
             "against general chat and long-form writing), the share of the family's test questions it admits "
             "per format, and the most it admits in any format of held-out chat and long-form prompts (no gate "
             "saw their templates or topics).", "",
             "| left out | " + " | ".join(FORMAT_NAMES) + " | chat prompts | long-form |",
             "|---|" + "---|" * (len(FORMAT_NAMES) + 2)]
    for r in rows:
        q = r["quiet_admitted"]
        lines.append(f"| {r['left_out']} | " + " | ".join(f"{r['admitted'][f]:.0%}" for f in FORMAT_NAMES) +
                     f" | {max(q['chat'].values()):.0%} | {max(q['long-form'].values()):.0%} |")
    mean = {f: sum(r["admitted"][f] for r in rows) / len(rows) for f in FORMAT_NAMES}
    lines.append("| **mean** | " + " | ".join(f"{mean[f]:.0%}" for f in FORMAT_NAMES) + " | | |")
    # (no timings: the machine's load changes nothing here)
    report(lines, cmd, args.out, 0.0, seconds=round(time.time() - started, 1), model=args.model, draft=args.model_draft,
           chat_template=args.chat_template, rows=rows)

if __name__ == "__main__":
    main()
