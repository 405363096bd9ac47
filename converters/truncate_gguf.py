"""Build a shallow draft model by keeping only the first N blocks of a GGUF.

    python -m converters.truncate_gguf SRC DST --layers N
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cospec_local.formats.gguf_edit import truncate_layers
from cospec_local.command_line import REQUIRED, option, parse_config


@dataclass
class TruncateConfig:
    src: Path = option(REQUIRED, "input GGUF (llama, gemma3, ... architecture)", positional=True)
    dst: Path = option(REQUIRED, "output GGUF", positional=True)
    layers: int = option(REQUIRED, "number of leading blocks to keep")


def main(argv: list[str] | None = None) -> None:
    args = parse_config(TruncateConfig, argv, __doc__.split("\n\n")[0])
    out = truncate_layers(args.src, args.dst, args.layers)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
