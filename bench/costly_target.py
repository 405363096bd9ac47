"""Write a llama GGUF followed by zero feed-forward blocks: the source's exact function at the
per-token cost of a larger model (`cospec_local.formats.gguf_edit.add_ffn_blocks`). The named models
`smollm2-135m-as-1b` / `-as-8b` are SmolLM2 made this way; this script makes the same from any
llama GGUF, e.g. the bundled distilled draft on a machine without SmolLM2:

    python bench/costly_target.py smollm2-135m-draft OUT.gguf --size 8b
"""
from __future__ import annotations

import argparse

import gguf

from cospec_local.formats.gguf_edit import add_ffn_blocks
from cospec_local.models import SMOLLM2_AT_COST, resolve_model


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("source", help="llama GGUF file or named model")
    ap.add_argument("out", help="GGUF to write")
    ap.add_argument("--size", choices=sorted(SMOLLM2_AT_COST), default="1b",
                    help="cost to add: 1b (16 blocks of 34,816 Q8_0 channels) or 8b (32 blocks of 147,456 Q4_0)")
    a = ap.parse_args()
    n_blocks, n_ff, weight_type = SMOLLM2_AT_COST[a.size]
    path = add_ffn_blocks(resolve_model(a.source), a.out, n_blocks, n_ff, gguf.GGMLQuantizationType[weight_type])
    print(path)


if __name__ == "__main__":
    main()
