"""The end that the measuring scripts of bench/ share: the command that ran, the Markdown table
printed (with a warning where the machine was busy), and with --out the table written beside a JSON
record of the command, the machine and the script's own fields."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def command(script: str, argv: list[str] | None) -> list[str]:
    """The command line that ran `script` (a file of bench/) with these arguments."""
    return ["python", f"bench/{script}", *(argv or sys.argv[1:])]


def report(lines: list[str], cmd: list[str], out: Path | None, other_load: float, **fields) -> None:
    from cospec_local.evaluation.machine import busy_note, machine_identity

    if (note := busy_note(other_load)) is not None:
        lines.append(f"\nwarning: {note}")
    print("\n".join(lines))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        record = {"command": cmd, "machine": machine_identity(), "other_load": other_load, **fields}
        (out / "results.json").write_text(json.dumps(record, indent=1))
        (out / "results.md").write_text("\n".join(lines) + "\n")
