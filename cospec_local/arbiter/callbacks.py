"""Arbiters that decide in Python: any function the engine calls at each block, and a learned
arbiter's head under ONNX Runtime (`--arbiter-head onnx`), which the engine then calls the same way.
onnxruntime is imported only when a head runs under it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

from .. import _cospec
from .catalog import Arbiter, arbiter_dir
from .file_format import ONNX_FILE


def arbiter_from_function(fn: Callable[[dict], Sequence[float]], name: str = "python", *,
                          begin: Callable | None = None, taken: Callable | None = None,
                          reset: Callable | None = None) -> Arbiter:
    """Wrap a Python function as an arbiter.

    `fn(block)` gets a dict with numpy arrays `draft` (K), `target` (K+1),
    `mismatch` (K, bool), `target_logits` (K+1, n_vocab), `draft_logits`
    (K, n_vocab), `context` (prompt and verified tokens), `n_context`, `index`,
    `temperature`, `n_prompt` (the context's first n_prompt tokens are the prompt),
    `reply_drafted` and `reply_agreed` (the reply's earlier draft positions the target
    judged, and agreed with), and returns K values: P(keep draft token) at each
    position (booleans are 0 or 1). Optional `begin(prompt)` is called when a
    generation starts, `taken(block, decisions)` with the decisions the walk
    applied: (block, position, token_index, p_keep, keep) tuples; `reset()` on `arbiter.reset()`.
    """
    return _cospec.Arbiter.callback(name, fn, begin, taken, reset)


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
