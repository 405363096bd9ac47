"""`serve` (the OpenAI-compatible server) and `rpc-server` (this machine lent to engines elsewhere)."""
from __future__ import annotations

import threading

import click

from ..models import resolve_model
from ..params import CHAT_SAMPLING
from .drafts import draft_for_mode
from .group import main
from .loading import drafting_line, gpu_notice
from .options import MAX_THREADS, generation_options, model_options

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
        from ..server import CospecServer, ServerSettings, bind
        from ..server import serve as run_server
        from ..server.workers import EngineSpec, EngineUnavailable, EngineWorker
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
    if load.head is not None:
        click.echo(f"head:   {drafting_line(load.head, None)}", err=True)
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
        from ..models import TASK_PAIR_SCOPE, prompt_style

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

    from .. import _cospec
    from ..errors import from_native

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
