"""mlperf_logging's own checking code, fed efficiently: each log read once, the rule files parsed once.

The official line parser of the ruleset (``mlp_parser.ruleset_XYZ.string_to_logline``), the
compliance checker with its YAML rules, and the rcp_checker, called as the summarizer calls them.
What changes is only how logs reach that code: ``mllog_lines`` strips a line as
``mlp_parser.strip_and_dedup`` does without its regular expression (quadratic in the line
length), ``official_tools`` makes mlp_compliance parse each rule file once per process and
compile each rule's expression once, gives rcp_checker one RCP_Checker per benchmark and one
read of each file, and mutes the tools' logging. mlrepro.scoring.engine scores with it (tree mode,
per-folder mode and a reproduction's seeds). One reading is ours and not the parser's: a record
that several ranks of a ``srun -l`` log printed word for word is read once (read_mllog says why).
"""

from __future__ import annotations

import builtins
import contextlib
import importlib
import logging
import os
import re
from typing import Any, Iterator

TOKEN = ":::MLLOG "
# Keys of the lines rcp_checker.read_submission_file acts on; every other line leaves its state
# unchanged, so it is given only these.
RCP_KEYS = ("global_batch_size", "submission_benchmark", "eval_error", "eval_accuracy", "train_samples", "run_stop")
# The prefixes that name the rank that printed a line: `srun -l` ("12: ") and Open MPI's --tag-output.
_RANK = re.compile(r"^\s*(?:(\d+)\s*:\s|\[\d+,(\d+)\]<std(?:out|err)>:)")
_DEPTH = [0]  # official_tools() in use (it is re-entrant)


class _CachedYaml:
    """Stands in for the ``yaml`` module inside mlp_compliance: the rule files are
    parsed once per process. ``configured_checks`` only reads what it loads."""

    def __init__(self, yaml_module):
        self._yaml = yaml_module
        self.BaseLoader = yaml_module.BaseLoader
        self._cache: dict[tuple, Any] = {}

    def load(self, stream, Loader):
        name = getattr(stream, "name", None)
        if not isinstance(name, str):
            return self._yaml.load(stream, Loader=Loader)
        key = (name, os.stat(name).st_mtime_ns, Loader)
        if key not in self._cache:
            self._cache[key] = self._yaml.load(stream, Loader=Loader)
        return self._cache[key]

    def __getattr__(self, name):
        return getattr(self._yaml, name)


# Per process: the rule files and reference points do not change during a run.
_YAML: _CachedYaml | None = None
_RCP_CHECKERS: dict[tuple, Any] = {}
_CODE: dict[tuple[str, str], Any] = {}


def _compiled(source, mode: str):
    if not isinstance(source, str):
        return source
    key = (source, mode)
    code = _CODE.get(key)
    if code is None:
        code = _CODE[key] = compile(source, "<string>", mode)
    return code


def _eval(source, globals_=None, locals_=None):
    """builtins.eval, with each rule's expression compiled once instead of once per log line."""
    return builtins.eval(_compiled(source, "eval"), globals_, locals_)


def _exec(source, globals_=None, locals_=None):
    return builtins.exec(_compiled(source, "exec"), globals_, locals_)


@contextlib.contextmanager
def official_tools() -> Iterator[None]:
    """mlp_compliance with cached rule files, rcp_checker with one RCP_Checker per
    benchmark, and the tools' logging muted (they log every check at WARNING)."""
    if _DEPTH[0]:  # an inner use (score_run inside score_runs) leaves the outer set-up in place
        _DEPTH[0] += 1
        try:
            yield
        finally:
            _DEPTH[0] -= 1
        return
    import yaml
    from mlperf_logging.compliance_checker import mlp_compliance
    from mlperf_logging.rcp_checker import rcp_checker

    real_checker = rcp_checker.RCP_Checker
    checkers = _RCP_CHECKERS

    def cached_checker(usage, ruleset, benchmark, verbose, rcp_file=None):
        # Its references (means, allowed speed-ups) depend only on these; the
        # evaluation it is used for does not change them.
        if rcp_file is not None:
            return real_checker(usage, ruleset, benchmark, verbose, rcp_file)
        key = (usage, ruleset, benchmark)
        if key not in checkers:
            checkers[key] = real_checker(usage, ruleset, benchmark, verbose)
        return checkers[key]

    previous_disable = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    global _YAML
    if _YAML is None:
        _YAML = _CachedYaml(yaml)
    mlp_compliance.yaml = _YAML
    # Module globals shadow the builtins for the checker's own code only.
    mlp_compliance.eval, mlp_compliance.exec = _eval, _exec
    rcp_checker.RCP_Checker = cached_checker
    real_read = rcp_checker.read_submission_file
    reads: dict[tuple, Any] = {}

    def read_once(result_file, ruleset, use_train_samples):
        # check_directory and get_submission_epochs each read every file; the answer is the same.
        key = (result_file, os.stat(result_file).st_mtime_ns, ruleset, use_train_samples)
        if key not in reads:
            reads[key] = real_read(result_file, ruleset, use_train_samples)
        return reads[key]

    rcp_checker.read_submission_file = read_once
    _DEPTH[0] += 1
    try:
        yield
    finally:
        _DEPTH[0] -= 1
        mlp_compliance.yaml = yaml
        del mlp_compliance.eval, mlp_compliance.exec
        rcp_checker.RCP_Checker = real_checker
        rcp_checker.read_submission_file = real_read
        logging.disable(previous_disable)


def _parser_module(ruleset: str):
    """The official line parser of `ruleset` (mlp_parser.parse_file dispatches the same way)."""
    return importlib.import_module(f"mlperf_logging.compliance_checker.mlp_parser.ruleset_{ruleset.replace('.', '')}")


def read_mllog(path: str | os.PathLike) -> tuple[list[str], int]:
    """The MLLOG lines of a log as mlp_parser.strip_and_dedup leaves them, and how many copies of
    records printed by several ranks were set aside.

    ``re.sub(".*" + TOKEN, TOKEN, line).strip()`` keeps the text from the last TOKEN on, which is
    what rfind does without the regex's quadratic scan. A record that several ranks printed word
    for word (``srun -l`` with every rank logging) is one event and is kept once; the official
    parser would keep a copy per rank and its checker then finds run_start more than once. Records
    only one rank printed (rank 56's run_stop beside rank 0's run_start) are all kept.
    """
    kept: list[str] = []
    first_rank: dict[str, str] = {}
    repeats = 0
    with open(path, encoding="latin-1") as fh:  # universal newlines, as the parser reads
        for line in fh:
            at = line.rfind(TOKEN)
            if at < 0:
                continue
            text = line[at:].strip()
            m = _RANK.match(line[:at]) if at else None
            if m:
                rank = m.group(1) or m.group(2)
                if first_rank.setdefault(text, rank) != rank:
                    repeats += 1
                    continue
            kept.append(text)
    return kept, repeats


def mllog_lines(path: str | os.PathLike) -> list[str]:
    """read_mllog's lines."""
    return read_mllog(path)[0]


def parse_lines(lines: list[str], ruleset: str) -> tuple[list, list]:
    """mlp_parser's (loglines, failed) for the stripped lines (its parse_generator)."""
    to_logline = _parser_module(ruleset).string_to_logline
    loglines, failed = [], []
    for lineno, line in enumerate(lines):
        try:
            loglines.append(to_logline(lineno, line))
        except ValueError as exc:
            failed.append((line, str(exc)))
    return loglines, failed


def compliance(loglines: list, failed: list, usage: str, ruleset: str) -> tuple[bool, list[str]]:
    """mlp_compliance.ComplianceChecker.check_file on lines parsed already."""
    from mlperf_logging.compliance_checker import mlp_compliance

    mlp_compliance.enqueued_configs.clear()
    checker = mlp_compliance.make_checker(usage=usage, ruleset=ruleset, quiet=True, werror=False)
    if failed:
        checker.put_message("Log lines had parsing errors.")
    # The rules may add lines (stable_diffusion's aggregated_eval_accuracy): give them a copy.
    checker.check_loglines(list(loglines), f"{usage}_{ruleset}/common.yaml")
    messages = [*checker.overwritable.values(), *checker.not_overwritable]
    return not checker.has_messages(), [_first_line(m) for m in messages]


def _first_line(msg: str) -> str:
    lines = [ln.strip() for ln in str(msg).splitlines() if ln.strip()]
    head = lines[0] if lines else str(msg)
    for ln in lines[1:3]:
        if ln.startswith("failed test"):
            head += f" ({ln})"
    return head[:300]
