"""The `cospec-local` command line: generate, chat, bench, models.

Flags follow llama.cpp's where one exists (-m, -md, -p, -n, -c, -t, --temp, --seed).
"""
from __future__ import annotations

import json
import sys

import click

from .engine import DEFAULT_DRAFT_MAX, MODES, Engine, Generation
from .errors import CospecError
from .models import DEFAULT_DRAFT, DEFAULT_TARGET, NAMED_MODELS, resolve_model

# ANSI colours for --color: which tokens came from the draft.
COLORS = {"match": "\x1b[32m", "kept": "\x1b[35;1m"}
RESET = "\x1b[0m"


def model_options(fn):
    """Options shared by every command that opens an engine."""
    options = [
        click.option("-m", "--model", "target", default=DEFAULT_TARGET, show_default=True,
                     help="Target GGUF file or named model."),
        click.option("-md", "--model-draft", "draft", default=DEFAULT_DRAFT, show_default=True,
                     help="Draft GGUF file or named model."),
        click.option("-c", "--ctx-size", "n_ctx", default=4096, show_default=True, help="Context window in tokens."),
        click.option("-t", "--threads", "n_threads", default=0, help="CPU threads (0: all cores)."),
        click.option("-ngl", "--gpu-layers", "n_gpu_layers", default=-1,
                     help="Layers to offload with a GPU build of llama.cpp (-1: all)."),
        click.option("--verbose", is_flag=True, help="Show llama.cpp's own log."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def sampling_options(fn):
    options = [
        click.option("--mode", type=click.Choice(MODES), default="sps", show_default=True,
                     help="target-only, draft-only, sps (lossless speculative), fly (loose verification)."),
        click.option("--draft-max", "draft_max", default=DEFAULT_DRAFT_MAX, show_default=True,
                     help="Most draft tokens per block (K)."),
        click.option("--draft-p-min", default=0.0, show_default=True,
                     help="End a block early when the draft's top probability is below this (greedy)."),
        click.option("--adaptive-draft/--fixed-draft", default=True, show_default=True,
                     help="Choose each block's length in [0, K] from measured acceptance and costs, or always K."),
        click.option("--temp", "temperature", default=0.0, show_default=True, help="Temperature (0: greedy)."),
        click.option("--top-k", default=0, show_default=True, help="Top-k sampling (0: off)."),
        click.option("--top-p", default=1.0, show_default=True, help="Top-p sampling (1: off)."),
        click.option("-s", "--seed", default=0, show_default=True, help="Sampling seed."),
        click.option("--fly-window", default=6, show_default=True, help="FLy: deferred window W."),
        click.option("--fly-entropy", default=0.3, show_default=True,
                     help="FLy: minimum target entropy (nats) at a kept mismatch."),
    ]
    for option in reversed(options):
        fn = option(fn)
    return fn


def open_engine(target: str, draft: str | None, n_ctx: int, n_threads: int, n_gpu_layers: int, verbose: bool,
                quiet: bool = False) -> Engine:
    show = not quiet and sys.stderr.isatty()
    last = {"which": None, "shown": -1}

    def progress(which: str, value: float):
        percent = int(value * 100)
        if show and (which != last["which"] or percent // 5 != last["shown"] // 5):
            click.echo(f"\rloading {which} model {percent:3d}%", err=True, nl=percent >= 100)
            last.update(which=which, shown=percent)
        return True

    try:
        if not quiet:
            click.echo(f"target: {resolve_model(target)}\ndraft:  {resolve_model(draft) if draft else '-'}", err=True)
        return Engine(target, draft, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers,
                      n_gpu_layers_draft=n_gpu_layers, progress=progress, verbose=verbose)
    except (CospecError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None


def stats_line(result: Generation) -> str:
    s = result.stats
    line = f"[{s.n_generated} tokens, {s.tokens_per_second:.1f} tok/s, mode {result.mode}"
    if s.n_blocks:
        line += (f" | drafted {s.n_drafted}, accepted {s.n_accepted + s.n_kept} ({100 * s.acceptance_rate:.0f}%),"
                 f" arbiter keeps {s.n_kept}, {s.mean_accepted_per_block:.2f} per block")
    return line + f", stop: {result.stop_reason}]"


def colored(text: str, provenance: str, color: bool) -> str:
    if not color or provenance not in COLORS or not text:
        return text
    return COLORS[provenance] + text + RESET


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="cospec-local")
def main():
    """Collaborative speculative decoding: a draft model proposes, a target verifies,
    an arbiter decides where they disagree."""


@main.command()
@model_options
@sampling_options
@click.option("-p", "--prompt", required=True, help="Prompt text.")
@click.option("-n", "--n-predict", "max_tokens", default=128, show_default=True, help="Most tokens to generate.")
@click.option("--stop", multiple=True, help="Stop string (repeatable).")
@click.option("--chat", "as_chat", is_flag=True, help="Send the prompt as a user message through the chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: text, tokens, provenance, stats.")
@click.option("--color", is_flag=True, help="Colour draft tokens: green matched, magenta kept by the arbiter.")
def generate(target, draft, n_ctx, n_threads, n_gpu_layers, verbose, mode, draft_max, draft_p_min, adaptive_draft,
             temperature, top_k, top_p, seed, fly_window, fly_entropy, prompt, max_tokens, stop, as_chat, as_json, color):
    """Generate a continuation of a prompt."""
    needs_draft = mode != "target-only"
    engine = open_engine(target, draft if needs_draft else None, n_ctx, n_threads, n_gpu_layers, verbose,
                         quiet=as_json)
    with engine:
        tokens = engine.render_chat([{"role": "user", "content": prompt}]) if as_chat else prompt
        options = dict(mode=mode, max_tokens=max_tokens, draft_max=draft_max, draft_p_min=draft_p_min,
                       adaptive_draft=adaptive_draft, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, stop=list(stop),
                       fly_window=fly_window, fly_entropy=fly_entropy)
        try:
            if as_json:
                result = engine.generate(tokens, **options)
                click.echo(json.dumps(result.to_json(), ensure_ascii=False))
                return
            if not as_chat:
                click.echo(prompt, nl=False)
            for event in engine.stream(tokens, **options):
                click.echo(colored(event.text, event.provenance, color), nl=False)
            click.echo()
            click.echo(stats_line(engine.last_result), err=True)
        except KeyboardInterrupt:
            click.echo("\n[interrupted]", err=True)
            sys.exit(130)
        except CospecError as exc:
            raise click.ClickException(str(exc)) from None


@main.command()
@model_options
@sampling_options
@click.option("-n", "--n-predict", "max_tokens", default=512, show_default=True, help="Most tokens per reply.")
@click.option("--system", default=None, help="System message.")
@click.option("--color", is_flag=True, help="Colour draft tokens: green matched, magenta kept by the arbiter.")
def chat(target, draft, n_ctx, n_threads, n_gpu_layers, verbose, mode, draft_max, draft_p_min, adaptive_draft,
         temperature, top_k, top_p, seed, fly_window, fly_entropy, max_tokens, system, color):
    """Talk with the model pair. /? for help."""
    import signal

    from .chat_session import ChatSession

    if sys.stdin.isatty():
        # Ctrl-C stops a reply. A process started as a background job of a non-interactive
        # shell inherits SIGINT ignored; on a terminal, take the key back.
        signal.signal(signal.SIGINT, signal.default_int_handler)

    engine = open_engine(target, draft if mode != "target-only" else None, n_ctx, n_threads, n_gpu_layers, verbose)
    settings = dict(mode=mode, max_tokens=max_tokens, draft_max=draft_max, draft_p_min=draft_p_min,
                    adaptive_draft=adaptive_draft, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, fly_window=fly_window,
                    fly_entropy=fly_entropy)
    with engine:
        ChatSession(engine, settings, system=system, color=color).run()


@main.command()
@model_options
@click.option("--draft-max", "draft_max_list", default=str(DEFAULT_DRAFT_MAX), show_default=True,
              help="Comma-separated list of K to measure.")
@click.option("--modes", default="target-only,sps,fly", show_default=True, help="Comma-separated modes.")
@click.option("--draft-p-min", default=0.0, show_default=True,
              help="End a block early when the draft's top probability is below this.")
@click.option("--adaptive-draft", is_flag=True, help="Let each block's length adapt in [0, K] (default: always K).")
@click.option("-n", "--n-predict", "max_tokens", default=64, show_default=True, help="Tokens per prompt.")
@click.option("--prompts", "prompts_file", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Text file, one prompt per line (default: a built-in set, or task prompts for the demo pair).")
@click.option("--task", "task_families", default=None,
              help="Comma-separated task families whose test prompts to use instead (default for the demo pair: "
                   "arith,pyfunc).")
@click.option("--n-prompts", default=8, show_default=True, help="Number of task prompts with --task.")
@click.option("--repeat", default=1, show_default=True, help="Runs of each prompt per mode.")
@click.option("--chat", "as_chat", is_flag=True, help="Wrap each prompt in the chat template.")
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON.")
def bench(target, draft, n_ctx, n_threads, n_gpu_layers, verbose, draft_max_list, modes, draft_p_min, adaptive_draft,
          max_tokens,
          prompts_file, task_families, n_prompts, repeat, as_chat, as_json):
    """Measure target-only, sps and fly on the same prompts, in one run."""
    from .bench import BUILTIN_PROMPTS, markdown_table, run_bench, task_prompts
    from .models import prompt_style

    try:
        ks = [int(k) for k in draft_max_list.split(",") if k.strip()]
    except ValueError:
        raise click.BadParameter("--draft-max takes integers, e.g. 1,2,4,8") from None
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    for m in mode_list:
        if m not in MODES:
            raise click.BadParameter(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    if prompts_file and task_families:
        raise click.BadParameter("give either --prompts or --task")
    if not prompts_file and not task_families and prompt_style(target) == "task":
        task_families = "arith,pyfunc"
    prompts = BUILTIN_PROMPTS
    if prompts_file:
        with open(prompts_file, encoding="utf-8") as f:
            prompts = [line.rstrip("\n") for line in f if line.strip()]
    elif task_families:
        try:
            prompts = task_prompts([f.strip() for f in task_families.split(",") if f.strip()], n_prompts)
        except (KeyError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
    engine = open_engine(target, draft, n_ctx, n_threads, n_gpu_layers, verbose, quiet=as_json)
    with engine:
        try:
            report = run_bench(engine, prompts, ks, mode_list, max_tokens, repeat, as_chat, draft_p_min, adaptive_draft,
                               progress=None if as_json else lambda msg: click.echo(msg, err=True))
        except CospecError as exc:
            raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(markdown_table(report))


@main.command("eval")
@model_options
@click.option("--task", required=True, help="Task family (arith, pyfunc, listops) or a benchmark jsonl file.")
@click.option("--split", default="test", show_default=True, type=click.Choice(["train", "dev", "test"]))
@click.option("--limit", default=None, type=int, help="Number of problems (default: 200 for a family, all of a file).")
@click.option("--modes", default="target-only,draft-only,sps,fly", show_default=True, help="Comma-separated modes.")
@click.option("-n", "--n-predict", "max_tokens", default=256, show_default=True, help="Most tokens per answer.")
@click.option("--draft-max", "draft_max", default=DEFAULT_DRAFT_MAX, show_default=True, help="Most draft tokens per block.")
@click.option("--adaptive-draft/--fixed-draft", default=True, show_default=True)
@click.option("--chat", "as_chat", is_flag=True, help="Send each problem through the chat template.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Folder for records.jsonl (resumable), results.json, results.md and a PNG plot.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def eval_command(target, draft, n_ctx, n_threads, n_gpu_layers, verbose, task, split, limit, modes, max_tokens,
                 draft_max, adaptive_draft, as_chat, out_dir, as_json):
    """Accuracy and speed of each mode on a task, with oracle union and recovered non-nested successes."""
    from pathlib import Path

    from .evaluate import evaluate, markdown
    from .tasks import load_task, score

    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    for m in mode_list:
        if m not in MODES:
            raise click.BadParameter(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    try:
        problems = load_task(task, split, limit)
    except (KeyError, FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from None
    title = f"{Path(task).name} ({split})" if task.endswith((".jsonl", ".gz")) else f"{task} ({split})"
    engine = open_engine(target, draft, n_ctx, n_threads, n_gpu_layers, verbose, quiet=as_json)

    def progress(items):
        with click.progressbar(items, label="evaluating", file=sys.stderr) as bar:
            yield from bar

    with engine:
        try:
            summary = evaluate(engine, problems, mode_list, score, Path(out_dir) if out_dir else None, max_tokens,
                               draft_max, adaptive_draft, as_chat, title, progress=None if as_json else progress)
        except (CospecError, ValueError) as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            click.echo("\n[interrupted: rerun the same command to resume]" if out_dir else "\n[interrupted]", err=True)
            sys.exit(130)
    click.echo(json.dumps(summary, indent=1) if as_json else markdown(summary, title))


@main.command()
@click.option("--json", "as_json", is_flag=True)
def models(as_json):
    """List the named models: name, path, size, architecture, vocabulary, quantization."""
    from .models import describe_gguf

    rows = []
    for m in NAMED_MODELS.values():
        row = {"name": m.name, "description": m.description}
        try:
            path = m.locate()
            row.update(path=str(path), **describe_gguf(path))
        except (FileNotFoundError, ValueError, ImportError) as exc:
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


if __name__ == "__main__":
    main()
