"""Opening an engine for a command, and what it says about the models it loaded."""
from __future__ import annotations

import sys

import click
from click.core import ParameterSource

from .. import _cospec
from ..chat.display import other_vocab_note
from ..chat.template import ChatTemplateError
from ..engine import Engine
from ..errors import CospecError, VocabMismatchError
from ..models import resolve_model
from ..params import GenerationParams
from .options import LoadSettings


def drafting_line(draft: str | None, params: GenerationParams | None) -> str:
    """Where draft tokens come from, in words: the draft model's file and, where the settings draft
    with it, the n-gram drafter."""
    from ..params import parse_spec_type

    from ..arbiter.catalog import resolve_auto

    sources = parse_spec_type(params.spec_type) if params is not None and params.mode == "speculative" else []
    arbiter = None if params is None else params.arbiter if params.arbiter != "auto" else resolve_auto(
        resolve_model(draft) if draft else None)
    ngram = _cospec.DRAFT_NGRAM in sources or (_cospec.DRAFT_AUTO in sources and arbiter in ("target", None))
    if draft is None:
        return "- (the n-gram drafter drafts; -md DRAFT adds a draft model)" if ngram else "-"
    path = resolve_model(draft)
    return f"{path}" + HEAD_DRAFTER_WORDS.get(gguf_architecture(path), "") + \
        (" and the n-gram drafter" if ngram else "")


# How the draft line names a head drafter file, by its architecture.
HEAD_DRAFTER_WORDS = {"eagle3": " (an EAGLE-3 head)", "dflash": " (a DFlash drafter)"}


def gguf_architecture(path) -> str | None:
    """A GGUF's general.architecture, or None where the file cannot be read as one (the engine's
    load then says why)."""
    import pathlib

    from ..models import read_gguf_header

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
            if load.head is not None:
                click.echo(f"head:   {drafting_line(load.head, None)}", err=True)
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
    from ..models import TASK_PAIR_EXAMPLES, TASK_PAIR_SCOPE, prompt_style

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
