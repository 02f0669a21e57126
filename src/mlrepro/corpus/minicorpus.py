"""A miniature corpus and GPT-2-style tokenizer, made here, for tests and benchmarks.

No GPT-2 vocab.json/merges.txt can be fetched on a machine without network, so
`train_gpt2_bpe` trains a byte-level BPE with the `tokenizers` library and writes it in
GPT-2's file format (vocab.json, merges.txt with the `#version: 0.2` header,
`<|endoftext|>` as the last id), which transformers' GPT-2 tokenizer and Megatron's
GPT2BPETokenizer load as they load GPT-2's own. `documents` makes deterministic
pseudo-text with the cases a tokenizer must get right (unicode, whitespace runs, quotes,
the special token written out in the text).
"""

from __future__ import annotations

import functools
import http.server
import json
import random
import threading
import time
from pathlib import Path
from typing import Iterable, Iterator

WORDS = ("the of and to in is was for on that with as by at from his her are be this an which or had it "
         "not but have were they one all their has been its new more who also after first two can into "
         "Megatron tokenizer corpus shard chunk café naïve Ωμέγα Москва 日本語 한국어 🙂 data model train "
         "1234 3.14 1e-10 don't it's we're \"quoted\" (paren) [bracket] {brace} #hash @user https://x.y/z").split()
SPECIALS = ("\n", "\n\n", "  ", "\t", ". ", ", ", "! ", "? ", " <|endoftext|> ", "\u00a0", "\r\n")


def documents(n: int, seed: int = 0, mean_words: int = 60) -> Iterator[str]:
    rng = random.Random(seed)
    for _ in range(n):
        words = rng.randint(0, 2 * mean_words)
        parts = []
        for _ in range(words):
            parts.append(rng.choice(WORDS))
            parts.append(rng.choice(SPECIALS) if rng.random() < 0.15 else " ")
        yield "".join(parts).strip(" ")


def write_jsonl(path: Path, texts: Iterable[str], key: str = "text", extra: dict | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as out:
        for i, text in enumerate(texts):
            out.write(json.dumps({key: text, "id": i, **(extra or {})}, ensure_ascii=bool(i % 2)) + "\n")
    return path


def train_gpt2_bpe(texts: Iterable[str], out_dir: Path, vocab_size: int = 2000) -> tuple[Path, Path]:
    """vocab.json and merges.txt of a byte-level BPE trained on `texts`, in GPT-2's format."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size - 1, show_progress=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    bpe.save_model(str(out_dir))
    vocab_path = out_dir / "vocab.json"
    vocab = json.loads(vocab_path.read_text())
    vocab["<|endoftext|>"] = len(vocab)  # GPT-2 keeps it last (50256)
    vocab_path.write_text(json.dumps(vocab, ensure_ascii=False))
    return vocab_path, out_dir / "merges.txt"


def make_mini_corpus(root: Path, chunks: int = 2, shards: int = 5, docs_per_shard: int = 150,
                     hole: tuple[int, int] | None = (2, 3)) -> Path:
    """config/corpora/mini_corpus.yaml's files under `root`: mini/chunk{c}/part_{s}.jsonl.zst and tokenizer/."""
    import zstandard

    train_gpt2_bpe(documents(2000, seed=99), root / "tokenizer", vocab_size=1000)
    cctx = zstandard.ZstdCompressor(level=3)
    for c in range(1, chunks + 1):
        for s in range(shards):
            if (c, s) == hole:
                continue
            texts = list(documents(docs_per_shard, seed=1000 * c + s))
            texts[s % len(texts)] = ""  # an empty document in every shard
            body = "".join(json.dumps({"text": t, "meta": {"chunk": c, "shard": s}}) + "\n" for t in texts)
            path = root / "mini" / f"chunk{c}" / f"part_{s}.jsonl.zst"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(cctx.compress(body.encode()))
    return root


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True


def serve(folder: Path, port: int = 0, *, rate_limited: tuple[str, ...] = (),
          bytes_per_second: float | None = None) -> Server:
    """A threaded HTTP server of `folder` on 127.0.0.1 (port 0: a free one); stop it with shutdown().

    Paths in `rate_limited` answer 429 once first (as a busy server does); `bytes_per_second` paces
    every response (a slow link: a download that lasts long enough to be watched)."""
    limited = set(rate_limited)

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):
            if self.path in limited:
                limited.discard(self.path)
                self.send_response(429)
                self.send_header("Retry-After", "1")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            super().do_GET()

        def copyfile(self, source, outputfile):
            if not bytes_per_second:
                return super().copyfile(source, outputfile)
            block = max(1, int(bytes_per_second / 20))
            while chunk := source.read(block):
                outputfile.write(chunk)
                outputfile.flush()
                time.sleep(len(chunk) / bytes_per_second)

        def log_message(self, *args):
            pass

    server = Server(("127.0.0.1", port), functools.partial(Handler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, name=f"serve {folder}", daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    import argparse
    import time

    parser = argparse.ArgumentParser(description="Write and serve the miniature corpus of config/corpora/mini_corpus.yaml")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--dir", default="resources/mini_corpus_server")
    parser.add_argument("--port", type=int, default=18765)
    args = parser.parse_args(argv)
    root = make_mini_corpus(Path(args.dir))
    server = serve(root, args.port)
    print(f"serving {root} on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
