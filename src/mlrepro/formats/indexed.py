"""Megatron's indexed dataset (.bin/.idx): a streaming writer and a reader.

The bytes are those megatron/core/datasets/indexed_dataset.py writes (see DESIGN §7): the
.bin holds the token ids back to back; the .idx a 9-byte magic, version 1, the dtype code,
the sequence and document counts, then int32 lengths, int64 byte pointers and int64
document indices. One sequence per document (no sentence splitting), so an empty
document adds no sequence and repeats the last document index, as Megatron's tool does.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np

from mlrepro.util.fsutil import NotRegularFile, open_regular

MAGIC = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {np.uint8: 1, np.int8: 2, np.int16: 3, np.int32: 4, np.int64: 5,
               np.float64: 6, np.float32: 7, np.uint16: 8}
CODE_DTYPES = {code: dtype for dtype, code in DTYPE_CODES.items()}


class IndexedFormatError(ValueError):
    """A .bin/.idx pair is not a valid Megatron indexed dataset."""


def optimal_dtype(vocab_size: int) -> type:
    """The token dtype Megatron picks for a vocabulary (DType.optimal_dtype)."""
    return np.uint16 if vocab_size is not None and vocab_size < 65500 else np.int32


def paths(prefix: str | os.PathLike) -> tuple[Path, Path]:
    return Path(f"{prefix}.bin"), Path(f"{prefix}.idx")


class IndexedWriter:
    """Append documents to `bin_path`; `finalize(idx_path)` writes the index.

    Only the per-document lengths are kept in memory (4 bytes a document), never the
    tokens, so a corpus of any size streams through.
    """

    def __init__(self, bin_path: str | os.PathLike, dtype: type = np.uint16) -> None:
        self.dtype = np.dtype(dtype).type
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {dtype} has no Megatron code")
        self._bin = open(bin_path, "wb")
        self._lengths: list[np.ndarray] = []
        self._doc_has_tokens: list[np.ndarray] = []
        self.tokens = 0
        self.documents = 0

    def add_documents(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Documents given as all their tokens concatenated plus each one's length (0 = empty)."""
        lengths = np.asarray(lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens):
            raise ValueError(f"lengths sum to {int(lengths.sum())} but {len(tokens)} tokens were given")
        tokens = np.asarray(tokens)
        if len(tokens):
            if tokens.dtype != self.dtype:
                if np.issubdtype(tokens.dtype, np.integer) and int(np.max(tokens)) > np.iinfo(self.dtype).max:
                    raise ValueError(f"token id {int(np.max(tokens))} does not fit {np.dtype(self.dtype).name}")
                tokens = tokens.astype(self.dtype)
            # One write of the array's own buffer (no bytes copy); ids are native little-endian.
            self._bin.write(np.ascontiguousarray(tokens).data)
        self._lengths.append(lengths.astype(np.int32))
        self.tokens += len(tokens)
        self.documents += len(lengths)

    def add_document(self, tokens) -> None:
        tokens = np.asarray(tokens, dtype=np.int64)
        self.add_documents(tokens, np.array([len(tokens)]))

    def finalize(self, idx_path: str | os.PathLike) -> None:
        self._bin.close()
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int32)
        nonempty = lengths > 0
        seq_lengths = lengths[nonempty]
        itemsize = np.dtype(self.dtype).itemsize
        pointers = np.zeros(len(seq_lengths), dtype=np.int64)
        if len(seq_lengths) > 1:
            np.cumsum(seq_lengths[:-1].astype(np.int64) * itemsize, out=pointers[1:])
        # Document i ends after the sequences of documents 0..i; an empty one repeats the previous index.
        doc_index = np.concatenate([[0], np.cumsum(nonempty, dtype=np.int64)])
        with open(idx_path, "wb") as out:
            out.write(MAGIC)
            out.write(struct.pack("<Q", VERSION))
            out.write(struct.pack("<B", DTYPE_CODES[self.dtype]))
            out.write(struct.pack("<Q", len(seq_lengths)))
            out.write(struct.pack("<Q", len(doc_index)))
            out.write(seq_lengths.astype("<i4").tobytes())
            out.write(pointers.astype("<i8").tobytes())
            out.write(doc_index.astype("<i8").tobytes())

    def close(self) -> None:
        self._bin.close()


class IndexedReader:
    """Read a Megatron indexed dataset: `len(r)` sequences, `r[i]` the tokens of sequence i.

    Everything the index says is checked before a token is read, and every error names the file:
    the header, that the arrays fill the .idx exactly, that each pointer is where the lengths
    before it put it (Megatron's writer leaves no gaps), that the .bin holds exactly those tokens,
    and that the document indices start at 0, never go back and end at the sequence count. Only
    regular files are opened (a FIFO would block the open forever).
    """

    def __init__(self, prefix: str | os.PathLike) -> None:
        bin_path, idx_path = paths(prefix)
        raw = _read_regular(idx_path)
        if len(raw) < HEADER_BYTES:
            raise IndexedFormatError(f"{idx_path}: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte header "
                                     f"(truncated?)")
        if raw[:9] != MAGIC:
            raise IndexedFormatError(f"{idx_path}: not a Megatron index (magic {raw[:9]!r})")
        (version,) = struct.unpack_from("<Q", raw, 9)
        if version != VERSION:
            raise IndexedFormatError(f"{idx_path}: version {version}, expected {VERSION}")
        (code,) = struct.unpack_from("<B", raw, 17)
        if code not in CODE_DTYPES:
            raise IndexedFormatError(f"{idx_path}: unknown dtype code {code}")
        self.dtype = CODE_DTYPES[code]
        seq_count, doc_count = struct.unpack_from("<QQ", raw, 18)
        expected = HEADER_BYTES + 12 * seq_count + 8 * doc_count  # int32 + int64 per sequence, int64 per document
        if expected != len(raw):
            raise IndexedFormatError(
                f"{idx_path}: {len(raw)} bytes, but {seq_count} sequences and {doc_count} document indices take "
                f"{expected} (truncated, or multimodal modes, which are not supported)")
        offset = HEADER_BYTES
        self.sequence_lengths = np.frombuffer(raw, "<i4", seq_count, offset)
        offset += 4 * seq_count
        self.sequence_pointers = np.frombuffer(raw, "<i8", seq_count, offset)
        offset += 8 * seq_count
        self.document_indices = np.frombuffer(raw, "<i8", doc_count, offset)
        itemsize = np.dtype(self.dtype).itemsize
        _check_arrays(idx_path, self.sequence_lengths, self.sequence_pointers, self.document_indices, itemsize)
        expected_bin = int(self.sequence_lengths.astype(np.int64).sum()) * itemsize
        size = _regular_size(bin_path)
        if size != expected_bin:
            raise IndexedFormatError(f"{bin_path}: {size} bytes, the index {idx_path.name} describes {expected_bin}")
        self.tokens = np.memmap(bin_path, dtype=self.dtype, mode="r") if expected_bin else np.zeros(0, self.dtype)
        self.bin_path, self.idx_path = bin_path, idx_path

    def __len__(self) -> int:
        return len(self.sequence_lengths)

    def __getitem__(self, i: int) -> np.ndarray:
        start = int(self.sequence_pointers[i]) // np.dtype(self.dtype).itemsize
        return np.asarray(self.tokens[start:start + int(self.sequence_lengths[i])])

    def document(self, d: int) -> np.ndarray:
        """All tokens of document d (empty for an empty document)."""
        if not 0 <= d < self.num_documents:
            raise IndexError(f"{self.idx_path}: document {d} of {self.num_documents}")
        first, last = int(self.document_indices[d]), int(self.document_indices[d + 1])
        if first == last:
            return np.zeros(0, self.dtype)
        return np.concatenate([self[i] for i in range(first, last)])

    @property
    def num_documents(self) -> int:
        return len(self.document_indices) - 1


HEADER_BYTES = 34


def _check_arrays(idx_path: Path, lengths: np.ndarray, pointers: np.ndarray, doc_index: np.ndarray,
                  itemsize: int) -> None:
    if len(lengths) and int(lengths.min()) < 0:
        i = int(np.argmax(lengths < 0))
        raise IndexedFormatError(f"{idx_path}: sequence {i} has length {int(lengths[i])}")
    expected = np.zeros(len(lengths), np.int64)
    if len(lengths) > 1:
        np.cumsum(lengths[:-1].astype(np.int64) * itemsize, out=expected[1:])
    if not np.array_equal(pointers, expected):
        i = int(np.argmax(pointers != expected))
        raise IndexedFormatError(f"{idx_path}: sequence {i} starts at byte {int(pointers[i])} of the .bin, "
                                 f"but the lengths before it put it at {int(expected[i])}")
    if len(doc_index) == 0 or int(doc_index[0]) != 0:
        raise IndexedFormatError(f"{idx_path}: the document indices do not start at 0")
    steps = np.diff(doc_index)
    if len(steps) and int(steps.min()) < 0:
        i = int(np.argmax(steps < 0)) + 1
        raise IndexedFormatError(f"{idx_path}: document index {i} ({int(doc_index[i])}) goes back from "
                                 f"{int(doc_index[i - 1])}")
    if int(doc_index[-1]) != len(lengths):
        raise IndexedFormatError(f"{idx_path}: the document indices end at {int(doc_index[-1])}, "
                                 f"not at the {len(lengths)} sequences")


def _open_regular(path: Path):
    try:
        return open_regular(path)
    except NotRegularFile:
        raise IndexedFormatError(f"{path}: not a regular file") from None
    except OSError as exc:
        raise IndexedFormatError(f"{path}: cannot open: {exc.strerror or exc}") from None


def _read_regular(path: Path) -> bytes:
    with _open_regular(path) as fh:
        return fh.read()


def _regular_size(path: Path) -> int:
    with _open_regular(path) as fh:
        return os.fstat(fh.fileno()).st_size
