"""A pair's calibration on this machine: what its decodes cost and how often its drafts are
accepted, measured once, stored, and the start of every engine that opens the pair here.

Without one, each process starts its block-length tuners from priors and spends its first blocks
measuring and exploring, and the modes whose lengths may not depend on timing (an arbiter that
keeps mismatches, sampling) guess the costs from the pair's parameter counts. With one, a fresh
process drafts from its first block at lengths fitted to this machine, and those modes take their
lengths from its fixed numbers and the call's own tokens: the same calibration, inputs, settings
and seed give the same tokens in any process (`--json`, bench and eval records name its id).

The store is one JSON file per pair and machine (the files' identities; the CPU, llama.cpp's build
and kernels; the engine's threads, offload and repacked weights: whatever changes the costs) under
$COSPEC_CALIBRATION_DIR, else $XDG_CACHE_HOME/cospec-local/calibration (~/.cache/...). A file there
is untrusted input: one that does not parse, is of another format, another pair or another machine
is named in a one-line notice and measured again. It changes only when measured again (`cospec-local
calibrate`, or a missing or unusable one at open), and its id changes with it; a file kept aside
(`--calibration FILE`) brings an earlier id's tokens back.

Costs timed while other work shared the CPUs would slow every later process without a word: each
measurement records the share of the CPUs' time other work took meanwhile (`other_load`), one above
$COSPEC_CALIBRATION_MAX_LOAD (default 0.10) is timed once more, and one still busy is used by the
process that measured it but never stored. The store keeps the MAX_STORED calibrations used last
(`cospec-local calibrate --clear` empties it).
"""
from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

from . import _cospec
from .errors import CalibrationNotice, CospecError
from .evaluation.machine import BUSY_SHARE, OtherLoad

FILE_FORMAT = 1  # the file's layout; the numbers inside are the engine's (CALIBRATION_VERSION)
STORE_ENV = "COSPEC_CALIBRATION_DIR"
# The most other work may take of the CPUs' time while costs are timed for them to be stored; a
# machine that is never idle (a shared CI runner) may allow more.
MAX_LOAD_ENV = "COSPEC_CALIBRATION_MAX_LOAD"
# Calibrations kept in the store (one per pair, machine and settings ever opened); the least
# recently used go first.
MAX_STORED = 64
# Costs are timed after this many context tokens (fewer where the context is small).
CONTEXT_TOKENS = 64
# Room a measurement needs beyond its context: its largest verify batch.
_BATCH_ROOM = 65
# Acceptance is measured on replies of this length, per prompt.
ACCEPTANCE_TOKENS = 64
# The seed of the sampled acceptance run's first prompt (one more for each next prompt).
SAMPLED_SEED = 1
# What acceptance is measured on where no prompts are given: open questions and requests that
# copy their input, through the target's chat template where it has one.
DEFAULT_PROMPTS = (
    "Write a short paragraph about why the sea is salty.",
    "Give three tips for learning to play the guitar.",
    "What is the difference between weather and climate?",
    "Tell me a short story about a lighthouse keeper.",
    "Rewrite this sentence in the past tense: The committee reviews every application and sends a reply "
    "within two weeks, and each applicant receives a copy of the decision.",
    "Extract the names from this text and list them: Maria met Jonas at the station, and later Priya and "
    "Tomasz joined them for dinner with Maria's sister Elena.",
    "Fix the typo in this code and return the whole function:\n\ndef total(items):\n    result = 0\n    for item "
    "in items:\n        reslt += item.price * item.count\n    return result\n",
    "Turn this list into a numbered list: apples, bread, coffee, eggs, flour, garlic, honey.",
)
_TIMING_TEXT = ("The river runs past the old mill and under the stone bridge, where the town's children "
                "gather on summer evenings to watch the boats come in from the lake. ")


def store_dir() -> Path:
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "cospec-local" / "calibration"


def max_load() -> float:
    """The largest share of the CPUs' time other work may take while costs are timed, for them to be stored."""
    text = os.environ.get(MAX_LOAD_ENV)
    if text is None:
        return BUSY_SHARE
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{MAX_LOAD_ENV} must be a share between 0 and 1, not {text!r}")
    return value


def file_identity(path: str | os.PathLike) -> dict:
    """A model file's name, size and a hash of its first and last MiB: cheap on a 40 GB file,
    and another file (or a re-quantized one) differs in its header or tensors' tail."""
    path = Path(path)
    size = path.stat().st_size
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            digest.update(f.read(1 << 20))
    return {"file": path.name, "size": size, "sha256_ends": digest.hexdigest()[:32]}


@dataclass(frozen=True)
class Calibration:
    """One pair's calibration: the engine's numbers (cospec_calibration as a dict), and what it
    was measured for and on."""

    numbers: dict
    pair: dict
    machine: dict
    measured_at: str = ""
    acceptance_on: str = ""  # what acceptance was measured on ("" : not measured, priors stand)
    extra: dict = field(default_factory=dict)
    # The share of the CPUs' time other work took while the costs were timed (None: not measured,
    # off Linux or a file from before it was recorded).
    other_load: float | None = None

    @property
    def busy(self) -> bool:
        """Timed while other work took more of the CPUs than a stored calibration may have."""
        return self.other_load is not None and self.other_load > max_load()

    @property
    def id(self) -> str:
        """A hash of the numbers: the same id, the same block lengths."""
        text = json.dumps(self.numbers, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def to_json(self) -> dict:
        return {"format": FILE_FORMAT, "id": self.id, "measured_at": self.measured_at, "pair": self.pair,
                "machine": self.machine, "acceptance_on": self.acceptance_on, "other_load": self.other_load,
                "numbers": self.numbers}

    def summary(self) -> str:
        n = self.numbers
        verify = n["verify"]
        curve = " / ".join(f"{verify[k - 1]:.2f}" for k in VERIFY_CURVE_TOKENS)
        parts = [f"calibration {self.id}: a target step {n['target_step_ms']:.2f} ms; verifying "
                 f"{' / '.join(map(str, VERIFY_CURVE_TOKENS))} tokens {curve} steps"]
        if n["draft_step"] > 0:
            parts.append(f"a draft step {n['draft_step']:.3f} steps")
        if n["draft_acceptance"] >= 0:
            parts.append(f"draft acceptance {n['draft_acceptance']:.2f} (sampled as chat does: "
                         f"{n['draft_acceptance_sampled']:.2f})")
        measured = [f"{a:.2f}" for a in n["ngram_acceptance"] if a >= 0]
        if measured:
            parts.append(f"n-gram acceptance by match length {', '.join(measured)}")
        if not self.acceptance_on:
            parts.append("acceptance not measured (priors)")
        if self.other_load is not None:
            parts.append(f"other work took {self.other_load:.0%} of the CPUs while timed")
        return "; ".join(parts)


# The verify sizes `calibrate` prints (tokens in one target batch: K drafted + 1).
VERIFY_CURVE_TOKENS = (2, 3, 5, 9, 17, 33)


class CalibrationProblem(ValueError):
    """A stored calibration that cannot be used, and why."""


def _finite(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CalibrationProblem(f"{value!r} is not a finite number")
    return float(value)


def parse(data, pair: dict | None = None, machine: dict | None = None) -> Calibration:
    """A calibration from a stored file's JSON, checked: its format, shape and, where given, that it
    was measured for this pair on this machine (CalibrationProblem says what is wrong). The
    engine checks the numbers' ranges again when it takes them."""
    if not isinstance(data, dict):
        raise CalibrationProblem("not a JSON object")
    if data.get("format") != FILE_FORMAT:
        raise CalibrationProblem(f"file format {data.get('format')!r}, this version reads {FILE_FORMAT}")
    numbers = data.get("numbers")
    if not isinstance(numbers, dict):
        raise CalibrationProblem("no numbers")
    if numbers.get("version") != _cospec.CALIBRATION_VERSION:
        raise CalibrationProblem(f"calibration version {numbers.get('version')!r}, this engine reads "
                                 f"{_cospec.CALIBRATION_VERSION}")
    lists = {"verify": _cospec.N_DRAFT_MAX + 1, "ngram_acceptance": _cospec.N_NGRAM_BUCKETS}
    clean = {"version": _cospec.CALIBRATION_VERSION}
    for key in ("target_step_ms", "draft_first", "draft_step", "catch_up", "draft_acceptance",
                "draft_acceptance_sampled"):
        try:
            clean[key] = _finite(numbers.get(key))
        except CalibrationProblem as exc:
            raise CalibrationProblem(f"{key}: {exc}") from None
    for key, n in lists.items():
        values = numbers.get(key)
        if not isinstance(values, list) or len(values) != n:
            raise CalibrationProblem(f"{key} must be a list of {n} numbers")
        try:
            clean[key] = [_finite(v) for v in values]
        except CalibrationProblem as exc:
            raise CalibrationProblem(f"{key}: {exc}") from None
    for name, expected in (("pair", pair), ("machine", machine)):
        if expected is not None and data.get(name) != expected:
            raise CalibrationProblem(f"measured for another {name}")
    load = data.get("other_load")
    if load is not None:
        try:
            load = _finite(load)
        except CalibrationProblem as exc:
            raise CalibrationProblem(f"other_load: {exc}") from None
    calibration = Calibration(clean, data.get("pair") or {}, data.get("machine") or {},
                              str(data.get("measured_at", "")), str(data.get("acceptance_on", "")), other_load=load)
    if data.get("id") not in (None, calibration.id):
        raise CalibrationProblem("its id does not match its numbers (edited or damaged)")
    return calibration


def read(path: str | os.PathLike, pair: dict | None = None, machine: dict | None = None) -> Calibration:
    """A stored calibration (CalibrationProblem where it cannot be used; a missing file raises
    FileNotFoundError). Reading it marks it used (the store keeps those used last)."""
    with open(path, "rb") as f:
        raw = f.read(1 << 20)
    try:
        os.utime(path)
    except OSError:
        pass
    try:
        data = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CalibrationProblem(f"not JSON ({exc.__class__.__name__}: truncated or damaged)") from None
    return parse(data, pair, machine)


def write(calibration: Calibration, path: str | os.PathLike) -> None:
    """Write atomically: a reader, or another process writing the same file, sees a whole file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(calibration.to_json(), f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if path.parent == store_dir():
        prune_store()


def stored_files() -> list[Path]:
    """The store's calibrations, the least recently used first."""
    found = []
    for path in store_dir().glob("*.json"):
        try:
            found.append((path.stat().st_mtime, path))
        except OSError:
            pass  # (another process pruned it)
    return [path for _, path in sorted(found)]


def prune_store(keep: int = MAX_STORED) -> None:
    """Delete all but the `keep` calibrations used last."""
    files = stored_files()
    for path in files[:max(0, len(files) - keep)]:
        try:
            path.unlink()
        except OSError:
            pass


def clear_store() -> int:
    """Delete every stored calibration; how many there were."""
    files = stored_files()
    prune_store(keep=0)
    return len(files)


def store_path(pair: dict, machine: dict) -> Path:
    key = json.dumps({"pair": pair, "machine": machine}, sort_keys=True)
    name = pair["target"]["file"].removesuffix(".gguf")
    return store_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def _timing_context(engine) -> list[int]:
    tokens = engine.tokenize(_TIMING_TEXT * 8, add_special=False, parse_special=False)
    n = max(1, min(CONTEXT_TOKENS, engine.n_ctx - _BATCH_ROOM - 1))
    while len(tokens) < n:
        tokens = tokens + tokens
    return tokens[:n]


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


# Costs are timed at most this many times over while other work keeps the CPUs busy.
COST_TRIES = 2


def measure_costs(engine) -> Calibration:
    """The pair's costs on this machine (seconds for small models; a few verify batches of each
    size for large ones), timed again where other work took the CPUs meanwhile (the result's busy
    says whether the last try still found them busy); acceptance stays unmeasured. The engine's
    caches are emptied."""
    context = _timing_context(engine)
    for _ in range(COST_TRIES):
        with OtherLoad() as load:
            numbers = engine._native.measure_costs(context)
        measured = Calibration(numbers, engine.calibration_pair, engine.calibration_machine, _now(),
                               other_load=load.share)
        if not measured.busy:
            break
    return measured


def measure(engine, prompts: Sequence[str | Sequence[int]] | None = None, *, chat: bool | None = None,
            max_tokens: int = ACCEPTANCE_TOKENS) -> Calibration:
    """Costs, then acceptance: the draft model's (fixed blocks of the default length, greedy and
    under chat's sampling) and the n-gram drafter's per match length, on `prompts` (default:
    DEFAULT_PROMPTS through the chat template where the target has one; chat=False sends them as
    they are). Resets the engine."""
    costs = measure_costs(engine)
    engine._native.set_calibration(costs.numbers)
    chat = (prompts is None and engine.chat_template is not None) if chat is None else chat
    chosen = list(DEFAULT_PROMPTS if prompts is None else prompts)
    rendered = _rendered(engine, chosen, chat)
    numbers = {**costs.numbers, **_draft_acceptance(engine, rendered, max_tokens)}
    base = _fixed_blocks(max_tokens)
    engine.reset()  # the n-gram pool holds the prompts and replies from here on, as a chat's would
    for prompt in rendered:
        engine.generate(prompt, base, spec_type="ngram")
    learned = engine._native.get_calibration()
    numbers["ngram_acceptance"] = list(learned["ngram_acceptance"]) if learned else numbers["ngram_acceptance"]
    engine.reset()
    what = "given prompts" if prompts is not None else "built-in prompts"
    return Calibration(numbers, costs.pair, costs.machine, _now(),
                       f"{len(chosen)} {what}{' (chat)' if chat else ''}, {max_tokens} tokens each",
                       other_load=costs.other_load)


# What an engine that finds no calibration measures of the draft's acceptance beside the costs:
# replies to the first built-in prompts in short fixed blocks (the acceptance per token is the same
# estimate at any block length, and short blocks of a draft the target rarely agrees with cost the
# least). A few seconds for SmolLM2-135M; `calibrate` measures more, and the n-gram drafter's too.
FIRST_USE_PROMPTS = 2
FIRST_USE_TOKENS = 32
FIRST_USE_BLOCK = 4


def measure_first_use(engine) -> Calibration:
    """The costs and a short sample of the draft model's acceptance, greedy and sampled (a sampled
    call would otherwise explore drafting in every reply to learn what the calibration can say
    once). Resets the engine."""
    costs = measure_costs(engine)
    if not engine.has_draft:
        return costs
    from .chat.template import ChatTemplateError

    engine._native.set_calibration(costs.numbers)
    chosen = DEFAULT_PROMPTS[:FIRST_USE_PROMPTS]
    chat = engine.chat_template is not None
    try:
        rendered = _rendered(engine, chosen, chat)
    except ChatTemplateError:  # a template that cannot render (its error comes where the user asks for chat)
        chat, rendered = False, list(chosen)
    try:
        sample = _draft_acceptance(engine, rendered, FIRST_USE_TOKENS, FIRST_USE_BLOCK)
    except (CospecError, ChatTemplateError):
        sample = {}  # (a context too small for the prompts, say): the costs alone
    engine.reset()
    if not sample:
        return costs
    return Calibration({**costs.numbers, **sample}, costs.pair, costs.machine, _now(),
                       f"{len(chosen)} built-in prompts{' (chat)' if chat else ''}, {FIRST_USE_TOKENS} tokens "
                       f"each, the draft model's acceptance only", other_load=costs.other_load)


def _rendered(engine, prompts: Sequence, chat: bool) -> list:
    """Text prompts as the user's message in the target's chat template where `chat` (token lists as they are)."""
    return [engine.render_chat([{"role": "user", "content": p}]) if chat and isinstance(p, str) else p for p in prompts]


def _fixed_blocks(max_tokens: int):
    """Greedy, lossless, blocks of the default length whatever they cost: what acceptance is measured under."""
    from .params import GenerationParams

    return GenerationParams(max_tokens=max_tokens, adaptive_draft=False, arbiter="target", temperature=0.0)


def _draft_acceptance(engine, rendered: Sequence, max_tokens: int, block: int | None = None) -> dict:
    """The draft model's acceptance in fixed blocks, greedy and under chat's sampling (a seed per
    prompt): a drawn target token matches the draft's less often, or more, than the target's
    likeliest one, and sampled calls take the sampled one. {} without a draft model."""
    from .params import CHAT_SAMPLING

    if not engine.has_draft:
        return {}
    greedy = _fixed_blocks(max_tokens)
    if block is not None:
        greedy = replace(greedy, draft_max=block)
    measured = {}
    for key, params in (("draft_acceptance", greedy), ("draft_acceptance_sampled", replace(greedy, **CHAT_SAMPLING))):
        accepted = rejected = 0
        for seed, prompt in enumerate(rendered, start=SAMPLED_SEED):
            engine.reset()
            stats = engine.generate(prompt, replace(params, seed=seed), spec_type="draft").stats
            accepted += stats.draft_n_matched - stats.draft_n_matched_ngram
            rejected += stats.target_fallbacks
        if accepted + rejected > 0:
            measured[key] = accepted / (accepted + rejected)
    return measured


def busy_words(calibration: Calibration) -> str:
    return (f"other work took {calibration.other_load:.0%} of the CPUs while its costs were timed (more than "
            f"{max_load():.0%}; ${MAX_LOAD_ENV} sets the limit)")


def notice(message: str) -> None:
    warnings.warn(message, CalibrationNotice, stacklevel=3)
