"""`arbiter train`, `list`, `show` and `record`: learned arbiters for the user's own pairs."""
from __future__ import annotations

import json
import sys

import click

from .group import main
from .options import MAX_THREADS


@main.group()
def arbiter():
    """Learned arbiters: train one for your own draft/target pair, list them, show one, record an eval of one."""


def _recipe_option(name: str, *flags: str, **extra):
    """A `arbiter train` option whose default and help are RecipeSettings' (one source of truth)."""
    from ..train.arbiter_recipe import setting_default, setting_help

    default = setting_default(name)
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

    from ..arbiter.catalog import NAMED_ARBITERS, user_arbiters_dir
    from ..errors import CospecError
    from ..arbiter.file_format import KINDS, LORA
    from ..train.arbiter_recipe import RecipeRun, RecipeSettings, RecipeStop, default_work_dir

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
    from ..arbiter.catalog import NAMED_ARBITERS, installed_arbiters
    from ..arbiter.evaluations import describe_arbiter

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
    from ..arbiter.catalog import user_arbiters_dir
    from ..arbiter.evaluations import summary_line

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
    from ..arbiter.catalog import NAMED_ARBITERS, installed_arbiters, missing_arbiter_hint, resolve_arbiter_path
    from ..arbiter.evaluations import describe_arbiter, details_text

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
    from ..arbiter.catalog import missing_arbiter_hint
    from ..arbiter.evaluations import BASELINE_RUNS, record_evaluation

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
