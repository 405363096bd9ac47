"""Generation settings as one object, from the command line to the native loop.

Every numeric default is read from the native library's own
`cospec_generate_default_params()` / `cospec_fly_default_params()`, so C, the
Python API and the CLI cannot disagree. A field's `help` is also its CLI help
and `flags` its command-line spelling (llama.cpp's where one exists).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from . import _cospec

_NATIVE = _cospec.GenerateParams()
_FLY = _cospec.FLY_DEFAULTS
_AASD = _cospec.AASD_DEFAULTS
_LEARNED = _cospec.LEARNED_ARBITER_DEFAULTS

# How a generation decodes; who settles mismatches is the separate `arbiter`.
MODES = ("speculative", "target-only", "draft-only")
UNTIL_CONTEXT_ENDS = -1  # max_tokens as llama-cli's -n -1: the engine gives what the context has left
_NATIVE_MODE = {"speculative": _cospec.MODE_SPECULATIVE, "target-only": _cospec.MODE_TARGET_ONLY,
                "draft-only": _cospec.MODE_DRAFT_ONLY}


# --spec-type: where draft tokens come from (cospec.h's enum cospec_draft_source), spelled as
# llama.cpp spells it where the meaning is the same (its draft-simple is the draft model).
SPEC_TYPES = {"ngram": _cospec.DRAFT_NGRAM, "draft": _cospec.DRAFT_MODEL, "draft-simple": _cospec.DRAFT_MODEL,
              "head": _cospec.DRAFT_HEAD, "draft-eagle3": _cospec.DRAFT_HEAD, "draft-mtp": _cospec.DRAFT_HEAD,
              "draft-dflash": _cospec.DRAFT_HEAD, "auto": _cospec.DRAFT_AUTO, "none": _cospec.DRAFT_NONE}
# The head drafter each of llama.cpp's head spellings asks for (Engine.head must be it).
HEAD_SPEC_TYPES = {"draft-eagle3": "eagle3", "draft-mtp": "mtp", "draft-dflash": "dflash"}
# llama.cpp's n-gram kinds: each is this engine's n-gram drafter (the longest earlier match of the
# text's end, over the prompt, the reply and earlier requests, with its acceptance per match length),
# which does what each of them does and more; the kinds it has not: what to use instead.
LLAMA_NGRAM_KINDS = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache")
_FOREIGN_SPEC_TYPES = ("draft-dspark",)


def parse_spec_type(text: str) -> list[int]:
    """The draft sources of a --spec-type value (a comma list in order of precedence), as
    cospec_draft_source values; ValueError naming what is wrong."""
    names = [n.strip() for n in str(text).split(",")]
    sources = []
    for name in names:
        if name in _FOREIGN_SPEC_TYPES:
            raise ValueError(f"{name!r} is one of llama.cpp's kinds that this engine does not have; use head "
                             "(an EAGLE-3 head or a DFlash drafter as -md, or the target's MTP layers), draft (the draft model) or ngram")
        if name not in SPEC_TYPES and name not in LLAMA_NGRAM_KINDS:
            raise ValueError(f"unknown {name!r}: use ngram, draft, head (draft-eagle3, draft-mtp, draft-dflash), a comma list of "
                             "two of them (ngram,draft), auto or none")
        source = SPEC_TYPES.get(name, _cospec.DRAFT_NGRAM)
        if source in sources or ((name in ("auto", "none")) and len(names) > 1):
            raise ValueError(f"{text!r}: each of ngram, draft and head at most once; auto and none stand alone")
        sources.append(source)
    return sources


def spec_type_note(text: str) -> str | None:
    """What to say, once, where --spec-type names llama.cpp's n-gram kinds."""
    kinds = [n.strip() for n in str(text).split(",") if n.strip() in LLAMA_NGRAM_KINDS]
    if not kinds:
        return None
    return (f"{', '.join(kinds)}: llama.cpp's n-gram {'kind' if len(kinds) == 1 else 'kinds'}, which this engine's "
            "n-gram drafter covers (the longest earlier match of the text's end in the prompt, the reply and earlier "
            "requests; its block length from its acceptance per match length)")


def spec_type_heads(text: str) -> set[str]:
    """The head drafters these draft sources ask for by llama.cpp's names ("eagle3", "mtp", "dflash")."""
    return {HEAD_SPEC_TYPES[n.strip()] for n in str(text).split(",") if n.strip() in HEAD_SPEC_TYPES}


def spec_type_uses_model(text: str) -> bool:
    """Whether these draft sources can draft with the draft model (auto can)."""
    return any(s in (_cospec.DRAFT_MODEL, _cospec.DRAFT_AUTO) for s in parse_spec_type(text))


def _f(default: Any, help: str, flags: tuple[str, ...] = (), **extra) -> Any:
    return field(default=default, metadata={"help": help, "flags": flags, **extra})


# llama.cpp's names of settings that have another name here.
SETTING_ALIASES = {"n_predict": "max_tokens"}


@dataclass
class GenerationParams:
    """What one generation does. `Engine.generate(prompt, params, **overrides)` takes it."""

    mode: str = _f("speculative", "How to decode: speculative (draft, verify, arbitrate), target-only or draft-only.",
                   ("--mode",), choices=MODES)
    arbiter: Any = _f("target", "Who settles a mismatch in speculative mode: target (lossless), fly (FLy's rule), "
                                "aasd (AASD's conditional verification), "
                                "a learned arbiter (named, e.g. demo-lora, or its folder), auto (the bundled learned "
                                "arbiter made for this draft if there is one, else target), or an Arbiter object.",
                      ("--arbiter",))
    spec_type: str = _f("auto", "Where draft tokens come from, in order of precedence: ngram (the n-gram drafter: what "
                                "followed the longest earlier match of the text's end, in the prompt, the reply or "
                                "earlier requests; llama.cpp's ngram-simple, ngram-mod, ngram-map-k, ngram-map-k4v and ngram-cache "
                                "name it too), draft (the draft model), head (llama.cpp's head drafter: an EAGLE-3 "
                                "head or a DFlash drafter given as the draft or with -mh, or the target's MTP layers; "
                                "also spelled draft-eagle3, draft-mtp, draft-dflash), ngram,draft (the n-gram proposal where there is one, else the draft "
                                "model's), none. auto: ngram, then the head where the engine has one, then the draft "
                                "model; the draft model alone with an arbiter that keeps mismatches (it decides the "
                                "draft model's).",
                        ("--spec-type",))
    max_tokens: int = _f(_NATIVE.n_predict, "Most tokens to generate (-1: until the end of text or of the context).",
                         ("-n", "--n-predict"))
    draft_max: int = _f(_NATIVE.n_draft, "Most draft tokens per block (K).", ("--draft-max", "--spec-draft-n-max"))
    draft_min: int = _f(_NATIVE.n_draft_min, "Fewest draft tokens worth verifying: a shorter block (as the tuner, "
                                             "--draft-p-min or a grammar leaves it) is not verified and the target "
                                             "steps alone (0: any).", ("--draft-min", "--spec-draft-n-min"))
    draft_max_ngram: int = _f(_NATIVE.n_draft_ngram, "Most tokens per n-gram block: a copied span costs no model "
                                                     "step to draft and is often accepted whole.",
                              ("--draft-max-ngram",))
    draft_p_min: float = _f(_NATIVE.draft_p_min, "End a block early when the draft's top probability is below this "
                                                 "(greedy; 0: off).", ("--draft-p-min", "--spec-draft-p-min"))
    adaptive_draft: bool = _f(_NATIVE.adaptive_draft,
                              "Choose each block's length in [0, K]: from measured speed with the target arbiter, from "
                              "acceptance counts alone with an arbiter that keeps mismatches (so its output never "
                              "depends on timing); or always K.", ("--adaptive-draft/--fixed-draft",))
    draft_cost: float = _f(round(_NATIVE.draft_cost, 6), "Cost model of adaptive lengths with an arbiter that keeps: "
                                                        "one draft step in target steps (0: the pair's parameter "
                                                        "ratio; `bench` measures it).", ("--draft-cost",))
    verify_cost: float = _f(round(_NATIVE.verify_cost, 6), "Cost model of adaptive lengths with an arbiter that keeps: "
                                                          "each verified token beyond the first, in target steps "
                                                          "(negative: the one the learned arbiter was trained under, "
                                                          f"else {_cospec.DEFAULT_VERIFY_COST:g}; `bench` measures "
                                                          "it).", ("--verify-cost",))
    temperature: float = _f(_NATIVE.temperature, "Temperature (0: greedy).", ("--temp",))
    top_k: int = _f(_NATIVE.top_k, "Top-k sampling (0: off).", ("--top-k",))
    top_p: float = _f(_NATIVE.top_p, "Top-p sampling (1: off).", ("--top-p",))
    min_p: float = _f(_NATIVE.min_p, "Min-p sampling: drop tokens below this x the likeliest one's probability "
                                     "(0: off).", ("--min-p",))
    repeat_penalty: float = _f(_NATIVE.repeat_penalty, "Penalise tokens seen in the last repeat-last-n tokens "
                                                       "(1: off).", ("--repeat-penalty",))
    repeat_last_n: int = _f(_NATIVE.repeat_last_n, "Tokens of history the repeat penalty looks at (0: off, -1: the "
                                                   "whole context).", ("--repeat-last-n",))
    seed: int = _f(_NATIVE.seed, "Seed of sampling and of sampled arbiter decisions.", ("-s", "--seed"))
    sample_arbiter: bool = _f(_NATIVE.sample_arbiter, "Draw each arbiter decision from Bernoulli(P(keep)) instead of "
                                                      "thresholding it (training rollouts).", ("--sample-arbiter",))
    arbiter_threshold: float | None = _f(None, "Learned arbiters: keep a mismatch when P(keep) >= this "
                                               "(default: the arbiter's own).", ("--arbiter-threshold",))
    arbiter_head: str = _f("native", "Learned arbiters: run the head natively or with ONNX Runtime (onnx).",
                           ("--arbiter-head",), choices=("native", "onnx"))
    arbiter_gate: bool = _f(_LEARNED["use_gate"], "Learned arbiters: abstain on a prompt unlike the prompts they "
                                                  "were trained on (their domain gate: decoding is then lossless); "
                                                  "off: decide every prompt's mismatches.",
                            ("--arbiter-gate/--no-arbiter-gate",))
    fly_window: int = _f(_FLY["window"], "FLy: deferred window W (a kept mismatch needs the next W-1 draft tokens "
                                         "to match).", ("--fly-window",))
    fly_entropy: float = _f(round(_FLY["entropy_threshold"], 6), "FLy: minimum target entropy (nats) at a kept "
                                                                 "mismatch.", ("--fly-entropy",))
    fly_top_k: int = _f(_FLY["entropy_top_k"], "FLy: entropy over the k likeliest tokens (0: all).", ("--fly-top-k",))
    aasd_alpha: float = _f(round(_AASD["alpha"], 6), "AASD: how fast the keep threshold on the target's probability of "
                                                     "the draft token falls with the target's entropy.", ("--aasd-alpha",))
    aasd_beta: float = _f(round(_AASD["beta"], 6), "AASD: the keep threshold where the target is certain.",
                          ("--aasd-beta",))
    stop: tuple[str, ...] = _f((), "Stop strings.", ("--stop",))
    ignore_eos: bool = _f(_NATIVE.ignore_eos, "Keep generating past end-of-generation tokens.", ("--ignore-eos",))
    grammar: str | None = _f(None, "A GBNF grammar (llama.cpp's format) the output must match: draft proposals, the "
                                   "target's choices and kept tokens all follow it (--json-schema writes one from a "
                                   "JSON schema).", ("--grammar",))
    logprobs: bool = _f(_NATIVE.logprobs, "Record each token's log-probability under the model that chose it "
                                          "(the target's; the draft's in draft-only mode).", ())
    top_logprobs: int = _f(_NATIVE.n_top_logprobs, "With logprobs: also this many likeliest tokens at each "
                                                   f"position (0..{_cospec.N_TOP_LOGPROBS_MAX}).", ())

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop or ())

    def updated(self, **changes) -> "GenerationParams":
        """A copy with some fields changed (unknown names are an error; llama.cpp's names of a few,
        n_predict for max_tokens, are taken as theirs)."""
        for alias, name in SETTING_ALIASES.items():
            if alias in changes:
                if name in changes and changes[name] != changes[alias]:
                    raise TypeError(f"{alias} and {name} are one setting: give one")
                changes[name] = changes.pop(alias)
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise TypeError(f"unknown generation parameters: {', '.join(sorted(unknown))}")
        return replace(self, **changes)

    def validate(self) -> None:
        """Refuse bad settings early, naming the setting (InvalidArgumentError whose `field` is the
        field's name here). The native library is the one authority on ranges: this asks it
        (cospec_generate_params_check, and cospec_fly/aasd_params_check for the rules' settings).
        Checked here only what C never sees: the names of modes and draft sources, integers too
        wide for the native struct, and a learned arbiter's threshold (None here: its own)."""
        from .errors import InvalidArgumentError

        def bad(name: str, why: str):
            error = InvalidArgumentError(f"{name}: {why}")
            error.field = name  # the CLI names its flag
            raise error

        if self.mode not in MODES:
            bad("mode", f"{self.mode!r} is not one of {', '.join(MODES)}")
        try:
            parse_spec_type(self.spec_type)
        except ValueError as exc:
            bad("spec_type", str(exc))
        if not (0 < self.max_tokens < 2**31 or self.max_tokens == UNTIL_CONTEXT_ENDS):
            bad("max_tokens", "must be a positive 32-bit number, or -1 (until the end of text or of the context)")
        if not 0 <= self.seed < 2**64:
            bad("seed", "must be in [0, 2^64)")
        for name in ("draft_max", "draft_min", "draft_max_ngram", "top_k", "repeat_last_n", "top_logprobs"):
            if not -2**31 <= getattr(self, name) < 2**31:
                bad(name, "must be a 32-bit number")
        if self.arbiter_threshold is not None and not 0 <= self.arbiter_threshold <= 1:
            bad("arbiter_threshold", "must be in [0, 1]")
        for name in ("fly_window", "fly_top_k"):
            if not -2**31 <= getattr(self, name) < 2**31:
                bad(name, "must be a 32-bit number")
        until_context_ends = self.max_tokens == UNTIL_CONTEXT_ENDS  # resolved against the context later
        for refused, names in ((_cospec.generate_params_check((self.updated(max_tokens=1) if until_context_ends
                                                               else self).native()), NATIVE_FIELD_NAMES),
                               (_cospec.fly_params_check(self.fly_window, self.fly_entropy, self.fly_top_k), _FLY_FIELDS),
                               (_cospec.aasd_params_check(self.aasd_alpha, self.aasd_beta), _AASD_FIELDS)):
            if refused is not None:
                raise native_refusal(*refused, names=names)

    def native(self) -> "_cospec.GenerateParams":
        """The native parameters struct (arbiter, stop strings and grammar travel beside it)."""
        n = _cospec.GenerateParams()
        n.mode = _NATIVE_MODE[self.mode]
        n.draft_sources = parse_spec_type(self.spec_type)
        n.n_predict = self.max_tokens
        n.n_draft = self.draft_max
        n.n_draft_min = self.draft_min
        n.n_draft_ngram = self.draft_max_ngram
        n.draft_p_min = self.draft_p_min
        n.adaptive_draft = self.adaptive_draft
        n.draft_cost = self.draft_cost
        n.verify_cost = self.verify_cost
        n.temperature = self.temperature
        n.top_k = self.top_k
        n.top_p = self.top_p
        n.min_p = self.min_p
        n.repeat_penalty = self.repeat_penalty
        n.repeat_last_n = self.repeat_last_n
        n.seed = self.seed
        n.sample_arbiter = self.sample_arbiter
        n.ignore_eos = self.ignore_eos
        n.logprobs = self.logprobs or self.top_logprobs > 0
        n.n_top_logprobs = self.top_logprobs
        return n


DEFAULTS = GenerationParams()

# The settings whose field in cospec_generate_params has another name than here (native() sets
# each from its own); every other refused field is spelled the same on both sides.
NATIVE_FIELD_NAMES = {"n_predict": "max_tokens", "n_draft": "draft_max", "n_draft_min": "draft_min",
                      "n_draft_ngram": "draft_max_ngram", "n_top_logprobs": "top_logprobs", "draft_sources": "spec_type"}


# The rules' settings (cospec_fly_params, cospec_aasd_params) under their names here.
_FLY_FIELDS = {"window": "fly_window", "entropy_threshold": "fly_entropy", "entropy_top_k": "fly_top_k"}
_AASD_FIELDS = {"alpha": "aasd_alpha", "beta": "aasd_beta"}


def native_refusal(status: int, field: str, message: str, names: dict[str, str] = NATIVE_FIELD_NAMES):
    """The typed error of a setting the native checks refused (cospec_generate_params_check,
    cospec_generate_check, cospec_fly/aasd_params_check: status, the field in C's name, "[RULE: ]FIELD:
    why"), told under this side's name of the field (`names`), which its `field` holds."""
    from .errors import error_for_status

    name = names.get(field, field) or None
    marker = f"{field}: "
    why = message[message.index(marker) + len(marker):] if field and marker in message else message
    error = error_for_status(status, f"{name}: {why}" if name else why)
    error.field = name
    return error

# `chat` samples by default, with llama-cli's defaults for temperature, top-k, top-p and min-p
# and Ollama's repeat penalty (1.1 over the last 64 tokens): greedy small models loop.
# generate, bench, eval and the Python API stay greedy, so their results reproduce exactly.
CHAT_SAMPLING = dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1)


def param_flags(name: str) -> tuple[str, ...]:
    """A setting's command-line spelling (max_tokens: -n, --n-predict); () for one no command takes."""
    return next((f.metadata["flags"] for f in fields(GenerationParams) if f.name == name), ())
