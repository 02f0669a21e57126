"""jsonl → Megatron indexed dataset, byte-identical to Megatron-LM's tools/preprocess_data.py.

`mlrepro preprocess` takes that tool's flags. The input is cut into slices of whole lines
(`slice_bytes`, 16 MiB by default); each of --workers parses and tokenizes one slice at a
time (threads with gigatoken, which encodes without the GIL; forked processes with the
`tokenizers` fallback) and the slices' tokens are written in input order, at most two slices
per worker in flight, so memory stays bounded whatever the file's size. Per document: the text of each --json-keys key, its
ids, then EOD with --append-eod; an empty text gives no tokens and a repeated document index
(Megatron's behaviour). A line that is not JSON, not UTF-8, lacks a key or holds a non-string
value stops the run with the file and line named; the outputs are written under temporary
names and renamed only when complete, so a failed run never leaves a shorter dataset.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import logging
import multiprocessing
import multiprocessing.pool
import os
import sys
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from mlrepro.formats import indexed
from mlrepro.corpus import tokenizer as tokenizers_mod

log = logging.getLogger(__name__)

SLICE_BYTES = 16 << 20


class InputError(ValueError):
    """The input jsonl has a line Megatron's tool would not turn into a document."""


@dataclass
class Options:
    input: Path
    output_prefix: str
    tokenizer_type: str
    json_keys: tuple[str, ...] = ("text",)
    vocab_file: str | None = None
    merge_file: str | None = None
    tokenizer_model: str | None = None
    append_eod: bool = False
    workers: int = 1
    use_gigatoken: bool = True
    slice_bytes: int = SLICE_BYTES
    log_interval: float = 30.0
    pool: str = "auto"  # "thread", "process", or auto: threads for gigatoken, processes otherwise


@dataclass
class Result:
    documents: int = 0
    tokens: dict[str, int] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    backend: str = ""
    outputs: dict[str, str] = field(default_factory=dict)


def output_prefix(prefix: str, key: str) -> str:
    """Megatron's naming: {prefix}_{key}_document."""
    return f"{prefix}_{key}_document"


def slices(path: Path, size: int):
    """(start, end) byte ranges of `path`, each ending after a newline (or at the end of the file)."""
    total = path.stat().st_size
    with open(path, "rb") as fh:
        start = 0
        while start < total:
            if start + size >= total:
                end = total
            else:
                # readline from the slice's last byte: ends right there if that byte is a newline.
                fh.seek(start + size - 1)
                fh.readline()
                end = fh.tell()
            yield start, end
            start = end


# The worker's encoder: set in the parent before the pool forks, or by _init in a spawned child.
_ENCODER: tokenizers_mod.Encoder | None = None
_OPTIONS: Options | None = None


def _init(options: Options) -> None:
    global _ENCODER, _OPTIONS
    _OPTIONS = options
    if _ENCODER is None:
        _ENCODER = _load_encoder(options, quiet=True)


def _load_encoder(options: Options, quiet: bool = False) -> tokenizers_mod.Encoder:
    return tokenizers_mod.load(options.tokenizer_type, vocab_file=options.vocab_file, merge_file=options.merge_file,
                               tokenizer_model=options.tokenizer_model, use_gigatoken=options.use_gigatoken, quiet=quiet)


def _parse(raw) -> tuple[object, str | None]:
    """The JSON value of one line (bytes or a memoryview of them), or None and why it is not one.

    orjson is 2-3x faster than json and strict where json is lenient (NaN, lone surrogates);
    a line orjson refuses is given to json.loads, which Megatron's tool uses, so the two
    accept the same lines.
    """
    try:
        return orjson.loads(raw), None
    except orjson.JSONDecodeError:
        pass
    raw = bytes(raw)
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not UTF-8 (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})"
    try:
        doc = json.loads(line)
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg} at column {exc.colno})" if line.strip() else "empty line (not a JSON object)"
    except RecursionError:
        return None, "nested too deeply to read"
    # json lets a lone surrogate escape (\ud800) through; no tokenizer can encode it. orjson refuses
    # those lines, so only here, on the slow path, is the text checked.
    if isinstance(doc, dict):
        for key, value in doc.items():
            if isinstance(value, str):
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError as exc:
                    return None, (f"key {key!r} holds a lone surrogate (\\u{ord(value[exc.start]):04x}), "
                                  f"which is no Unicode text")
    return doc, None


def line_bounds(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """Start and end offsets of the lines of `data` (a last line without its newline counts too)."""
    ends = np.flatnonzero(np.frombuffer(data, np.uint8) == 10)
    if len(data) and data[-1] != 10:
        ends = np.append(ends, len(data))
    starts = np.empty_like(ends)
    if len(ends):
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def _texts(data: bytes, keys: tuple[str, ...]) -> tuple[dict[str, list[str]], int] | tuple[int, str]:
    """The texts of each key and the number of lines, or (index of the bad line, why).

    Lines are parsed from a memoryview of the slice: no per-line copy of the bytes."""
    view = memoryview(data)
    starts, ends = line_bounds(data)
    texts: dict[str, list[str]] = {k: [] for k in keys}
    for i, (a, b) in enumerate(zip(starts.tolist(), ends.tolist())):
        doc, problem = _parse(view[a:b])
        if problem is not None:
            return i, problem
        if not isinstance(doc, dict):
            return i, f"not a JSON object but {type(doc).__name__}"
        for k in keys:
            if k not in doc:
                return i, f"no key {k!r} (keys: {', '.join(map(repr, list(doc)[:10]))})"
            value = doc[k]
            if not isinstance(value, str):
                return i, f"key {k!r} holds {type(value).__name__}, not a string"
            texts[k].append(value)
    return texts, len(ends)


def encode_slice(path: str, start: int, end: int) -> tuple:
    """Worker: ("ok", n_lines, {key: (tokens, lengths)}) or ("error", line_in_slice, message).

    The tokens are already what the .bin holds for these documents (EOD appended, in the
    dataset's dtype), so writing them is one write of their buffer."""
    assert _ENCODER is not None and _OPTIONS is not None
    with open(path, "rb") as fh:
        fh.seek(start)
        data = fh.read(end - start)
    parsed = _texts(data, _OPTIONS.json_keys)
    del data
    if isinstance(parsed[0], int):
        return ("error", *parsed)
    texts, n_lines = parsed
    dtype = indexed.optimal_dtype(_ENCODER.vocab_size)
    eod = _ENCODER.eod if _OPTIONS.append_eod else None
    out = {}
    for key in list(texts):
        ids, lengths = _ENCODER.encode_batch(texts.pop(key))
        out[key] = frame(ids, lengths, eod, dtype)
    return ("ok", n_lines, out)


def frame(ids: np.ndarray, lengths: np.ndarray, eod: int | None, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The .bin tokens of these documents in `dtype`, EOD after every non-empty one (an empty
    document stays empty, as in Megatron), and each document's length."""
    info = np.iinfo(dtype)
    if len(ids) and int(ids.max()) > info.max:
        raise ValueError(f"token id {int(ids.max())} does not fit {np.dtype(dtype).name}")
    if eod is None:
        return ids.astype(dtype, copy=False), lengths
    nonempty = lengths > 0
    framed = lengths + nonempty
    out = np.empty(int(framed.sum()), dtype)
    eod_at = np.cumsum(framed)[nonempty] - 1
    keep = np.ones(len(out), bool)
    keep[eod_at] = False
    out[keep] = ids
    out[eod_at] = eod
    return out, framed


class Progress:
    """Documents, tokens/s and ETA: a redrawn line on a terminal, plain lines every `interval` s otherwise."""

    def __init__(self, total_bytes: int, stream=None, interval: float = 30.0) -> None:
        self.total = max(total_bytes, 1)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.2 if self.tty else interval
        self.start = time.monotonic()
        self.last = self.start

    def line(self, docs: int, tokens: int, done: int) -> str:
        elapsed = max(time.monotonic() - self.start, 1e-9)
        rate = done / elapsed
        eta = (self.total - done) / rate if rate > 0 else float("inf")
        eta_s = f"{eta:,.0f} s" if eta != float("inf") else "?"
        return (f"{100 * done / self.total:5.1f}% {docs:,} documents, {tokens:,} tokens, "
                f"{tokens / elapsed:,.0f} tokens/s, {done / elapsed / 2**20:,.1f} MB/s, ETA {eta_s}")

    def update(self, docs: int, tokens: int, done: int, final: bool = False) -> None:
        now = time.monotonic()
        if not final and now - self.last < self.interval:
            return
        self.last = now
        text = self.line(docs, tokens, done)
        if self.tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
            self.stream.flush()
        else:
            log.info("%s", text)


def _line_number_error(path: Path, lines_before: int, index: int, message: str) -> InputError:
    return InputError(f"{path}:{lines_before + index + 1}: {message}")


def _check_regular(path: Path) -> None:
    """Refuse an input that is not a regular file, by its stat and without opening it: the reader would
    wait forever on a FIFO, and "no such file" misleads about one that exists."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"--input {path}: no such file") from None
    except OSError as exc:
        raise InputError(f"--input {path}: cannot read: {exc.strerror or exc}") from None
    if not stat.S_ISREG(mode):
        what = "a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a special file"
        raise InputError(f"--input {path}: {what}, not a regular file (give a JSONL file)")


def preprocess(options: Options, progress_stream=None) -> Result:
    """Write {prefix}_{key}_document.{bin,idx} for every key; return what was done."""
    path = Path(options.input)
    _check_regular(path)
    encoder = _load_encoder(options)
    dtype = indexed.optimal_dtype(encoder.vocab_size)
    log.info("%s: %s tokenizer (vocab %d, %s), %d worker(s)", path, options.tokenizer_type, encoder.vocab_size,
             encoder.backend, options.workers)
    result = Result(backend=encoder.backend)
    prefixes = {k: output_prefix(options.output_prefix, k) for k in options.json_keys}
    writers = {}
    try:
        for k, p in prefixes.items():
            Path(p).parent.mkdir(parents=True, exist_ok=True)
            writers[k] = indexed.IndexedWriter(f"{p}.bin.tmp", dtype)
    except OSError as exc:
        for k, w in writers.items():
            w.close()
            Path(f"{prefixes[k]}.bin.tmp").unlink(missing_ok=True)
        where = exc.filename or options.output_prefix
        raise InputError(f"--output-prefix {options.output_prefix}: cannot write there "
                         f"({where}: {exc.strerror or exc})") from None
    progress = Progress(path.stat().st_size, progress_stream, options.log_interval)
    start = time.monotonic()
    ok = False
    try:
        lines_before = 0
        for (s, e), reply in zip(slices(path, options.slice_bytes), _encoded(path, options, encoder)):
            if reply[0] == "error":
                raise _line_number_error(path, lines_before, reply[1], reply[2])
            _, n_lines, per_key = reply
            lines_before += n_lines
            for key, (ids, lengths) in per_key.items():
                writers[key].add_documents(ids, lengths)
            result.documents += n_lines
            result.bytes = e
            progress.update(result.documents, sum(w.tokens for w in writers.values()), e)
        for key, w in writers.items():
            w.finalize(f"{prefixes[key]}.idx.tmp")
        for key, p in prefixes.items():
            os.replace(f"{p}.bin.tmp", f"{p}.bin")
            os.replace(f"{p}.idx.tmp", f"{p}.idx")
            result.tokens[key] = writers[key].tokens
            result.outputs[key] = p
        ok = True
    finally:
        for key, p in prefixes.items():
            writers[key].close()
            if not ok:
                for suffix in (".bin.tmp", ".idx.tmp"):
                    Path(p + suffix).unlink(missing_ok=True)
    result.seconds = time.monotonic() - start
    progress.update(result.documents, sum(result.tokens.values()), result.bytes, final=True)
    return result


def _encoded(path: Path, options: Options, encoder: tokenizers_mod.Encoder):
    """The workers' replies, in input order, with at most 2 slices per worker in flight."""
    global _ENCODER
    if options.workers <= 1:
        _ENCODER = encoder
        _init(options)
        for s, e in slices(path, options.slice_bytes):
            yield encode_slice(str(path), s, e)
        return
    _ENCODER = encoder  # inherited by forked workers
    _init(options)
    if _use_threads(options, encoder):
        # gigatoken encodes without the GIL, so threads overlap one slice's JSON parsing with
        # the others' encoding, without forking or sending tokens between processes.
        pool = concurrent.futures.ThreadPoolExecutor(options.workers)
        submit = lambda s, e: pool.submit(encode_slice, str(path), s, e)  # noqa: E731
        result = concurrent.futures.Future.result
    else:
        pool = multiprocessing.get_context("fork").Pool(options.workers, initializer=_init, initargs=(options,))
        submit = lambda s, e: pool.apply_async(encode_slice, (str(path), s, e))  # noqa: E731
        result = multiprocessing.pool.ApplyResult.get
    with pool:
        pending: collections.deque = collections.deque()
        for s, e in slices(path, options.slice_bytes):
            if len(pending) >= 2 * options.workers:
                yield result(pending.popleft())
            pending.append(submit(s, e))
        while pending:
            yield result(pending.popleft())


def _use_threads(options: Options, encoder: tokenizers_mod.Encoder) -> bool:
    if options.pool != "auto":
        return options.pool == "thread"
    return encoder.backend == "gigatoken"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Tokenize a jsonl file into Megatron's indexed dataset "
                          "({prefix}_{key}_document.bin/.idx); the flags are those of Megatron-LM's "
                          "tools/preprocess_data.py and the output is byte-identical to it.")
    parser.add_argument("--input", required=True, help="jsonl file, one JSON object per line")
    parser.add_argument("--output-prefix", required=True, help="outputs are {prefix}_{key}_document.bin/.idx")
    parser.add_argument("--json-keys", nargs="+", default=["text"], help="keys whose text is tokenized (default: text)")
    parser.add_argument("--tokenizer-type", required=True, choices=tokenizers_mod.TOKENIZER_TYPES)
    parser.add_argument("--vocab-file", help="GPT2BPETokenizer: vocab.json")
    parser.add_argument("--merge-file", help="GPT2BPETokenizer: merges.txt")
    parser.add_argument("--tokenizer-model", help="HuggingFaceTokenizer: folder or tokenizer.json; "
                                                  "SentencePieceTokenizer: the .model file")
    parser.add_argument("--append-eod", action="store_true", help="end every non-empty document with the EOD token")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="worker processes (default: all cores)")
    parser.add_argument("--log-interval", type=float, default=30.0, help="seconds between progress lines in a log")
    parser.add_argument("--no-gigatoken", action="store_true", help="encode with the tokenizers library only")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    options = Options(input=Path(args.input), output_prefix=args.output_prefix, tokenizer_type=args.tokenizer_type,
                      json_keys=tuple(args.json_keys), vocab_file=args.vocab_file, merge_file=args.merge_file,
                      tokenizer_model=args.tokenizer_model, append_eod=args.append_eod, workers=max(1, args.workers),
                      use_gigatoken=not args.no_gigatoken, log_interval=args.log_interval)
    try:
        result = preprocess(options)
    except (InputError, tokenizers_mod.TokenizerError) as exc:
        log.error("%s", exc)
        return 1
    total = sum(result.tokens.values())
    log.info("done: %d documents, %d tokens in %.1f s (%.0f tokens/s, %s); wrote %s", result.documents, total,
             result.seconds, total / max(result.seconds, 1e-9), result.backend,
             ", ".join(f"{p}.bin/.idx" for p in result.outputs.values()))
    return 0
