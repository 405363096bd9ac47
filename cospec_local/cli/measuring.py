"""`calibrate`, `bench` and `eval`: measuring a pair on this machine."""
from __future__ import annotations

import json
import sys
from dataclasses import replace

import click
from click.core import ParameterSource

from ..chat.template import ChatTemplateError
from ..errors import CospecError
from ..models import resolve_model
from ..params import GenerationParams
from .drafts import pick_draft
from .group import main
from .loading import HEAD_DRAFTER_WORDS, gguf_architecture, open_engine
from .options import generation_options, model_options


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
@click.option("--clear", is_flag=True, help="Delete every stored calibration (of every pair) and measure nothing; "
                                             "each pair is measured again when next opened.")
def calibrate(load, prompts_file, task_families, n_prompts, as_chat, max_tokens, no_draft, as_json, clear):
    """Measure the pair's costs and acceptance on this machine and store them: every later engine of the
    pair here starts its block lengths from them (greedy calls drafting from the first block; sampled
    and arbiter calls reproducible under the calibration's id). Costs timed while other work took
    the CPUs are timed again, and not stored where the machine stays busy."""
    from .. import calibration as calibration_store
    from ..evaluation.bench import task_prompts
    from ..models import prompt_style

    if clear:
        removed = calibration_store.clear_store()
        click.echo(f"removed {removed} stored calibration{'s' if removed != 1 else ''} from "
                   f"{calibration_store.store_dir()}")
        return

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
    stored = not measured.busy
    if as_json:
        click.echo(json.dumps({**measured.to_json(), "path": str(path) if stored else None}))
        return
    click.echo(measured.summary())
    click.echo(f"stored in {path}" if stored else f"not stored: {calibration_store.busy_words(measured)}; "
                                                  f"measure again with nothing else running")


RUNS_HELP = ("Comma-separated runs: target-only, draft-only, sps (lossless), ngram (sps from the n-gram drafter "
             "alone), head (from the head drafter alone: an EAGLE-3 head as -md, or the target's MTP layers), fly, "
             "aasd, cospec (the bundled learned "
             "arbiter for this draft), cospec:NAME_OR_FOLDER, speculative:ARBITER.")


def parse_runs_option(text: str | None, draft: str | None, default: str = ""):
    """The runs asked for; by default `default` and, where a bundled learned arbiter fits the
    draft, cospec (the project's headline run)."""
    from ..arbiter.catalog import bundled_arbiter_for
    from ..evaluation.runs import parse_runs

    try:
        draft_path = resolve_model(draft) if draft else None
        if text is None and draft_path is not None and gguf_architecture(draft_path) in HEAD_DRAFTER_WORDS:
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
    from ..evaluation.bench import BUILTIN_PROMPTS, markdown_table, run_bench, task_prompts
    from ..models import prompt_style

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
    from ..evaluation.machine import busy_note

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

    from ..tasks.sandbox import UNSAFE_ENV, SandboxUnavailableError

    if unsafe_code_execution:
        os.environ[UNSAFE_ENV] = "1"

    from ..evaluation.task_eval import evaluate, markdown
    from ..tasks import load_task, score

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
