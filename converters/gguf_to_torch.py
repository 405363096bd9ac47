"""Write a llama-architecture GGUF as a Hugging Face folder (config.json + model.safetensors),
dequantized to float32: the weights llama.cpp computes with, ready for torch fine-tuning.

    python -m converters.gguf_to_torch MODEL.gguf OUT_DIR [--layers N]

The reader is cospec_local.convert.gguf_to_torch; needs the `train` extra (torch, transformers).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from cospec_local.convert.gguf_to_torch import load_llama_gguf


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gguf", type=Path, help="input GGUF (llama architecture)")
    ap.add_argument("out", type=Path, help="output folder")
    ap.add_argument("--layers", type=int, default=None, help="keep only the first N blocks (default: all)")
    args = ap.parse_args(argv)
    if not args.gguf.is_file():
        raise SystemExit(f"{args.gguf}: file not found")
    model = load_llama_gguf(args.gguf, args.layers)
    model.save_pretrained(args.out)
    print(f"wrote {args.out} ({model.config.num_hidden_layers} blocks, {model.num_parameters() / 1e6:.1f}M parameters)")


if __name__ == "__main__":
    main()
