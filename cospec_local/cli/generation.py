"""`generate` and `chat` (Ollama's `run` is one of them: see group.py)."""
from __future__ import annotations

import json
import signal
import sys

import click
from click.core import ParameterSource

from ..chat.display import abstained_note, colored, draft_off_note, stats_line
from ..chat.template import ChatTemplateError
from ..engine import Engine
from ..errors import ContextFullError, CospecError
from ..params import CHAT_SAMPLING, GenerationParams
from .drafts import draft_for_mode
from .group import main
from .loading import chat_banner, open_engine, template_notice
from .options import generation_options, model_options


def run_record(engine: Engine, params: GenerationParams, result) -> dict:
    """A generation as --json prints it: the result, and what produced it (the models, the draft
    sources asked for and the blocks each drafted)."""
    s = result.stats
    return {**result.to_json(),
            "models": {"target": engine.target_path, "draft": engine.draft_path if engine.has_draft else None,
                       "head": None if engine.head is None else {"kind": engine.head, "path": engine.head_file},
                       # bytes of each model's weights llama.cpp repacked (its kernels round near ties their own way)
                       "repacked": engine.repacked_bytes},
            "spec_type": params.spec_type if params.mode == "speculative" else None,
            "blocks_by_source": {"ngram": s.blocks_ngram, "head": s.blocks_head,
                                 "draft": s.blocks - s.blocks_ngram - s.blocks_head}}


def without_last_newline(text: str) -> str:
    """A prompt read from a file or standard input, less the newline that ends its last line, as
    llama-cli's -f reads it (an editor's final newline would otherwise change the reply)."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


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
    from ..chat.session import ChatSession

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
