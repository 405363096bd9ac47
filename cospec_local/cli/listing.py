"""`devices` and `models` (Ollama's `list`): what this install can run."""
from __future__ import annotations

import json

import click

from .. import _cospec
from ..models import NAMED_MODELS
from .group import main


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
    from ..models import describe_gguf

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
    from ..arbiter.catalog import NAMED_ARBITERS

    click.echo("\narbiters (--arbiter NAME, or a folder):")
    for a in NAMED_ARBITERS.values():
        click.echo(f"{a.name:<20} for {a.draft}: {a.description}\n{'':<20} {a.path}")
