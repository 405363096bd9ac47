"""A small SentencePiece BPE tokenizer that llama.cpp reads as a llama (SPM) vocabulary.

    from cospec_local.formats.spm_tokenizer import train_tokenizer
    model = train_tokenizer(["Question: 12 + 30 = ?\nAnswer: 42\n#### 42"], "out/tokenizer.model", vocab_size=512)

Choices, each one checked against llama.cpp's SPM tokenizer (src/llama-vocab.cpp):
- BPE with `split_digits`: no piece holds two digits, so every digit is its own token.
- `byte_fallback`: all 256 `<0xXX>` pieces exist, so any text round-trips (llama.cpp needs
  them to find its newline token) and characters unseen in training become bytes.
- Identity normalisation and no removal of extra whitespace: the text is kept as given.
- `add_dummy_prefix` (a space before the text), as llama.cpp does for SPM vocabularies.
- Newlines: by default each training document is given to the trainer whole, so "\n" is an
  ordinary character of the vocabulary and may merge ("?\n", "\n####"); with
  `split_lines=True` documents are cut into lines, "\n" is never in a piece and always
  encodes as the byte token <0x0A>. Both tokenise identically in SentencePiece and llama.cpp;
  whole documents gave about 8% fewer tokens on the arithmetic corpus of the tests.
- Control tokens <unk>=0, <s>=1, </s>=2; no padding token.

User-defined symbols are accepted but not recommended: llama.cpp matches them before the
BPE merges, as "special" fragments, and then tokenises the text around them differently:
"#### 42" is "####", "▁", "▁", "4", "2" there but "▁", "####", "▁", "4", "2" in SentencePiece,
and a user-defined "\n" adds a "▁" after every newline. Frequent strings such as "####" are
learnt as ordinary pieces anyway.
"""
from __future__ import annotations

import io
import os
import string
import struct
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import gguf

UNK_ID, BOS_ID, EOS_ID = 0, 1, 2
# Printable ASCII but the space (SentencePiece's "▁" stands for it): always in the vocabulary,
# so digits, operators and letters never fall back to bytes even if the corpus lacks them.
DEFAULT_REQUIRED_CHARS = "".join(c for c in string.printable if not c.isspace())
# SentencePiece's default cap on a training sentence, in bytes; longer ones are dropped.
_MAX_SENTENCE_BYTES = 4192


def _documents(text: str | os.PathLike | Iterable[str], split_lines: bool) -> Iterator[str]:
    """Training documents: the strings of an iterable, or a file's blank-line-separated blocks;
    with `split_lines`, their non-empty lines instead."""
    if isinstance(text, (str, os.PathLike)):
        path = Path(text)
        if not path.is_file():
            raise FileNotFoundError(f"training text not found: {path} (pass a list of strings for raw text)")
        text = path.read_text(encoding="utf-8").split("\n\n")
    for doc in text:
        if split_lines:
            yield from (line for line in doc.split("\n") if line)
        elif doc.strip("\n"):
            yield doc.strip("\n")


def train_tokenizer(text: str | os.PathLike | Iterable[str], out_path: str | os.PathLike, vocab_size: int = 512, *,
                    split_lines: bool = False, required_chars: str = DEFAULT_REQUIRED_CHARS,
                    user_defined_symbols: Sequence[str] = (), hard_vocab_limit: bool = False,
                    num_threads: int = 1) -> Path:
    """Train a BPE SentencePiece model on `text` and write it to `out_path` (a .model file).

    `text` is an iterable of documents (strings, newlines allowed) or the path of a UTF-8 file
    whose documents are separated by blank lines. `vocab_size` counts the 3 control tokens
    and the 256 byte tokens, so it must exceed 259 + len(required_chars) (+1 for "\n").
    With `hard_vocab_limit=False` a small corpus may give fewer pieces than asked for: read
    the real size from `load_tokenizer(path).vocab_size()`.
    """
    import sentencepiece as spm

    docs = list(_documents(text, split_lines))
    if not docs:
        raise ValueError("no training text")
    if not split_lines and "\n" not in required_chars:
        required_chars += "\n"
    longest = max(len(d.encode("utf-8")) for d in docs)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(docs), model_writer=model,
        model_type="bpe", vocab_size=vocab_size, hard_vocab_limit=hard_vocab_limit,
        split_digits=True, byte_fallback=True, add_dummy_prefix=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        character_coverage=1.0, required_chars=required_chars,
        user_defined_symbols=list(user_defined_symbols),
        max_sentence_length=max(_MAX_SENTENCE_BYTES, longest + 1),
        unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID, pad_id=-1,
        num_threads=num_threads, minloglevel=2,
    )
    out_path.write_bytes(model.getvalue())
    return out_path


def load_tokenizer(path: str | os.PathLike):
    """The SentencePieceProcessor of a .model file."""
    import sentencepiece as spm

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer model not found: {path}")
    return spm.SentencePieceProcessor(model_file=str(path))


def gguf_vocab(sp_model: str | os.PathLike,
               vocab_size: int | None = None) -> tuple[list[bytes], list[float], list[int]]:
    """Token texts, scores and types as llama.cpp's converter builds them for a SentencePiece
    model (convert_hf_to_gguf.py, `_create_vocab_sentencepiece`), with SentencePiece's
    user-defined pieces typed USER_DEFINED; ids past the tokenizer's own size, up to the
    model's `vocab_size`, are unused `[PADn]` tokens."""
    pieces = read_pieces(sp_model)
    n_sp = len(pieces)
    n = n_sp if vocab_size is None else vocab_size
    if n < n_sp:
        raise ValueError(f"the model's vocab_size {n} is smaller than the tokenizer's {n_sp}")
    tokens = [f"[PAD{i}]".encode("utf-8") for i in range(n)]
    scores = [-10000.0] * n
    types = [int(gguf.TokenType.UNUSED)] * n
    for i, (piece, score, kind) in enumerate(pieces):
        tokens[i] = piece.encode("utf-8")
        scores[i] = score
        types[i] = kind
    return tokens, scores, types


# SentencePiece's piece types have the numbers of gguf.TokenType (NORMAL=1 ... BYTE=6).
_PIECE_TYPES = {int(t) for t in gguf.TokenType}


def read_pieces(sp_model: str | os.PathLike) -> list[tuple[str, float, int]]:
    """(piece, score, type) of every piece of a SentencePiece .model file.

    The file is a protobuf ModelProto; only its repeated field 1 (SentencePiece: piece=1,
    score=2, type=3) is read, so neither protobuf nor sentencepiece is needed here.
    """
    path = Path(sp_model)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer model not found: {path}")
    pieces = []
    for field, value in _proto_fields(path.read_bytes()):
        if field != 1:
            continue
        piece, score, kind = "", 0.0, int(gguf.TokenType.NORMAL)
        for f, v in _proto_fields(value):
            if f == 1:
                piece = v.decode("utf-8")
            elif f == 2:
                score = struct.unpack("<f", v)[0]
            elif f == 3:
                kind = v
        if kind not in _PIECE_TYPES:
            raise ValueError(f"{path}: piece {piece!r} has unknown type {kind}")
        pieces.append((piece, score, kind))
    if not pieces:
        raise ValueError(f"{path} holds no SentencePiece pieces")
    return pieces


def _proto_fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message: ints for varints, bytes otherwise."""
    def varint(i: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            if i >= len(data):
                raise ValueError("truncated protobuf message")
            b = data[i]
            value |= (b & 0x7F) << shift
            i += 1
            if b < 0x80:
                return value, i
            shift += 7

    i = 0
    while i < len(data):
        key, i = varint(i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(i)
        elif wire == 1:
            value, i = data[i:i + 8], i + 8
        elif wire == 2:
            n, i = varint(i)
            value, i = data[i:i + n], i + n
        elif wire == 5:
            value, i = data[i:i + 4], i + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        if i > len(data):
            raise ValueError("truncated protobuf message")
        yield field, value


def add_vocab_to_gguf(writer: gguf.GGUFWriter, sp_model: str | os.PathLike, vocab_size: int | None = None) -> int:
    """Write the `tokenizer.*` keys of a llama SPM vocabulary; returns the number of tokens."""
    tokens, scores, types = gguf_vocab(sp_model, vocab_size)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(UNK_ID)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    return len(tokens)
