"""Calls into the extension as the Python API makes them: its errors as this package's typed ones,
and native work on a thread of its own so that Ctrl-C reaches the caller."""
from __future__ import annotations

import contextlib
import threading
from typing import Callable

from . import _cospec
from .errors import from_native

MODEL_INDEX = {"target": 0, "draft": 1}  # the native API's model index


@contextlib.contextmanager
def native_errors():
    """The extension's errors as this package's typed ones (a closed engine: InvalidArgumentError)."""
    try:
        yield
    except _cospec.CospecError as exc:
        raise from_native(exc) from None


class Background:
    """Native work on a daemon thread while the caller's thread waits in short steps, so that
    Ctrl-C reaches the caller. Completion is an Event, not Thread.join: a join interrupted by
    KeyboardInterrupt can leave the thread marked as finished while it still runs (Python 3.11),
    which lost the partial result and left a generation running."""

    def __init__(self, name: str, work: Callable):
        self.result = None
        self.error: BaseException | None = None
        self._done = threading.Event()

        def run():
            try:
                self.result = work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                self.error = exc
            finally:
                self._done.set()

        threading.Thread(target=run, name=name, daemon=True).start()

    def wait(self) -> None:
        while not self._done.wait(0.05):
            pass

    def wait_ignoring_interrupts(self) -> None:
        """After asking the work to stop: a second Ctrl-C must not leave it running."""
        while not self._done.is_set():
            try:
                self._done.wait(0.05)
            except KeyboardInterrupt:
                pass

    def outcome(self):
        if self.error is not None:
            raise from_native(self.error) if isinstance(self.error, _cospec.CospecError) else self.error
        return self.result
