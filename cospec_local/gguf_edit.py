"""Editing GGUF files with the gguf package: copy with metadata edits and a
tensor filter, and build a shallow draft from a model's first N blocks.

A truncated draft shares the target's vocabulary, tokenizer and embeddings
byte for byte, so it is a valid same-vocabulary draft that needs no training.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Iterable

import gguf

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.")

# Maps (key, value) -> new value; returning None drops the key.
KvEdit = Callable[[str, Any], Any]


def open_gguf(path: str | Path) -> gguf.GGUFReader:
    """Open a GGUF for reading, turning the usual failures into clear errors."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (bad magic)")
    try:
        return gguf.GGUFReader(path, "r")
    except Exception as exc:  # truncated or malformed header/tensor table
        raise ValueError(f"{path} is not a readable GGUF file: {exc}") from exc


def architecture(reader: gguf.GGUFReader) -> str:
    field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if field is None:
        raise ValueError("GGUF has no general.architecture key")
    return field.contents()


def block_count(reader: gguf.GGUFReader) -> int:
    arch = architecture(reader)
    field = reader.get_field(f"{arch}.block_count")
    if field is None:
        raise ValueError(f"GGUF has no {arch}.block_count key")
    return int(field.contents())


def rewrite_gguf(
    reader: gguf.GGUFReader,
    dst: str | Path,
    kv_edit: KvEdit = lambda key, value: value,
    keep_tensor: Callable[[str], bool] = lambda name: True,
    add_kv: dict[str, tuple[Any, gguf.GGUFValueType]] | None = None,
    add_tensors: Iterable[tuple[str, Any, gguf.GGMLQuantizationType | None]] = (),
) -> Path:
    """Copy `reader` to `dst`, editing metadata values and filtering tensors.

    `add_kv` maps key -> (value, type) for keys written after the copied ones
    (drop the key in `kv_edit` when replacing an existing one). `add_tensors`
    are (name, data, raw type or None for a plain float array) written after the
    kept tensors, e.g. new weights for a model that keeps the source's metadata.

    Tensors keep their raw (quantized) bytes and ggml type. Follows gguf-py's
    own gguf_new_metadata.py: the reader hands out tensor data in numpy order
    (reverse of ggml order; quantized rows as bytes) and the writer converts
    that back, so no manual shape juggling is needed.
    """
    dst = Path(dst)
    if Path(reader.data.filename).resolve() == dst.resolve():
        raise ValueError("destination must differ from the source (it is memory-mapped)")
    tmp = dst.with_name(dst.name + ".tmp")  # never leave a half-written GGUF at dst
    writer = gguf.GGUFWriter(tmp, architecture(reader), endianess=reader.endianess)
    writer.data_alignment = reader.alignment  # general.alignment is copied below

    for field in reader.fields.values():
        # general.architecture is written by GGUFWriter itself; GGUF.* are header pseudo-keys.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = kv_edit(field.name, field.contents())
        if value is not None:
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    for key, (value, vtype) in (add_kv or {}).items():
        writer.add_key_value(key, value, vtype)

    for t in reader.tensors:
        if keep_tensor(t.name):
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type, tensor_endianess=reader.endianess)
    for name, data, raw_dtype in add_tensors:
        writer.add_tensor(name, data, raw_dtype=raw_dtype)

    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def truncate_layers(src: str | Path, dst: str | Path, n_layers: int) -> Path:
    """Write to `dst` a GGUF holding the first `n_layers` blocks of `src`.

    All metadata is copied unchanged except `<arch>.block_count`, per-layer
    `<arch>.*` arrays (sliced to n_layers) and `general.name`. Non-block tensors
    (token_embd, output_norm, output if untied) are kept as they are.
    """
    reader = open_gguf(src)
    arch, total = architecture(reader), block_count(reader)
    if not isinstance(n_layers, int) or not 1 <= n_layers <= total:
        raise ValueError(f"n_layers must be an int in [1, {total}], got {n_layers!r}")

    def kv_edit(key: str, value: Any) -> Any:
        if key == f"{arch}.block_count":
            return n_layers
        if key == gguf.Keys.General.NAME:
            return None  # re-added below, also when the source has no name
        # Some architectures store per-layer hyperparameters as arrays.
        if key.startswith(f"{arch}.") and isinstance(value, list) and len(value) == total:
            return value[:n_layers]
        return value

    def keep_tensor(name: str) -> bool:
        m = _BLOCK_RE.match(name)
        return m is None or int(m.group(1)) < n_layers

    old = reader.get_field(gguf.Keys.General.NAME)
    name = f"{old.contents() if old else Path(src).stem} (truncated draft: first {n_layers} of {total} layers)"
    return rewrite_gguf(reader, dst, kv_edit, keep_tensor,
                        add_kv={gguf.Keys.General.NAME: (name, gguf.GGUFValueType.STRING)})
