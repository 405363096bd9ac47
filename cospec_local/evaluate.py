"""`cospec-local eval`: task accuracy and speed of each decoding mode on the
same problems, with the metrics of collaborative decoding: the oracle union of
target and draft, the non-nested successes (only the draft solves them), the
share of those each mode recovers, and what each mode loses against the target.

Every (problem, mode) record is appended to OUT/records.jsonl as it completes,
so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from .engine import Engine
from .tasks import Problem

REFERENCE = "target-only"
DRAFT = "draft-only"
# Where a plain (non-chat) completion of each family ends: answers end with a
# "#### N" line, code with the function (HumanEval's own stop sequences).
FAMILY_STOPS = {
    "arith": ["\n\n"], "listops": ["\n\n"], "gsm8k": ["\n\n"],
    "pyfunc": ["\ndef ", "\nclass ", "\nif __name__", "\nprint("],
    "humaneval": ["\ndef ", "\nclass ", "\nif __name__", "\nprint("],
    "mbpp": ["[DONE]"],
}


def model_identity(path: str) -> dict:
    """File name, size and a hash of 16 evenly spaced 64 KiB samples. A resumed run compares it, so
    a model retrained into the same path never mixes with the old one's records; sampling keeps
    this instant for a 20 GB target, and the name (not the path) keeps result folders portable."""
    size = os.path.getsize(path)
    h = hashlib.sha256(str(size).encode())
    chunk = 1 << 16
    with open(path, "rb") as f:
        for i in range(16):
            f.seek(max(0, (size - chunk) * i // 15))
            h.update(f.read(chunk))
    return {"file": os.path.basename(path), "bytes": size, "sample_sha256": h.hexdigest()[:16]}


@dataclass
class Record:
    problem_id: str
    mode: str
    correct: bool
    completion: str
    tokens: int
    ms: float
    drafted: int
    accepted: int
    kept: int
    blocks: int


def run_problem(engine: Engine, problem: Problem, mode: str, score: Callable[[Problem, str], bool], max_tokens: int,
                draft_max: int, adaptive_draft: bool, as_chat: bool) -> Record:
    prompt = engine.render_chat([{"role": "user", "content": problem.prompt}]) if as_chat else problem.prompt
    stop = None if as_chat else FAMILY_STOPS.get(problem.family)
    r = engine.generate(prompt, mode=mode, max_tokens=max_tokens, draft_max=draft_max, adaptive_draft=adaptive_draft,
                        stop=stop)
    s = r.stats
    return Record(problem.id, mode, bool(score(problem, r.text)), r.text, s.n_generated, s.t_generate_ms,
                  s.n_drafted, s.n_accepted + s.n_kept, s.n_kept, s.n_blocks)


def load_records(path: Path) -> dict[tuple[str, str], Record]:
    done = {}
    if path.is_file():
        with path.open(encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = Record(**json.loads(line))
                    done[rec.problem_id, rec.mode] = rec
    return done


def summarize(problems: Sequence[Problem], modes: Sequence[str], records: dict[tuple[str, str], Record]) -> dict:
    ids = [p.id for p in problems]
    correct = {m: {i for i in ids if (i, m) in records and records[i, m].correct} for m in modes}
    summary: dict = {"problems": len(ids), "modes": {}}
    base_tps = None
    per_mode = defaultdict(dict)
    for m in modes:
        recs = [records[i, m] for i in ids if (i, m) in records]
        tokens = sum(r.tokens for r in recs)
        ms = sum(r.ms for r in recs)
        drafted = sum(r.drafted for r in recs)
        accepted = sum(r.accepted for r in recs)
        blocks = sum(r.blocks for r in recs)
        tps = 1000.0 * tokens / ms if ms else 0.0
        if m == REFERENCE:
            base_tps = tps
        per_mode[m] = {
            "n": len(recs),
            "accuracy": len(correct[m]) / len(recs) if recs else 0.0,
            "predicted_per_second": tps,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_per_block": accepted / blocks if blocks else None,
            "arbiter_keeps": sum(r.kept for r in recs),
            "tokens": tokens,
        }
    for m in modes:
        per_mode[m]["speedup"] = per_mode[m]["predicted_per_second"] / base_tps if base_tps else None
    if REFERENCE in modes and DRAFT in modes:
        target_ok, draft_ok = correct[REFERENCE], correct[DRAFT]
        non_nested = draft_ok - target_ok
        summary["oracle_union"] = len(target_ok | draft_ok) / len(ids) if ids else 0.0
        summary["non_nested"] = len(non_nested)
        for m in modes:
            per_mode[m]["recovered"] = len(correct[m] & non_nested)
            per_mode[m]["recovered_share"] = len(correct[m] & non_nested) / len(non_nested) if non_nested else None
            per_mode[m]["losses"] = len(target_ok - correct[m])
    summary["modes"] = dict(per_mode)
    return summary


def markdown(summary: dict, title: str) -> str:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    lines = [f"## {title}", "", f"{summary['problems']} problems"]
    if "oracle_union" in summary:
        lines.append(f"oracle union (target or draft): {summary['oracle_union']:.1%}, "
                     f"non-nested successes (draft only): {summary['non_nested']}")
    lines += ["", "| mode | accuracy | tok/s | speed-up | acceptance | accepted/block | arbiter keeps | recovered | losses |",
              "|---|---|---|---|---|---|---|---|---|"]
    for mode, m in summary["modes"].items():
        rec = "-" if m.get("recovered") is None else f"{m['recovered']}/{summary.get('non_nested', 0)}"
        lines.append(f"| {mode} | {m['accuracy']:.1%} | {m['predicted_per_second']:.1f} | {fmt(m['speedup'], '.2f')}x "
                     f"| {fmt(m['acceptance_rate'], '.1%')} | {fmt(m['mean_accepted_per_block'], '.2f')} "
                     f"| {m['arbiter_keeps']} | {rec} | {m.get('losses', '-')} |")
    return "\n".join(lines)


def plot(summary: dict, path: Path, title: str) -> Path | None:
    """Accuracy against speed-up, one point per mode."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(5, 4), dpi=120)
    for mode, m in summary["modes"].items():
        if m["speedup"] is None:
            continue
        ax.scatter(m["speedup"], 100 * m["accuracy"], s=40)
        ax.annotate(mode, (m["speedup"], 100 * m["accuracy"]), textcoords="offset points", xytext=(5, 5))
    if "oracle_union" in summary:
        ax.axhline(100 * summary["oracle_union"], linestyle="--", linewidth=1, color="gray")
        ax.annotate("oracle union", (ax.get_xlim()[0], 100 * summary["oracle_union"]), textcoords="offset points",
                    xytext=(2, 3), color="gray", fontsize=8)
    ax.set_xlabel("speed-up over target-only")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def evaluate(engine: Engine, problems: Sequence[Problem], modes: Sequence[str], score: Callable[[Problem, str], bool],
             out_dir: Path | None = None, max_tokens: int = 256, draft_max: int = 8, adaptive_draft: bool = True,
             as_chat: bool = False, title: str = "eval",
             progress: Callable[[Iterable], Iterable] | None = None) -> dict:
    records: dict[tuple[str, str], Record] = {}
    log = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        config = {"title": title, "target": model_identity(engine.target_path),
                  "draft": model_identity(engine.draft_path) if engine.draft_path else None, "modes": list(modes),
                  "max_tokens": max_tokens, "draft_max": draft_max, "adaptive_draft": adaptive_draft,
                  "chat": as_chat, "problems": [p.id for p in problems]}
        config_path = out_dir / "config.json"
        if config_path.is_file() and json.loads(config_path.read_text()) != config:
            raise ValueError(f"{out_dir} holds a run with other settings; use another --out or delete it")
        config_path.write_text(json.dumps(config, indent=1))
        records = load_records(out_dir / "records.jsonl")
        log = (out_dir / "records.jsonl").open("a", encoding="utf-8")
    todo = [(p, m) for p in problems for m in modes if (p.id, m) not in records]
    try:
        for problem, mode in (progress(todo) if progress else todo):
            rec = run_problem(engine, problem, mode, score, max_tokens, draft_max, adaptive_draft, as_chat)
            records[problem.id, mode] = rec
            if log:
                log.write(json.dumps(asdict(rec)) + "\n")
                log.flush()
    finally:
        if log:
            log.close()
    summary = summarize(problems, modes, records)
    summary["title"] = title
    if out_dir is not None:
        (out_dir / "results.json").write_text(json.dumps(summary, indent=1))
        (out_dir / "results.md").write_text(markdown(summary, title) + "\n")
        plot(summary, out_dir / "accuracy_vs_speedup.png", title)
    return summary
