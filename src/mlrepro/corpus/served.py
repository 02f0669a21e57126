"""A corpus the workflow serves itself, over real HTTP on localhost, for as long as a stage needs it.

The miniature corpus (config/corpora/mini_corpus.yaml) has no home on the internet. It says

    served: mini_corpus

and its URLs name files on `http://127.0.0.1:18765/`. A stage that downloads from it (the shards,
the tokenizer) writes the miniature's files once (deterministic: mlrepro.corpus.minicorpus) under
resources/corpora/<name>/origin/, serves that folder on a free port of 127.0.0.1, points the
corpus's localhost URLs at that port, downloads over HTTP as from any server, and stops it. Nothing
is started by hand, two stages (or two checkouts) never fight over a port, and the download path
is the one a real corpus takes.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit, urlunsplit

from mlrepro.corpus.minicorpus import make_mini_corpus, serve
from mlrepro.util.fsutil import locked

log = logging.getLogger(__name__)

MAKERS = ("mini_corpus",)  # what `served:` may name: the miniatures mlrepro can write
_LOCAL = ("127.0.0.1", "localhost")
_DONE = "origin.json"


def origin(root_folder: Path, name: str) -> Path:
    """The served files of `name` under `root_folder` (resources/corpora/<corpus>/origin), written once.

    A lock keeps two stages starting together from writing the same folder at once."""
    if name not in MAKERS:
        raise ValueError(f"served: {name!r} is not a corpus mlrepro can write (known: {', '.join(MAKERS)})")
    root_folder.mkdir(parents=True, exist_ok=True)
    with locked(root_folder.parent / f".{root_folder.name}.lock"):
        done = root_folder / _DONE
        if not done.is_file():
            started = time.monotonic()
            make_mini_corpus(root_folder)
            files = sorted(str(p.relative_to(root_folder)) for p in root_folder.rglob("*") if p.is_file())
            done.write_text(json.dumps({"made_by": f"mlrepro.corpus.minicorpus ({name})", "files": files}))
            log.info("wrote the %s files under %s (%.1f s)", name, root_folder, time.monotonic() - started)
    return root_folder


def _pointed(url: str, port: int) -> str:
    parts = urlsplit(url)
    if parts.scheme != "http" or parts.hostname not in _LOCAL:
        return url
    return urlunsplit((parts.scheme, f"127.0.0.1:{port}", parts.path, parts.query, parts.fragment))


def pointed_at(corpus: dict, port: int) -> dict:
    """A copy of `corpus` whose localhost URLs (source and tokenizer) name 127.0.0.1:`port`."""
    out = copy.deepcopy(corpus)
    source = out.get("source") or {}
    if "url" in source:
        source["url"] = _pointed(source["url"], port)
    if "urls" in source:
        source["urls"] = [_pointed(u, port) for u in source["urls"]]
    for key, value in (out.get("tokenizer") or {}).items():
        if isinstance(value, str) and "://" in value:
            out["tokenizer"][key] = _pointed(value, port)
    out.pop("served", None)  # what the stage hands on (a Slurm array's spec) is an ordinary corpus
    return out


@contextlib.contextmanager
def serving(corpus: dict, corpus_folder: Path) -> Iterator[dict]:
    """The corpus as a stage downloads it: itself, or, when it says `served:`, pointed at a server of
    its files that runs until the block ends."""
    name = corpus.get("served")
    if not name:
        yield corpus
        return
    folder = origin(Path(corpus_folder) / "origin", name)
    server = serve(folder)
    port = server.server_address[1]
    log.info("serving %s from %s on http://127.0.0.1:%d/ while this stage downloads", corpus.get("name"), folder, port)
    try:
        yield pointed_at(corpus, port)
    finally:
        server.shutdown()
        server.server_close()
        log.info("stopped the server of %s", corpus.get("name"))
