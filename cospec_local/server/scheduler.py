"""Requests onto engines: one generation at a time per engine, a bounded wait for the rest.

Each engine is a process of its own (workers.py); the server talks to it from a thread, and the
thread hands the tokens to the event loop. A request that finds every engine busy and the
waiting line full is refused at once (ServerBusy, answered 503 with Retry-After); none waits
without bound. An engine goes back to the pool only when its generation has ended, so a
cancelled generation (a client gone) can never overlap the next one on the same engine.
"""
from __future__ import annotations

import asyncio
import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from ..generation import Generation
from ..params import GenerationParams
from .workers import EngineWorker, PreparedPrompt


class ServerBusy(Exception):
    """Every engine is busy and the waiting line is full."""


class EnginePool:
    def __init__(self, workers: list[EngineWorker], max_waiting: int):
        self.workers = workers
        self.max_waiting = max_waiting
        self.waiting = 0
        self._idle: asyncio.Queue[EngineWorker] | None = None
        self._threads = ThreadPoolExecutor(max_workers=len(workers), thread_name_prefix="cospec-serve")
        self._generation_ids = itertools.count(1)
        self.leased: set[int] = set()  # the workers (by id) a request holds: /slots' is_processing

    def _queue(self) -> asyncio.Queue:
        if self._idle is None:  # made in the event loop that uses it
            self._idle = asyncio.Queue()
            for worker in self.workers:
                self._idle.put_nowait(worker)
        return self._idle

    @property
    def busy(self) -> int:
        return len(self.workers) - self._queue().qsize()

    @property
    def alive(self) -> int:
        return sum(w.alive for w in self.workers)

    async def acquire(self) -> "Lease":
        idle = self._queue()
        if idle.empty() and self.waiting >= self.max_waiting:
            raise ServerBusy()
        self.waiting += 1
        try:
            worker = await idle.get()
        finally:
            self.waiting -= 1
        self.leased.add(id(worker))
        return Lease(self, worker, asyncio.get_running_loop())

    def _give_back(self, worker: EngineWorker) -> None:
        self.leased.discard(id(worker))
        self._queue().put_nowait(worker)

    def close(self) -> None:
        """End the engine processes, then the threads that talk to them (they see the pipes close)."""
        for worker in self.workers:
            worker.stop_process()
        self._threads.shutdown(wait=True, cancel_futures=True)
        for worker in self.workers:
            worker.close()


@dataclass
class Lease:
    """One engine, held by one request until its generation is over."""

    pool: EnginePool
    worker: EngineWorker
    loop: asyncio.AbstractEventLoop
    _released: bool = False
    _in_use: bool = False  # a thread is working on the engine: it is given back when that work ends
    _release_pending: bool = False

    def _on_thread(self, fn, *args) -> Future:
        """fn(*args) on the pool's threads; the lease is given back only after it, however it ends."""
        self._in_use = True
        work = self.pool._threads.submit(fn, *args)

        def done(_):
            self._in_use = False
            if self._release_pending:
                self.release()

        work.add_done_callback(lambda f: self.loop.call_soon_threadsafe(done, f))
        return work

    async def prepare(self, chat: bool, payload, params: GenerationParams) -> PreparedPrompt:
        """The prompt's tokens, on the engine (started again first if its process had ended)."""

        def work():
            self.worker.ensure_started()
            return self.worker.prepare(chat, payload, params)

        return await asyncio.wrap_future(self._on_thread(work))

    async def query(self, op: str, *args):
        """A question the engine answers without generating (workers.QUERIES); the lease stays held."""

        def work():
            self.worker.ensure_started()
            return self.worker.query(op, *args)

        return await asyncio.wrap_future(self._on_thread(work))

    def release(self) -> None:
        """Give the engine back (at once, or when the work on it ends: a cancelled request's thread
        may still be talking to it)."""
        if self._in_use:
            self._release_pending = True
        elif not self._released:
            self._released = True
            self.pool._give_back(self.worker)

    def start(self, prompt: PreparedPrompt, params: GenerationParams) -> "Job":
        """Start generating; the lease is given back when the generation ends."""
        job = Job(self.loop, self.worker, next(self.pool._generation_ids))
        job.future = asyncio.wrap_future(self._on_thread(job.work, prompt, params))
        self.release()  # takes effect when the generation's thread is done
        return job


END = object()


@dataclass
class Job:
    """A generation running on an engine. `events` receives TokenEvents, then END."""

    loop: asyncio.AbstractEventLoop
    worker: EngineWorker
    generation_id: int
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    future: asyncio.Future | None = None
    result: Generation | None = None

    def work(self, prompt: PreparedPrompt, params: GenerationParams) -> Generation:
        put = self.events.put_nowait
        try:
            self.result = self.worker.generate(self.generation_id, prompt, params,
                                               lambda event: self.loop.call_soon_threadsafe(put, event))
            return self.result
        finally:
            self.loop.call_soon_threadsafe(put, END)

    def cancel(self) -> None:
        """Stop the generation now (from the event loop: a client went away)."""
        if self.future is not None and not self.future.done():
            self.worker.request_stop(self.generation_id)  # names this generation: it cannot stop another

    async def tokens(self):
        """The TokenEvents as they come."""
        while True:
            event = await self.events.get()
            if event is END:
                return
            yield event

    async def finish(self) -> Generation:
        """The finished generation (its error, if it failed)."""
        return await self.future
