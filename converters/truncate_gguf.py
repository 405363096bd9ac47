"""Build a shallow draft model by keeping only the first N blocks of a GGUF.

    python -m converters.truncate_gguf SRC DST --layers N
"""
from __future__ import annotations

import argparse
from pathlib import Path

from cospec_local.gguf_edit import truncate_layers


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src", type=Path, help="input GGUF (llama, gemma3, ... architecture)")
    ap.add_argument("dst", type=Path, help="output GGUF")
    ap.add_argument("--layers", type=int, required=True, help="number of leading blocks to keep")
    args = ap.parse_args(argv)
    out = truncate_layers(args.src, args.dst, args.layers)
    print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
