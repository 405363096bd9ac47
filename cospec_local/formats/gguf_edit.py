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
import numpy as np

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
    add_kv: dict[str, tuple] | None = None,
    add_tensors: Iterable[tuple[str, Any, gguf.GGMLQuantizationType | None]] = (),
    arch: str | None = None,
) -> Path:
    """Copy `reader` to `dst`, editing metadata values and filtering tensors.

    `add_kv` maps key -> (value, type[, array element type]) for keys written after the copied ones
    (drop the key in `kv_edit` when replacing an existing one). `add_tensors`
    are (name, data, raw type or None for a plain float array) written after the
    kept tensors, e.g. new weights for a model that keeps the source's metadata.
    `arch` changes general.architecture (its keys are the caller's to rename).

    Tensors keep their raw (quantized) bytes and ggml type. Follows gguf-py's
    own gguf_new_metadata.py: the reader hands out tensor data in numpy order
    (reverse of ggml order; quantized rows as bytes) and the writer converts
    that back, so no manual shape juggling is needed.
    """
    dst = Path(dst)
    if Path(reader.data.filename).resolve() == dst.resolve():
        raise ValueError("destination must differ from the source (it is memory-mapped)")
    # Never leave a half-written GGUF at dst; a name of its own, since several processes may
    # make the same derived model at once (the last rename wins, with identical contents).
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(tmp, arch or architecture(reader), endianess=reader.endianess)
    writer.data_alignment = reader.alignment  # general.alignment is copied below

    for field in reader.fields.values():
        # general.architecture is written by GGUFWriter itself; GGUF.* are header pseudo-keys.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value = kv_edit(field.name, field.contents())
        if value is not None:
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)
    for key, (value, vtype, *sub_type) in (add_kv or {}).items():
        writer.add_key_value(key, value, vtype, sub_type=sub_type[0] if sub_type else None)

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


def q4_k_m_uses_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's Q4_K_M rule (llama-quant.cpp's use_more_bits) for the blocks whose ffn_down and
    attn_v it writes in Q6_K instead of Q4_K: the first and last eighth, and every third between."""
    return i_layer < n_layers // 8 or i_layer >= 7 * n_layers // 8 or (i_layer - n_layers // 8) % 3 == 2


# Types an extra block's weights may take: each one's all-zero block is the value 0.
EXTRA_BLOCK_TYPES = {gguf.GGMLQuantizationType[t] for t in ("Q4_0", "Q8_0", "Q4_K", "Q6_K")}


def add_ffn_blocks(src: str | Path, dst: str | Path, n_blocks: int, n_ff: int,
                   weight_type: gguf.GGMLQuantizationType = gguf.GGMLQuantizationType.Q8_0,
                   down_type: gguf.GGMLQuantizationType | str | None = None) -> Path:
    """Write to `dst` the llama model `src` followed by `n_blocks` feed-forward blocks of width
    `n_ff` whose weights are zero: `src`'s function at a larger per-token cost, a 135M model made
    to read as many bytes per token as a 1B or 8B one, for benchmarks of speculation at realistic
    sizes.

    An extra block has no attention and its FFN outputs silu(0) * 0 projected by zeros: it adds
    exactly 0 to the residual stream. It still costs what a real FFN of that shape costs, since a
    dense matrix product reads and multiplies every weight whatever its value. llama.cpp's llama
    architecture takes one FFN length for all blocks, so the result is written as `deci` (Llama
    with per-block head counts and FFN lengths, blocks without attention allowed). Its graph runs
    the same operations for the original blocks but one: when only some rows' logits are wanted
    (a prompt), the selection of those rows moves from the last original block to the last extra
    one, so that block's FFN runs on every row, which can change the last bits of a prompt's
    logits. Greedy outputs are tested equal. `weight_type` (the gate and up projections) and
    `down_type` (the down projection; default: weight_type; "q4_k_m": Q4_K or Q6_K block by block,
    as llama.cpp's Q4_K_M writes a model's ffn_down) must be block formats whose all-zero block is
    the value 0 (EXTRA_BLOCK_TYPES); a K-quant needs its rows in whole blocks of 256.
    """
    reader = open_gguf(src)
    arch, total = architecture(reader), block_count(reader)
    if arch != "llama":
        raise ValueError(f"only llama models can be extended, not {arch!r}")
    q4_k_m_down = isinstance(down_type, str) and down_type.lower() == "q4_k_m"
    if isinstance(down_type, str) and not q4_k_m_down:
        raise ValueError(f"down_type is a weight type or 'q4_k_m', not {down_type!r}")
    down_types = ({gguf.GGMLQuantizationType.Q4_K, gguf.GGMLQuantizationType.Q6_K} if q4_k_m_down
                  else {down_type or weight_type})
    for t in {weight_type} | down_types:
        if t not in EXTRA_BLOCK_TYPES:
            raise ValueError(f"extra blocks are {', '.join(sorted(x.name for x in EXTRA_BLOCK_TYPES))}, not {t.name}")
    if n_blocks < 1 or n_ff < 256 or n_ff % 256:
        raise ValueError(f"need n_blocks >= 1 and n_ff a positive multiple of 256, got {n_blocks}, {n_ff}")
    experts = reader.get_field(f"{arch}.expert_count")
    if experts is not None and experts.contents():
        raise ValueError("mixture-of-experts models are not supported")
    per_block = ("feed_forward_length", "attention.head_count", "attention.head_count_kv")
    fields = {f: reader.get_field(f"{arch}.{f}") for f in per_block + ("embedding_length",)}
    if fields["attention.head_count_kv"] is None:  # optional: as many KV heads as heads
        fields["attention.head_count_kv"] = fields["attention.head_count"]
    if any(v is None for v in fields.values()):
        raise ValueError(f"{src} lacks {arch}.{', '.join(f for f, v in fields.items() if v is None)}")
    values = {f: v.contents() for f, v in fields.items()}
    if any(isinstance(v, list) for v in values.values()):
        raise ValueError("models with per-block head counts or FFN lengths are not supported")
    n_embd = values["embedding_length"]
    if weight_type.name.endswith("_K") and n_embd % 256:
        raise ValueError(f"{weight_type.name} needs rows of whole 256-value blocks; the gate and up rows are "
                         f"{n_embd} wide (use Q4_0 there)")
    extra = {"feed_forward_length": n_ff, "attention.head_count": 0, "attention.head_count_kv": 0}
    new_arch = "deci"

    def kv_edit(key: str, value: Any) -> Any:
        if key.startswith(f"{arch}."):
            return None  # re-added below under the new architecture's prefix
        return None if key == gguf.Keys.General.NAME else value

    add_kv = {}
    for field in reader.fields.values():
        if field.name.startswith(f"{arch}."):
            rest = field.name[len(arch) + 1:]
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            add_kv[f"{new_arch}.{rest}"] = (field.contents(), field.types[0], sub)
    u32 = gguf.GGUFValueType.UINT32
    add_kv[f"{new_arch}.block_count"] = (total + n_blocks, u32)
    for f in per_block:
        add_kv[f"{new_arch}.{f}"] = ([values[f]] * total + [extra[f]] * n_blocks, gguf.GGUFValueType.ARRAY, u32)
    old = reader.get_field(gguf.Keys.General.NAME)
    add_kv[gguf.Keys.General.NAME] = (f"{old.contents() if old else Path(src).stem} (+{n_blocks} zero FFN blocks "
                                      f"of {n_ff}: same function, larger per-token cost)", gguf.GGUFValueType.STRING)

    def zeros(n_in: int, n_out: int, kind) -> np.ndarray:  # numpy order of a raw quantized tensor: a row of bytes per output
        block, type_size = gguf.GGML_QUANT_SIZES[kind]
        return np.zeros((n_out, n_in // block * type_size), dtype=np.uint8)

    def down_type_of(i: int):
        if not q4_k_m_down:
            return down_type or weight_type
        more = q4_k_m_uses_more_bits(i, total + n_blocks)
        return gguf.GGMLQuantizationType.Q6_K if more else gguf.GGMLQuantizationType.Q4_K

    def extra_tensors():
        for i in range(total, total + n_blocks):
            yield f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32), None
            yield f"blk.{i}.ffn_gate.weight", zeros(n_embd, n_ff, weight_type), weight_type
            yield f"blk.{i}.ffn_up.weight", zeros(n_embd, n_ff, weight_type), weight_type
            yield f"blk.{i}.ffn_down.weight", zeros(n_ff, n_embd, down_type_of(i)), down_type_of(i)

    return rewrite_gguf(reader, dst, kv_edit, add_kv=add_kv, add_tensors=extra_tensors(), arch=new_arch)


# Weight types whose all-zero bytes are the value 0 in every block (a zero scale, a zero minimum).
ZERO_BYTES_ARE_ZERO = {gguf.GGMLQuantizationType[t] for t in (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")}
_FFN_IN = ("ffn_gate", "ffn_up")  # [n_embd -> n_ff]: a channel is a row
_FFN_OUT = "ffn_down"             # [n_ff -> n_embd]: a channel is a column


def widen_ffn(src: str | Path, dst: str | Path, n_ff: int) -> Path:
    """Write to `dst` the llama model `src` with every FFN widened to `n_ff` channels whose weights
    are zero, in each tensor's own type: `src`'s function at the multiply count of a larger model,
    still in llama's architecture (whose graph gives an EAGLE-3 head the layers it reads, where
    `add_ffn_blocks`' `deci` does not), with its layer ids unchanged.

    A new channel's gate and up rows are zero, so it carries silu(0) * 0 = 0 into a down column
    of zeros: every product it adds is exactly 0. The original channels come first and are read
    in the same blocks, so their sums (and the quantized activations they multiply) are the same,
    bit for bit on the CPU, where both widths are whole 256-channel blocks: ggml's dot products
    then take the original channels in the same SIMD steps and add the new ones after them (a GPU
    library may split a longer sum otherwise).
    """
    reader = open_gguf(src)
    arch = architecture(reader)
    if arch != "llama":
        raise ValueError(f"only llama models can be widened, not {arch!r}")
    experts = reader.get_field(f"{arch}.expert_count")
    if experts is not None and experts.contents():
        raise ValueError("mixture-of-experts models are not supported")
    field = reader.get_field(f"{arch}.feed_forward_length")
    if field is None or isinstance(field.contents(), list):
        raise ValueError(f"{src} needs one {arch}.feed_forward_length for all blocks")
    old_ff = int(field.contents())
    ffn = {t.name: t for t in reader.tensors if _BLOCK_RE.match(t.name) and t.name.split(".")[2] in (*_FFN_IN, _FFN_OUT)
           and t.name.endswith(".weight") and len(t.shape) == 2}  # (biases keep their width)
    if not isinstance(n_ff, int) or n_ff <= old_ff:
        raise ValueError(f"n_ff must be an int above the model's {old_ff}, got {n_ff!r}")
    # (every weight type's block divides 256)
    if old_ff % 256 or n_ff % 256:
        raise ValueError(f"the FFN widths must be whole blocks of 256 channels (the model's {old_ff}, asked {n_ff})")
    for t in ffn.values():
        if t.tensor_type not in ZERO_BYTES_ARE_ZERO:
            raise ValueError(f"{t.name} is {t.tensor_type.name}, whose zero bytes are not known to be the value 0")

    def kv_edit(key: str, value: Any) -> Any:
        if key == f"{arch}.feed_forward_length":
            return n_ff
        return None if key == gguf.Keys.General.NAME else value

    def widened():
        for name, t in ffn.items():
            block, type_size = gguf.GGML_QUANT_SIZES[t.tensor_type]
            data = np.asarray(t.data)  # numpy order: a row per output, quantized rows as bytes
            if name.split(".")[2] in _FFN_IN:
                pad = np.zeros((n_ff - old_ff, *data.shape[1:]), dtype=data.dtype)
                data = np.concatenate([data, pad], axis=0)
            else:
                per_row = (n_ff - old_ff) // block * (type_size if data.dtype == np.uint8 else block)
                data = np.concatenate([data, np.zeros((data.shape[0], per_row), dtype=data.dtype)], axis=1)
            yield name, data, t.tensor_type if data.dtype == np.uint8 else None

    old = reader.get_field(gguf.Keys.General.NAME)
    name = f"{old.contents() if old else Path(src).stem} (FFN widened to {n_ff} by zero channels: same function)"
    return rewrite_gguf(reader, dst, kv_edit, keep_tensor=lambda n: n not in ffn,
                        add_kv={gguf.Keys.General.NAME: (name, gguf.GGUFValueType.STRING)}, add_tensors=widened())


# Where a layer's output reaches the residual stream only through these weights, a layer whose
# every one of them is zero adds exactly 0 (Gemma 3: the attention output and the FFN's down
# projection, each then RMS-normed, and an RMS norm of a zero vector is zero).
ZERO_LAYER_OUTPUTS = {"gemma3": ("attn_output", "ffn_down")}


def add_zero_layers(src: str | Path, dst: str | Path, n_layers: int) -> Path:
    """Write to `dst` the model `src` followed by `n_layers` copies of its first layer's shape
    whose matrices are zero (F32) and whose norms are one: `src`'s function at a larger per-token
    cost, for architectures whose layers all share one shape (`add_ffn_blocks` does this for
    llama, which can carry layers of other widths).

    Each extra layer's attention and FFN read the residual stream and write zero into it
    (ZERO_LAYER_OUTPUTS), so every logit is what `src` computes, bit for bit: x + 0 is x. A dense
    product still reads every weight, so the layer costs what a real one of its bytes costs; F32
    makes each as dear as a quantized layer four to eight times its width. Extra layers come after
    the source's, so the sliding-window pattern of the source's layers (set by their index) is
    unchanged. One graph change: when only some rows' logits are wanted (a prompt), their selection
    moves to the last extra layer, after which the same row-wise operations run on fewer rows.
    """
    if not isinstance(n_layers, int) or n_layers < 1:
        raise ValueError(f"n_layers must be a positive int, got {n_layers!r}")
    reader = open_gguf(src)
    arch, total = architecture(reader), block_count(reader)
    if arch not in ZERO_LAYER_OUTPUTS:
        raise ValueError(f"zero layers are known to add nothing only for {', '.join(ZERO_LAYER_OUTPUTS)}, not {arch!r}")
    per_layer = [k for k, f in reader.fields.items()
                 if k.startswith(f"{arch}.") and f.types[0] == gguf.GGUFValueType.ARRAY and len(f.data) == total]
    if per_layer:
        raise ValueError(f"per-layer hyperparameters ({', '.join(per_layer)}) are not supported")
    first = [t for t in reader.tensors if t.name.startswith("blk.0.")]
    matrices = [t for t in first if len(t.shape) == 2]
    outputs = {t.name.split(".")[2] for t in matrices} & set(ZERO_LAYER_OUTPUTS[arch])
    if outputs != set(ZERO_LAYER_OUTPUTS[arch]):
        raise ValueError(f"{src}'s layers lack {', '.join(sorted(set(ZERO_LAYER_OUTPUTS[arch]) - outputs))}")

    def kv_edit(key: str, value: Any) -> Any:
        if key == f"{arch}.block_count":
            return total + n_layers
        return None if key == gguf.Keys.General.NAME else value

    def extra_tensors():
        for i in range(total, total + n_layers):
            for t in first:
                name = f"blk.{i}." + t.name[len("blk.0."):]
                shape = tuple(int(n) for n in reversed(t.shape))  # numpy order
                fill = np.zeros if len(t.shape) == 2 else np.ones
                yield name, fill(shape, dtype=np.float32), None

    old = reader.get_field(gguf.Keys.General.NAME)
    name = (f"{old.contents() if old else Path(src).stem} (+{n_layers} zero layers: same function, larger "
            f"per-token cost)")
    return rewrite_gguf(reader, dst, kv_edit, add_kv={gguf.Keys.General.NAME: (name, gguf.GGUFValueType.STRING)},
                        add_tensors=extra_tensors())


EMBEDDING = "token_embd.weight"
EMBEDDING_DIGEST_KEY = "cospec.embedding_sha256"
EMBEDDING_INDEX_KEY = "cospec.embedding_index"  # its place among the tensors: fingerprints follow tensor order


def _drop_embedding_keys(key: str, value: Any) -> Any:
    return None if key in (EMBEDDING_DIGEST_KEY, EMBEDDING_INDEX_KEY) else value


def _embedding_digest(tensor) -> str:
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(tensor.data).tobytes()).hexdigest()


def strip_embedding(src: str | Path, dst: str | Path) -> Path:
    """Write to `dst` the model `src` without its (tied) token embedding, recording the
    embedding's digest: a draft that shares its target's embedding ships as its blocks alone
    (a SmolLM2 draft's embedding is 85% of its bytes) and is rebuilt by graft_embedding."""
    reader = open_gguf(src)
    names = [t.name for t in reader.tensors]
    if EMBEDDING not in names:
        raise ValueError(f"{src} has no {EMBEDDING}")
    embedding = reader.tensors[names.index(EMBEDDING)]
    return rewrite_gguf(reader, dst, _drop_embedding_keys,
                        keep_tensor=lambda name: name != EMBEDDING,
                        add_kv={EMBEDDING_DIGEST_KEY: (_embedding_digest(embedding), gguf.GGUFValueType.STRING),
                                EMBEDDING_INDEX_KEY: (names.index(EMBEDDING), gguf.GGUFValueType.UINT32)})


def graft_embedding(blocks: str | Path, embedding_source: str | Path, dst: str | Path) -> Path:
    """Write to `dst` the model of `blocks` (made by strip_embedding) with the token embedding of
    `embedding_source` (the target it was trained with), byte for byte. Refused when that
    embedding is not the one the blocks were made with."""
    reader, source = open_gguf(blocks), open_gguf(embedding_source)
    field = reader.get_field(EMBEDDING_DIGEST_KEY)
    if field is None:
        raise ValueError(f"{blocks} records no embedding ({EMBEDDING_DIGEST_KEY}): not made by strip_embedding")
    index = reader.get_field(EMBEDDING_INDEX_KEY)
    index = int(index.contents()) if index is not None else 0
    if not 0 <= index <= len(reader.tensors):
        raise ValueError(f"{blocks}: {EMBEDDING_INDEX_KEY} {index} is outside its {len(reader.tensors)} tensors")
    embedding = next((t for t in source.tensors if t.name == EMBEDDING), None)
    if embedding is None or _embedding_digest(embedding) != field.contents():
        raise ValueError(f"{embedding_source} does not hold the embedding {Path(blocks).name} was trained with")
    # Every tensor in the order the whole model had: the result's fingerprint is the trained draft's.
    tensors = [(t.name, t.data, t.tensor_type) for t in reader.tensors]
    tensors.insert(index, (EMBEDDING, embedding.data, embedding.tensor_type))
    return rewrite_gguf(reader, dst, _drop_embedding_keys,
                        keep_tensor=lambda name: False, add_tensors=tensors)
