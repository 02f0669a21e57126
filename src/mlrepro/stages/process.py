"""What every stage runs inside (stage_process), and how a rule's function says what it takes of
Snakemake's job (`rule`): the one dispatcher (mlrepro.stages.run_from_snakemake) reads both."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import Callable

from mlrepro.config import ConfigError
from mlrepro.container import image as containers
from mlrepro.container import prebuilt
from mlrepro.data.checks import DataError
from mlrepro.implementation import configs as implementation
from mlrepro.launch.job import SeedFailed
from mlrepro.scoring import reference
from mlrepro.util import secrets
from mlrepro.util.fsutil import private_umask

# What a rule function declares of its log: Snakemake's first log file is the stage's (LOG), the
# stage writes it itself (OWN: the child's output goes there), or the named log file is the stage's.
LOG, OWN = "0", None


def rule(arguments: Callable, *, log: str | None = LOG) -> Callable:
    """Mark a function as the rule of the same name: `arguments(smk, settings)` gives its positional
    and keyword arguments ((args...), {kwargs}) from Snakemake's job; `log` says which log file the
    stage logs to (see LOG, OWN)."""
    def mark(fn):
        fn.snakemake_arguments = arguments
        fn.snakemake_log = log
        return fn
    return mark


def log_file(fn, smk) -> Path | None:
    """The file the stage `fn` logs to in Snakemake's job `smk`."""
    which = fn.snakemake_log
    if which is OWN:
        return None
    return Path(smk.log[int(which)] if which.isdigit() else getattr(smk.log, which))


@contextlib.contextmanager
def stage_process(path: Path | None):
    """What every stage script runs inside: a private umask, this interpreter first on PATH, and
    logging to `path` with secrets redacted."""
    private_umask()
    host_python_first()
    handlers = [logging.StreamHandler(sys.stderr)]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="w"))
    for handler in handlers:
        handler.addFilter(secrets.RedactingFilter())
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", handlers=handlers, force=True)
    try:
        yield
    except Exception:
        logging.getLogger("mlrepro").exception("stage failed")
        raise


def host_python_first() -> None:
    """Put this interpreter's folder first on PATH, for every child that runs on the host.

    The implementations' scripts call `python3` (run_and_time.sh, download_*.py, run.sub's
    checker); on a host without containers that must be the environment mlrepro runs in
    (the project's .venv), also when it was not activated (`.venv/bin/python -m snakemake`).
    """
    here = os.path.dirname(sys.executable)  # not resolved: a venv's python is a link out of it
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != here:
        os.environ["PATH"] = here + os.pathsep + path if path else here


def user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message says everything: shown without a traceback (a module of mlrepro.stages may
    name its own with a `user_errors()` of its own)."""
    return (SeedFailed, ConfigError, DataError, implementation.ImplementationError, containers.ContainerError,
            prebuilt.ImageError, reference.ReferenceError)
