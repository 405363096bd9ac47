"""A corpus of structured corruptions of the demo pair's GGUF files, and a runner that loads each
one in a worker process and classifies what happened.

    python tests/gguf_corpus.py --out runs/corpus              # build and run all cases (about 3 minutes)
    python tests/gguf_corpus.py --out runs/corpus --arbiters   # the arbiter cases
    python tests/gguf_corpus.py --out runs/corpus --heads      # the EAGLE-3 head cases

Every case must end as a clean typed error (a CospecError subclass with a short, valid message)
or a correct run (finite logits, a few tokens); never a signal, a hang, more than 2 GiB, an
untyped exception or NaN garbage. Mutations (each deterministic, from the case name):

- metadata: every scalar key of both models with its type kept (0, 1, -1, the type's maximum,
  NaN, inf, ...), its type changed (string, float, array) or deleted; unknown architectures and
  tokenizer models; per-layer arrays with zeros;
- tokens: duplicate, empty, very long and invalid-UTF-8 token texts, lists shorter or longer than
  the others, NaN scores, bad token types, special-token ids out of range;
- tensor infos: unknown types, wrong shapes and dimension counts, offsets out of range or
  misaligned, duplicate and missing tensors; general.alignment values;
- the header (magic, version, counts), truncations, seeded bit flips;
- pairs: a clean target with a mutated draft, and drafts whose vocabulary, tokenizer or special
  tokens differ from the target's;
- arbiters (`arbiter_cases`, with `--arbiters`): the shipped arbiters' LoRA adapter or head file
  mutated as above (keys, tensor infos, header, truncations, bit flips), loaded for the clean pair
  and asked about a block;
- heads (`head_cases`, with `--heads`): the shipped EAGLE-3 head for SmolLM2 mutated as above, plus
  the layers it reads and the widths it names, opened beside its clean target and drafted from,
  greedy and sampled.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cospec_local.formats.gguf_edit import open_gguf, rewrite_gguf  # noqa: E402

T = gguf.GGUFValueType
PER_TOKEN = (gguf.Keys.Tokenizer.LIST, gguf.Keys.Tokenizer.SCORES, gguf.Keys.Tokenizer.TOKEN_TYPE)
CASE_TIMEOUT = 30.0
MEMORY_LIMIT = 2 << 30


@dataclass
class Case:
    name: str
    target: str
    draft: str | None
    arbiter: str | None = None  # an arbiter folder, loaded for the clean pair and run
    head: bool = False  # the draft is a head drafter: draft with it, not with arbiters


# ---------------------------------------------------------------------------------------- writing


def with_kv(src: Path, dst: Path, key: str, value, vtype=None, sub_type=None) -> Path:
    """src with metadata `key` set to `value` of `vtype` (arrays: of `sub_type`; None: deleted)."""
    reader = open_gguf(src)

    def edit(k, v):
        return None if k == key else v

    add = {} if value is None else {key: (value, vtype) if sub_type is None else (value, vtype, sub_type)}
    return rewrite_gguf(reader, dst, edit, add_kv=add)


@functools.lru_cache(maxsize=4)
def _layout(src: Path) -> tuple[bytes, dict[str, tuple[int, int]], int, int, int]:
    """A GGUF's bytes, each key's byte range, where the tensor infos end, its alignment and
    where its data starts (reading a whole vocabulary's header once)."""
    reader = open_gguf(src)

    def span(f):
        return int(f.offset), int(f.offset) + sum(int(part.nbytes) for part in f.parts)

    keys = {f.name: span(f) for f in reader.fields.values() if not f.name.startswith("GGUF.")}
    return src.read_bytes(), keys, span(reader.tensors[-1].field)[1], reader.alignment, reader.data_offset


def spliced_kv(src: Path, dst: Path, key: str, value, vtype=None, sub_type=None) -> Path:
    """with_kv by bytes, for files whose other keys are costly to write again (a whole vocabulary):
    the one key replaced in place, dropped or added after the others, the rest copied as it is."""
    raw, keys, infos_end, alignment, data_offset = _layout(src)
    new = b""
    if value is not None:
        writer = gguf.GGUFWriter(None, "llama")
        new = writer._pack_val(key, T.STRING, add_vtype=False) + \
            writer._pack_val(value, vtype, add_vtype=True, sub_type=sub_type)
    at, cut = keys[key] if key in keys else (max(end for _, end in keys.values()),) * 2
    n_kv = struct.unpack_from("<Q", raw, 16)[0] + (value is not None) - (key in keys)
    body = raw[:16] + struct.pack("<Q", n_kv) + raw[24:at] + new + raw[cut:infos_end]
    body += b"\0" * (-len(body) % alignment)
    dst.write_bytes(body + raw[data_offset:])
    return dst


def with_tokens(src: Path, dst: Path, change) -> Path:
    """src with its per-token arrays passed through change(key, list) -> list."""
    reader = open_gguf(src)
    return rewrite_gguf(reader, dst, lambda k, v: change(k, list(v)) if k in PER_TOKEN else v)


def patched(src: Path, dst: Path, offset: int, data: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    raw[offset:offset + len(data)] = data
    dst.write_bytes(bytes(raw))
    return dst


def tensor_info_offsets(src: Path) -> dict[str, int]:
    """Byte offset of each tensor's info record (its name's length field)."""
    reader = open_gguf(src)
    return {t.name: int(t.field.offset) for t in reader.tensors}


# ---------------------------------------------------------------------------------------- cases


def scalar_variants(vtype) -> list[tuple[str, object, object]]:
    ints = {T.UINT8: 255, T.UINT16: 65535, T.UINT32: 2**32 - 1, T.UINT64: 2**64 - 1,
            T.INT8: 127, T.INT16: 32767, T.INT32: 2**31 - 1, T.INT64: 2**63 - 1}
    if vtype in ints:
        out = [("zero", 0, vtype), ("one", 1, vtype), ("max", ints[vtype], vtype)]
        if vtype in (T.INT8, T.INT16, T.INT32, T.INT64):
            out.append(("minus1", -1, vtype))
        return out + [("as-string", "x", T.STRING), ("as-float", 1.5, T.FLOAT32)]
    if vtype in (T.FLOAT32, T.FLOAT64):
        return [("zero", 0.0, vtype), ("nan", float("nan"), vtype), ("inf", float("inf"), vtype),
                ("neg", -1.0, vtype), ("tiny", 1e-38, vtype), ("as-int", 7, T.UINT32), ("as-string", "x", T.STRING)]
    if vtype == T.BOOL:
        return [("flip", None, vtype), ("as-int", 2, T.UINT32)]
    if vtype == T.STRING:
        return [("empty", "", vtype), ("long", "x" * 100_000, vtype), ("as-int", 1, T.UINT32)]
    return []


def kv_cases(src: Path, d: Path, tag: str, keep=lambda key: True, write=with_kv) -> list[tuple[str, Path]]:
    """Every scalar key with its type kept, its type changed, or deleted; every array key deleted
    (of the keys `keep` selects, each file written by `write`)."""
    reader = open_gguf(src)
    out = []
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE or not keep(field.name):
            continue
        vtype = field.types[0]
        safe = field.name.replace(".", "_")
        if vtype != T.ARRAY:
            for label, value, new_type in scalar_variants(vtype):
                if label == "flip":
                    value = not field.contents()
                out.append((f"{tag}-kv-{safe}-{label}", write(src, d / f"{tag}-kv-{safe}-{label}.gguf", field.name,
                                                               value, new_type)))
        out.append((f"{tag}-kv-{safe}-deleted", write(src, d / f"{tag}-kv-{safe}-deleted.gguf", field.name, None)))
    return out


def metadata_cases(src: Path, d: Path, tag: str) -> list[tuple[str, Path]]:
    reader = open_gguf(src)
    out = kv_cases(src, d, tag)
    special = [("arch-unknown", gguf.Keys.General.ARCHITECTURE, "nonesuch"), ("arch-gemma3", gguf.Keys.General.ARCHITECTURE, "gemma3"),
               ("tok-bert", gguf.Keys.Tokenizer.MODEL, "bert"), ("tok-no_vocab", gguf.Keys.Tokenizer.MODEL, "no_vocab"),
               ("tok-none", gguf.Keys.Tokenizer.MODEL, "none"), ("tok-gpt2", gguf.Keys.Tokenizer.MODEL, "gpt2"),
               ("tok-rwkv", gguf.Keys.Tokenizer.MODEL, "rwkv"), ("tok-t5", gguf.Keys.Tokenizer.MODEL, "t5"),
               ("pre-unknown", gguf.Keys.Tokenizer.PRE, "nonesuch")]
    for label, key, value in special:
        path = d / f"{tag}-{label}.gguf"
        if key == gguf.Keys.General.ARCHITECTURE:
            raw = bytearray(src.read_bytes())
            old = b"llama"
            i = raw.find(b"general.architecture") + len(b"general.architecture") + 4 + 8
            if raw[i:i + len(old)] == old and len(value) == len(old):
                raw[i:i + len(old)] = value.encode()
                path.write_bytes(bytes(raw))
            else:  # a different length: rewrite the whole header
                rewrite_gguf(reader, path)
                blob = path.read_bytes().replace(b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
                                                 len(value).to_bytes(8, "little") + value.encode(), 1)
                path.write_bytes(blob)
            out.append((f"{tag}-{label}", path))
        else:
            out.append((f"{tag}-{label}", with_kv(src, path, key, value, T.STRING)))
    n_layer = int(reader.get_field("llama.block_count").contents())
    for key in ("llama.attention.head_count", "llama.attention.head_count_kv", "llama.feed_forward_length"):
        value = int(reader.get_field(key).contents())
        for label, arr in (("zero-in-array", [value] * (n_layer - 1) + [0]), ("short-array", [value]),
                           ("long-array", [value] * (n_layer + 3))):
            name = f"{tag}-{key.replace('.', '_')}-{label}"
            out.append((name, with_kv(src, d / f"{name}.gguf", key, arr, T.ARRAY, T.UINT32)))
    for label, value in (("0", 0), ("1", 1), ("2", 2), ("3", 3), ("4", 4), ("7", 7), ("8", 8), ("16", 16), ("64", 64),
                         ("huge", 2**31)):
        name = f"{tag}-alignment-{label}"
        out.append((name, with_kv(src, d / f"{name}.gguf", gguf.Keys.General.ALIGNMENT, value, T.UINT32)))
    return out


# Token lists that collide only as llama.cpp's loader reads them (C strings; an empty text named
# [EMPTY_<id>]): label -> edit of the token list. The "-distinct" ones do not collide and must load.
EMPTY_NAME_EDITS = {
    "after": lambda v: v[:300] + ["", "[EMPTY_300]"] + v[302:],
    "before": lambda v: v[:300] + ["[EMPTY_301]", ""] + v[302:],
    "far-apart": lambda v: v[:5] + ["[EMPTY_450]"] + v[6:450] + [""] + v[451:],
    "nul-first": lambda v: v[:300] + ["\x00hidden", "[EMPTY_300]"] + v[302:],
    "nul-inside": lambda v: v[:300] + [v[299] + "\x00tail"] + v[301:],
    "two-empties-distinct": lambda v: v[:300] + ["", ""] + v[302:],
    "zero-padded-distinct": lambda v: v[:300] + ["", "[EMPTY_0300]"] + v[302:],
    "other-id-distinct": lambda v: v[:300] + ["", "[EMPTY_299]"] + v[302:],
}


def token_cases(src: Path, d: Path, tag: str) -> list[tuple[str, Path]]:
    reader = open_gguf(src)
    n = len(reader.get_field(gguf.Keys.Tokenizer.LIST).data)
    tokens = list(reader.get_field(gguf.Keys.Tokenizer.LIST).contents())

    def tok_edit(f):
        return lambda key, values: f(list(values)) if key == gguf.Keys.Tokenizer.LIST else values

    def all_edit(f):
        return lambda key, values: f(list(values)) if key in PER_TOKEN else values

    edits = {
        "dup-early": tok_edit(lambda v: v[:300] + [v[299]] + v[301:]),
        "dup-late": tok_edit(lambda v: v[:-2] + [v[-3], v[-1]]),
        "dup-special": tok_edit(lambda v: [v[0], v[0]] + v[2:]),
        "empty-token": tok_edit(lambda v: v[:400] + [""] + v[401:]),
        # llama.cpp names an empty token text [EMPTY_<id>]; another token spelling that name aborts
        # its loader unless it is refused first, in either order, and through a text that is empty
        # only as a C string
        **{f"empty-named-{label}": tok_edit(change) for label, change in EMPTY_NAME_EDITS.items()},
        "long-token": tok_edit(lambda v: v[:401] + ["y" * 1_000_000] + v[402:]),
        "newline-token": tok_edit(lambda v: v[:402] + ["\n\n\n"] + v[403:]),
        "shorter-tokens": tok_edit(lambda v: v[:-1]),
        "longer-tokens": tok_edit(lambda v: v + ["extra"]),
        "shorter-scores": lambda key, v: list(v)[:-5] if key == gguf.Keys.Tokenizer.SCORES else v,
        "shorter-types": lambda key, v: list(v)[:-5] if key == gguf.Keys.Tokenizer.TOKEN_TYPE else v,
        "nan-scores": lambda key, v: [float("nan")] * len(v) if key == gguf.Keys.Tokenizer.SCORES else v,
        "types-zero": lambda key, v: [0] * len(v) if key == gguf.Keys.Tokenizer.TOKEN_TYPE else v,
        "types-99": lambda key, v: [99] * len(v) if key == gguf.Keys.Tokenizer.TOKEN_TYPE else v,
        "types-control": lambda key, v: [3] * len(v) if key == gguf.Keys.Tokenizer.TOKEN_TYPE else v,
        "types-unused": lambda key, v: [5] * len(v) if key == gguf.Keys.Tokenizer.TOKEN_TYPE else v,
        "one-token": all_edit(lambda v: v[:1]),
        "no-bytes": tok_edit(lambda v: [t if not t.startswith("<0x") else f"<nb{i}>" for i, t in enumerate(v)]),
    }
    out = []
    for label, edit in edits.items():
        out.append((f"{tag}-tokens-{label}", rewrite_gguf(reader, d / f"{tag}-tokens-{label}.gguf", edit)))
    for key in ("bos_token_id", "eos_token_id", "unknown_token_id"):
        full = f"tokenizer.ggml.{key}"
        for label, value in (("out-of-range", n + 5), ("huge", 2**31 - 1), ("last", n - 1)):
            name = f"{tag}-{key}-{label}"
            out.append((name, with_kv(src, d / f"{name}.gguf", full, value, T.UINT32)))
    # invalid UTF-8 in a token text: byte-level, in place (same length)
    raw = src.read_bytes()
    word = next(t for t in tokens[300:] if len(t) >= 3 and t.isascii())
    i = raw.find(len(word.encode()).to_bytes(8, "little") + word.encode())
    if i >= 0:
        for label, bad in (("invalid-utf8", b"\xff\xfe\xc3"[:len(word)]), ("nul-byte", b"a\x00b"[:len(word)])):
            name = f"{tag}-tokens-{label}"
            out.append((name, patched(src, d / f"{name}.gguf", i + 8, bad + word.encode()[len(bad):])))
    return out


def tensor_cases(src: Path, d: Path, tag: str, chosen: list[str] | None = None) -> list[tuple[str, Path]]:
    reader = open_gguf(src)
    raw = src.read_bytes()
    offsets = tensor_info_offsets(src)
    names = [t.name for t in reader.tensors]
    if chosen is None:
        chosen = [n for n in names if n in ("token_embd.weight", "output.weight", "output_norm.weight")] + \
            [n for n in names if n.startswith("blk.0.")] + [n for n in names if n.startswith("blk.1.attn")]
    out = []
    for name in chosen:
        off = offsets[name]
        name_len = struct.unpack_from("<Q", raw, off)[0]
        dims_at = off + 8 + name_len
        n_dims = struct.unpack_from("<I", raw, dims_at)[0]
        ne_at = dims_at + 4
        type_at = ne_at + 8 * n_dims
        offset_at = type_at + 4
        data_off = struct.unpack_from("<Q", raw, offset_at)[0]
        ne0 = struct.unpack_from("<Q", raw, ne_at)[0]
        safe = name.replace(".", "_")
        muts = {
            "type-99": (type_at, struct.pack("<I", 99)),
            "type-f16": (type_at, struct.pack("<I", int(gguf.GGMLQuantizationType.F16))),
            "type-q4_0": (type_at, struct.pack("<I", int(gguf.GGMLQuantizationType.Q4_0))),
            "ne0-plus-32": (ne_at, struct.pack("<Q", ne0 + 32)),
            "ne0-zero": (ne_at, struct.pack("<Q", 0)),
            "ne0-huge": (ne_at, struct.pack("<Q", 2**62)),
            "ndims-0": (dims_at, struct.pack("<I", 0)),
            "ndims-5": (dims_at, struct.pack("<I", 5)),
            "offset-plus-1": (offset_at, struct.pack("<Q", data_off + 1)),
            "offset-huge": (offset_at, struct.pack("<Q", 2**62)),
            "offset-zero": (offset_at, struct.pack("<Q", 0)),
            "name-dup": (off + 8, names[0].encode()[:name_len].ljust(name_len, b"x")),
        }
        for label, (at, data) in muts.items():
            case = f"{tag}-tensor-{safe}-{label}"
            out.append((case, patched(src, d / f"{case}.gguf", at, data)))
        case = f"{tag}-tensor-{safe}-missing"
        out.append((case, rewrite_gguf(reader, d / f"{case}.gguf", keep_tensor=lambda n, drop=name: n != drop)))
    return out


def header_cases(src: Path, d: Path, tag: str, bit_flips: int = 80) -> list[tuple[str, Path]]:
    muts = {"magic": (0, b"GGUG"), "magic-zero": (0, b"\0\0\0\0"), "version-0": (4, struct.pack("<I", 0)),
            "version-1": (4, struct.pack("<I", 1)), "version-2": (4, struct.pack("<I", 2)),
            "version-999": (4, struct.pack("<I", 999)), "tensors-0": (8, struct.pack("<Q", 0)),
            "tensors-huge": (8, struct.pack("<Q", 2**62)), "tensors-plus-1": (8, None),
            "kv-0": (16, struct.pack("<Q", 0)), "kv-huge": (16, struct.pack("<Q", 2**62)), "kv-plus-1": (16, None)}
    raw = src.read_bytes()
    out = []
    for label, (at, data) in muts.items():
        if data is None:
            data = struct.pack("<Q", struct.unpack_from("<Q", raw, at)[0] + 1)
        out.append((f"{tag}-header-{label}", patched(src, d / f"{tag}-header-{label}.gguf", at, data)))
    size = len(raw)
    for frac in (0.0001, 0.001, 0.003, 0.01, 0.02, 0.05, 0.1, 0.3, 0.5, 0.9, 0.999):
        cut = max(1, int(size * frac))
        name = f"{tag}-truncated-{cut}"
        (d / f"{name}.gguf").write_bytes(raw[:cut])
        out.append((name, d / f"{name}.gguf"))
    rng = random.Random(f"bitflips-{tag}")
    header_end = open_gguf(src).tensors[0].data_offset
    for i in range(bit_flips):
        pos = rng.randrange(0, header_end) if i < bit_flips * 3 // 4 else rng.randrange(header_end, size)
        bit = 1 << rng.randrange(8)
        name = f"{tag}-bitflip-{i}-{pos}-{bit}"
        out.append((name, patched(src, d / f"{name}.gguf", pos, bytes([raw[pos] ^ bit]))))
    return out


def build(out: Path, target: Path, draft: Path) -> list[Case]:
    """Write the corpus into `out` and return its cases."""
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for tag, src in (("target", target), ("draft", draft)):
        for maker in (metadata_cases, token_cases, tensor_cases, header_cases):
            for name, path in maker(src, out, tag):
                if tag == "target":
                    cases.append(Case(name, str(path), str(draft)))
                else:  # a mutated draft beside a clean target
                    cases.append(Case(name, str(target), str(path)))
    # pairs that load on their own but do not belong together
    for name, path in token_cases(draft, out, "pair")[:8]:
        cases.append(Case(name + "-as-target-only", str(path), None))
    cases.append(Case("pair-draft-is-target", str(target), str(target)))
    cases.append(Case("pair-swapped", str(draft), str(target)))
    return cases


def shipped_arbiters() -> dict[str, Path]:
    """The demo pair's arbiter folders, by kind."""
    from cospec_local.arbiter.catalog import NAMED_ARBITERS

    return {kind: NAMED_ARBITERS[f"demo-{kind}"].path for kind in ("lora", "features")}


def arbiter_cases(out: Path, target: Path, draft: Path, arbiters: dict[str, Path]) -> list[Case]:
    """Arbiter folders with one file corrupted (the LoRA adapter, or the head and its metadata),
    each loaded for the clean pair it was made for and asked to decide."""
    cases = []
    for tag, folder in arbiters.items():
        for file in ("adapter.gguf", "arbiter.gguf"):
            src = folder / file
            if not src.exists():
                continue
            files = out / f"{tag}-{file}"
            files.mkdir(parents=True, exist_ok=True)
            label = f"{tag}-{file.split('.')[0]}"
            made = kv_cases(src, files, label) + tensor_cases(src, files, label, [t.name for t in open_gguf(src).tensors][:4]) \
                + header_cases(src, files, label, bit_flips=24)
            for name, path in made:
                case_folder = out / name
                shutil.copytree(folder, case_folder, dirs_exist_ok=True)
                shutil.copyfile(path, case_folder / file)
                cases.append(Case(name, str(target), str(draft), str(case_folder)))
    return cases


def head_cases(out: Path, target: Path, head: Path) -> list[Case]:
    """A head drafter (an EAGLE-3 head, a DFlash drafter) with one thing corrupted (a key, the
    layers it reads, the width it names, its mask token, a tensor info, the header), opened beside
    the clean target it was made for and drafted from."""
    out.mkdir(parents=True, exist_ok=True)
    reader = open_gguf(head)
    arch = str(reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    # (the tokenizer's keys are the target's, corrupted in the models' corpus; here the vocabulary
    # list goes, which the head must match)
    made = kv_cases(head, out, "head", lambda key: not key.startswith("tokenizer.") or key == gguf.Keys.Tokenizer.LIST,
                    write=spliced_kv)
    layers = f"{arch}.target_layers"
    # (EAGLE-3 names the target's width; DFlash is as wide as the target)
    width = f"{arch}.target_hidden_size" if arch == "eagle3" else f"{arch}.embedding_length"
    for label, value in (("past-the-target", [2, 15, 99]), ("negative", [-1, 15, 27]), ("two", [2, 15]),
                         ("four", [2, 15, 27, 28]), ("one", [15]), ("last-plus-one", [2, 15, 31])):
        name = f"head-{layers.replace('.', '_')}-{label}"
        made.append((name, spliced_kv(head, out / f"{name}.gguf", layers, value, T.ARRAY, T.INT32)))
    for label, value in (("half", 288), ("double", 1152), ("one", 1)):
        name = f"head-{width.replace('.', '_')}-{label}"
        made.append((name, spliced_kv(head, out / f"{name}.gguf", width, value, T.UINT32)))
    if arch == "dflash":
        mask = gguf.Keys.Tokenizer.MASK_ID
        n_vocab = len(reader.get_field(gguf.Keys.Tokenizer.LIST).data)
        for label, value in (("vocab-size", n_vocab), ("huge", 2**31 - 1)):
            name = f"head-mask-{label}"
            made.append((name, spliced_kv(head, out / f"{name}.gguf", mask, value, T.UINT32)))
        made.append(("head-mask-none", with_kv(head, out / "head-mask-none.gguf", mask, None)))
        for label, value in (("zero", 0), ("one", 1), ("huge", 2**31 - 1)):
            name = f"head-block-{label}"
            made.append((name, spliced_kv(head, out / f"{name}.gguf", "dflash.block_size", value, T.UINT32)))
    tensors = [t.name for t in reader.tensors]
    chosen = [n for n in tensors if n in ("fc.weight", "d2t", "output.weight", "output_norm.weight",
                                          "enc.output_norm.weight")
              or n.startswith(("blk.0.attn_q", "blk.0.attn_norm_2"))]
    made += tensor_cases(head, out, "head", chosen) + header_cases(head, out, "head", bit_flips=24)
    return [Case(name, str(target), str(path), head=True) for name, path in made]


# ---------------------------------------------------------------------------------------- running

WORKER = r'''
import json, math, resource, sys
if {mem} > 0:
    resource.setrlimit(resource.RLIMIT_AS, ({mem}, {mem}))
import numpy as np
from cospec_local import CospecError, Engine
for line in sys.stdin:
    case = json.loads(line)
    out = {{"name": case["name"]}}
    try:
        # (each corrupted head is a new pair to calibrate: its costs are not what is tested)
        calibration = None if case.get("head") else "auto"
        with Engine(case["target"], case["draft"], n_ctx=256, n_threads=1, calibration=calibration) as engine:
            prompt = engine.tokenize("Mei has 94 stamps. How many stamps does Mei have now?")
            runs = [engine.generate(prompt, mode="target-only", max_tokens=8, ignore_eos=True)]
            if case.get("head"):
                runs.append(engine.generate(prompt, max_tokens=8, ignore_eos=True, spec_type="head",
                                            draft_max=4, adaptive_draft=False))
                runs.append(engine.generate(prompt, max_tokens=8, ignore_eos=True, spec_type="head",
                                            temperature=0.8, seed=1))
            elif case["draft"]:
                runs.append(engine.generate(prompt, max_tokens=8, ignore_eos=True, draft_max=4, adaptive_draft=False))
                runs.append(engine.generate(prompt, max_tokens=8, ignore_eos=True, arbiter="fly"))
            if case.get("arbiter"):
                arbiter = engine.arbiter(case["arbiter"])
                runs.append(engine.generate(prompt, max_tokens=8, ignore_eos=True, arbiter=arbiter))
                k, v = 4, engine.n_vocab  # a block with a mismatch at every position, so the head runs
                p_keep = arbiter.score({{"context": np.array(prompt[:8], np.int32),
                                        "draft": np.array(prompt[8:8 + k], np.int32),
                                        "target": np.array(prompt[9:10 + k], np.int32),
                                        "mismatch": np.ones(k, np.uint8),
                                        "target_logits": np.zeros((k + 1, v), np.float32),
                                        "draft_logits": np.zeros((k, v), np.float32)}})
                if not np.isfinite(p_keep).all():
                    raise RuntimeError("non-finite P(keep)")
            logits = engine.score(prompt[:8])
            finite = bool(np.isfinite(logits).all())
            out["outcome"] = "run" if finite else "nan-logits"
            out["tokens"] = runs[0].tokens
    except CospecError as exc:
        msg = str(exc)
        out["outcome"] = "error"
        out["error_class"] = type(exc).__name__
        out["message_length"] = len(msg)
        out["message"] = msg[:300]
    except MemoryError:
        out["outcome"] = "memory"
    except Exception as exc:
        out["outcome"] = "untyped"
        out["error_class"] = type(exc).__name__
        out["message"] = str(exc)[:300]
    print("@@case " + json.dumps(out), flush=True)
'''


def run(cases: list[Case], timeout: float = CASE_TIMEOUT) -> list[dict]:
    """Each case in a worker process (restarted after a crash or a hang); one result per case."""
    results = []
    todo = list(cases)
    code = WORKER.format(mem=int(os.environ.get("COSPEC_CORPUS_MEMORY_LIMIT", MEMORY_LIMIT)))
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    while todo:
        worker = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True, env=env)
        while todo:
            case = todo[0]
            t0 = time.monotonic()
            worker.stdin.write(json.dumps(asdict(case)) + "\n")
            worker.stdin.flush()
            line = _read_line(worker, timeout)
            if line is None:  # a hang or a death: that case's fault
                worker.kill()
                worker.wait()
                rc = worker.returncode
                results.append({"name": case.name, "outcome": "hang" if rc == -9 else f"signal {-rc}" if rc < 0
                                else f"exit {rc}", "seconds": round(time.monotonic() - t0, 2)})
                todo.pop(0)
                break
            result = json.loads(line)
            result["seconds"] = round(time.monotonic() - t0, 2)
            results.append(result)
            todo.pop(0)
        else:
            worker.stdin.close()
            worker.wait()
    return results


def _read_line(proc, timeout):
    """The worker's next result line (anything else it prints, e.g. llama.cpp's own output, is skipped)."""
    import select

    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([proc.stdout], [], [], left)
        if not ready:
            return None
        line = proc.stdout.readline()
        if not line:
            return None
        if line.startswith("@@case "):
            return line[len("@@case "):]


def verdict(result: dict) -> str | None:
    """Why a result is a failure, or None when it is fine."""
    outcome = result["outcome"]
    if outcome == "run":
        return None
    if outcome == "error":
        if result["message_length"] > 2000:
            return f"error message of {result['message_length']} characters"
        return None
    return outcome


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--arbiters", action="store_true", help="the arbiter cases instead of the models'")
    ap.add_argument("--heads", action="store_true", help="the EAGLE-3 head cases instead of the models'")
    args = ap.parse_args(argv)
    from cospec_local.models import demo_model, resolve_model

    if args.heads:
        cases = head_cases(args.out / "files", resolve_model("smollm2-135m"), resolve_model("smollm2-135m-eagle3"))
    elif args.arbiters:
        cases = arbiter_cases(args.out / "files", demo_model("target"), demo_model("draft"), shipped_arbiters())
    else:
        cases = build(args.out / "files", demo_model("target"), demo_model("draft"))
    t0 = time.time()
    results = run(cases)
    bad = [(r["name"], verdict(r)) for r in results if verdict(r)]
    summary = {"cases": len(results), "seconds": round(time.time() - t0), "failures": len(bad),
               "outcomes": {k: sum(1 for r in results if r["outcome"] == k) for k in {r["outcome"] for r in results}}}
    (args.out / "results.json").write_text(json.dumps({"summary": summary, "results": results}, indent=1))
    print(json.dumps(summary, indent=1))
    for name, why in bad:
        print(f"FAIL {name}: {why}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
