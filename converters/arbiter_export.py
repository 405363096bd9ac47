"""Write a learned arbiter as the folder the engine loads (`--arbiter FOLDER`):

    arbiter.gguf   the head's weights (F32) and the metadata binding it to its draft:
                   cospec.arbiter.{version, kind, name, threshold, draft_fingerprint, draft_file,
                   head_layers, n_features, verify_cost, n_embd, adapter, lora_scale, lora_context, ...}
    adapter.gguf   (kind `lora`) the LoRA adapter in llama.cpp's format: general.type = adapter,
                   adapter.type = lora, adapter.lora.alpha, tensors <base tensor>.lora_a / .lora_b
                   (llama.cpp's loader refuses any other tensor, so the head is not in here)
    head.onnx      the same head with its sigmoid, for ONNX Runtime (rows -> P(keep))

The LoRA B matrices of attn_q / attn_k get the row permutation converters.llama_to_gguf applies
to those weights (Hugging Face's rotate-half rope -> llama.cpp's NORM rope): P(W + BA) = PW + (PB)A.
"""
from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np

from .llama_to_gguf import permute_qk

FORMAT_VERSION = 1  # native/src/learned_arbiter.cpp reads this version
KEY = "cospec.arbiter."


def head_tensors(head) -> list[tuple[str, np.ndarray]]:
    """The engine's names for a torch `Head`'s tensors (nn.Linear layout: weight (out, in))."""
    out = [("head.in_mean", head.in_mean), ("head.in_scale", head.in_scale)]
    for i, layer in enumerate(head.layers):
        out += [(f"head.{i}.weight", layer.weight), (f"head.{i}.bias", layer.bias)]
    return [(name, t.detach().cpu().numpy().astype(np.float32)) for name, t in out]


def draft_heads(draft_gguf: Path) -> tuple[int, int]:
    reader = gguf.GGUFReader(draft_gguf, "r")

    def get(key):
        field = reader.get_field(key)
        return None if field is None else field.contents()

    n_head = int(get("llama.attention.head_count"))
    return n_head, int(get("llama.attention.head_count_kv") or n_head)


def write_adapter(path: Path, lora: dict[str, tuple[np.ndarray, np.ndarray]], alpha: float, draft_gguf: Path) -> Path:
    n_head, n_head_kv = draft_heads(draft_gguf)
    writer = gguf.GGUFWriter(path, gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA])
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    for name, (a, b) in sorted(lora.items()):
        if name.endswith("attn_q.weight"):
            b = permute_qk(b, n_head)
        elif name.endswith("attn_k.weight"):
            b = permute_qk(b, n_head_kv)
        writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a, dtype=np.float32))
        writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_onnx(path: Path, head) -> Path:
    """head.onnx: float32 rows (N, n_in) -> P(keep) (N,), checked with onnx.checker."""
    import onnx
    import torch

    from cospec_local.train.arbiter_model import ProbabilityHead

    model = ProbabilityHead(head).eval()
    n_in = head.in_mean.shape[0]
    example = torch.zeros(2, n_in)
    torch.onnx.export(model, (example,), str(path), input_names=["inputs"], output_names=["p_keep"],
                      dynamic_shapes={"x": {0: torch.export.Dim("rows")}}, dynamo=True, verbose=False,
                      external_data=False)
    # One self-contained file (some exporter versions still write weights beside it).
    loaded = onnx.load(str(path))
    onnx.save_model(loaded, str(path), save_as_external_data=False)
    Path(str(path) + ".data").unlink(missing_ok=True)
    onnx.checker.check_model(onnx.load(str(path)), full_check=True)
    return path


def write_arbiter(out_dir: str | Path, *, kind: str, head, draft_gguf: str | Path, threshold: float, name: str,
                  description: str = "", lora: dict | None = None, lora_alpha: float | None = None,
                  n_embd: int | None = None, lora_context: str = "draft", verify_cost: float | None = None,
                  info: dict | None = None, onnx: bool = True) -> Path:
    """Write the arbiter folder; `info` (training settings, measurements) goes into arbiter.gguf
    as one JSON string and into info.json beside it, for people. verify_cost is the timing-free
    length model's verify cost the training states were drafted under: the engine drafts under it
    too wherever a call leaves that setting at its default. onnx=False leaves out head.onnx
    (the engine's native head does not need it; a training run's intermediate policies skip it)."""
    from cospec_local import _cospec

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    draft_gguf = Path(draft_gguf)
    tensors = head_tensors(head)
    n_layers = sum(1 for n, _ in tensors if n.endswith(".weight"))
    writer = gguf.GGUFWriter(out / "arbiter.gguf", "cospec-arbiter")
    writer.add_type("arbiter")
    writer.add_uint32(KEY + "version", FORMAT_VERSION)
    writer.add_string(KEY + "kind", kind)
    writer.add_string(KEY + "name", name)
    writer.add_string(KEY + "description", description)
    writer.add_float32(KEY + "threshold", float(threshold))
    writer.add_string(KEY + "draft_fingerprint", _cospec.model_fingerprint(str(draft_gguf)))
    writer.add_string(KEY + "draft_file", draft_gguf.name)
    writer.add_uint32(KEY + "head_layers", n_layers)
    writer.add_uint32(KEY + "n_features", int(_cospec.N_FEATURES))
    writer.add_string(KEY + "features", ",".join(_cospec.FEATURE_NAMES))
    if verify_cost is not None:
        writer.add_float32(KEY + "verify_cost", float(verify_cost))
    if kind == "lora":
        if lora is None or lora_alpha is None or n_embd is None:
            raise ValueError("a lora arbiter needs its LoRA weights, alpha and n_embd")
        writer.add_uint32(KEY + "n_embd", int(n_embd))
        writer.add_string(KEY + "adapter", "adapter.gguf")
        writer.add_float32(KEY + "lora_scale", 1.0)
        writer.add_string(KEY + "lora_context", lora_context)
        write_adapter(out / "adapter.gguf", lora, lora_alpha, draft_gguf)
    writer.add_string(KEY + "info", json.dumps(info or {}, sort_keys=True))
    for tensor_name, data in tensors:
        writer.add_tensor(tensor_name, np.ascontiguousarray(data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if onnx:
        write_onnx(out / "head.onnx", head)
    (out / "info.json").write_text(json.dumps({"kind": kind, "name": name, "description": description,
                                                "threshold": threshold, "draft_file": draft_gguf.name,
                                                **(info or {})}, indent=1, sort_keys=True) + "\n")
    return out
