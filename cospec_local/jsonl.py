"""Files that long jobs write and a rerun reads back, safe against a kill at any instant (SIGKILL,
power loss): append-only logs of one JSON object a line, and whole files replaced atomically.

A process killed mid-write leaves a last line without its newline: not data. A resumed job first
cuts its log back to the complete lines (keep_complete_lines), so that what it appends next starts
on a line of its own."""
from __future__ import annotations

import os
from pathlib import Path


def _whole_lines(text: str) -> list[str]:
    """The lines written whole (each ended by its newline)."""
    return text.splitlines()[:text.count("\n")] if text else []


def write_atomic(path: Path, text: str) -> None:
    """Replace `path` by `text` in one step: a reader sees the old file or the new one, never part."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def keep_complete_lines(path: Path, keep=lambda line: True) -> list[str]:
    """Cut the log at `path` back to its complete, non-empty lines that `keep` accepts (rewritten
    atomically when anything goes); returns them."""
    if not path.is_file():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = [line for line in _whole_lines(text) if line.strip() and keep(line)]
    kept = "".join(line + "\n" for line in lines)
    if kept != text:
        write_atomic(path, kept)
    return lines
