"""Requests onto engines: one generation at a time per engine, a bounded wait for the rest.

Each engine runs its generations on a thread of its own (the native loop releases the GIL), and
the thread hands its tokens to the event loop. A request that finds every engine busy and the
waiting line full is refused at once (ServerBusy, answered 503 with Retry-After); none waits
without bound. An engine goes back to the pool only when its thread has finished, so a
cancelled generation (a client gone) can never overlap the next one on the same engine.
"""
from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

from ..engine import Engine, Generation
from ..params import GenerationParams


class ServerBusy(Exception):
    """Every engine is busy and the waiting line is full."""


class EnginePool:
    def __init__(self, engines: list[Engine], max_waiting: int):
        self.engines = engines
        self.max_waiting = max_waiting
        self.waiting = 0
        self._idle: asyncio.Queue[Engine] | None = None
        self._threads = ThreadPoolExecutor(max_workers=len(engines), thread_name_prefix="cospec-serve")

    def _queue(self) -> asyncio.Queue:
        if self._idle is None:  # made in the event loop that uses it
            self._idle = asyncio.Queue()
            for engine in self.engines:
                self._idle.put_nowait(engine)
        return self._idle

    @property
    def busy(self) -> int:
        return len(self.engines) - self._queue().qsize()

    async def acquire(self) -> "Lease":
        idle = self._queue()
        if idle.empty() and self.waiting >= self.max_waiting:
            raise ServerBusy()
        self.waiting += 1
        try:
            engine = await idle.get()
        finally:
            self.waiting -= 1
        return Lease(self, engine, asyncio.get_running_loop())

    def _give_back(self, engine: Engine) -> None:
        self._queue().put_nowait(engine)

    def close(self) -> None:
        """Stop the running generations and their threads (the engines stay open: their owner closes them)."""
        for engine in self.engines:
            engine.abort()
        self._threads.shutdown(wait=True, cancel_futures=True)


@dataclass
class Lease:
    """One engine, held by one request until its work on the engine's thread is over."""

    pool: EnginePool
    engine: Engine
    loop: asyncio.AbstractEventLoop
    _released: bool = False

    async def run(self, fn: Callable, *args):
        """fn(engine, *args) on the engine's thread (the lease stays held)."""
        return await self.loop.run_in_executor(self.pool._threads, fn, self.engine, *args)

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.pool._give_back(self.engine)

    def start(self, prompt: list[int], params: GenerationParams) -> "Job":
        """Start generating; the lease is given back when the generation's thread ends."""
        job = Job(self.loop, self.engine)
        future = self.loop.run_in_executor(self.pool._threads, job.work, prompt, params)
        job.future = future
        future.add_done_callback(lambda _: self.release())
        return job


END = object()


@dataclass
class Job:
    """A generation running on an engine's thread. `events` receives TokenEvents, then END."""

    loop: asyncio.AbstractEventLoop
    engine: Engine
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    future: asyncio.Future | None = None
    result: Generation | None = None

    def work(self, prompt: list[int], params: GenerationParams) -> Generation | None:
        put = self.events.put_nowait
        try:
            for event in self.engine.stream(prompt, params):
                if self.cancelled.is_set():
                    break  # closing the stream aborts the native loop
                self.loop.call_soon_threadsafe(put, event)
            self.result = self.engine.last_result
            return self.result
        finally:
            self.loop.call_soon_threadsafe(put, END)

    def cancel(self) -> None:
        """Stop the generation now (from the event loop: a client went away)."""
        self.cancelled.set()
        # The engine is ours until the future is done (its lease is given back in the done callback,
        # on this same loop), so the abort cannot reach another request's generation.
        if self.future is not None and not self.future.done():
            self.engine.abort()

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
