"""The workflow's stages as plain functions, one per Snakemake rule.

workflow/scripts/stage.py hands each rule's job to `run_from_snakemake`, which picks the
function named like the rule. The functions take paths and names only, so they are tested
without Snakemake.
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import launch
from mlrepro.fsutil import atomic_dir, atomic_write_json

log = logging.getLogger("mlrepro.stages")


def container(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Build the implementation's image (or, with runtime none, record this machine's environment)."""
    from mlrepro import container as containers

    bench = settings.benchmark(benchmark)
    runtime = settings.system.container_runtime
    containers.build_container(
        {
            "runtime": "podman" if runtime == "enroot" else runtime,
            "context": str(bench.implementation_dir),
            "dockerfile": "Dockerfile",
            "tag": f"mlrepro/{benchmark}:latest",
            # pyxis/enroot clusters run a squashfs image; a podman system runs the image itself.
            "sqsh": str(settings.root / "resources" / benchmark / "image.sqsh") if runtime == "enroot" else None,
        },
        out,
    )


def _download(settings: mlrepro_config.Settings, benchmark: str, stage: str, out: Path, log_path: Path) -> None:
    """Run the implementation's own download script for `stage` into the folder holding `out`."""
    from mlrepro import data

    bench = settings.benchmark(benchmark)
    spec = getattr(bench, stage)
    if spec is None:
        raise mlrepro_config.ConfigError(f"{bench.source}: {stage}: not configured")
    if spec["needs_token"]:
        data.require_token("HF_TOKEN")
    folder = out.parent
    data.check_free_space(folder.parent, int(spec["min_free_gb"] * 2**30))
    with atomic_dir(folder) as partial:
        args = [a.replace("{out}", str(partial)) for a in spec["args"]]
        data.run_download_script(
            bench.implementation_dir / spec["script"], args, env=_download_env(bench), log_path=log_path
        )
        data.write_manifest(partial, partial / out.name, extra={"benchmark": benchmark, "stage": stage})


def _download_env(bench: mlrepro_config.Benchmark) -> dict:
    import os

    return {**os.environ, **bench.env}


def dataset(settings, benchmark: str, out: Path, log_path: Path) -> None:
    _download(settings, benchmark, "dataset", out, log_path)


def base_checkpoint(settings, benchmark: str, out: Path, log_path: Path) -> None:
    _download(settings, benchmark, "checkpoint", out, log_path)


def train_seed(settings, benchmark: str, seed: int, out: Path, log_path: Path) -> None:
    """Run the seed, retrying a failed attempt up to the benchmark's `retries` times."""
    plan = launch.plan_seed(settings, benchmark, seed)
    bench = settings.benchmark(benchmark)
    run = launch.run_seed_slurm if plan.scheduler == "slurm" else launch.run_seed_local
    log.info("%s seed %d: %s", benchmark, seed, plan.describe())
    for attempt in range(bench.retries + 1):
        try:
            run(plan, settings.system, log_path)
            launch.finish_seed(plan, log_path, out, bench.not_converged)
            return
        except launch.SeedFailed as exc:
            if attempt == bench.retries:
                raise
            log.warning("%s; retrying (%d of %d)", exc, attempt + 1, bench.retries)


def score_seed(settings, benchmark: str, seed: int, mllog_path: Path, out: Path) -> None:
    from mlrepro import scoring

    run = scoring.score_run(mllog_path, settings.benchmark(benchmark).scoring_rules())
    run["seed"] = seed if run.get("seed") is None else run["seed"]
    atomic_write_json(out, run)


def score(settings, benchmark: str, run_files: list[Path], mllogs: list[Path], out: Path) -> None:
    from mlrepro import scoring

    runs = [json.loads(Path(p).read_text()) for p in run_files]
    result = scoring.score_runs(mllogs, settings.benchmark(benchmark).scoring_rules(), runs=runs)
    atomic_write_json(out, result)


def report(settings, benchmark: str, score_file: Path, mllogs: list[Path], out: Path) -> None:
    from mlrepro import report as reports

    reports.write_report(json.loads(Path(score_file).read_text()), mllogs, out)


@contextlib.contextmanager
def _logging_to(path: Path | None):
    handlers = [logging.StreamHandler(sys.stderr)]
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(path, mode="w"))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s", handlers=handlers, force=True)
    try:
        yield
    except Exception:
        logging.getLogger("mlrepro").exception("stage failed")
        raise


def run_from_snakemake(smk) -> None:
    settings = mlrepro_config.load(smk.config, Path.cwd())
    wc = smk.wildcards
    rule = smk.rule
    out = Path(smk.output[0])
    log_path = Path(smk.log[0])
    calls = {
        "container": lambda: container(settings, wc.benchmark, out),
        "dataset": lambda: dataset(settings, wc.benchmark, out, log_path),
        "base_checkpoint": lambda: base_checkpoint(settings, wc.benchmark, out, log_path),
        "train_seed": lambda: train_seed(settings, wc.benchmark, int(wc.seed), out, log_path),
        "score_seed": lambda: score_seed(settings, wc.benchmark, int(wc.seed), Path(smk.input[0]), out),
        "score": lambda: score(settings, wc.benchmark, list(map(Path, smk.input.runs)), list(map(Path, smk.input.mllogs)), out),
        "report": lambda: report(settings, wc.benchmark, Path(smk.input.score), list(map(Path, smk.input.mllogs)), out),
    }
    # The download and training stages own their log file (the child's output goes there).
    own_log = None if rule in ("dataset", "base_checkpoint", "train_seed") else log_path
    with _logging_to(own_log):
        try:
            calls[rule]()
        except (launch.SeedFailed, mlrepro_config.ConfigError) as exc:
            logging.getLogger("mlrepro").error("%s", exc)
            sys.exit(1)
