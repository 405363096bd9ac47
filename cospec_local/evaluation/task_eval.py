"""`cospec-local eval`: task accuracy and speed of each run (a decoding mode and,
for speculative decoding, an arbiter; see evaluation/runs.py) on the same problems, with the metrics of collaborative decoding: the oracle union of
target and draft, the non-nested successes (only the draft solves them), the
share of those each run recovers, and what each run loses against the target.

Every (problem, run) record is appended to OUT/records.jsonl as it completes,
so an interrupted run resumes where it stopped.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from collections import defaultdict
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Sequence

from ..jsonl import keep_complete_lines, write_atomic
from .machine import OtherLoad, busy_note, machine_identity, other_share
from ..arbiter.file_format import TRAINED_UNDER
from ..arbiter.catalog import arbiter_identity
from ..arbiter.evaluations import BASELINE_RUNS, verdict
from ..engine import Engine
from ..params import GenerationParams
from .runs import Run
from ..tasks import FAMILY_STOPS, Problem

REFERENCE = "target-only"
DRAFT = "draft-only"


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
    run: str  # the run's label (evaluation/runs.py)
    correct: bool
    completion: str
    tokens: int
    ms: float
    drafted: int
    accepted: int
    kept: int
    blocks: int
    arbiter_ms: float = 0.0
    # Other work on this process's CPUs during the generation, and those CPUs' time then (evaluation/machine.py):
    # summed over records, how busy the machine was, also across a resumed run.
    other_cpu_ms: float | None = None
    cpu_ms: float | None = None


def task_prompt(engine: Engine, problem: Problem, as_chat: bool) -> tuple[list[int], tuple[str, ...]]:
    """A problem's prompt tokens and stop strings: the raw prompt, ended at its family's stops, or
    the prompt as the user's message in the target's chat template, ended by the template's end
    of turn (the same everywhere a problem is generated: eval, collection, training)."""
    if as_chat or in_chat_format(problem):
        return engine.render_chat([{"role": "user", "content": problem.prompt}]), ()
    return engine.tokenize(problem.prompt), tuple(FAMILY_STOPS.get(problem.family, ()))


def in_chat_format(problem: Problem) -> bool:
    """A problem drawn to be asked through the chat template (the short-answer families' formats)."""
    return problem.meta.get("format") == "chat"


def task_draft_prompt(engine: Engine, problem: Problem, as_chat: bool) -> list[int] | None:
    """What a draft of another vocabulary reads for a problem: the user's message in its own chat
    format (None: the prompt's text, as for a raw prompt or a draft that has no format of its own)."""
    if as_chat or in_chat_format(problem):
        return engine.render_draft_chat([{"role": "user", "content": problem.prompt}])
    return None


def run_problem(engine: Engine, problem: Problem, run: Run, params: GenerationParams,
                score: Callable[[Problem, str], bool], as_chat: bool) -> Record:
    """One problem with one run, from a clean cache: the record is a function of the problem and
    the settings alone, whatever ran before (a resumed eval gives the same records). The rest of
    the machine is watched during the generation only: the sandboxed scoring after it runs in
    processes this one's counters do not see."""
    prompt, stop = task_prompt(engine, problem, as_chat)
    draft_prompt = task_draft_prompt(engine, problem, as_chat)
    engine.reset()
    with OtherLoad() as watch:
        r = engine.generate(prompt, params, stop=stop, draft_prompt=draft_prompt, **run.overrides())
    s = r.stats
    load = watch.totals()
    return Record(problem.id, run.label, bool(score(problem, r.text)), r.text, s.predicted_n, s.predicted_ms,
                  s.draft_n, s.draft_n_accepted, s.arbiter_keeps, s.blocks, s.arbiter_ms,
                  round(1000 * load["other_s"], 3), round(1000 * load["cpu_s"], 3))


def rotated(runs: Sequence[Run], shift: int) -> list[Run]:
    """The runs in their order, starting at index shift (mod their number): who runs first after
    another problem's runs rotates, so that no run always pays for coming first."""
    runs = list(runs)
    return runs[shift % len(runs):] + runs[:shift % len(runs)] if runs else []


def load_records(path: Path) -> dict[tuple[str, str], Record]:
    """The records of an earlier (perhaps killed) run; the log is cut back to its whole lines, so
    that records appended next start on a line of their own."""
    done = {}
    for line in keep_complete_lines(path):
        rec = Record(**json.loads(line))
        done[rec.problem_id, rec.run] = rec
    return done


def wilson_interval(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion: honest at small n and near 0 or 1, where the
    normal approximation is not."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    # The bounds hold p itself (rounding can leave 0/n's lower bound a hair above 0).
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def summarize(problems: Sequence[Problem], labels: Sequence[str], records: dict[tuple[str, str], Record]) -> dict:
    ids = [p.id for p in problems]
    correct = {m: {i for i in ids if (i, m) in records and records[i, m].correct} for m in labels}
    summary: dict = {"problems": len(ids), "runs": {}}
    base_tps = None
    per_run = defaultdict(dict)
    for m in labels:
        recs = [records[i, m] for i in ids if (i, m) in records]
        tokens = sum(r.tokens for r in recs)
        ms = sum(r.ms for r in recs)
        drafted = sum(r.drafted for r in recs)
        accepted = sum(r.accepted for r in recs)
        blocks = sum(r.blocks for r in recs)
        tps = 1000.0 * tokens / ms if ms else 0.0
        if m == REFERENCE:
            base_tps = tps
        per_run[m] = {
            "n": len(recs),
            "accuracy": len(correct[m]) / len(recs) if recs else 0.0,
            "accuracy_ci95": wilson_interval(len(correct[m]), len(recs)),
            "predicted_per_second": tps,
            "acceptance_rate": accepted / drafted if drafted else None,
            "mean_accepted_per_block": accepted / blocks if blocks else None,
            "arbiter_keeps": sum(r.kept for r in recs),
            "arbiter_share": sum(r.arbiter_ms for r in recs) / ms if ms else 0.0,
            "tokens": tokens,
        }
    for m in labels:
        per_run[m]["speedup"] = per_run[m]["predicted_per_second"] / base_tps if base_tps else None
    if REFERENCE in labels and DRAFT in labels:
        target_ok, draft_ok = correct[REFERENCE], correct[DRAFT]
        non_nested = draft_ok - target_ok
        summary["oracle_union"] = len(target_ok | draft_ok) / len(ids) if ids else 0.0
        summary["non_nested"] = len(non_nested)
        for m in labels:
            per_run[m]["recovered"] = len(correct[m] & non_nested)
            per_run[m]["recovered_share"] = len(correct[m] & non_nested) / len(non_nested) if non_nested else None
            per_run[m]["losses"] = len(target_ok - correct[m])
    summary["runs"] = dict(per_run)
    watched = [r for m in labels for i in ids if (r := records.get((i, m))) is not None and r.cpu_ms]
    summary["other_load"] = other_share(sum(r.other_cpu_ms for r in watched), sum(r.cpu_ms for r in watched))
    return summary


def markdown(summary: dict, title: str) -> str:
    def fmt(v, spec):
        return "-" if v is None else format(v, spec)

    lines = [f"## {title}", "", f"{summary['problems']} problems"]
    if "oracle_union" in summary:
        lines.append(f"oracle union (target or draft): {summary['oracle_union']:.1%}, "
                     f"non-nested successes (draft only): {summary['non_nested']}")
    lines += ["", "| run | accuracy (95% CI) | tok/s | speed-up over target-only | acceptance | accepted/block | arbiter keeps | arbiter time "
                  "| recovered | losses |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for label, m in summary["runs"].items():
        rec = "-" if m.get("recovered") is None else f"{m['recovered']}/{summary.get('non_nested', 0)}"
        lo, hi = m["accuracy_ci95"]
        lines.append(f"| {label} | {m['accuracy']:.1%} ({lo:.1%}-{hi:.1%}) | {m['predicted_per_second']:.1f} | {fmt(m['speedup'], '.2f')}x "
                     f"| {fmt(m['acceptance_rate'], '.1%')} | {fmt(m['mean_accepted_per_block'], '.2f')} "
                     f"| {m['arbiter_keeps']} | {m.get('arbiter_share', 0.0):.1%} | {rec} | {m.get('losses', '-')} |")
    verdicts = [f"- {label}: {said.text}" for label, m in summary["runs"].items()
                if label not in BASELINE_RUNS and m.get("arbiter_keeps") is not None
                and (said := verdict(summary["runs"], label)) is not None]
    if verdicts:
        lines += ["", "Verdict (speed-ups against target-only, from these runs' own numbers and intervals):", *verdicts]
    if (note := busy_note(summary.get("other_load"))) is not None:
        lines += ["", f"**Warning**: {note} (accuracy is unaffected)."]
    if len(summary.get("machines") or []) > 1:
        machines = "; ".join(map(str, summary["machines"]))
        lines += ["", f"**Warning**: records from {len(summary['machines'])} machines ({machines}): the speed ratios "
                      f"mix their timings, and greedy tokens can differ between CPUs."]
    return "\n".join(lines)


def plot(summary: dict, path: Path, title: str) -> Path | None:
    """Accuracy (with 95% Wilson intervals) against speed-up, one marker per run, named in a
    legend so labels never overprint; the y-axis starts at 0 and a line marks 1.0x."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.8), dpi=120)
    markers = "osD^vP*Xh<>"
    for i, (label, m) in enumerate(summary["runs"].items()):
        if m["speedup"] is None:
            continue
        acc = 100 * m["accuracy"]
        lo, hi = (100 * v for v in m["accuracy_ci95"])
        ax.errorbar(m["speedup"], acc, yerr=[[acc - lo], [hi - acc]], fmt=markers[i % len(markers)], markersize=6,
                    capsize=3, label=f"{label}: {acc:.1f}% [{lo:.1f}, {hi:.1f}], {m['speedup']:.2f}x (n={m['n']})")
    ax.axvline(1.0, linestyle=":", linewidth=1, color="black")
    if "oracle_union" in summary:
        ax.axhline(100 * summary["oracle_union"], linestyle="--", linewidth=1, color="gray",
                   label=f"oracle union (target or draft): {100 * summary['oracle_union']:.1f}%")
    ax.set_ylim(0, 100)
    left, right = ax.get_xlim()
    ax.set_xlim(min(left, 0.9), max(right, 1.1))
    ax.set_xlabel("speed-up over target-only (dotted: 1.0x)")
    ax.set_ylabel("accuracy (%), 95% Wilson interval")
    models = summary.get("models")
    subtitle = f"{summary['problems']} problems" + (f"; target {models['target']}, draft {models['draft'] or '-'}"
                                                    if models else "")
    ax.set_title(f"{title}\n{subtitle}", fontsize=9)
    ax.legend(loc="lower left", fontsize=7, framealpha=0.9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def run_config(engine: Engine, runs: Sequence[Run], params: GenerationParams) -> dict:
    """Everything that decides a run's records: models, mode, arbiter identity and settings."""
    settings = {k: v for k, v in asdict(params).items() if k not in ("mode", "arbiter", "stop")}

    def arbiter_of(run: Run) -> dict | None:
        if run.arbiter is None:
            return None
        identity = arbiter_identity(run.arbiter, params.arbiter_threshold)
        if identity["kind"] == "learned":  # a LoRA arbiter's adapter folded or applied at decode: other rounding
            loaded = engine.arbiter_for(params.updated(arbiter=run.arbiter))
            if (use := loaded.meta("adapter_use")) is not None:
                identity["adapter_use"] = use
            # What it was trained under: a run under other settings (--draft-max) shows beside them.
            trained = {key: loaded.meta(key) for key in TRAINED_UNDER + ("verify_cost",) if loaded.meta(key) is not None}
            if trained:
                identity["trained_under"] = trained
        return identity

    return {r.label: {"mode": r.mode, "arbiter": arbiter_of(r), **({"spec_type": r.spec_type} if r.spec_type else {})}
            for r in runs} | {"settings": settings}


_CONFIG_WORDS = {"title": "task or split", "target": "target model", "draft": "draft model",
                 "chat": "chat setting", "problems": "problems (task, split or --limit)"}


def _flag(setting: str) -> str:
    """The command-line flag of a generation setting (max_tokens: -n/--n-predict), as --help names it."""
    from ..params import param_flags

    return "/".join(param_flags(setting)) or f"--{setting.replace('_', '-')}"


def merged_config(saved: dict, new: dict, out_dir: Path) -> dict:
    """An evaluation folder takes more runs of the same evaluation (models, problems and settings):
    the config then lists the earlier runs and the new ones. Anything else that differs is named."""
    differ = [_CONFIG_WORDS.get(key, key) for key in new
              if key not in ("runs", "machines") and saved.get(key) != new[key]]
    old_runs, new_runs = saved.get("runs", {}), new["runs"]
    # A setting added since the folder was written is compared as its default: the folder ran under it.
    defaults = {f.name: f.default for f in fields(GenerationParams) if f.default is not MISSING}
    old_settings = {**{key: defaults[key] for key in new_runs["settings"] if key in defaults},
                    **old_runs.get("settings", {})}
    new_settings = new_runs["settings"]
    differ += [f"{_flag(key)} ({old_settings.get(key)!r} there, {new_settings.get(key)!r} here)"
               for key in sorted(set(old_settings) | set(new_settings)) if old_settings.get(key) != new_settings.get(key)]
    differ += [f"run {label} (another arbiter or mode)" for label in new_runs
               if label != "settings" and label in old_runs and old_runs[label] != new_runs[label]]
    if differ:
        raise ValueError(f"{out_dir} holds an evaluation with other settings: {', '.join(differ)}; use another "
                         f"--out, or delete it")
    runs = {label: run for label, run in old_runs.items() if label != "settings"}
    runs.update({label: run for label, run in new_runs.items() if label != "settings"})
    return {**new, "runs": {**runs, "settings": new_settings}, "machines": saved.get("machines", [])}


def evaluate(engine: Engine, problems: Sequence[Problem], runs: Sequence[Run], score: Callable[[Problem, str], bool],
             out_dir: Path | None = None, params: GenerationParams | None = None, as_chat: bool = False,
             title: str = "eval", progress: Callable[[Iterable], Iterable] | None = None) -> dict:
    params = params or GenerationParams(max_tokens=256)
    labels = [r.label for r in runs]
    for run in runs:  # an arbiter that cannot run here (e.g. made for another draft) fails before any record
        if run.arbiter is not None:
            engine.arbiter_for(params.updated(arbiter=run.arbiter))
    records: dict[tuple[str, str], Record] = {}
    log = None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        config = {"title": title, "target": model_identity(engine.target_path),
                  "draft": model_identity(engine.draft_path) if engine.draft_path else None,
                  **({"head": model_identity(engine.head_path)} if engine.head_path else {}),
                  "runs": run_config(engine, runs, params), "chat": as_chat, "problems": [p.id for p in problems],
                  "machines": []}
        config_path = out_dir / "config.json"
        if config_path.is_file():
            config = merged_config(json.loads(config_path.read_text()), config, out_dir)
            labels = [label for label in config["runs"] if label != "settings"]  # earlier runs stay in the results
        records = load_records(out_dir / "records.jsonl")
    # Each problem runs every run back to back, in an order that rotates with the problem.
    todo = [(p, r) for i, p in enumerate(problems) for r in rotated(runs, i) if (p.id, r.label) not in records]
    if out_dir is not None:
        # Every machine that ran records (a run resumed on another machine goes on: sessions end).
        # (with the pair's calibration there, which sets the block lengths of arbiter and sampled runs)
        # (and the weights llama.cpp repacked there, whose kernels round near ties their own way)
        here = {**machine_identity(), "calibration": engine.calibration_id, "repacked": engine.repacked_bytes}
        if todo and here not in config["machines"]:
            config["machines"].append(here)
        write_atomic(config_path, json.dumps(config, indent=1))
        log = (out_dir / "records.jsonl").open("a", encoding="utf-8")
    try:
        for problem, run in (progress(todo) if progress else todo):
            rec = run_problem(engine, problem, run, params, score, as_chat)
            records[problem.id, run.label] = rec
            if log:
                log.write(json.dumps(asdict(rec)) + "\n")
                log.flush()
    finally:
        if log:
            log.close()
    summary = summarize(problems, labels, records)
    summary["title"] = title
    if out_dir is not None:
        summary["machines"] = [m.get("cpu") for m in config["machines"]]
    summary["calibration"] = engine.calibration_id
    summary["models"] = {"target": Path(engine.target_path).name,
                         "draft": Path(engine.draft_path).name if engine.draft_path else None}
    if out_dir is not None:
        write_atomic(out_dir / "results.json", json.dumps(summary, indent=1))
        write_atomic(out_dir / "results.md", markdown(summary, title) + "\n")
        plotted = plot(summary, out_dir / "accuracy_vs_speedup.png", title)
        summary["written"] = [str(out_dir / name) for name in ("records.jsonl", "config.json", "results.json",
                                                               "results.md")] + ([str(plotted)] if plotted else [])
    return summary
