"""Deliberately broken GGUF copies for tests of the loading and vocabulary checks."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import gguf

from cospec_local.formats.gguf_edit import open_gguf, rewrite_gguf

# Per-token arrays that must be permuted together so the file stays self-consistent.
_PER_TOKEN_KEYS = (gguf.Keys.Tokenizer.LIST, gguf.Keys.Tokenizer.SCORES, gguf.Keys.Tokenizer.TOKEN_TYPE)
_NORMAL = int(gguf.TokenType.NORMAL)


def _default_swaps(token_types: list[int] | None, n_vocab: int) -> list[tuple[int, int]]:
    """Two pairs of adjacent ordinary tokens: one early in the vocab, one at its end.

    Special tokens (BOS/EOS/...) are avoided so the copy still loads and runs;
    one pair near each end is caught by checks that compare only a prefix or
    only a sample of the vocabulary.
    """
    def normal(i: int) -> bool:
        return token_types is None or token_types[i] == _NORMAL

    early = next(i for i in range(min(1000, n_vocab - 2), n_vocab - 1) if normal(i) and normal(i + 1))
    late = next(i for i in range(n_vocab - 2, early + 1, -1) if normal(i) and normal(i + 1))
    return [(early, early + 1), (late, late + 1)]


def corrupt_vocab(src: str | Path, dst: str | Path, swaps: Sequence[tuple[int, int]] | None = None) -> Path:
    """Copy `src` with some token ids swapped (texts, scores and types move together).

    The vocab size, set of token strings and all tensors are unchanged, so the
    file still loads and generates, yet token id -> text differs from `src`:
    a vocabulary compatibility check must refuse to pair the two.
    """
    reader = open_gguf(src)
    tokens_field = reader.get_field(gguf.Keys.Tokenizer.LIST)
    if tokens_field is None:
        raise ValueError(f"{src} has no {gguf.Keys.Tokenizer.LIST}")
    n_vocab = len(tokens_field.data)
    types_field = reader.get_field(gguf.Keys.Tokenizer.TOKEN_TYPE)
    swaps = list(swaps) if swaps is not None else _default_swaps(
        types_field.contents() if types_field else None, n_vocab)
    for a, b in swaps:
        if not (0 <= a < n_vocab and 0 <= b < n_vocab and a != b):
            raise ValueError(f"bad swap ({a}, {b}) for a vocab of {n_vocab}")

    def kv_edit(key: str, value: Any) -> Any:
        if key in _PER_TOKEN_KEYS:
            value = list(value)
            for a, b in swaps:
                value[a], value[b] = value[b], value[a]
        return value

    return rewrite_gguf(reader, dst, kv_edit)


def truncate_file(src: str | Path, dst: str | Path, n_bytes: int) -> Path:
    """Copy only the first `n_bytes` of `src`: a cut-off download for error-path tests."""
    src, dst = Path(src), Path(dst)
    size = src.stat().st_size
    if not 0 <= n_bytes < size:
        raise ValueError(f"n_bytes must be in [0, {size}) for {src}, got {n_bytes}")
    with src.open("rb") as fin:
        dst.write_bytes(fin.read(n_bytes))  # models here are small (< 300 MB)
    return dst
