"""Arbiters: who settles a mismatch between draft and target.

- `target`: never keeps one (plain, lossless speculative decoding);
- `fly`: FLy's training-free rule (window + entropy gate);
- a learned arbiter: a folder holding arbiter.gguf (head weights and the
  metadata binding it to its draft), adapter.gguf for the `lora` kind (a
  llama.cpp LoRA adapter on the draft) and head.onnx (the same head for ONNX
  Runtime); named ones ship with the package;
- any Python function (`arbiter_from_function`).

Only the standard library, numpy and the extension are imported here (gguf where a file is read);
onnxruntime is imported when a head runs under it.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from . import _cospec
from .arbiter_bundle import ADAPTER_FILE, ARBITER_FILE, ONNX_FILE

Arbiter = _cospec.Arbiter


DEMO_ARBITERS_DIR = Path(__file__).parent / "data" / "demo" / "arbiters"
SMOLLM2_ARITH_ARBITERS_DIR = Path(__file__).parent / "data" / "smollm2-arith" / "arbiters"
GEMMA3_SMOLLM2_DIR = Path(__file__).parent / "data" / "gemma3-smollm2"


@dataclass(frozen=True)
class NamedArbiter:
    name: str
    description: str
    path: Path
    draft: str  # the named draft model it was trained for
    target: str = "demo-target"  # the named target it was trained with
    # What its reference.jsonl was generated on (train/bundle.py): task families or files, and
    # whether through the target's chat template.
    reference_tasks: tuple[str, ...] = ("arith", "pyfunc")
    reference_chat: bool = False
    reference_max_tokens: int = 256
    # The target's chat template where it is not the target's own (a base model's question/answer
    # form), as the arbiter was trained and is used: a Jinja file.
    chat_template: Path | None = None
    # Whether `auto` picks it for its draft. Not for a general model's draft that serves many
    # targets: an arbiter learned with one target is chosen by name.
    auto: bool = True


NAMED_ARBITERS = {
    a.name: a
    for a in (
        NamedArbiter("demo-lora", "the demo draft with a LoRA adapter and a head over its hidden states and the block's "
                                  "features (warm-up on branch-oracle labels)", DEMO_ARBITERS_DIR / "lora", "demo-draft"),
        NamedArbiter("demo-features", "an MLP over the block's features (probabilities, entropies, margins, "
                                      "positions), no extra forward pass", DEMO_ARBITERS_DIR / "features", "demo-draft"),
        NamedArbiter("smollm2-arith", "SmolLM2-135M with its arithmetic draft: an MLP over the block's features, "
                                      "trained by `cospec-local arbiter train` on one-operation arithmetic and a "
                                      "second round of the states it meets itself, with a domain gate", SMOLLM2_ARITH_ARBITERS_DIR / "features", "smollm2-135m-arith-draft",
                     "smollm2-135m", (str(SMOLLM2_ARITH_ARBITERS_DIR.parent / "arithmetic.jsonl"),), True),
        NamedArbiter("gemma3-smollm2-words", "Gemma 3 270M (a base model, in a question/answer form) with "
                                             "SmolLM2-135M-Instruct drafting across vocabularies: an MLP over the "
                                             "block's features, trained by `cospec-local arbiter train --rounds 2` on "
                                             "capitals, antonyms and plurals, with a domain gate; chosen by name",
                     GEMMA3_SMOLLM2_DIR / "arbiters" / "features", "smollm2-135m", "gemma3-270m",
                     tuple(str(GEMMA3_SMOLLM2_DIR / f"{kind}.jsonl") for kind in ("capitals", "antonyms", "plurals")),
                     True, 24, GEMMA3_SMOLLM2_DIR / "qa.jinja", auto=False),
    )
}


AUTO = "auto"  # the bundled learned arbiter made for the engine's draft, else the lossless target arbiter


def bundled_arbiter_for(draft_path: str | os.PathLike | None) -> str | None:
    """The named arbiter trained for this draft file (the first listed for a draft is its
    default), or None."""
    from .models import NAMED_MODELS

    if draft_path is None:
        return None
    for arbiter in NAMED_ARBITERS.values():
        if not arbiter.auto:
            continue
        try:  # where the draft is or would be: asking must not make a derived draft
            if Path(NAMED_MODELS[arbiter.draft].path_without_making()).resolve() == Path(draft_path).resolve():
                return arbiter.name
        except (FileNotFoundError, OSError):
            continue
    return None


def resolve_auto(draft_path: str | os.PathLike | None) -> str:
    """What the `auto` arbiter means for this draft: its bundled learned arbiter, else target."""
    return bundled_arbiter_for(draft_path) or "target"


def arbiter_from_function(fn: Callable[[dict], Sequence[float]], name: str = "python", *,
                          begin: Callable | None = None, taken: Callable | None = None,
                          reset: Callable | None = None) -> Arbiter:
    """Wrap a Python function as an arbiter.

    `fn(block)` gets a dict with numpy arrays `draft` (K), `target` (K+1),
    `mismatch` (K, bool), `target_logits` (K+1, n_vocab), `draft_logits`
    (K, n_vocab), `context` (prompt and verified tokens), `n_context`, `index`
    and `temperature`, and returns K values: P(keep draft token) at each
    position (booleans are 0 or 1). Optional `begin(prompt)` is called when a
    generation starts, `taken(block, decisions)` with the decisions the walk
    applied: (block, position, token_index, p_keep, keep) tuples; `reset()` on `arbiter.reset()`.
    """
    return _cospec.Arbiter.callback(name, fn, begin, taken, reset)


def user_arbiters_dir() -> Path:
    """Where `cospec-local arbiter train` installs arbiters, each found by its name as `--arbiter NAME`:
    $COSPEC_LOCAL_ARBITERS, default ~/.local/share/cospec-local/arbiters."""
    return Path(os.environ.get("COSPEC_LOCAL_ARBITERS") or Path.home() / ".local" / "share" / "cospec-local" / "arbiters")


def installed_arbiters() -> dict[str, Path]:
    """The arbiters installed in the user's folder, by name."""
    root = user_arbiters_dir()
    if not root.is_dir():
        return {}
    # Dot folders are installs in progress (or interrupted): not arbiters yet.
    return {p.name: p for p in sorted(root.iterdir()) if not p.name.startswith(".") and (p / ARBITER_FILE).is_file()}


def resolve_arbiter_path(spec: str | os.PathLike) -> Path:
    """A bundled arbiter's folder by name, the given path (a folder or its arbiter.gguf) where it
    holds an arbiter, else an arbiter installed in the user's folder by that name (else the path as
    given: its loader says what is missing)."""
    key = os.fspath(spec)
    if key in NAMED_ARBITERS:
        path = NAMED_ARBITERS[key].path
        if not (path / ARBITER_FILE).is_file():
            raise FileNotFoundError(f"the bundled arbiter {key!r} is missing from {path}; reinstall cospec-local")
        return path
    path = Path(key)
    holds_arbiter = path.is_file() or (path / ARBITER_FILE).is_file()
    if not holds_arbiter and os.sep not in key and (user_arbiters_dir() / key / ARBITER_FILE).is_file():
        return user_arbiters_dir() / key  # a folder here of the same name that holds no arbiter does not hide it
    return path


def arbiters_for_draft(draft_path: str | os.PathLike | None) -> list[str]:
    """What --arbiter can name with this draft: auto, the built-in rules, and the bundled and
    installed learned arbiters made for it (the draft fingerprint each records is this file's)."""
    from .arbiter_bundle import read_meta

    names = [AUTO, *BUILTIN_NAMES]
    if draft_path is None or not Path(draft_path).is_file():
        return names
    fingerprint = _cospec.model_fingerprint(os.fspath(draft_path))
    for name, path in [(n, a.path) for n, a in NAMED_ARBITERS.items()] + list(installed_arbiters().items()):
        try:
            if read_meta(path).get("draft_fingerprint") == fingerprint:
                names.append(name)
        except (OSError, ValueError):  # an unreadable arbiter is not offered
            continue
    return names


def another_draft_fix(draft_path: str | os.PathLike | None) -> str:
    """The fix line for an arbiter made for another draft: what fits this one."""
    return (f"fix: --arbiter {', '.join(arbiters_for_draft(draft_path))} (those fit this draft), or train one "
            f"for this pair: cospec-local arbiter train NAME -m TARGET -md DRAFT --task TASKS")


def missing_arbiter_hint(spec: str | os.PathLike, draft_path: str | os.PathLike | None = None) -> str | None:
    """Why `spec` names no arbiter, in words a user can act on, or None when it does name one; with
    draft_path, the names offered are those that fit that draft."""
    path = resolve_arbiter_path(spec)
    if path.is_file() or (path / ARBITER_FILE).is_file():
        return None
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if (p / ARBITER_FILE).is_file())
        if inside:
            return f"{path} holds arbiters in {', '.join(name + '/' for name in inside)}: pass one of those folders"
        return f"{path} holds no {ARBITER_FILE}"
    name = path.name
    if os.fspath(spec) != name and (name in NAMED_ARBITERS or name in installed_arbiters()):
        return (f"no arbiter {os.fspath(spec)!r}: no such file or folder; {name!r} is an arbiter's name: give it "
                f"without a path, --arbiter {name}")
    if draft_path is not None:
        return (f"no arbiter {os.fspath(spec)!r}: not a folder, nor a name that fits this draft "
                f"({', '.join(arbiters_for_draft(draft_path))}; installed ones live in {user_arbiters_dir()})")
    names = sorted(NAMED_ARBITERS) + sorted(installed_arbiters())
    return (f"no arbiter {os.fspath(spec)!r}: not a folder, nor one of the arbiters by name "
            f"({', '.join(names)}; installed ones live in {user_arbiters_dir()})")


def arbiter_dir(path: Path) -> Path:
    return path if path.is_dir() else path.parent


def onnx_head(path: Path, n_threads: int = 1) -> Callable:
    """The arbiter's head.onnx under ONNX Runtime: rows of head inputs -> P(keep)."""
    try:
        import numpy as np
        import onnxruntime as ort
    except ImportError as exc:  # pragma: no cover - onnxruntime is a dependency
        raise ImportError(f"the onnx head needs onnxruntime ({exc})") from None
    file = arbiter_dir(path) / ONNX_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{file} is missing: this arbiter has no ONNX head")
    options = ort.SessionOptions()
    options.intra_op_num_threads = n_threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name

    def head(rows):
        return session.run(None, {input_name: np.ascontiguousarray(rows, dtype=np.float32)})[0].reshape(-1)

    return head


def arbiter_identity(spec, threshold: float | None = None) -> dict:
    """What exactly decides mismatches, for eval records: a built-in rule's name, or a learned
    arbiter's name, kind, files' hashes, draft fingerprint and threshold."""
    if isinstance(spec, Arbiter):
        return {"name": spec.name, "kind": "object"}
    key = os.fspath(spec)
    if key in BUILTIN_NAMES:
        return {"name": key, "kind": "builtin"}
    folder = arbiter_dir(resolve_arbiter_path(key))
    digest = hashlib.sha256()
    for name in (ARBITER_FILE, ADAPTER_FILE):
        file = folder / name
        if file.is_file():
            digest.update(name.encode() + file.read_bytes())
    return {"name": key if key in NAMED_ARBITERS else folder.name, "kind": "learned", "sha256": digest.hexdigest()[:16],
            "threshold": threshold}


BUILTIN_NAMES = ("target", "fly")


# ---------------------------------------------------------------- describing arbiters (`arbiter list/show`)

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
    """What a report's own numbers and intervals say of run `mine` (an arbiter's) beside the baselines
    in `runs` (eval's labels): the draft alone scores as high or higher and is faster, use the arbiter,
    the arbiter loses accuracy, or no reliable difference from sps (the target's accuracy at
    speculation's speed). None where the runs needed are missing."""
    me = runs.get(mine)
    base_name = "sps" if "sps" in runs else "target-only"
    base, draft = runs.get(base_name), runs.get("draft-only")
    if me is None or base is None or me.get("accuracy_ci95") is None or base.get("accuracy_ci95") is None:
        return None

    def pct(r: dict) -> str:
        return f"{100 * r['accuracy']:.1f}%"

    def speed(r: dict) -> str:
        return f"{r.get('speedup') or 0:.2f}x"

    if (draft is not None and draft.get("accuracy_ci95") is not None and draft["accuracy"] >= me["accuracy"]
            and (draft.get("speedup") or 0) > (me.get("speedup") or 0)):
        how = "better" if _reliably_above(draft, me) else "as good or better"
        return Verdict(f"the draft alone is {how} and faster",
                       f"the draft alone is {how} ({pct(draft)} against {pct(me)}) and faster ({speed(draft)} "
                       f"against {speed(me)} target-only): --mode draft-only")
    if _reliably_above(me, base):
        return Verdict("use the arbiter", f"use the arbiter: {pct(me)} against {base_name}'s {pct(base)}, beyond the "
                                          f"95% intervals")
    if _reliably_above(base, me):
        return Verdict("the arbiter loses accuracy", f"the arbiter loses accuracy: {pct(me)} against {base_name}'s "
                                                     f"{pct(base)}: leave it off this task")
    return Verdict(f"no reliable difference from {base_name}",
                   f"no reliable difference from {base_name} ({pct(me)} against {pct(base)}: the intervals overlap)")


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

    from .arbiter_bundle import read_meta
    from .jsonl import write_atomic

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

    from .arbiter_bundle import BUNDLE_FILES, REFERENCE_FILE, read_meta

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
    gate = (f"abstains on prompts whose token pairs are less than {100 * float(row['gate_threshold']):.1f}% "
            f"ones its training prompts had" if row.get("gate_threshold") is not None else "none: decides on every prompt")
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
        from .machine import busy_note

        lines.append("  evaluation")
        for task, result in row["evaluation"].items():
            source = result.get("recorded_from")
            if source:  # `arbiter record`: the eval folder, kept relative to the arbiter's own
                machines = ", ".join(map(str, source.get("machines") or ["machine not recorded"]))
                origin = f"eval {os.path.normpath(Path(row['path']) / source['folder'])}; {machines}"
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
