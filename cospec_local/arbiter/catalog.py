"""Which arbiter a name means: the built-in rules, the learned arbiters shipped with the package,
the ones `cospec-local arbiter train` installed for the user, and a folder or file given by path.

- `target`: never keeps a mismatch (plain, lossless speculative decoding);
- `fly`: FLy's training-free rule (window + entropy gate);
- `aasd`: AASD's conditional verification (an entropy-adaptive threshold on the target's probability);
- a learned arbiter: a folder holding arbiter.gguf (head weights and the metadata binding it to
  its draft), adapter.gguf for the `lora` kind (a llama.cpp LoRA adapter on the draft) and
  head.onnx (the same head for ONNX Runtime); its format is file_format.py;
- any Python function (callbacks.py).

Only the standard library and the extension are imported here.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from .. import _cospec
from .file_format import ADAPTER_FILE, ARBITER_FILE

Arbiter = _cospec.Arbiter


DEMO_ARBITERS_DIR = Path(__file__).parent.parent / "data" / "demo" / "arbiters"
SMOLLM2_ARITH_ARBITERS_DIR = Path(__file__).parent.parent / "data" / "smollm2-arith" / "arbiters"
GEMMA3_SMOLLM2_DIR = Path(__file__).parent.parent / "data" / "gemma3-smollm2"


@dataclass(frozen=True)
class NamedArbiter:
    name: str
    description: str
    path: Path
    draft: str  # the named draft model it was trained for
    target: str = "demo-target"  # the named target it was trained with
    # What its reference.jsonl was generated on (train/ship_arbiter.py): task families or files, and
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
    from ..models import NAMED_MODELS

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
    from .file_format import read_meta

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


BUILTIN_NAMES = ("target", "fly", "aasd")
