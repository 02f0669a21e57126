"""jsonl → Megatron .bin/.idx: `mlrepro preprocess` against Megatron-LM's own tools, side by side.

    python benchmarks/preprocess.py --megatron /path/to/Megatron-LM [--size-mb 200] [--workers 2]
    python benchmarks/preprocess.py --big [--memory-gb 2]   # bounded memory on a multi-GB input

--big makes a multi-GB input (the --size-mb corpus repeated) and runs `mlrepro preprocess` on it
and on the small corpus, and the floor on the big one (Megatron's tools would take an hour
there): peak RSS per process shows memory does not grow with the input, and the big output is
checked to be the small one's, repeated (the .bin's sha256 against the small .bin's bytes
repeated; the index's lengths tiled), the small output being byte-identical to Megatron's
(the side-by-side run).

Runs on the same jsonl with the same GPT-2-style BPE (vocab.json + merges.txt), each as the
subprocess a user would type:
  mlrepro            `mlrepro preprocess` (gigatoken when its ids match, see mlrepro.corpus.tokenizer)
  mlrepro-tokenizers the same with --no-gigatoken (the `tokenizers` library)
  megatron           Megatron-LM's tools/preprocess_data.py
  fast               Megatron-LM's tools/preprocess_data_fast.py --use-gigatoken
  floor              gigatoken's encode_files alone on the file (no framing, no writing)
and prints wall seconds, tokens/s, MB/s, peak RSS per process (the largest process and the
sum over the process tree) and the sha256 of each output pair.

No network is needed: the corpus is cut from text files on this machine (the Python standard
library, Megatron-LM's docs and sources), and the tokenizer is a byte-level BPE trained on it
and written in GPT-2's file format (GPT-2's own files cannot be downloaded here). Megatron-LM
is run from a checkout given with --megatron (fetched at a pinned commit; see its `git log`):
GPT2BPETokenizer there calls AutoTokenizer.from_pretrained("gpt2", vocab_file=..., merges_file=...),
which works offline from a folder named gpt2 holding a config.json in its working directory; a
sitecustomize supplies typing.override (Python 3.12) when this Python is 3.11. Its imports need
torch, transformers, triton and absl-py: give --megatron-python a Python that has them.
Measured with Megatron-LM d98e8a64ddf34856e74b24714e3bedb2f5a39553 (2026-08-22).

preprocess_data_fast.py writes a lone EOD for an empty document where preprocess_data.py
writes nothing (see --empty-every): its output matches only on inputs without empty texts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from mlrepro.corpus import minicorpus  # noqa: E402
from mlrepro.formats.indexed import IndexedReader  # noqa: E402

TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")
SITECUSTOMIZE = '''import typing
import typing_extensions
typing.override = getattr(typing, "override", typing_extensions.override)
'''


def source_texts(roots: list[Path], limit_bytes: int = 64 << 20) -> list[str]:
    texts, total = [], 0
    for root in roots:
        for path in sorted(root.rglob("*")):
            if path.suffix in TEXT_SUFFIXES and path.is_file() and "test" not in path.name:
                try:
                    text = path.read_text(encoding="utf-8")
                except (UnicodeDecodeError, OSError):
                    continue
                if len(text) > 200:
                    texts.append(text)
                    total += len(text)
            if total > limit_bytes:
                return texts
    return texts


def make_corpus(path: Path, size_mb: float, roots: list[Path], empty_every: int = 0) -> Path:
    """`size_mb` of jsonl: documents of 200–12,000 characters cut at random places from the texts."""
    if path.exists():
        return path
    texts = source_texts(roots)
    if not texts:
        raise SystemExit(f"no text files under {', '.join(map(str, roots))}")
    rng = random.Random(0)
    target = int(size_mb * 2**20)
    written, n = 0, 0
    with open(path.with_suffix(".tmp"), "w", encoding="utf-8") as out:
        while written < target:
            text = rng.choice(texts)
            start = rng.randrange(len(text))
            doc = "" if empty_every and n % empty_every == empty_every - 1 else text[start:start + rng.randint(200, 12000)]
            line = json.dumps({"text": doc, "id": n}) + "\n"
            out.write(line)
            written += len(line.encode())
            n += 1
    path.with_suffix(".tmp").rename(path)
    return path


def make_tokenizer(folder: Path, corpus: Path, vocab_size: int) -> tuple[Path, Path]:
    if (folder / "merges.txt").exists():
        return folder / "vocab.json", folder / "merges.txt"

    def sample():
        with open(corpus, encoding="utf-8") as fh:
            for i, line in enumerate(fh):
                if i >= 8000:
                    return
                yield json.loads(line)["text"]

    return minicorpus.train_gpt2_bpe(sample(), folder, vocab_size)


def tree_peak(pid: int, stop: threading.Event, peaks: dict) -> None:
    """Sample the RSS of `pid` and its descendants: peak per process and peak of the sum."""
    import psutil

    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    while not stop.is_set():
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        total = 0
        for p in procs:
            try:
                rss = p.memory_info().rss
            except psutil.NoSuchProcess:
                continue
            peaks["per_process"][p.pid] = max(peaks["per_process"].get(p.pid, 0), rss)
            total += rss
        peaks["sum"] = max(peaks["sum"], total)
        stop.wait(0.1)


def run_measured(cmd: list[str], *, cwd: Path | None = None, env: dict | None = None, log: Path) -> dict:
    peaks: dict = {"per_process": {}, "sum": 0}
    stop = threading.Event()
    start = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        watcher = threading.Thread(target=tree_peak, args=(proc.pid, stop, peaks), daemon=True)
        watcher.start()
        rc = proc.wait()
    seconds = time.monotonic() - start
    stop.set()
    watcher.join()
    if rc != 0:
        raise RuntimeError(f"{cmd[:3]} failed ({rc}); see {log}:\n{log.read_text()[-2000:]}")
    per = peaks["per_process"].values()
    return {"seconds": seconds, "peak_process_mb": max(per, default=0) / 2**20, "peak_tree_mb": peaks["sum"] / 2**20,
            "processes": len(peaks["per_process"])}


def sha(prefix: str) -> tuple[str, str]:
    def one(p):
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            while block := fh.read(1 << 24):
                h.update(block)
        return h.hexdigest()

    return one(f"{prefix}.bin"), one(f"{prefix}.idx")


def tokens_of(prefix: str) -> int:
    return int(IndexedReader(prefix).sequence_lengths.astype("int64").sum())


FLOOR = '''
import sys, time, gigatoken
from transformers import GPT2Tokenizer
hf = GPT2Tokenizer(vocab=sys.argv[2], merges=sys.argv[3])
tok = gigatoken.Tokenizer.from_json(hf.backend_tokenizer.to_str())
start = time.monotonic()
docs = tok.encode_files(gigatoken.JsonlFileSource([sys.argv[1]], field="text"), parallel=True)
import awkward as ak
n = int(ak.sum(ak.num(docs)))
print("FLOOR", time.monotonic() - start, n, len(docs))
'''


def _processing_seconds(log: Path) -> float | None:
    """The seconds `mlrepro preprocess` reports for reading, tokenizing and writing (after its start-up)."""
    for line in log.read_text().splitlines():
        if " done: " in line and " tokens in " in line:
            return float(line.split(" tokens in ")[1].split(" s ")[0])
    return None


def check_repeated(small: Path, big: Path, out: Path, env: dict, flags: list[str], workers: int, work: Path) -> dict:
    """mlrepro on the small corpus; the big corpus (the small one repeated) must give its tokens repeated."""
    big_flags = [small if f == str(big) else f for f in map(str, flags)]
    cmd = [sys.executable, "-m", "mlrepro", "preprocess", *map(str, big_flags), "--output-prefix", str(out / "small"),
           "--workers", str(workers)]
    measured = run_measured(cmd, env=env, log=work / "small.log")
    repeats, rest = divmod(big.stat().st_size, small.stat().st_size)
    small_prefix, big_prefix = str(out / "small_text_document"), str(out / "mlrepro_text_document")
    h = hashlib.sha256()
    block = Path(f"{small_prefix}.bin").read_bytes()
    for _ in range(repeats):
        h.update(block)
    import numpy as np

    lengths_ok = rest == 0 and np.array_equal(IndexedReader(big_prefix).sequence_lengths,
                                              np.tile(IndexedReader(small_prefix).sequence_lengths, repeats))
    big_sha = sha(big_prefix)[0]
    return {"repeats": repeats, "sha256_bin": big_sha, "small_peak_mb": measured["peak_process_mb"],
            "identical": lengths_ok and h.hexdigest() == big_sha}


def run_tool(name: str, cmd: list[str], megatron_cwd: Path, megatron_env: dict, env: dict, work: Path,
             out: Path) -> dict:
    is_megatron = name in ("megatron", "fast")
    log = work / f"{name}.log"
    r = run_measured(cmd, cwd=megatron_cwd if is_megatron else None, env=megatron_env if is_megatron else env, log=log)
    prefix = str(out / f"{name}_text_document")
    r["tokens"] = tokens_of(prefix)
    r["sha256_bin"], r["sha256_idx"] = sha(prefix)
    if name == "mlrepro":
        r["processing_seconds"] = _processing_seconds(log)
    return r


def run_floor(corpus: Path, vocab: Path, merges: Path, env: dict, work: Path) -> dict:
    r = run_measured([sys.executable, "-c", FLOOR, str(corpus), str(vocab), str(merges)], env=env,
                     log=work / "floor.log")
    line = next(ln for ln in (work / "floor.log").read_text().splitlines() if ln.startswith("FLOOR"))
    _, seconds, tokens, docs = line.split()
    r.update(encode_seconds=float(seconds), tokens=int(tokens) + int(docs))  # + the EODs the others write
    return r


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=float, default=200)
    parser.add_argument("--memory-gb", type=float, default=0, help="instead: a corpus of this many GB (the "
                        "--size-mb corpus repeated), to show peak memory does not grow with the input")
    parser.add_argument("--big", action="store_true", help="the bounded-memory run: --memory-gb (default 2) "
                        "with mlrepro and the floor, output checked against the small corpus's")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--vocab-size", type=int, default=50257)
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "mlrepro-preprocess-bench")
    parser.add_argument("--megatron", type=Path, help="Megatron-LM checkout (tools/preprocess_data.py)")
    parser.add_argument("--megatron-python", default=sys.executable)
    parser.add_argument("--text-root", type=Path, action="append", help="folders whose text files make the corpus")
    parser.add_argument("--empty-every", type=int, default=0, help="make every N-th document empty")
    parser.add_argument("--skip", default="", help="comma-separated: mlrepro,mlrepro-tokenizers,megatron,fast,floor")
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the fast tools; the best of each is kept")
    args = parser.parse_args(argv)
    args.skip = set(filter(None, args.skip.split(",")))
    if args.big:
        args.memory_gb = args.memory_gb or 2
        args.skip |= {"mlrepro-tokenizers", "megatron", "fast"}
    return args


def _inputs(args: argparse.Namespace, work: Path) -> tuple[Path, Path, Path, Path]:
    """(the --size-mb corpus, the corpus measured on: it or the --memory-gb one, vocab.json, merges.txt)."""
    roots = args.text_root or [Path(sysconfig.get_paths()["stdlib"])] + ([args.megatron] if args.megatron else [])
    print(f"corpus: {args.size_mb:g} MB of jsonl from {', '.join(map(str, roots))} ...", flush=True)
    small = make_corpus(work / f"corpus_{args.size_mb:g}mb_e{args.empty_every}.jsonl", args.size_mb, roots,
                        args.empty_every)
    vocab, merges = make_tokenizer(work / f"gpt2bpe_{args.vocab_size}", small, args.vocab_size)
    if not args.memory_gb:
        return small, small, vocab, merges
    big = work / f"corpus_{args.memory_gb:g}gb.jsonl"
    if not big.exists():
        with open(big.with_suffix(".tmp"), "wb") as out:
            while out.tell() < args.memory_gb * 2**30:
                out.write(small.read_bytes())
        big.with_suffix(".tmp").rename(big)
    return small, big, vocab, merges


def _commands(args: argparse.Namespace, flags: list[str], out: Path, work: Path, env: dict) -> tuple[dict, Path, dict]:
    """Each tool's command line, and Megatron's working folder and environment."""
    runs: dict[str, list[str]] = {
        "mlrepro": [sys.executable, "-m", "mlrepro", "preprocess", *flags, "--output-prefix", str(out / "mlrepro"),
                    "--workers", str(args.workers)],
        "mlrepro-tokenizers": [sys.executable, "-m", "mlrepro", "preprocess", *flags, "--no-gigatoken",
                               "--output-prefix", str(out / "mlrepro-tokenizers"), "--workers", str(args.workers)],
    }
    megatron_env = dict(env)
    megatron_cwd = work / "megatron_cwd"
    if not args.megatron:
        print("no --megatron checkout: Megatron-LM's tools are not run", flush=True)
        return runs, megatron_cwd, megatron_env
    (megatron_cwd / "gpt2").mkdir(parents=True, exist_ok=True)
    (megatron_cwd / "gpt2" / "config.json").write_text('{"model_type": "gpt2"}\n')
    (megatron_cwd / "shim").mkdir(exist_ok=True)
    (megatron_cwd / "shim" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    megatron_env["PYTHONPATH"] = f"{megatron_cwd / 'shim'}:{args.megatron}"
    runs["megatron"] = [args.megatron_python, str(args.megatron / "tools" / "preprocess_data.py"), *flags,
                        "--output-prefix", str(out / "megatron"), "--workers", str(args.workers)]
    if (args.megatron / "tools" / "preprocess_data_fast.py").exists():
        runs["fast"] = [args.megatron_python, str(args.megatron / "tools" / "preprocess_data_fast.py"), *flags,
                        "--output-prefix", str(out / "fast"), "--use-gigatoken"]
    return runs, megatron_cwd, megatron_env


def _report(results: dict, size_mb: float) -> None:
    print()
    print(f"{'tool':<20}{'seconds':>9}{'tokens':>14}{'tokens/s':>13}{'MB/s':>8}{'peak MB/proc':>14}{'peak MB tree':>14}"
          f"  sha256 .bin / .idx")
    for name, r in results.items():
        secs = r.get("encode_seconds", r["seconds"])
        sums = f"{r['sha256_bin'][:12]} / {r['sha256_idx'][:12]}" if "sha256_bin" in r else "(no output; encode time only)"
        print(f"{name:<20}{secs:>9.1f}{r['tokens']:>14,}{r['tokens'] / secs:>13,.0f}{size_mb / secs:>8.1f}"
              f"{r['peak_process_mb']:>14,.0f}{r['peak_tree_mb']:>14,.0f}  {sums}")
    pairs = {n: (r["sha256_bin"], r["sha256_idx"]) for n, r in results.items() if "sha256_bin" in r}
    if "megatron" in pairs:
        for name, pair in pairs.items():
            if name != "megatron":
                print(f"{name} output {'IDENTICAL to' if pair == pairs['megatron'] else 'DIFFERS from'} "
                      f"preprocess_data.py's")
        if "mlrepro" in results:
            ratio = (results["mlrepro"]["tokens"] / results["mlrepro"]["seconds"]) / (
                results["megatron"]["tokens"] / results["megatron"]["seconds"])
            print(f"mlrepro / preprocess_data.py tokens/s: {ratio:.1f}x")
    if "floor" in results and "mlrepro" in results:
        floor = results["floor"]["encode_seconds"]
        print(f"mlrepro wall time / gigatoken floor encode time: {results['mlrepro']['seconds'] / floor:.2f}x")
        inside = results["mlrepro"].get("processing_seconds")
        if inside:
            print(f"mlrepro reading+tokenizing+writing time ({inside:.1f} s, its log) / floor encode time: "
                  f"{inside / floor:.2f}x")


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    small, corpus, vocab, merges = _inputs(args, work)
    size_mb = corpus.stat().st_size / 2**20
    print(f"input {corpus} ({size_mb:,.1f} MB), tokenizer {vocab.parent} (vocab {args.vocab_size}), "
          f"{args.workers} workers", flush=True)
    out = work / "out"
    out.mkdir(exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    flags = ["--input", str(corpus), "--json-keys", "text", "--tokenizer-type", "GPT2BPETokenizer",
             "--vocab-file", str(vocab), "--merge-file", str(merges), "--append-eod"]
    runs, megatron_cwd, megatron_env = _commands(args, flags, out, work, env)
    results: dict = {}
    # Rounds interleave the tools, so that a busy spell of a shared machine does not fall on one
    # of them alone; each tool's best round is kept (Megatron's slow tools run once).
    for round_ in range(args.repeat):
        for name, cmd in runs.items():
            if name in args.skip or (round_ and name in ("megatron", "fast")):
                continue
            print(f"running {name} (round {round_ + 1}) ...", flush=True)
            r = run_tool(name, cmd, megatron_cwd, megatron_env, env, work, out)
            if name not in results or r["seconds"] < results[name]["seconds"]:
                results[name] = r
        if "floor" not in args.skip:
            print(f"running floor (round {round_ + 1}) ...", flush=True)
            r = run_floor(corpus, vocab, merges, env, work)
            if "floor" not in results or r["encode_seconds"] < results["floor"]["encode_seconds"]:
                results["floor"] = r
    _report(results, size_mb)
    if args.big and "mlrepro" in results:
        check = results["big_check"] = check_repeated(small, corpus, out, env, flags, args.workers, work)
        print(f"big output = small output repeated {check['repeats']}x: {'IDENTICAL' if check['identical'] else 'DIFFERS'}"
              f" (sha256 .bin {check['sha256_bin'][:12]}); peak RSS per process: big input "
              f"{results['mlrepro']['peak_process_mb']:,.0f} MB, small input {check['small_peak_mb']:,.0f} MB")
    if args.json:
        args.json.write_text(json.dumps({"input_mb": size_mb, "workers": args.workers, "rounds": args.repeat,
                                         "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
