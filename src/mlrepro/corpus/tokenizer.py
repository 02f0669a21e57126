"""The tokenizers Megatron's preprocess_data.py offers, loaded without the network.

`load()` builds the same tokenizer Megatron builds for a --tokenizer-type (transformers'
GPT-2 tokenizer from vocab.json + merges.txt, AutoTokenizer from a local folder or
tokenizer.json) and, when gigatoken reproduces its ids, encodes through gigatoken
(tens of millions of tokens/s, against well under one million for per-document calls).
Whether gigatoken agrees is checked at load time on a probe text that holds the awkward
cases (special tokens written in the text, unicode, whitespace runs); where it refuses the
tokenizer or disagrees, the `tokenizers` library encodes instead and the log says so.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

log = logging.getLogger(__name__)

TOKENIZER_TYPES = ("GPT2BPETokenizer", "HuggingFaceTokenizer", "SentencePieceTokenizer")

PROBE = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "  leading spaces,\ttabs\r\nand CRLF\n\n\nblank lines   ",
    "<|endoftext|> written in the text, twice<|endoftext|>, and <s></s> tags",
    "Unicode: café naïve Ωμέγα Москва 日本語のテキスト 한국어 العربية 🙂👍🏽 \u00a0nbsp",
    "Numbers 1234567890 3.14159 1e-10, code: def f(x): return x**2  # comment",
    "",
    "a",
    "'s 're 've 'll 'd 'm 't can't WON'T",
]


class TokenizerError(ValueError):
    """A tokenizer cannot be built from what was given."""


@dataclass
class Encoder:
    """Encodes batches of texts to the ids Megatron's tool would write."""

    name: str
    vocab_size: int
    eod: int | None
    backend: str  # "gigatoken" or "tokenizers"
    _impl: Any = None

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """All ids of `texts` concatenated (uint32) and each text's number of ids."""
        if self.backend == "gigatoken":
            import awkward as ak

            encoded = self._impl.encode_batch(texts)
            return ak.to_numpy(ak.flatten(encoded)), ak.to_numpy(ak.num(encoded)).astype(np.int64)
        encoded = self._impl.encode_batch(texts, add_special_tokens=True)
        lengths = np.fromiter((len(e.ids) for e in encoded), dtype=np.int64, count=len(encoded))
        flat = np.fromiter((i for e in encoded for i in e.ids), dtype=np.uint32, count=int(lengths.sum()))
        return flat, lengths

    def __getstate__(self):
        raise TypeError("an Encoder is built in each worker (load()), not pickled")


def _require(path: str | None, flag: str, kind: str) -> Path:
    if not path:
        raise TokenizerError(f"{kind} needs {flag}")
    p = Path(path)
    if not p.exists():
        raise TokenizerError(f"{flag} {path}: no such file")
    if flag != "--tokenizer-model" and not p.is_file():  # a FIFO would block the read forever
        raise TokenizerError(f"{flag} {path}: not a regular file")
    return p


def check_gpt2_files(vocab: Path, merges: Path) -> None:
    """What the BPE readers only say without naming the file: vocab.json must map tokens to ids,
    merges.txt must be text."""
    try:
        data = json.loads(vocab.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"--vocab-file {vocab}: not UTF-8 (byte {exc.start})") from None
    except (ValueError, RecursionError) as exc:
        raise TokenizerError(f"--vocab-file {vocab}: not valid JSON ({exc})") from None
    except OSError as exc:
        raise TokenizerError(f"--vocab-file {vocab}: cannot read: {exc.strerror or exc}") from None
    if not isinstance(data, dict) or not data:
        raise TokenizerError(f"--vocab-file {vocab}: not a JSON object of token: id (GPT-2's vocab.json)")
    bad = next((k for k, v in data.items() if isinstance(v, bool) or not isinstance(v, int) or v < 0), None)
    if bad is not None:
        raise TokenizerError(f"--vocab-file {vocab}: token {bad!r} has id {data[bad]!r}, not a non-negative integer")
    try:
        merges.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TokenizerError(f"--merge-file {merges}: not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise TokenizerError(f"--merge-file {merges}: cannot read: {exc.strerror or exc}") from None


def _hf_tokenizer(tokenizer_type: str, vocab_file: str | None, merge_file: str | None, tokenizer_model: str | None):
    """The transformers tokenizer Megatron's build_tokenizer() makes, and its `tokenizers` backend."""
    if tokenizer_type == "GPT2BPETokenizer":
        from transformers import GPT2Tokenizer

        vocab = _require(vocab_file, "--vocab-file", tokenizer_type)
        merges = _require(merge_file, "--merge-file", tokenizer_type)
        # What AutoTokenizer.from_pretrained("gpt2", vocab_file=..., merges_file=...) gives in Megatron.
        return GPT2Tokenizer(vocab=str(vocab), merges=str(merges))
    from transformers import AutoTokenizer

    model = _require(tokenizer_model, "--tokenizer-model", tokenizer_type)
    if model.is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast(tokenizer_file=str(model))
    # A folder on disk, never a hub name: preprocessing must not reach out to a hub mid-run.
    return AutoTokenizer.from_pretrained(str(model), local_files_only=True)


EOD_GPT2 = "<|endoftext|>"


def gpt2_backend(vocab_file: str, merge_file: str):
    """The `tokenizers` object transformers' GPT2Tokenizer(vocab, merges) builds (the same JSON, see
    the tests), made without importing transformers (seconds of a short run's start); None when the
    vocabulary lacks <|endoftext|> (transformers then adds it as a new id: let it)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    bpe = models.BPE.from_file(vocab_file, merge_file, continuing_subword_prefix="", end_of_word_suffix="")
    if bpe.token_to_id(EOD_GPT2) is None:
        return None
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    tok.post_processor = processors.TemplateProcessing(single="$A", pair="$A $B:1", special_tokens=[])
    tok.add_special_tokens([AddedToken(EOD_GPT2, special=True, normalized=False)])
    return tok


def _gigatoken(backend, reference) -> tuple[Any | None, str]:
    """A gigatoken tokenizer with the same ids as `reference` on PROBE, or None and why not."""
    try:
        import gigatoken
    except ImportError:
        return None, "gigatoken is not installed"
    try:
        giga = gigatoken.Tokenizer.from_json(backend.to_str())
    except Exception as exc:  # gigatoken refuses some tokenizers (e.g. byte remapping)
        return None, f"gigatoken refused the tokenizer: {exc}"
    for text in PROBE:
        got = [int(i) for i in giga.encode(text)]
        want = reference(text)
        if got != want:
            return None, f"gigatoken gives other ids than transformers for {text[:40]!r}"
    return giga, ""


def load(tokenizer_type: str, *, vocab_file: str | None = None, merge_file: str | None = None,
         tokenizer_model: str | None = None, use_gigatoken: bool = True, quiet: bool = False) -> Encoder:
    """The encoder for a Megatron --tokenizer-type and its files."""
    if tokenizer_type not in TOKENIZER_TYPES:
        raise TokenizerError(f"--tokenizer-type {tokenizer_type}: supported are {', '.join(TOKENIZER_TYPES)}")
    if tokenizer_type == "SentencePieceTokenizer":
        return _sentencepiece(tokenizer_model)
    try:
        backend, vocab_size, eod, reference = _reference(tokenizer_type, vocab_file, merge_file, tokenizer_model)
    except TokenizerError:
        raise
    except Exception as exc:
        files = ", ".join(str(f) for f in (vocab_file, merge_file, tokenizer_model) if f)
        raise TokenizerError(f"cannot build the {tokenizer_type} tokenizer from {files}: {exc}") from None
    giga, why = _gigatoken(backend, reference) if use_gigatoken else (None, "gigatoken not requested")
    if giga is not None:
        return Encoder(tokenizer_type, vocab_size, eod, "gigatoken", giga)
    if not quiet:
        log.warning("encoding with the tokenizers library (slower): %s", why)
    for text in PROBE:
        if backend.encode(text, add_special_tokens=True).ids != reference(text):
            raise TokenizerError(f"the {tokenizer_type} tokenizer's backend disagrees with transformers on {text[:40]!r}")
    return Encoder(tokenizer_type, vocab_size, eod, "tokenizers", backend)


def _reference(tokenizer_type: str, vocab_file: str | None, merge_file: str | None, tokenizer_model: str | None):
    """(the `tokenizers` backend, vocab size, EOD id, the ids Megatron's tokenizer gives a text)."""
    if tokenizer_type == "GPT2BPETokenizer":
        vocab = _require(vocab_file, "--vocab-file", tokenizer_type)
        merges = _require(merge_file, "--merge-file", tokenizer_type)
        check_gpt2_files(vocab, merges)
        backend = gpt2_backend(str(vocab), str(merges))
        if backend is not None:
            return (backend, backend.get_vocab_size(with_added_tokens=True), backend.token_to_id(EOD_GPT2),
                    lambda text: backend.encode(text, add_special_tokens=True).ids)
    hf = _hf_tokenizer(tokenizer_type, vocab_file, merge_file, tokenizer_model)
    eod = hf.eos_token_id if hf.eos_token_id is not None else hf.sep_token_id
    return hf.backend_tokenizer, len(hf), eod, lambda text: list(hf(text).input_ids)


def _sentencepiece(tokenizer_model: str | None) -> Encoder:
    model = _require(tokenizer_model, "--tokenizer-model", "SentencePieceTokenizer")
    try:
        import gigatoken

        giga = gigatoken.Tokenizer.from_sentencepiece(model)
    except Exception as exc:
        raise TokenizerError(f"cannot load the SentencePiece model {model}: {exc}") from None
    special = giga._special_tokens() if hasattr(giga, "_special_tokens") else {}
    eod = special.get("</s>")
    return Encoder("SentencePieceTokenizer", giga.vocab_size, eod, "gigatoken", giga)
