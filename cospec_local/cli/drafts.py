"""The one rule for choosing the draft model a command loads."""
from __future__ import annotations

import click

from ..models import DEFAULT_TARGET, resolve_model
from ..params import GenerationParams


def pick_draft(target: str, draft: str | None, quiet: bool = False, measuring: bool = False) -> str | None:
    """The draft the user gave, or one chosen for the target (said on stderr); None: there is none.
    measuring (bench, eval): any named model with the target's vocabulary will do, since a pair is
    what they measure; otherwise only a bundled draft measured to pay for the target."""
    if draft is not None:
        return draft
    from ..models import choose_draft

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
    from .. import _cospec
    from ..params import parse_spec_type, spec_type_note, spec_type_uses_model
    from .loading import HEAD_DRAFTER_WORDS, gguf_architecture

    if params.mode == "target-only":
        return None, params
    if not quiet and (note := spec_type_note(params.spec_type)) is not None:
        click.echo(f"note: {note}", err=True)
    if params.mode == "speculative" and draft is not None and _cospec.DRAFT_HEAD in parse_spec_type(params.spec_type) \
            and gguf_architecture(resolve_model(draft)) in HEAD_DRAFTER_WORDS:
        return draft, params  # -md is the head drafter the engine drafts with
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
