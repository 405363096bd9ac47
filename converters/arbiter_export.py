"""Write an arbiter folder's head as head.onnx (ONNX Runtime: `--arbiter-head onnx`), from the
weights in its arbiter.gguf, and check that both compute the same P(keep).

    python -m converters.arbiter_export ARBITER_FOLDER -md DRAFT.gguf

Training writes head.onnx itself; this is for a folder without one (e.g. an intermediate
policy of a GRPO run). The format is cospec_local.arbiter.file_format; needs the `train` extra.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cospec_local.arbiter.file_format import ONNX_FILE, write_onnx
from cospec_local.models import resolve_model
from cospec_local.command_line import REQUIRED, option, parse_config


@dataclass
class ArbiterExportConfig:
    arbiter: Path = option(REQUIRED, "arbiter folder (arbiter.gguf, and adapter.gguf for a lora arbiter)", positional=True)
    model_draft: str = option(REQUIRED, "the draft it was made for (named model or GGUF path)", ("-md", "--model-draft"))


def main(argv: list[str] | None = None) -> None:
    args = parse_config(ArbiterExportConfig, argv, __doc__.split("\n\n")[0])
    import onnxruntime
    import torch

    from cospec_local.train.arbiter_model import load_arbiter

    model = load_arbiter(args.arbiter, resolve_model(args.model_draft))
    path = write_onnx(args.arbiter / ONNX_FILE, model.head)
    rows = torch.randn(64, model.head.in_mean.numel()) / model.head.in_scale + model.head.in_mean
    with torch.no_grad():
        expected = torch.sigmoid(model.head(rows)).numpy()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: rows.numpy().astype(np.float32)})[0]
    error = float(np.abs(got - expected).max())
    if error > 1e-5:
        raise SystemExit(f"{path}: P(keep) differs from arbiter.gguf's head by up to {error:.2e}")
    print(f"wrote {path} (P(keep) within {error:.1e} of arbiter.gguf's head on 64 rows)")


if __name__ == "__main__":
    main()
