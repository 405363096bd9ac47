"""Arbiters: who settles a mismatch between draft and target.

- `target`: never keeps one (plain, lossless speculative decoding);
- `fly`: FLy's training-free rule (window + entropy gate);
- a learned arbiter: a folder holding arbiter.gguf (head weights and the
  metadata binding it to its draft), adapter.gguf for the `lora` kind (a
  llama.cpp LoRA adapter on the draft) and head.onnx (the same head for ONNX
  Runtime); named ones ship with the package;
- any Python function (`arbiter_from_function`).

Only the standard library, numpy, gguf and the extension are imported here;
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


@dataclass(frozen=True)
class NamedArbiter:
    name: str
    description: str
    path: Path
    draft: str  # the named draft model it was trained for


NAMED_ARBITERS = {
    a.name: a
    for a in (
        NamedArbiter("demo-lora", "the demo draft with a LoRA adapter and a head over its hidden states and the block's "
                                  "features (warm-up on branch-oracle labels)", DEMO_ARBITERS_DIR / "lora", "demo-draft"),
        NamedArbiter("demo-features", "an MLP over the block's features (probabilities, entropies, margins, "
                                      "positions), no extra forward pass", DEMO_ARBITERS_DIR / "features", "demo-draft"),
    )
}


AUTO = "auto"  # the bundled learned arbiter made for the engine's draft, else the lossless target arbiter


def bundled_arbiter_for(draft_path: str | os.PathLike | None) -> str | None:
    """The named arbiter trained for this draft file (the first listed for a draft is its
    default), or None."""
    from .models import resolve_model

    if draft_path is None:
        return None
    for arbiter in NAMED_ARBITERS.values():
        try:
            if Path(resolve_model(arbiter.draft)).resolve() == Path(draft_path).resolve():
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


def resolve_arbiter_path(spec: str | os.PathLike) -> Path:
    """A named arbiter's folder, or the given path (a folder or its arbiter.gguf)."""
    key = os.fspath(spec)
    if key in NAMED_ARBITERS:
        path = NAMED_ARBITERS[key].path
        if not (path / ARBITER_FILE).is_file():
            raise FileNotFoundError(f"the bundled arbiter {key!r} is missing from {path}; reinstall cospec-local")
        return path
    return Path(key)


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
