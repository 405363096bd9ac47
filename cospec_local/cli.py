"""The `cospec-local` command line: generate, chat, serve, bench, eval, models.

Flags follow llama.cpp's where one exists (-m, -md, -p, -n, -c, -t, --temp, --seed).
"""
from __future__ import annotations

import difflib
import json
import re
import signal
import sys
import threading
import warnings
from dataclasses import MISSING, dataclass, field, fields, replace

import click
from click.core import ParameterSource

from . import _cospec
from .chat.template import ChatTemplateError
from .chat.display import abstained_note, colored, draft_off_note, other_vocab_note, stats_line
from .engine import FLASH_ATTN, Engine
from .errors import ArbiterSettingsWarning, CalibrationNotice, ContextFullError, CospecError, VocabMismatchError
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, NAMED_MODELS, resolve_model
from .params import CHAT_SAMPLING, GenerationParams, param_flags

MAX_THREADS = 512  # ggml's GGML_MAX_N_THREADS; the engine refuses more


MIN_CTX = 64  # smaller windows hold no useful prompt and reply


@dataclass
class LoadSettings:
    """How to open the engine: the command-line options every command that loads models shares."""

    target: str
    draft: str | None
    n_ctx: int
    n_threads: int
    n_gpu_layers: int | None  # None: all layers (llama.cpp's default), without asking for it
    n_gpu_layers_draft: int | None
    rpc: str | None
    flash_attn: str | None  # None: the engine's default
    chat_template: str | None  # None: the target's own
    draft_chat_template: str | None  # None: the draft's own (a draft of another vocabulary reads its own format)
    verbose: bool
    calibration: str = "auto"  # auto, none or a file (cospec_local.calibration)
    # llama.cpp's own loading settings, passed through as its flags name them (None: its default).
    llama: dict = field(default_factory=dict)

    def engine_options(self, draft: str | None) -> dict:
        """Engine's keyword arguments for these settings and `draft` (the one chosen for the mode)."""
        all_layers = -1
        return dict(target=self.target, draft=draft, n_ctx=self.n_ctx, n_threads=self.n_threads,
                    n_gpu_layers=all_layers if self.n_gpu_layers is None else self.n_gpu_layers,
                    n_gpu_layers_draft=all_layers if self.n_gpu_layers_draft is None else self.n_gpu_layers_draft,
                    rpc=self.rpc, flash_attn=self.flash_attn, chat_template=self.chat_template,
                    draft_chat_template=self.draft_chat_template, verbose=self.verbose,
                    calibration=None if self.calibration == "none" else self.calibration,
                    **{name: value for name, value in self.llama.items() if value is not None})


def _check_ctx(ctx, param, value: int) -> int:
    if 0 < value < MIN_CTX:
        raise click.BadParameter(f"{value} tokens is too small a context (0: the default, else at least {MIN_CTX})")
    return value


def model_options(fn):
    """Options shared by every command that opens an engine; the command receives one `load`."""
    options = [
        click.option("-m", "--model", "target", default=DEFAULT_TARGET, show_default=True,
                     help="Target GGUF file or named model."),
        click.option("-md", "--model-draft", "draft", default=None,
                     help=f"Draft GGUF file or named model (default: {DEFAULT_DRAFT} with the default target; for "
                          "another target its bundled draft, or a smaller named model with its vocabulary, else "
                          "target-only decoding)."),
        click.option("-c", "--ctx-size", "n_ctx", default=_cospec.DEFAULT_N_CTX, show_default=True,
                     type=click.IntRange(0, 1 << 24), callback=_check_ctx,
                     help="Context window in tokens, at most what the models were trained for (the demo pair: 512; "
                          "chat's /show gives the one in use)."),
        click.option("-t", "--threads", "n_threads", default=0, type=click.IntRange(0, MAX_THREADS),
                     help="CPU threads (0: all cores)."),
        click.option("-ngl", "--gpu-layers", "n_gpu_layers", default=None, type=click.IntRange(-1, 1 << 16),
                     help="Target layers to offload with a GPU build of llama.cpp (default, -1: all)."),
        click.option("-ngld", "--gpu-layers-draft", "n_gpu_layers_draft", default=None,
                     type=click.IntRange(-1, 1 << 16),
                     help="Draft layers to offload with a GPU build of llama.cpp (default, -1: all)."),
        click.option("--rpc", "rpc", default=None, metavar="HOST:PORT[,...]",
                     help="Put the target's layers (-ngl) on these `cospec-local rpc-server` machines (llama.cpp's "
                          "RPC backend); the draft stays here."),
        click.option("-fa", "--flash-attn", "flash_attn", default=None, type=click.Choice(sorted(FLASH_ATTN)),
                     help="llama.cpp's flash attention for both models (default: off for a model under "
                          f"{_cospec.FLASH_ATTN_CPU_OFF_MAX_PARAMS / 1e6:g}M parameters on the CPU, where it makes "
                          "verifying a block dear; llama.cpp's choice for larger models and offloaded layers)."),
        click.option("-b", "--batch-size", "n_batch", default=None, type=click.IntRange(1, 1 << 20),
                     help="llama.cpp's logical batch: most prompt tokens decoded at once (default 512)."),
        click.option("-ub", "--ubatch-size", "n_ubatch", default=None, type=click.IntRange(1, 1 << 20),
                     help="llama.cpp's physical batch: most tokens one compute step runs (default: the batch)."),
        click.option("-ctk", "--cache-type-k", "cache_type_k", default=None, metavar="TYPE",
                     help="The target's KV cache type for K: f32, f16 (default), bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, "
                          "q5_1."),
        click.option("-ctv", "--cache-type-v", "cache_type_v", default=None, metavar="TYPE",
                     help="The same for V (llama.cpp wants flash attention, -fa on, for a quantized V cache)."),
        click.option("-ctkd", "--cache-type-k-draft", "cache_type_k_draft", default=None, metavar="TYPE",
                     help="The draft's KV cache type for K."),
        click.option("-ctvd", "--cache-type-v-draft", "cache_type_v_draft", default=None, metavar="TYPE",
                     help="The draft's KV cache type for V."),
        click.option("-lm", "--load-mode", "load_mode", default=None,
                     type=click.Choice(["auto", "none", "mmap", "mlock", "mmap+mlock", "dio"]),
                     help="How llama.cpp loads the weights: auto (default: mapped unless a device cannot), none "
                          "(read), mmap, mlock or mmap+mlock (kept in RAM), dio (direct I/O)."),
        click.option("--no-mmap", "no_mmap", is_flag=True, help="Read the weights instead of mapping them (-lm none)."),
        click.option("--mlock", "mlock", is_flag=True, help="Keep the weights in RAM (-lm mmap+mlock; with --no-mmap: "
                                                            "mlock)."),
        click.option("-dev", "--device", "devices", default=None, metavar="DEV[,...]",
                     help="Devices for the target's offloaded layers (a GPU build of llama.cpp; `cospec-local "
                          "devices` lists them), or none: this machine's CPU alone."),
        click.option("-devd", "--device-draft", "devices_draft", default=None, metavar="DEV[,...]",
                     help="The same for the draft."),
        click.option("--chat-template", "chat_template", default=None, metavar="JINJA",
                     help="A chat template instead of the target's own: Jinja text as in a GGUF's "
                          "tokenizer.chat_template, or a name: chatml, gemma."),
        click.option("--chat-template-file", "chat_template_file", default=None,
                     type=click.Path(exists=True, dir_okay=False), help="The same, read from a file."),
        click.option("--chat-template-draft", "draft_chat_template", default=None, metavar="JINJA",
                     help="For a draft of another vocabulary, which reads a chat in its own format: a template "
                          "instead of the draft's own (Jinja text, or a name: chatml, gemma)."),
        click.option("--chat-template-draft-file", "draft_chat_template_file", default=None,
                     type=click.Path(exists=True, dir_okay=False), help="The same, read from a file."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's own log."),
        click.option("--calibration", "calibration", default="auto", show_default=True, metavar="auto|none|FILE",
                     help="The pair's costs and acceptance on this machine, which block lengths start from: auto, "
                          "the stored one (measured now where there is none; `cospec-local calibrate` measures "
                          "acceptance too); a file kept from an earlier one (its tokens again); none: priors."),
    ]
    names = ("target", "draft", "n_ctx", "n_threads", "n_gpu_layers", "n_gpu_layers_draft", "rpc", "flash_attn",
             "chat_template", "draft_chat_template", "verbose", "calibration")

    def wrapper(**kwargs):
        for name, flag in (("chat_template", "--chat-template"), ("draft_chat_template", "--chat-template-draft")):
            template_file = kwargs.pop(f"{name}_file")
            if template_file is None:
                continue
            if kwargs[name] is not None:
                raise click.UsageError(f"give {flag} or {flag}-file, not both")
            try:
                with open(template_file, encoding="utf-8") as f:
                    kwargs[name] = f.read()
            except (OSError, UnicodeDecodeError) as exc:
                raise click.BadParameter(str(exc), param_hint=f"{flag}-file") from None
        load = LoadSettings(**{name: kwargs.pop(name) for name in names}, llama=llama_settings(kwargs))
        return fn(load=load, **kwargs)

    wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
    wrapper.__click_params__ = list(getattr(fn, "__click_params__", []))
    for option in reversed(options):
        wrapper = option(wrapper)
    return wrapper


def llama_settings(kwargs: dict) -> dict:
    """llama.cpp's loading settings from the options model_options adds (popped from kwargs), as
    Engine takes them; --no-mmap and --mlock (llama.cpp's older spellings) become a load mode."""
    out = {name: kwargs.pop(name) for name in ("n_batch", "n_ubatch", "cache_type_k", "cache_type_v",
                                               "cache_type_k_draft", "cache_type_v_draft", "load_mode", "devices",
                                               "devices_draft")}
    no_mmap, mlock = kwargs.pop("no_mmap"), kwargs.pop("mlock")
    if (no_mmap or mlock) and out["load_mode"] is not None:
        raise click.UsageError("give -lm/--load-mode or --no-mmap/--mlock, not both")
    if no_mmap or mlock:
        out["load_mode"] = {(True, False): "none", (False, True): "mmap+mlock", (True, True): "mlock"}[(no_mmap, mlock)]
    return out


def generation_options(exclude: tuple[str, ...] = (), fresh_seed: bool = False, **defaults):
    """Click options for GenerationParams' fields: flags, help and defaults come from the
    dataclass (a command may change a default, e.g. chat's longer replies); the command
    receives one `params` object. fresh_seed: the command draws a new seed for each reply unless
    --seed is given (chat), which its help says instead of a default."""
    # Settings without a command-line spelling (logprobs) are the API's and the server's.
    chosen = [f for f in fields(GenerationParams) if f.name not in exclude and f.metadata["flags"]]
    takes_grammar = any(f.name == "grammar" for f in chosen)

    def decorate(fn):
        def wrapper(**kwargs):
            values = {f.name: kwargs.pop(f.name) for f in chosen}
            if takes_grammar:
                values["grammar"] = grammar_option(values["grammar"], *(kwargs.pop(n) for n in GRAMMAR_SOURCES))
            if "stop" in values:
                values["stop"] = tuple(values["stop"])
            params = GenerationParams(**values)
            try:
                params.validate()
            except ValueError as exc:
                field = getattr(exc, "field", None)
                flags = param_flags(field) if any(f.name == field for f in chosen) else None
                why = str(exc).split(": ", 1)[-1] if field else str(exc)
                raise click.BadParameter(why, param_hint=list(flags) if flags else None) from None
            return fn(params=params, **kwargs)

        wrapper.__name__, wrapper.__doc__ = fn.__name__, fn.__doc__
        wrapper.__click_params__ = list(getattr(fn, "__click_params__", []))
        if takes_grammar:  # llama-cli's other spellings of a grammar
            wrapper = click.option("-jf", "--json-schema-file", "json_schema_file", type=click.Path(dir_okay=False),
                                   help="The same, read from a file.")(wrapper)
            wrapper = click.option("-j", "--json-schema", "json_schema", help="A JSON schema the output must match "
                                   "(llama.cpp's converter writes its grammar).")(wrapper)
            wrapper = click.option("--grammar-file", "grammar_file", type=click.Path(dir_okay=False),
                                   help="A GBNF grammar file the output must match.")(wrapper)
        for f in reversed(chosen):
            default = defaults.get(f.name, f.default if f.default is not MISSING else None)
            meta = f.metadata
            extra: dict = {}
            if meta.get("choices"):
                extra["type"] = click.Choice(meta["choices"])
            elif f.name == "stop":
                extra["multiple"] = True
            elif f.name == "arbiter_threshold":
                extra["type"] = float
            elif f.name == "seed":
                extra["type"] = click.IntRange(0, 2**64 - 1)
            elif isinstance(default, bool) and "/" not in meta["flags"][0]:
                extra["is_flag"] = True
            fresh = fresh_seed and f.name == "seed"
            wrapper = click.option(*meta["flags"], f.name, default=default, show_default=default is not None and not fresh,
                                   help=meta["help"] + (" Default: a fresh one for each reply (/show gives it)."
                                                        if fresh else ""), **extra)(wrapper)
        return wrapper

    return decorate


GRAMMAR_SOURCES = ("grammar_file", "json_schema", "json_schema_file")


def grammar_option(grammar: str | None, grammar_file: str | None, json_schema: str | None,
                   json_schema_file: str | None) -> str | None:
    """The one grammar of --grammar, --grammar-file, -j/--json-schema and -jf/--json-schema-file."""
    given = [flag for flag, value in (("--grammar", grammar), ("--grammar-file", grammar_file),
                                      ("--json-schema", json_schema), ("--json-schema-file", json_schema_file))
             if value is not None]
    if len(given) > 1:
        raise click.UsageError(f"give one of {', '.join(given)}")
    if not given:
        return None
    flag = given[0]
    try:
        text = {"--grammar": grammar, "--json-schema": json_schema}.get(flag)
        if text is None:
            with open(grammar_file or json_schema_file, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None
    if flag in ("--grammar", "--grammar-file"):
        return text
    from .json_grammar import SchemaError, schema_grammar

    try:
        return schema_grammar(json.loads(text))
    except (json.JSONDecodeError, SchemaError) as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None


def pick_draft(target: str, draft: str | None, quiet: bool = False, measuring: bool = False) -> str | None:
    """The draft the user gave, or one chosen for the target (said on stderr); None: there is none.
    measuring (bench, eval): any named model with the target's vocabulary will do, since a pair is
    what they measure; otherwise only a bundled draft measured to pay for the target."""
    if draft is not None:
        return draft
    from .models import choose_draft

    try:
        chosen, why = choose_draft(target, paying_only=not measuring)
    except FileNotFoundError as exc:
        raise click.ClickException(str(exc)) from None
    if not quiet and target != DEFAULT_TARGET and why:
        if chosen:
            click.echo(f"note: draft {chosen}: {why} (-md to choose another)", err=True)
        elif measuring:
            click.echo(f"note: {why}: decoding with the target alone (-md DRAFT to speculate)", err=True)
    return chosen


def draft_for_mode(target: str, draft: str | None, params: GenerationParams,
                   quiet: bool = False) -> tuple[str | None, GenerationParams]:
    """The draft model to load for this mode (none for target-only, nor where --spec-type leaves
    it out), and the settings; said once on stderr. Without a draft model the n-gram drafter
    drafts alone; where --spec-type asks for the draft model and none is to be had, that is an
    error, and where nothing can draft the mode is target-only."""
    from .params import spec_type_heads, spec_type_note, spec_type_uses_model

    if params.mode == "target-only":
        return None, params
    if not quiet and (note := spec_type_note(params.spec_type)) is not None:
        click.echo(f"note: {note}", err=True)
    if params.mode == "speculative" and draft is not None and "eagle3" in spec_type_heads(params.spec_type):
        return draft, params  # -md is the EAGLE-3 head the engine drafts with
    if params.mode == "speculative" and not spec_type_uses_model(params.spec_type):
        if draft is not None and not quiet:
            click.echo(f"note: --spec-type {params.spec_type} leaves the draft model out: -md {draft} not loaded",
                       err=True)
        return None, params
    draft = pick_draft(target, draft, quiet)
    if draft is not None:
        return draft, params
    if params.mode == "draft-only" or params.spec_type in ("draft", "draft-simple"):
        flag = "--mode draft-only" if params.mode == "draft-only" else f"--spec-type {params.spec_type}"
        raise click.UsageError(f"{flag} needs a draft model: give one with -md DRAFT")
    return None, params


def run_record(engine: Engine, params: GenerationParams, result) -> dict:
    """A generation as --json prints it: the result, and what produced it (the models, the draft
    sources asked for and the blocks each drafted)."""
    s = result.stats
    head = engine.draft_path if engine.head == "eagle3" else engine.target_path if engine.head == "mtp" else None
    return {**result.to_json(),
            "models": {"target": engine.target_path, "draft": engine.draft_path if engine.has_draft else None,
                       "head": None if engine.head is None else {"kind": engine.head, "path": head}},
            "spec_type": params.spec_type if params.mode == "speculative" else None,
            "blocks_by_source": {"ngram": s.blocks_ngram, "head": s.blocks_head,
                                 "draft": s.blocks - s.blocks_ngram - s.blocks_head}}


def without_last_newline(text: str) -> str:
    """A prompt read from a file or standard input, less the newline that ends its last line, as
    llama-cli's -f reads it (an editor's final newline would otherwise change the reply)."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def drafting_line(draft: str | None, params: GenerationParams | None) -> str:
    """Where draft tokens come from, in words: the draft model's file and, where the settings draft
    with it, the n-gram drafter."""
    from .params import parse_spec_type

    from .arbiter.catalog import resolve_auto

    sources = parse_spec_type(params.spec_type) if params is not None and params.mode == "speculative" else []
    arbiter = None if params is None else params.arbiter if params.arbiter != "auto" else resolve_auto(
        resolve_model(draft) if draft else None)
    ngram = _cospec.DRAFT_NGRAM in sources or (_cospec.DRAFT_AUTO in sources and arbiter in ("target", None))
    if draft is None:
        return "- (the n-gram drafter drafts; -md DRAFT adds a draft model)" if ngram else "-"
    path = resolve_model(draft)
    return f"{path}" + (" (an EAGLE-3 head)" if gguf_architecture(path) == "eagle3" else "") + \
        (" and the n-gram drafter" if ngram else "")


def gguf_architecture(path) -> str | None:
    """A GGUF's general.architecture, or None where the file cannot be read as one (the engine's
    load then says why)."""
    import pathlib

    from .models import read_gguf_header

    try:
        return read_gguf_header(pathlib.Path(path), {"general.architecture"}).get("general.architecture")
    except (OSError, ValueError):
        return None


def context_note(load: LoadSettings, engine: Engine) -> str | None:
    """Where -c asked for more than the models were trained for: the context the engine holds."""
    ctx = click.get_current_context(silent=True)
    given = ctx is not None and "n_ctx" in ctx.params and \
        ctx.get_parameter_source("n_ctx") not in (ParameterSource.DEFAULT, None)
    if given and load.n_ctx > engine.n_ctx:
        return (f"-c {load.n_ctx} is more than the models were trained for: the context holds {engine.n_ctx} "
                f"tokens")
    return None


def gpu_notice(load: LoadSettings, quiet: bool) -> None:
    """Say once that -ngl/-ngld do nothing on a build of llama.cpp without a GPU backend."""
    asked = [flag for flag, value in (("-ngl", load.n_gpu_layers), ("-ngld", load.n_gpu_layers_draft))
             if value not in (None, 0)]
    if asked and not quiet and not _cospec.supports_gpu_offload():
        click.echo(f"warning: {'/'.join(asked)} ignored: this llama.cpp build has no GPU backend (reinstall with "
                   "CMAKE_ARGS=\"-DGGML_CUDA=on\" ./install.sh, or -DGGML_METAL=on on a Mac)", err=True)


def open_engine(load: LoadSettings, draft: str | None, quiet: bool = False,
                params: GenerationParams | None = None) -> Engine:
    """The engine for these settings, with `draft` (the one chosen for the mode; None: target alone).
    Says which models load and, with params, where draft tokens will come from."""
    show = not quiet and sys.stderr.isatty()
    last = {"which": None, "shown": -1}

    def progress(which: str, value: float):
        percent = int(value * 100)
        if show and (which != last["which"] or percent // 5 != last["shown"] // 5):
            click.echo(f"\rloading {which} model {percent:3d}%", err=True, nl=percent >= 100)
            last.update(which=which, shown=percent)
        return True

    gpu_notice(load, quiet)
    try:
        if not quiet:
            click.echo(f"target: {resolve_model(load.target)}\ndraft:  {drafting_line(draft, params)}", err=True)
        engine = Engine(**load.engine_options(draft), progress=progress)
        if not quiet and (note := other_vocab_note(engine)) is not None:
            click.echo(f"note: {note}", err=True)
        if not quiet and (note := context_note(load, engine)) is not None:
            click.echo(f"note: {note}", err=True)
        if not quiet and engine.head == "mtp" and params is not None and params.mode == "speculative":
            click.echo("note: the target carries multi-token-prediction layers, and they draft where --spec-type "
                       "takes the head (auto, head, draft-mtp)", err=True)
        return engine
    except VocabMismatchError as exc:
        raise click.ClickException(f"{exc}\nfix: -md with a draft whose tokenizer writes any text (byte-level BPE or "
                                   "SentencePiece with byte fallback, as most current models have), or --mode "
                                   "target-only") from None
    except ChatTemplateError as exc:
        raise click.ClickException(f"the chat template does not compile: {exc}") from None
    except (CospecError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def chat_banner(target: str, engine: Engine) -> str | None:
    """What the models are for: the task pair says it only knows its tasks and names the general
    pair; another model shows the description in its metadata, if any."""
    from .models import TASK_PAIR_EXAMPLES, TASK_PAIR_SCOPE, prompt_style

    if prompt_style(target) == "task":
        arithmetic, function = TASK_PAIR_EXAMPLES
        return (f"{TASK_PAIR_SCOPE} For example:\n{arithmetic}\nor a function to write (a def line and a docstring "
                f"with an example):\n{function}\nFor general chat: cospec-local chat -m smollm2-135m")
    description = engine.meta("general.description")
    return description[:300] if description else None


def template_notice(engine: Engine) -> None:
    """Say once that the model's own chat template was set aside (it did not compile)."""
    reason = getattr(engine.chat_template, "fallback_reason", None)
    if reason:
        click.echo(f"note: the model's chat template cannot be used ({reason}); using ChatML instead", err=True)


# A single dash and two or more letters: llama.cpp's multi-letter flags (-ngl, -sys, -cnv).
SINGLE_DASH_WORD = re.compile(r"-[A-Za-z][A-Za-z-]+\Z")


class WholeFlagCommand(click.Command):
    """A command that reads a single-dash flag of several letters whole, as llama.cpp does: one it
    does not know is refused by its whole name, where click would read a known short flag and a
    value (-sys as -s 'ys', -cnv as -c 'nv'). -n16 and -t2 still read as a flag and its value."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        known, takes_value = set(), set()
        for param in self.get_params(ctx):
            if isinstance(param, click.Option):
                known.update(param.opts + param.secondary_opts)
                if not param.is_flag and not param.count:
                    takes_value.update(param.opts)
        value_next = False
        for arg in args:
            if value_next:  # an option's value, e.g. -p "-abc"
                value_next = False
                continue
            if arg == "--":
                break
            if arg in takes_value:
                value_next = True
            elif SINGLE_DASH_WORD.match(arg) and arg not in known:
                if arg in LLAMA_FLAG_HINTS.get(self.name, {}):
                    raise click.UsageError(f"no option {arg} here: {LLAMA_FLAG_HINTS[self.name][arg]}", ctx=ctx)
                words = sorted(name for name in known if len(name) > 2)
                raise click.NoSuchOption(arg, possibilities=difflib.get_close_matches(arg, words, n=3, cutoff=0.6),
                                         ctx=ctx)
        return super().parse_args(ctx, args)


# llama-cli's flags whose behaviour is another command here.
LLAMA_FLAG_HINTS = {"generate": {"-cnv": "a conversation is `cospec-local chat` (it takes -sys, -n and the other flags)",
                                 "-no-cnv": "generate never converses (it is llama-cli's -no-cnv already)"}}


# Ollama's verbs without a command of their own here: what to use instead.
OLLAMA_HINTS = {"ps": "engines run inside the process that opened them; a server's are at GET /slots and /health",
                "pull": "models are GGUF files: pass a path with -m, or a named one (`cospec-local models`)",
                "show": "`cospec-local models` describes the named models; chat's /show the loaded ones"}


class WholeFlagGroup(click.Group):
    command_class = WholeFlagCommand

    def resolve_command(self, ctx, args):
        """Ollama's verbs as aliases: `list` is models; `run MODEL` is chat -m MODEL, and
        `run MODEL PROMPT` answers that one message (generate --chat) and exits."""
        if self.name == "main" and args:
            if args[0] == "list":
                args = ["models", *args[1:]]
            elif args[0] == "run":
                rest = list(args[1:])
                model = ["-m", rest.pop(0)] if rest and not rest[0].startswith("-") else []
                if rest and not rest[0].startswith("-"):
                    args = ["generate", *model, "--chat", "--no-display-prompt", "-p", rest.pop(0), *rest]
                else:
                    args = ["chat", *model, *rest]
            elif args[0] in OLLAMA_HINTS and args[0] not in self.commands:
                raise click.UsageError(f"no command {args[0]!r} here: {OLLAMA_HINTS[args[0]]}", ctx=ctx)
        return super().resolve_command(ctx, args)


WholeFlagGroup.group_class = WholeFlagGroup


@click.group(cls=WholeFlagGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cospec-local")
def main():
    """Collaborative speculative decoding: a draft model proposes, a target verifies,
    an arbiter decides where they disagree."""


@main.command()
@model_options
@generation_options(arbiter="auto")
@click.option("-p", "--prompt", default=None,
              help="Prompt text ('-': standard input; or -f FILE, or the prompt on standard input).")
@click.option("-f", "--file", "prompt_file", type=click.File("r", encoding="utf-8"), default=None,
              help="Read the prompt from a file ('-': standard input) without its last newline, as llama-cli's -f.")
@click.option("--chat", "as_chat", is_flag=True, help="Send the prompt as a user message through the chat template.")
@click.option("-sys", "--system-prompt", "system", default=None,
              help="A system message before the prompt (implies --chat).")
@click.option("--no-display-prompt", "hide_prompt", is_flag=True, help="Print only the generated text.")
@click.option("--jinja", "llama_cli_habits", is_flag=True, hidden=True,
              help="llama-cli's: chat templates are always Jinja here.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, provenance, decisions, stats.")
@click.option("--color", is_flag=True, help="Colour draft tokens: green matched, magenta kept by the arbiter.")
def generate(load, params, prompt, prompt_file, as_chat, system, hide_prompt, llama_cli_habits, as_json, color):
    """Generate a continuation of a prompt."""
    if prompt is not None and prompt_file is not None:
        raise click.BadParameter("give the prompt once: -p or -f", param_hint="-p/-f")
    if prompt is None or prompt == "-":
        if prompt_file is None and prompt is None and sys.stdin.isatty():
            raise click.UsageError("no prompt: give -p PROMPT, -f FILE, or the prompt on standard input")
        prompt = without_last_newline((prompt_file or sys.stdin).read())
        if not prompt.strip():
            raise click.UsageError("the prompt is empty")
    as_chat = as_chat or system is not None
    draft, params = draft_for_mode(load.target, load.draft, params, quiet=as_json)
    engine = open_engine(load, draft, quiet=as_json, params=params)
    with engine:
        try:
            messages = [{"role": "system", "content": system}] if system is not None else []
            messages.append({"role": "user", "content": prompt})
            tokens = engine.prompt_tokens(engine.render_chat(messages) if as_chat else prompt)
            draft_tokens = engine.render_draft_chat(messages) if as_chat else None
        except ChatTemplateError as exc:
            raise click.ClickException(str(exc)) from None
        except ContextFullError as exc:  # before the prompt is echoed
            raise click.ClickException(str(exc)) from None
        if as_chat:
            template_notice(engine)
        try:
            if params.mode == "speculative":  # a bad arbiter fails before the prompt is echoed
                engine.arbiter_for(params)
            if as_json:
                result = engine.generate(tokens, params, draft_prompt=draft_tokens)
                click.echo(json.dumps(run_record(engine, params, result), ensure_ascii=False))
                return
            if not as_chat and not hide_prompt:
                click.echo(prompt, nl=False)
            color = color and sys.stdout.isatty()  # no escape codes into a file or a pipe
            for event in engine.stream(tokens, params, draft_prompt=draft_tokens):
                click.echo(colored(event.text, event.provenance, color), nl=False)
            click.echo()
            click.echo(stats_line(engine.last_result), err=True)
            for note in (abstained_note(engine.last_result), draft_off_note(engine.last_result)):
                if note is not None:
                    click.echo(note, err=True)
        except KeyboardInterrupt:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the partial output short
            if as_json and engine.last_result is not None:
                click.echo(json.dumps(run_record(engine, params, engine.last_result), ensure_ascii=False))
            else:
                click.echo("\n[interrupted]", err=True)
            sys.exit(130)
        except (CospecError, FileNotFoundError) as exc:
            raise click.ClickException(str(exc)) from None


@main.command()
@model_options
@generation_options(max_tokens=512, arbiter="auto", fresh_seed=True, **CHAT_SAMPLING)
@click.option("-sys", "--system-prompt", "--system", "system", default=None, help="System message.")
@click.option("-cnv", "--conversation", "--jinja", "llama_cli_habits", is_flag=True, hidden=True,
              help="llama-cli's: chat always converses and renders Jinja templates.")
@click.option("--color", is_flag=True, help="Colour draft tokens: green matched, magenta kept by the arbiter.")
def chat(load, params, system, color, llama_cli_habits):
    """Talk with the model pair. /? for help."""
    from .chat.session import ChatSession

    if sys.stdin.isatty():
        # Ctrl-C stops a reply. A process started as a background job of a non-interactive
        # shell inherits SIGINT ignored; on a terminal, take the key back.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    draft, params = draft_for_mode(load.target, load.draft, params)
    engine = open_engine(load, draft, params=params)
    with engine:
        try:
            engine.arbiter_for(params) \
                if params.mode == "speculative" else None  # a bad arbiter fails now, not at the first reply
        except (CospecError, FileNotFoundError) as exc:
            raise click.ClickException(str(exc)) from None
        try:
            template_notice(engine)
        except ChatTemplateError as exc:
            raise click.ClickException(str(exc)) from None
        # A seed nobody set is drawn anew for each reply, as llama-cli and Ollama do (/show tells it).
        seed_given = click.get_current_context().get_parameter_source("seed") != ParameterSource.DEFAULT
        ChatSession(engine, params, system=system, color=color, seed_fixed=seed_given).run(
            chat_banner(load.target, engine))


LOOPBACK = ("127.0.0.1", "::1", "localhost")


@main.command()
@model_options
@generation_options(exclude=("seed", "sample_arbiter", "stop", "ignore_eos"), max_tokens=512, arbiter="auto",
                    **CHAT_SAMPLING)
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Anything but loopback lets other machines in: use --api-key then.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free one).")
@click.option("-np", "--parallel", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Engines, each a process generating one request at a time (each loads the models once more; "
                   "give each its share of the cores with -t).")
@click.option("--queue", "max_waiting", default=16, show_default=True, type=click.IntRange(0, 1 << 16),
              help="Requests that may wait for a busy engine; beyond that the answer is 503 with Retry-After.")
@click.option("--api-key", default=None, envvar="COSPEC_API_KEY",
              help="Require Authorization: Bearer KEY on /v1 and /metrics (also from $COSPEC_API_KEY).")
@click.option("-a", "--alias", default=None, help="The model name clients use (default: the -m value).")
@click.option("--strict", is_flag=True, help="Refuse requests with fields the API does not know (400) and model "
                                            "names this server does not serve (404; else any name gets the loaded "
                                            "model, as llama-server does).")
def serve(load, params, host, port, parallel, max_waiting, api_key, alias, strict):
    """An OpenAI-compatible server (/v1/chat/completions, /v1/completions) with a web chat at /.

    Requests may set mode and arbiter (the named ones, or this command's) per request; requests
    without a seed get a fresh one, reported back in the response. Needs the `server` extra."""
    try:
        from .server import CospecServer, ServerSettings, bind
        from .server import serve as run_server
        from .server.workers import EngineSpec, EngineUnavailable, EngineWorker
    except ImportError as exc:
        raise click.ClickException(f"serve needs the server extra ({exc.name} is missing): "
                                   "pip install 'cospec-local[server]'") from None
    if host not in LOOPBACK and api_key is None:
        click.echo(f"warning: listening on {host} without --api-key: anyone who can reach this port can use the "
                   "models", err=True)
    try:
        sock = bind(host, port)  # before loading: a taken port fails at once
    except OSError as exc:
        raise click.ClickException(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    draft, params = draft_for_mode(load.target, load.draft, params)
    gpu_notice(load, quiet=False)
    click.echo(f"target: {resolve_model(load.target)}\ndraft:  {drafting_line(draft, params)}", err=True)
    options = load.engine_options(draft)
    spec = EngineSpec(**{k: v for k, v in options.items() if k not in load.llama}, preload=params,
                      llama={k: v for k, v in options.items() if k in load.llama})
    workers = [EngineWorker(spec) for _ in range(parallel)]
    try:
        for i, worker in enumerate(workers):
            if parallel > 1:
                click.echo(f"starting engine {i + 1} of {parallel}", err=True)
            try:
                worker.start()  # a bad model or arbiter fails here, not at the first request
            except EngineUnavailable as exc:
                raise click.ClickException(str(exc)) from None
        from .models import TASK_PAIR_SCOPE, prompt_style

        about = TASK_PAIR_SCOPE + " For general chat: cospec-local serve -m smollm2-135m" \
            if prompt_style(load.target) == "task" else None
        settings = ServerSettings(model_id=alias or load.target, target=str(load.target), draft=draft, about=about,
                                  api_key=api_key, strict=strict, max_waiting=max_waiting,
                                  allowed_hosts=frozenset(LOOPBACK) if host in LOOPBACK else None)
        run_server(CospecServer(workers, params, settings), sock)
    finally:
        sock.close()
        for worker in workers:
            worker.close()


@main.command()
@model_options
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Text file, one prompt per line, to measure acceptance on: your own workload (default: a "
                   "built-in set of questions and copy-editing requests, or task prompts for the demo pair).")
@click.option("--task", "task_families", default=None,
              help="Comma-separated task families whose test prompts to measure acceptance on instead.")
@click.option("--n-prompts", default=8, show_default=True, type=click.IntRange(1, 1000),
              help="Number of task prompts with --task.")
@click.option("--chat/--no-chat", "as_chat", default=None,
              help="Send each prompt through the chat template (default: where the target has one, for the "
                   "built-in prompts).")
@click.option("-n", "--n-predict", "max_tokens", default=64, show_default=True, type=click.IntRange(8, 4096),
              help="Tokens generated per prompt to measure acceptance.")
@click.option("--no-draft", is_flag=True, help="The target alone (what `--spec-type ngram` runs): its costs and the "
                                                "n-gram drafter's acceptance.")
@click.option("--json", "as_json", is_flag=True, help="Print the calibration as JSON, with where it is stored.")
def calibrate(load, prompts_file, task_families, n_prompts, as_chat, max_tokens, no_draft, as_json):
    """Measure the pair's costs and acceptance on this machine and store them: every later engine of the
    pair here starts its block lengths from them (greedy calls drafting from the first block; sampled
    and arbiter calls reproducible under the calibration's id)."""
    from . import calibration as calibration_store
    from .evaluation.bench import task_prompts
    from .models import prompt_style

    if prompts_file and task_families:
        raise click.BadParameter("give either --prompts or --task")
    if not prompts_file and not task_families and prompt_style(load.target) == "task":
        task_families = "arith,pyfunc"
    prompts = None
    if prompts_file:
        with open(prompts_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
        if not prompts:
            raise click.BadParameter("the file has no prompt", param_hint="--prompts")
    elif task_families:
        try:
            prompts = task_prompts([f.strip() for f in task_families.split(",") if f.strip()], n_prompts)
        except (KeyError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    if no_draft and load.draft is not None:
        raise click.BadParameter("give -md or --no-draft, not both")
    # The pair `generate` and `chat` would load for this target (a draft that pays, or none).
    draft = None if no_draft else pick_draft(load.target, load.draft, quiet=as_json)
    load = replace(load, calibration="none")  # measured here, not taken from the store
    engine = open_engine(load, draft, quiet=as_json)
    with engine:
        try:
            measured = engine.calibrate(prompts, chat=as_chat, max_tokens=max_tokens)
        except (CospecError, OSError) as exc:
            raise click.ClickException(str(exc)) from None
        path = calibration_store.store_path(engine.calibration_pair, engine.calibration_machine)
    if as_json:
        click.echo(json.dumps({**measured.to_json(), "path": str(path)}))
        return
    click.echo(measured.summary())
    click.echo(f"stored in {path}")


@main.command("rpc-server")
@click.option("-H", "--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. The protocol has no authentication: use a trusted network only.")
@click.option("-p", "--port", default=50052, show_default=True, type=click.IntRange(1, 65535))
@click.option("-t", "--threads", "n_threads", default=0, type=click.IntRange(0, MAX_THREADS),
              help="CPU threads when serving the CPU (0: all cores).")
@click.option("--cache", "cache_dir", default=None, type=click.Path(file_okay=False),
              help="Folder caching large tensors sent here, so reloading a model sends less.")
def rpc_server(host, port, n_threads, cache_dir):
    """Lend this machine's GPUs (else its CPU) to engines elsewhere (their --rpc HOST:PORT), as
    llama.cpp's rpc-server does. Runs until stopped (Ctrl-C)."""
    import os

    from . import _cospec
    from .errors import from_native

    if host not in LOOPBACK:
        click.echo(f"warning: listening on {host}: llama.cpp's RPC protocol has no authentication or encryption; "
                   "anyone who reaches this port can run computations here", err=True)
    if not _cospec.supports_rpc():
        raise click.ClickException("this llama.cpp build has no RPC backend: reinstall with "
                                   "CMAKE_ARGS=\"-DGGML_RPC=on\" (./install.sh does)")
    if cache_dir:
        os.makedirs(cache_dir, exist_ok=True)
    click.echo(f"rpc-server on {host}:{port}", err=True)
    failure: list[BaseException] = []

    def run_server():
        try:
            _cospec.rpc_server_run(host, port, n_threads, cache_dir)
        except _cospec.CospecError as exc:
            failure.append(from_native(exc))

    # The server never returns; it runs beside this thread so that Ctrl-C ends the process.
    server = threading.Thread(target=run_server, name="cospec-rpc-server", daemon=True)
    server.start()
    while server.is_alive():
        server.join(0.2)
    raise click.ClickException(str(failure[0]) if failure else "the RPC server stopped")


RUNS_HELP = ("Comma-separated runs: target-only, draft-only, sps (lossless), ngram (sps from the n-gram drafter "
             "alone), head (from the head drafter alone: an EAGLE-3 head as -md, or the target's MTP layers), fly, "
             "aasd, cospec (the bundled learned "
             "arbiter for this draft), cospec:NAME_OR_FOLDER, speculative:ARBITER.")


def parse_runs_option(text: str | None, draft: str | None, default: str = ""):
    """The runs asked for; by default `default` and, where a bundled learned arbiter fits the
    draft, cospec (the project's headline run)."""
    from .arbiter.catalog import bundled_arbiter_for
    from .evaluation.runs import parse_runs

    try:
        draft_path = resolve_model(draft) if draft else None
        if text is None and draft_path is not None and gguf_architecture(draft_path) == "eagle3":
            text = "target-only,ngram,head,sps"  # a head is no draft model: nothing for an arbiter to keep
        if text is None:
            text = default + (",cospec" if bundled_arbiter_for(draft_path) else "")
        return parse_runs(text, draft_path)
    except (ValueError, FileNotFoundError) as exc:
        raise click.BadParameter(str(exc)) from None


@main.command()
@model_options
@generation_options(exclude=("mode", "arbiter", "draft_max", "stop", "ignore_eos"), max_tokens=64,
                    adaptive_draft=False)
@click.option("--draft-max", "draft_max_list", default=str(GenerationParams().draft_max), show_default=True,
              help="Comma-separated list of K to measure.")
@click.option("--runs", "--modes", "runs_text", default=None, help=RUNS_HELP + " [default: target-only,sps,fly, "
                                                                               "and cospec where an arbiter ships for "
                                                                               "the draft]")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Text file, one prompt per line (default: a built-in set, or task prompts for the demo pair).")
@click.option("--task", "task_families", default=None,
              help="Comma-separated task families whose test prompts to use instead (default for the demo pair: "
                   "arith,pyfunc).")
@click.option("--n-prompts", default=8, show_default=True, help="Number of task prompts with --task.")
@click.option("--repeat", default=3, show_default=True, type=click.IntRange(1, 1000),
              help="Runs of each prompt per run and K; the speed-up's range over them is shown.")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap each prompt in the chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Also write the results to this folder: bench.json (with the command line) and bench.md.")
def bench(load, params, draft_max_list, runs_text, prompts_file,
          task_families, n_prompts, repeat, as_chat, as_json, out_dir):
    """Measure runs (target-only, sps, fly, learned arbiters) on the same prompts, in one process."""
    from .evaluation.bench import BUILTIN_PROMPTS, markdown_table, run_bench, task_prompts
    from .models import prompt_style

    try:
        ks = [int(k) for k in draft_max_list.split(",") if k.strip()]
    except ValueError:
        raise click.BadParameter("--draft-max takes integers, e.g. 1,2,4,8") from None
    draft = pick_draft(load.target, load.draft, quiet=as_json, measuring=True)
    runs = parse_runs_option(runs_text, draft, "target-only,sps,fly")
    if prompts_file and task_families:
        raise click.BadParameter("give either --prompts or --task")
    if not prompts_file and not task_families and prompt_style(load.target) == "task":
        task_families = "arith,pyfunc"
    if not task_families and click.get_current_context().get_parameter_source("n_prompts") != ParameterSource.DEFAULT:
        raise click.BadParameter("--n-prompts counts task prompts: give --task too (--prompts and the built-in "
                                 "prompts are used whole)", param_hint="--n-prompts")
    prompts = BUILTIN_PROMPTS
    if prompts_file:
        with open(prompts_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    elif task_families:
        try:
            prompts = task_prompts([f.strip() for f in task_families.split(",") if f.strip()], n_prompts)
        except (KeyError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    engine = open_engine(load, draft, quiet=as_json)
    with engine:
        try:
            report = run_bench(engine, prompts, ks, runs, params, repeat, as_chat,
                               progress=None if as_json else lambda msg: click.echo(msg, err=True))
        except (CospecError, FileNotFoundError, ChatTemplateError) as exc:
            raise click.ClickException(str(exc)) from None
    if out_dir:
        import os

        os.makedirs(out_dir, exist_ok=True)
        report_file = os.path.join(out_dir, "bench.json")
        with open(report_file, "w", encoding="utf-8") as f:
            json.dump({"command": ["cospec-local", *sys.argv[1:]], **report.to_json()}, f, indent=2)
        with open(os.path.join(out_dir, "bench.md"), "w", encoding="utf-8") as f:
            f.write(f"`cospec-local {' '.join(sys.argv[1:])}`\n\n{markdown_table(report)}\n")
        if not as_json:
            click.echo(f"written: {report_file}, {os.path.join(out_dir, 'bench.md')}", err=True)
    if as_json:
        _warn_if_busy(report.other_load)
        click.echo(json.dumps(report.to_json(), indent=2))
    else:
        click.echo(markdown_table(report))


def _warn_if_busy(other_load: float | None) -> None:
    """With --json the table's busy-machine warning goes to stderr instead."""
    from .evaluation.machine import busy_note

    if (note := busy_note(other_load)) is not None:
        click.echo(f"warning: {note}", err=True)


@main.command("eval")
@model_options
@generation_options(exclude=("mode", "arbiter", "stop"), max_tokens=256)
@click.option("--task", required=True, help="Task family (arith, pyfunc, listops) or a benchmark jsonl file.")
@click.option("--split", default=None, type=click.Choice(["train", "dev", "test"]),
              help="Which split: default test for a family, every row for a file (a file's split: the rows whose "
                   "prompt hashes to it, 70/10/20).")
@click.option("--limit", default=None, type=click.IntRange(1, None),
              help="Number of problems (default: 200 for a family, all of a file).")
@click.option("--runs", "--modes", "runs_text", default=None,
              help=RUNS_HELP + " [default: target-only,draft-only,sps,fly, and cospec where an arbiter ships for "
                               "the draft]")
@click.option("--chat", "as_chat", is_flag=True, help="Send each problem through the chat template.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for records.jsonl (resumable), config.json, results.json, results.md and a PNG plot.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
@click.option("--unsafe-code-execution", is_flag=True,
              help="Where bubblewrap cannot isolate generated code, run it anyway, unisolated (unsafe).")
def eval_command(load, params, task, split, limit, runs_text,
                 as_chat, out_dir, as_json, unsafe_code_execution):
    """Accuracy and speed of each run on a task, with oracle union and recovered non-nested successes."""
    import os
    from pathlib import Path

    from .tasks.sandbox import UNSAFE_ENV, SandboxUnavailableError

    if unsafe_code_execution:
        os.environ[UNSAFE_ENV] = "1"

    from .evaluation.task_eval import evaluate, markdown
    from .tasks import load_task, score

    draft = pick_draft(load.target, load.draft, quiet=as_json, measuring=True)
    runs = parse_runs_option(runs_text, draft, "target-only,draft-only,sps,fly")
    try:
        problems = load_task(task, split, limit)
    except (KeyError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    is_file = task.endswith((".jsonl", ".gz"))
    title = f"{Path(task).name} ({split or 'all'})" if is_file else f"{task} ({split or 'test'})"
    engine = open_engine(load, draft, quiet=as_json)

    def progress(items):
        with click.progressbar(items, label="evaluating", file=sys.stderr) as bar:
            yield from bar

    with engine:
        try:
            summary = evaluate(engine, problems, runs, score, Path(out_dir) if out_dir else None, params, as_chat,
                               title, progress=None if as_json else progress)
        except (CospecError, ValueError, FileNotFoundError, SandboxUnavailableError) as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("\n[interrupted: rerun the same command to resume]" if out_dir else "\n[interrupted]", err=True)
            sys.exit(130)
    if as_json:
        _warn_if_busy(summary.get("other_load"))
    click.echo(json.dumps(summary, indent=1) if as_json else markdown(summary, title))
    if summary.get("written") and not as_json:
        click.echo("written: " + ", ".join(summary["written"]), err=True)


@main.command()
def devices():
    """List the devices this llama.cpp build offloads to, as -dev and -devd name them."""
    names = _cospec.device_names()
    click.echo("\n".join(names.split(", ")) if names else "none: this build of llama.cpp runs on the CPU alone "
                                                          "(-dev none says the same)")


@main.command()
@click.option("--json", "as_json", is_flag=True)
def models(as_json):
    """List the named models: name, path, size, architecture, vocabulary, quantization."""
    from .models import describe_gguf

    rows = []
    for m in NAMED_MODELS.values():
        row = {"name": m.name, "description": m.description}
        try:
            path = m.path_without_making()  # listing makes nothing
            if path.is_file():
                row.update(path=str(path), **describe_gguf(path))
            else:
                row["path"] = f"(made on first use: {path})"
        except (FileNotFoundError, ValueError, OSError) as exc:
            row["path"] = f"(unavailable: {exc})"
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    for r in rows:
        click.echo(f"{r['name']:<20} {r['description']}")
        if "architecture" in r:
            click.echo(f"{'':<20} {r['architecture']}, {r['layers']} layers, vocabulary {r['vocabulary']} "
                       f"({r['tokenizer']}), {r['quantization']}, {r['size_mb']} MB")
        click.echo(f"{'':<20} {r['path']}")
    from .arbiter.catalog import NAMED_ARBITERS

    click.echo("\narbiters (--arbiter NAME, or a folder):")
    for a in NAMED_ARBITERS.values():
        click.echo(f"{a.name:<20} for {a.draft}: {a.description}\n{'':<20} {a.path}")


@main.group()
def arbiter():
    """Learned arbiters: train one for your own draft/target pair, list them, show one, record an eval of one."""


def _recipe_option(name: str, *flags: str, **extra):
    """A `arbiter train` option whose default and help are RecipeSettings' (one source of truth)."""
    from .train.arbiter_recipe import DEFAULTS, setting_help

    default = getattr(DEFAULTS, name)
    if isinstance(default, bool):
        return click.option(*flags, name, is_flag=True, help=setting_help(name), **extra)
    if isinstance(default, tuple):
        return click.option(*flags, name, default=",".join(default), show_default=True, help=setting_help(name),
                            **extra)
    return click.option(*flags, name, default=default, show_default=default is not None, help=setting_help(name),
                        **extra)


@arbiter.command("train")
@click.argument("name")
@_recipe_option("target", "-m", "--model")
@_recipe_option("draft", "-md", "--model-draft")
@_recipe_option("tasks", "--task", "--tasks")
@_recipe_option("chat", "--chat")
@_recipe_option("chat_template", "--chat-template", metavar="JINJA")
@_recipe_option("draft_chat_template", "--chat-template-draft", metavar="JINJA")
@_recipe_option("kinds", "--kinds")
@_recipe_option("train", "--train", type=click.IntRange(1, None))
@_recipe_option("dev", "--dev", type=click.IntRange(1, None))
@_recipe_option("test", "--test", type=click.IntRange(1, None))
@_recipe_option("minutes", "--minutes", type=click.FloatRange(0, None, min_open=True))
@_recipe_option("max_tokens", "-n", "--max-tokens", type=click.IntRange(1, None))
@_recipe_option("threads", "-t", "--threads", type=click.IntRange(1, MAX_THREADS))
@_recipe_option("device", "--device", type=click.Choice(["auto", "cpu", "cuda"]))
@_recipe_option("rounds", "--rounds", type=click.IntRange(1, 5))
@_recipe_option("grpo", "--grpo")
@_recipe_option("grpo_steps", "--grpo-steps", type=click.IntRange(1, None))
@_recipe_option("ignore_headroom", "--ignore-headroom")
@_recipe_option("seed", "--seed", type=click.IntRange(0, None))
@click.option("--work", "work_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for the run's stages (default: the cache, arbiter-runs/NAME); rerun the same command to "
                   "resume an interrupted run.")
@click.option("--force", is_flag=True, help="Replace an installed arbiter of this name.")
def arbiter_train(name, work_dir, force, **options):
    """Train an arbiter for a draft/target pair on your tasks, evaluate it on held-out problems and
    install it as NAME: headroom check, decision states, warm-up, threshold, evaluation, install."""
    from pathlib import Path

    from .arbiter.catalog import NAMED_ARBITERS, user_arbiters_dir
    from .errors import CospecError
    from .arbiter.file_format import KINDS, LORA
    from .train.arbiter_recipe import RecipeRun, RecipeSettings, RecipeStop, default_work_dir

    if not name or name != Path(name).name or name.startswith(".") or name in ("target", "fly", "aasd", "auto"):
        raise click.BadParameter(f"{name!r} is not a usable name (one folder name, not target, fly, aasd or auto)",
                                 param_hint="NAME")
    if name in NAMED_ARBITERS:
        raise click.BadParameter(f"{name!r} is a bundled arbiter's name; choose another", param_hint="NAME")
    dest = user_arbiters_dir() / name
    if dest.exists() and not force:
        raise click.ClickException(f"an arbiter {name!r} is already installed ({dest}); pass --force to replace it")
    for module in ("torch", "peft", "transformers"):
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise click.ClickException(f"training needs {module}: install the train extra "
                                       "(pip install 'cospec-local[train]', with a CPU or CUDA torch first)")
    tasks = tuple(t.strip() for t in options.pop("tasks").split(",") if t.strip())
    kinds = tuple(k.strip() for k in options.pop("kinds").split(",") if k.strip())
    if not tasks:
        raise click.BadParameter("name at least one task", param_hint="--task")
    if not kinds or set(kinds) - set(KINDS):
        raise click.BadParameter(f"choose from {', '.join(KINDS)}", param_hint="--kinds")
    if options["grpo"] and LORA not in kinds:
        raise click.BadParameter("GRPO starts from the LoRA arbiter: add lora to --kinds", param_hint="--grpo")
    settings = RecipeSettings(name=name, tasks=tasks, kinds=kinds, **options)
    run = RecipeRun(settings, Path(work_dir) if work_dir else default_work_dir(name), user_arbiters_dir())
    try:
        run.run()
    except (RecipeStop, CospecError, ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo("\n[interrupted: rerun the same command to resume]", err=True)
        sys.exit(130)


def _arbiter_rows() -> list[dict]:
    from .arbiter.catalog import NAMED_ARBITERS, installed_arbiters
    from .arbiter.evaluations import describe_arbiter

    rows = []
    for name, path, where in [(a.name, a.path, "bundled") for a in NAMED_ARBITERS.values()] + \
            [(name, path, "installed") for name, path in installed_arbiters().items()]:
        try:
            rows.append(describe_arbiter(path, name=name, where=where))
        except (ValueError, OSError) as exc:  # one unreadable arbiter does not hide the others
            rows.append({"name": name, "where": where, "path": str(path), "error": str(exc)})
    return rows


@arbiter.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON list.")
def arbiter_list(as_json):
    """The arbiters `--arbiter NAME` finds: bundled ones and those `arbiter train` installed."""
    from .arbiter.catalog import user_arbiters_dir
    from .arbiter.evaluations import summary_line

    rows = _arbiter_rows()
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    for row in rows:
        click.echo(f"{row['name']:<22} {row['where']:<9} unreadable: {row['error']}" if "error" in row
                   else summary_line(row))
    click.echo(f"(installed arbiters live in {user_arbiters_dir()}; set COSPEC_LOCAL_ARBITERS to move them)")


@arbiter.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def arbiter_show(name, as_json):
    """Everything about one arbiter (a name or a folder): the draft it fits, the block length and
    cost model it was trained under, its threshold, files and recorded evaluation."""
    from .arbiter.catalog import NAMED_ARBITERS, installed_arbiters, missing_arbiter_hint, resolve_arbiter_path
    from .arbiter.evaluations import describe_arbiter, details_text

    if (hint := missing_arbiter_hint(name)) is not None:
        raise click.ClickException(hint)
    path = resolve_arbiter_path(name)
    where = "bundled" if name in NAMED_ARBITERS else "installed" if installed_arbiters().get(name) == path else None
    try:
        row = describe_arbiter(path, name=name, where=where)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(json.dumps(row, indent=1) if as_json else details_text(row))


@arbiter.command("record")
@click.argument("name")
@click.argument("eval_dirs", metavar="EVAL_DIR...", nargs=-1, required=True,
                type=click.Path(exists=True, file_okay=False))
@click.option("--replace", is_flag=True, help="Replace a recorded entry of more problems than the eval's.")
def arbiter_record(name, eval_dirs, replace):
    """Record what `cospec-local eval --out EVAL_DIR` measured of arbiter NAME (a name or a folder)
    beside its files, so that `arbiter list/show` report it: one entry per eval title, replacing an
    earlier one of that title (one of more problems only with --replace). The eval must have run
    these very files, as they run by default, beside target-only; nothing is written otherwise."""
    from .arbiter.catalog import missing_arbiter_hint
    from .arbiter.evaluations import BASELINE_RUNS, record_evaluation

    if (hint := missing_arbiter_hint(name)) is not None:
        raise click.ClickException(hint)
    try:
        _, entries = record_evaluation(name, eval_dirs, replace)
    except (ValueError, OSError) as exc:
        raise click.ClickException(str(exc)) from None
    for title, entry in entries.items():
        runs = entry["runs"]
        mine = next(label for label in runs if label not in BASELINE_RUNS)
        click.echo(f"{name}: {title}, {entry['problems']} problems: target-only "
                   f"{100 * runs['target-only']['accuracy']:.1f}% -> {100 * runs[mine]['accuracy']:.1f}% "
                   f"({runs[mine]['speedup'] or 0:.2f}x target-only)")


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """The engine's own warnings as one plain note; any other in Python's format."""
    if issubclass(category, (ArbiterSettingsWarning, CalibrationNotice)):
        click.echo(f"note: {message}", err=True)
    else:
        _python_showwarning(message, category, filename, lineno, file, line)


_python_showwarning = warnings.showwarning


def run() -> None:
    """The console entry point: click's own handling, except that an interrupt anywhere
    (loading, a second Ctrl-C) exits 130 quietly, as a shell expects, not "Aborted!" and 1."""
    warnings.showwarning = _show_warning
    try:
        main.main(standalone_mode=False)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(130)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)


if __name__ == "__main__":
    run()
