"""What an arbiter is measured to do, kept beside its files: the recorded evaluation
(evaluation.json, written by `arbiter train` and `arbiter record` from `cospec-local eval`
folders), the verdict its numbers support against the baselines, and the text of
`cospec-local arbiter list/show`."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from .catalog import arbiter_dir, arbiter_identity, resolve_arbiter_path

EVALUATION_FILE = "evaluation.json"  # written by `arbiter train` (or `arbiter record`) beside the arbiter's files
BASELINE_RUNS = ("target-only", "draft-only", "sps")  # what an arbiter's recorded evaluation compares it with


def _reliably_above(a: dict, b: dict) -> bool:
    """a's accuracy beats b's beyond both 95% intervals."""
    return a["accuracy_ci95"][0] > b["accuracy_ci95"][1]


@dataclass(frozen=True)
class Verdict:
    short: str  # a few words, for one-line listings
    text: str   # with the numbers it rests on


def verdict(runs: dict, mine: str) -> Verdict | None:
    """What a report's own numbers and intervals say of run `mine` (an arbiter's) beside every option
    in `runs` (eval's labels): target-only, sps and the draft alone, by accuracy with its 95%
    interval and by speed. The draft alone that the arbiter does not beat beyond the intervals and
    that runs faster is the better choice; else the arbiter is worth using where it beats the
    target (sps, or target-only) beyond the intervals, loses where it falls below, and otherwise
    makes no reliable difference. None where the runs needed are missing."""
    me = runs.get(mine)
    lossless = [(name, runs[name]) for name in ("sps", "target-only")
                if name in runs and runs[name].get("accuracy_ci95") is not None]
    if me is None or me.get("accuracy_ci95") is None or not lossless:
        return None
    base_name, base = max(lossless, key=lambda item: item[1]["accuracy"])  # sps first where they tie
    draft = runs.get("draft-only")

    def pct(r: dict) -> str:
        return f"{100 * r['accuracy']:.1f}%"

    def speed(r: dict) -> str:
        return f"{r.get('speedup') or 0:.2f}x"

    def said(name: str, r: dict) -> str:
        lo, hi = r["accuracy_ci95"]
        return f"{name} {pct(r)} ({100 * lo:.0f}-{100 * hi:.0f}) at {speed(r)}"

    options = "; ".join(said("the arbiter" if name == mine else name, r) for name, r in runs.items()
                        if r.get("accuracy_ci95") is not None)
    if (draft is not None and draft.get("accuracy_ci95") is not None and not _reliably_above(me, draft)
            and (draft.get("speedup") or 0) > (me.get("speedup") or 0)):
        how = "better" if _reliably_above(draft, me) else \
            "as good or better" if draft["accuracy"] >= me["accuracy"] else "as good within the 95% intervals"
        return Verdict(f"the draft alone is {how} and faster",
                       f"the draft alone is {how} ({pct(draft)} against {pct(me)}) and faster ({speed(draft)} "
                       f"against {speed(me)} target-only): --mode draft-only [{options}]")
    if _reliably_above(me, base):
        return Verdict("use the arbiter", f"use the arbiter: {pct(me)} against {base_name}'s {pct(base)}, beyond the "
                                          f"95% intervals, and the draft alone does not match it [{options}]")
    if _reliably_above(base, me):
        return Verdict("the arbiter loses accuracy", f"the arbiter loses accuracy: {pct(me)} against {base_name}'s "
                                                     f"{pct(base)}: leave it off this task [{options}]")
    return Verdict(f"no reliable difference from {base_name}",
                   f"no reliable difference from {base_name} ({pct(me)} against {pct(base)}: the intervals overlap) "
                   f"[{options}]")


def on_training_file(title: str) -> bool:
    """Whether a recorded evaluation is `arbiter train`'s held-out split of a file named as the
    training file (`*-train.jsonl`): held out from training, but not an independent test set."""
    import re

    return re.search(r"(^|[-_.])train([-_.]|$)", Path(title.split(" (")[0]).stem) is not None


def evaluation_row(run: dict) -> dict:
    """What an arbiter's recorded evaluation keeps of one run of an eval summary."""
    keys = ("n", "accuracy", "accuracy_ci95", "speedup", "predicted_per_second", "arbiter_keeps", "arbiter_share",
            "recovered", "recovered_share", "losses", "tokens")
    return {k: run.get(k) for k in keys}


def evaluation_entry(summary: dict, labels: dict[str, str]) -> dict:
    """One task's recorded evaluation from an eval summary (results.json): its size, either model's
    share, the draft-only successes, and the runs named in labels (summary label -> recorded one)."""
    return {"problems": summary["problems"], "union": summary.get("oracle_union"),
            "draft_only_solves": summary.get("non_nested"), "other_load": summary.get("other_load"),
            "runs": {mine: evaluation_row(summary["runs"][label]) for label, mine in labels.items()
                     if label in summary["runs"]}}


def _own_settings_differ(config: dict, label: str) -> list[str]:
    """Where an eval ran the arbiter otherwise than it runs by default (its recorded evaluation is of that)."""
    settings, arbiter = config["runs"].get("settings") or {}, config["runs"][label].get("arbiter") or {}
    trained = arbiter.get("trained_under") or {}
    differ = []
    if arbiter.get("threshold") is not None or settings.get("arbiter_threshold") is not None:
        differ.append("--arbiter-threshold")
    if settings.get("arbiter_gate") is False:
        differ.append("--no-arbiter-gate")
    if "draft_max" in trained and str(settings.get("draft_max")) != str(trained["draft_max"]):
        differ.append(f"--draft-max {settings.get('draft_max')} (trained at {trained['draft_max']})")
    if "adaptive_draft" in trained and str(settings.get("adaptive_draft")).lower() != str(trained["adaptive_draft"]):
        differ.append("--adaptive-draft / --fixed-draft")
    return differ


def evaluation_from_eval(folder: Path, sha: str, kind: str, recorded: dict, eval_dir: Path,
                         replace: bool = False) -> tuple[str, dict]:
    """The recorded-evaluation entry (title, entry) that `cospec-local eval --out EVAL_DIR` makes for
    the arbiter in folder (files' hash sha, its kind). Refused unless the eval ran these very files,
    as they run by default, beside target-only; or where it would replace an entry of `recorded`
    (title -> entry) of more problems (unless replace)."""
    import json

    try:
        config = json.loads((eval_dir / "config.json").read_text())
        summary = json.loads((eval_dir / "results.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{eval_dir} is not a finished `cospec-local eval --out` folder "
                         f"(config.json and results.json): {exc}") from None
    mine = [label for label, run in config.get("runs", {}).items()
            if isinstance(run, dict) and (run.get("arbiter") or {}).get("sha256") == sha and label in summary["runs"]]
    if not mine:
        seen = sorted({str((run.get("arbiter") or {}).get("sha256")) for run in config.get("runs", {}).values()
                       if isinstance(run, dict) and (run.get("arbiter") or {}).get("kind") == "learned"})
        raise ValueError(f"{eval_dir} has no run of this arbiter's files (hash {sha}); its learned arbiters' "
                         f"hashes: {', '.join(seen) or 'none'}. Run `cospec-local eval --runs "
                         f"target-only,sps,cospec:ARBITER --out DIR` and record that")
    if "target-only" not in summary["runs"]:
        raise ValueError(f"{eval_dir} has no target-only run to compare the arbiter with; add it to --runs")
    if differ := _own_settings_differ(config, mine[0]):
        raise ValueError(f"{eval_dir} ran the arbiter with {', '.join(differ)}; its recorded evaluation is of the "
                         f"arbiter as it runs by default: evaluate it without those")
    entry = evaluation_entry(summary, {label: label for label in BASELINE_RUNS} | {mine[0]: kind})
    entry["recorded_from"] = {"folder": os.path.relpath(eval_dir.resolve(), folder.resolve()),  # from the arbiter's folder
                              "settings": config["runs"].get("settings"), "target": config.get("target"),
                              "draft": config.get("draft"), "chat": config.get("chat"),
                              "machines": [m.get("cpu") for m in config.get("machines", [])]}
    title = summary.get("title") or config.get("title") or eval_dir.name
    old = recorded.get(title)
    if old is not None and old["problems"] > entry["problems"] and not replace:
        raise ValueError(f"the arbiter's recorded {title} has {old['problems']} problems and {eval_dir} "
                         f"{entry['problems']}; pass --replace to replace it")
    return title, entry


def record_evaluation(arbiter: str | os.PathLike, eval_dirs: Sequence[str | os.PathLike],
                      replace: bool = False) -> tuple[Path, dict[str, dict]]:
    """Add what `cospec-local eval --out EVAL_DIR` measured of this arbiter to its recorded evaluation
    (`arbiter show`), one entry per eval title. Every folder is checked (evaluation_from_eval)
    before anything is written. Returns the arbiter's folder and the entries by title."""
    import json

    from .file_format import read_meta
    from ..jsonl import write_atomic

    folder = arbiter_dir(resolve_arbiter_path(arbiter))
    identity, kind = arbiter_identity(arbiter), read_meta(folder)["kind"]
    path = folder / EVALUATION_FILE
    record = json.loads(path.read_text()) if path.is_file() else {"name": identity["name"], "kind": kind}
    recorded = record.setdefault("evaluation", {})
    entries = dict(evaluation_from_eval(folder, identity["sha256"], kind, recorded, Path(d), replace)
                   for d in eval_dirs)
    recorded.update(entries)
    write_atomic(path, json.dumps(record, indent=1) + "\n")
    return folder, entries


def describe_arbiter(folder: str | os.PathLike, name: str | None = None, where: str | None = None) -> dict:
    """What an arbiter folder holds, from its files' metadata alone (no model is loaded): kind,
    the draft it fits, what it was trained under, its threshold, files and recorded evaluation."""
    import json

    from .file_format import BUNDLE_FILES, REFERENCE_FILE, read_meta

    meta = read_meta(folder)  # the folder, or its arbiter.gguf
    folder = Path(folder) if Path(folder).is_dir() else Path(folder).parent
    info = json.loads(meta.get("info") or "{}")
    evaluation = folder / EVALUATION_FILE
    trained = {key: meta[key] for key in ("draft_max", "adaptive_draft", "draft_cost", "verify_cost") if key in meta}
    return {
        "name": name or folder.name, "where": where or "folder", "path": str(folder), "kind": meta["kind"],
        "description": meta.get("description", ""), "threshold": float(meta["threshold"]),
        "draft_file": meta.get("draft_file"), "draft_fingerprint": meta.get("draft_fingerprint"),
        "target_file": meta.get("target_file"), "target_fingerprint": meta.get("target_fingerprint"),
        "trained_under": trained, "lora_context": meta.get("lora_context"), "gate_threshold": meta.get("gate_threshold"),
        "gate_hash_bits": meta.get("gate_hash_bits"),
        "files": {f: (folder / f).stat().st_size for f in (*BUNDLE_FILES, REFERENCE_FILE, EVALUATION_FILE)
                  if (folder / f).is_file()},
        "warmup_dev": (info.get("warmup") or {}).get("dev"),
        "evaluation": json.loads(evaluation.read_text()).get("evaluation") if evaluation.is_file() else None,
    }


def _arbiter_run(runs: dict, kind: str) -> str | None:
    """The label of a recorded evaluation's arbiter run: its kind, else the one run that is no baseline."""
    return kind if kind in runs else next((label for label in runs if label not in BASELINE_RUNS), None)


def _headline(row: dict) -> str:
    """One line of the recorded evaluation: target -> arbiter accuracy, per task."""
    if not row["evaluation"]:
        return "no recorded evaluation"
    parts = []
    for task, result in row["evaluation"].items():
        if on_training_file(task):
            continue  # (show lists it apart)
        runs = result["runs"]
        label = _arbiter_run(runs, row["kind"])
        if label is None or "target-only" not in runs:
            continue
        mine = runs[label]
        said = verdict(runs, label)
        parts.append(f"{Path(task).name}: target {100 * runs['target-only']['accuracy']:.1f}% -> "
                     f"{100 * mine['accuracy']:.1f}% at {mine['speedup'] or 0:.2f}x target-only"
                     + (f" ({said.short})" if said else ""))
    return "; ".join(parts) or "no recorded evaluation"


def summary_line(row: dict) -> str:
    return (f"{row['name']:<22} {row['where']:<9} {row['kind']:<8} for {row['draft_file']}, threshold "
            f"{row['threshold']:.3f}; {_headline(row)}")


def details_text(row: dict) -> str:
    trained = row["trained_under"]
    block = (f"blocks of up to {int(trained['draft_max'])} tokens" if "draft_max" in trained
             else "block length not recorded (arbiters trained before it was recorded: 8)")
    cost = (f"verify cost {float(trained['verify_cost']):.3g} target steps a token" if "verify_cost" in trained
            else "the default cost model")
    if row.get("gate_threshold") is None:
        gate = "none: decides on every prompt"
    elif row.get("gate_hash_bits") is not None:
        gate = (f"a classifier of its tasks' words: abstains on prompts it gives less than "
                f"{float(row['gate_threshold']):.4f} of being one of its tasks")
    else:
        gate = (f"abstains on prompts whose token pairs are less than {100 * float(row['gate_threshold']):.1f}% "
                f"ones its training prompts had")
    lines = [f"{row['name']} ({row['where']}, {row['kind']}): {row['description']}",
             f"  folder      {row['path']}",
             f"  draft       {row['draft_file']} (fingerprint {str(row['draft_fingerprint'])[:16]})",
             *([f"  target      {row['target_file']} (fingerprint {str(row['target_fingerprint'])[:16]}): what its "
                f"states were collected with"] if row.get("target_fingerprint") else []),
             f"  trained on  {block}; {cost}",
             f"  threshold   keeps a mismatch at P(keep) >= {row['threshold']:.3f}",
             f"  gate        {gate}",
             "  files       " + ", ".join(f"{name} ({size / 1024:.0f} kB)" for name, size in row["files"].items())]
    dev = row["warmup_dev"]
    if dev:
        lines.append(f"  dev states  {dev['decisive']} decisive: {dev['right_keeps']} right keeps, "
                     f"{dev['wrong_keeps']} wrong")
    if row["evaluation"]:
        from ..evaluation.machine import busy_note

        tests = {task: r for task, r in row["evaluation"].items() if not on_training_file(task)}
        apart = {task: r for task, r in row["evaluation"].items() if on_training_file(task)}
        lines.append("  evaluation (held-out test sets)" if tests else "  evaluation  no held-out test set recorded")
        sections = list(tests.items()) + ([(None, None)] + list(apart.items()) if apart else [])
        for task, result in sections:
            if task is None:
                lines.append("  on its training files (arbiter train's held-out part of each: not an independent "
                             "test)")
                continue
            source = result.get("recorded_from")
            if source:  # `arbiter record`: the eval folder, kept relative to the arbiter's own
                machines = ", ".join(map(str, source.get("machines") or ["machine not recorded"]))
                origin = f"eval {os.path.normpath(Path(row['path']) / source['folder'])}; {machines}"
            elif on_training_file(task):
                origin = "arbiter train's held-out part of this training file"
            else:
                origin = "arbiter train's held-out test split"
            lines.append(f"    {Path(task).name}: {result['problems']} problems ({origin})")
            for label, r in result["runs"].items():
                extra = ""
                if r.get("recovered") is not None and label not in ("target-only", "draft-only"):
                    extra = f", recovered {r['recovered']}, lost {r['losses']}, {r['arbiter_keeps']} keeps"
                lines.append(f"      {label:<12} {100 * r['accuracy']:5.1f}%  {r['speedup'] or 0:.2f}x target-only{extra}")
            if (note := busy_note(result.get("other_load"))) is not None:
                lines.append(f"      warning: {note}")
            mine = _arbiter_run(result["runs"], row["kind"])
            if mine is not None and (said := verdict(result["runs"], mine)) is not None:
                lines.append(f"      verdict: {said.text}")
    else:
        lines.append("  evaluation  none recorded")
    return "\n".join(lines)
