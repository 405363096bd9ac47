"""Write a llama-architecture GGUF as a Hugging Face folder (config.json + model.safetensors),
dequantized to float32: the weights llama.cpp computes with, ready for torch fine-tuning.

    python -m converters.gguf_to_torch MODEL.gguf OUT_DIR [--layers N]

The reader is cospec_local.formats.gguf_llama_reader; needs the `train` extra (torch, transformers).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from cospec_local.formats.gguf_llama_reader import load_llama_gguf
from cospec_local.command_line import REQUIRED, option, parse_config


@dataclass
class GGUFToTorchConfig:
    gguf: Path = option(REQUIRED, "input GGUF (llama architecture)", positional=True)
    out: Path = option(REQUIRED, "output folder", positional=True)
    layers: int | None = option(None, "keep only the first N blocks (default: all)")


def main(argv: list[str] | None = None) -> None:
    args = parse_config(GGUFToTorchConfig, argv, __doc__.split("\n\n")[0])
    if not args.gguf.is_file():
        raise SystemExit(f"{args.gguf}: file not found")
    model = load_llama_gguf(args.gguf, args.layers)
    model.save_pretrained(args.out)
    print(f"wrote {args.out} ({model.config.num_hidden_layers} blocks, {model.num_parameters() / 1e6:.1f}M parameters)")


if __name__ == "__main__":
    main()
