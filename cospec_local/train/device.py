"""Where the torch stages run: one rule for every training entry point's --device."""
from __future__ import annotations


def resolve_device(device: str):
    """The torch device generation and training run on: `auto` is the first CUDA device where torch
    sees one (data and training in minutes instead of hours), else the CPU."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError:  # torch's own message names its whole list of device kinds
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be auto, cpu or cuda[:N], not {device!r}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {device}: this torch sees no CUDA device")
    return dev
