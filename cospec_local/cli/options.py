"""The options commands share: how to open the engine (models, llama.cpp's flags) and the generation settings."""
from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields

import click

from .. import _cospec
from ..engine import FLASH_ATTN
from ..models import DEFAULT_DRAFT, DEFAULT_TARGET
from ..params import GenerationParams, param_flags

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
    head: str | None = None  # a head drafter (EAGLE-3, DFlash) beside the draft model
    # llama.cpp's own loading settings, passed through as its flags name them (None: its default).
    llama: dict = field(default_factory=dict)

    def engine_options(self, draft: str | None) -> dict:
        """Engine's keyword arguments for these settings and `draft` (the one chosen for the mode)."""
        all_layers = -1
        return dict(target=self.target, draft=draft, head=self.head, n_ctx=self.n_ctx, n_threads=self.n_threads,
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
        click.option("-mh", "--model-head", "head", default=None,
                     help="A head drafter (an EAGLE-3 head or DFlash drafter: GGUF file or named head) beside "
                          "the draft model, so that both draft: "
                          "the head where the target would agree anyway, the draft model where an arbiter decides "
                          "(-md HEAD.gguf alone, llama.cpp's way, makes the head the only drafter)."),
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
        click.option("--repack/--no-repack", " /-nr", "repack", default=None,
                     help="llama.cpp's weight repacking for its multi-token CPU kernels (default: on, as in llama.cpp, "
                          "or $LLAMA_ARG_REPACK; each process then holds its own repacked copy of those weights)."),
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
             "chat_template", "draft_chat_template", "verbose", "calibration", "head")

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
                                               "devices_draft", "repack")}
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
    from ..json_grammar import SchemaError, schema_grammar

    try:
        return schema_grammar(json.loads(text))
    except (json.JSONDecodeError, SchemaError) as exc:
        raise click.BadParameter(str(exc), param_hint=flag) from None
