"""The workflow's stages as plain functions, one per Snakemake rule.

workflow/scripts/stage.py hands each rule's job to `run_from_snakemake`, which picks the
function named like the rule. The functions take paths and names only, so they are tested
without Snakemake.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.launch import plan as launch
from mlrepro.util import secrets
from mlrepro.util.fsutil import atomic_write_json, private_umask

log = logging.getLogger("mlrepro.stages")


def implementation(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Fetch a git implementation at its pinned commit into resources/<benchmark>/implementation/."""
    from mlrepro.implementation.configs import list_configs
    from mlrepro.implementation.fetch import fetch_implementation

    bench = settings.benchmark(benchmark)
    git = bench.implementation_git
    dest = paths.implementation_dir(settings.root, benchmark)
    folder = fetch_implementation(git["url"], git["commit"], git["folder"], dest)
    atomic_write_json(out, {**git, "path": str(folder), "configs": [str(p) for p in list_configs(folder)]})


def container(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Build the implementation's image (or, with runtime none, record this machine's environment)."""
    from mlrepro.container import image as containers

    bench = settings.benchmark(benchmark)
    # A pretraining benchmark has one folder for every layout (the planner, not config_<SYS>.sh, sets it).
    folder = (Path(bench.implementation_dir) if bench.is_pretrain
              else launch.implementation_config(bench, settings.system).path.parent)
    runtime = settings.system.container_runtime
    containers.build_container(
        {
            "runtime": "podman" if runtime == "enroot" else runtime,
            "context": str(folder),
            "dockerfile": str(folder / "Dockerfile"),
            "tag": f"mlrepro/{benchmark}:{folder.name.lower()}",
            # pyxis/enroot clusters run a squashfs image (or pull a pushed one); podman runs the image itself.
            "sqsh": (str(paths.image_sqsh(settings.root, benchmark))
                     if runtime == "enroot" and not settings.system.container_registry else None),
            "push": settings.system.container_registry,
        },
        out,
    )


def dataset(settings, benchmark: str, out: Path, log_path: Path) -> None:
    from mlrepro.data import pipeline

    pipeline.fill_stage(settings, benchmark, "dataset", out, log_path)


def base_checkpoint(settings, benchmark: str, out: Path, log_path: Path) -> None:
    from mlrepro.data import pipeline

    pipeline.fill_stage(settings, benchmark, "checkpoint", out, log_path)


def train_seed(settings, benchmark: str, seed: int, out: Path, log_path: Path) -> None:
    """Run the seed, retrying a failed attempt up to the benchmark's `retries` times."""
    from mlrepro.pretrain import megatron_seed, segments

    bench = settings.benchmark(benchmark)
    if bench.is_pretrain:
        plan = megatron_seed.prepare(settings, benchmark, seed)
    else:
        plan = launch.plan_seed(settings, benchmark, seed)
    log.info("%s seed %d: %s", benchmark, seed, plan.describe())
    launch.verify_inputs(plan, settings.root)
    chain = segments.limits(bench.segments, settings.system.max_job_minutes)
    for attempt in range(bench.retries + 1):
        try:
            if chain is None:
                launch.run_seed(plan, settings.system, log_path)
            else:
                segments.run_seed(plan, settings.system, log_path, launch.run_seed, chain)
            _finish_seed(bench, plan, log_path, out)
            return
        except launch.SeedFailed as exc:
            if attempt == bench.retries or not exc.retry:
                raise
            log.warning("%s; retrying (%d of %d)", exc, attempt + 1, bench.retries)


def _finish_seed(bench: mlrepro_config.Benchmark, plan: launch.SeedPlan, log_path: Path, out: Path) -> None:
    """After a successful attempt: keep the seed's log as out (mllog.txt), Megatron-LM's own for a GPT
    pretraining seed, the MLLOG lines otherwise; SeedFailed when the run is not a result."""
    if bench.is_pretrain:
        from mlrepro.pretrain import megatron_seed

        megatron_seed.finish_seed(plan, log_path, out)
    else:
        launch.finish_seed(plan, log_path, out, bench.not_converged)


def score_seed(settings, benchmark: str, seed: int, mllog_path: Path, out: Path) -> None:
    from mlrepro.pretrain import megatron_plan, segments
    from mlrepro.scoring import megatron_score, rules as scoring_rules
    from mlrepro.scoring import score as scoring

    bench = settings.benchmark(benchmark)
    rules = scoring_rules.for_benchmark(bench)
    if bench.is_pretrain:
        # Megatron-LM's own log: MFU against the system's GPU, the ranks the planner gave the seed.
        gpus = megatron_plan.first_fit(settings.root, bench, settings.system.name).layout.gpus
        run = megatron_score.score_training_log(mllog_path, target_loss=rules.target_value, seed=seed,
                                                benchmark=rules.benchmark, gpus=gpus,
                                                gpu=settings.system.hardware.get("gpu"))
    else:
        run = scoring.score_run(mllog_path, rules, seed=seed)
    if chained := segments.summary(mllog_path.parent):
        run["segments"] = chained  # a pretraining seed run as a chain of time-limited jobs
    atomic_write_json(out, run)


def score(settings, benchmark: str, run_files: list[Path], mllogs: list[Path], out: Path, *,
          reference_file: Path, container_file: Path, verdict_out: Path, distribution: Path,
          report_html: Path, plot_dir: Path) -> None:
    """score.json of the seeds' runs, its verdict against the reference, and the report that shows both."""
    from mlrepro.scoring import rules as scoring_rules, score as scoring

    runs = [json.loads(Path(p).read_text()) for p in run_files]
    result = scoring.score_runs(mllogs, scoring_rules.for_benchmark(settings.benchmark(benchmark)), runs=runs)
    atomic_write_json(out, result)
    verdict(settings, benchmark, out, reference_file, container_file, verdict_out, distribution)
    report(settings, benchmark, out, mllogs, report_html, plot_dir, verdict_out)


def report(settings, benchmark: str, score_file: Path, mllogs: list[Path], out: Path, plot_dir: Path,
           verdict_file: Path | None = None) -> None:
    from mlrepro.scoring import report as reports
    from mlrepro.scoring import verdict as verdicts

    section = None
    if verdict_file is not None:
        svg = plot_dir / "distribution.svg"
        section = verdicts.render_section(json.loads(Path(verdict_file).read_text()),
                                          svg.read_text() if svg.is_file() else None)
    reports.write_report(json.loads(Path(score_file).read_text()), mllogs, out, plot_dir=plot_dir,
                         verdict_html=section)


def reference(settings, benchmark: str, out: Path) -> None:
    """What the benchmark's runs are compared with, scored like them (see mlrepro.scoring.reference)."""
    from mlrepro.scoring import reference as references, rules as scoring_rules

    bench = settings.benchmark(benchmark)
    rules = scoring_rules.for_benchmark(bench)
    if bench.reference:
        ref = references.local_reference(bench.reference["runs"], rules, bench.reference["description"])
    elif bench.implementation_git and bench.mlperf_benchmark:
        # The shape the runs used is the config's, which fits the system.
        config = launch.implementation_config(bench, settings.system)
        ref = references.fetch_published(
            bench.implementation_git, config.path.parent.name, config.nodes, config.gpus_per_node,
            settings.system.submission.get("accelerator_model_name"), rules,
            paths.published_dir(settings.root, benchmark))
    else:
        ref = references.no_reference(benchmark)
    atomic_write_json(out, ref)


def preflight_file(settings, benchmark: str) -> Path | None:
    """The system's preflight record, when one was made."""
    for path in paths.preflight_files(settings.root, settings.system.name, benchmark):
        if path.is_file():
            return path
    return None


def verdict(settings, benchmark: str, score_file: Path, reference_file: Path, container_file: Path,
            out: Path, plot: Path) -> None:
    """Your score against the reference's (see mlrepro.scoring.verdict), with the runs' distributions plotted."""
    import dataclasses

    from mlrepro.scoring import verdict as verdicts
    from mlrepro.util.fsutil import atomic_write_text

    pre = preflight_file(settings, benchmark)
    environment = {"container": json.loads(Path(container_file).read_text()),
                   "preflight": json.loads(pre.read_text()) if pre else None}
    result = verdicts.compare(json.loads(Path(score_file).read_text()), json.loads(Path(reference_file).read_text()),
                              benchmark=benchmark, system=dataclasses.asdict(settings.system), environment=environment)
    result["config"] = _config_in_use(settings.benchmark(benchmark), settings.system)
    atomic_write_json(out, result)
    atomic_write_text(plot, verdicts.distribution_plot(result))


def final_report(settings, verdict_files: list[Path], out_html: Path, out_csv: Path, out_json: Path) -> None:
    from mlrepro.scoring import summary

    summary.write_final_report(verdict_files, out_html, out_csv, out_json)


def submission(settings, benchmark: str, score_file: Path, mllogs: list[Path], out: Path) -> None:
    """The MLPerf submission package of the runs, as package_checker expects it."""
    from mlrepro.scoring import package

    bench = settings.benchmark(benchmark)
    score = json.loads(Path(score_file).read_text())
    system = settings.system
    pre = preflight_file(settings, benchmark)
    measured = package.preflight_description(json.loads(pre.read_text())) if pre else {}
    made = package.write_submission_package(
        out, submitter=settings.submitter, system_name=system.name,
        system_desc=_with_generated_note(
            {"number_of_nodes": str(system.nodes), "accelerators_per_node": str(system.gpus_per_node),
             **measured, **system.submission}, bench, system),
        benchmark=bench.mlperf_benchmark, logs=mllogs, ruleset=bench.ruleset,
        scaling_factor=score["rcp"].get("scaling_factor"),
    )
    if made["empty_fields"]:
        log.warning("system description fields left empty (set them under `submission:` in config/systems/%s.yaml): %s",
                    system.name, ", ".join(made["empty_fields"]))


def _config_in_use(bench, system) -> dict | None:
    """The implementation config the runs use, {"file", "generated"} (by mlrepro plan); None if none fits."""
    from mlrepro.plan import generate

    try:
        config_path = launch.implementation_config(bench, system).path
    except mlrepro_config.ConfigError:
        return None
    return {"file": config_path.name, "generated": generate.is_generated(config_path)}


def _with_generated_note(desc: dict, bench, system) -> dict:
    """The system description, its sw_notes saying so when the config was generated by mlrepro plan."""
    config = _config_in_use(bench, system)
    if not config or not config["generated"]:
        return desc
    note = f"{config['file']} generated by mlrepro plan (no published config fits this system)"
    return {**desc, "sw_notes": "; ".join(n for n in (desc.get("sw_notes"), note) if n)}


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message says everything: shown without a traceback."""
    from mlrepro.container import image as containers
    from mlrepro.data.checks import DataError
    from mlrepro.implementation import configs as implementation
    from mlrepro.scoring import reference

    return (DataError, implementation.ImplementationError, containers.ContainerError, reference.ReferenceError)


@contextlib.contextmanager
def stage_process(path: Path | None):
    """What every stage script runs inside (mlrepro.stages and mlrepro.corpus.stages alike): a
    private umask, this interpreter first on PATH, and logging to `path` with secrets redacted."""
    private_umask()
    _host_python_first()
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


def _host_python_first() -> None:
    """Put this interpreter's folder first on PATH, for every child that runs on the host.

    The implementations' scripts call `python3` (run_and_time.sh, download_*.py, run.sub's
    checker); on a host without containers that must be the environment mlrepro runs in
    (the project's .venv), also when it was not activated (`.venv/bin/python -m snakemake`).
    """
    here = os.path.dirname(sys.executable)  # not resolved: a venv's python is a link out of it
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] != here:
        os.environ["PATH"] = here + os.pathsep + path if path else here


def run_from_snakemake(smk) -> None:
    settings = mlrepro_config.load(smk.config, Path.cwd())
    wc = smk.wildcards
    rule = smk.rule
    out = Path(smk.output[0])
    log_path = Path(smk.log[0])
    calls = {
        "implementation": lambda: implementation(settings, wc.benchmark, out),
        "container": lambda: container(settings, wc.benchmark, out),
        "dataset": lambda: dataset(settings, wc.benchmark, out, log_path),
        "base_checkpoint": lambda: base_checkpoint(settings, wc.benchmark, out, log_path),
        "train_seed": lambda: train_seed(settings, wc.benchmark, int(wc.seed), out, log_path),
        "score_seed": lambda: score_seed(settings, wc.benchmark, int(wc.seed), Path(smk.input[0]), out),
        "score": lambda: score(settings, wc.benchmark, list(map(Path, smk.input.runs)), list(map(Path, smk.input.mllogs)), out,
                               reference_file=Path(smk.input.reference), container_file=Path(smk.input.container),
                               verdict_out=Path(smk.output.verdict), distribution=Path(smk.output.distribution),
                               report_html=Path(smk.output.html), plot_dir=Path(smk.output.convergence).parent),
        "reference": lambda: reference(settings, wc.benchmark, out),
        "final_report": lambda: final_report(settings, list(map(Path, smk.input.verdicts)), out, Path(smk.output.csv),
                                             Path(smk.output.json)),
        "submission": lambda: submission(settings, wc.benchmark, Path(smk.input.score), list(map(Path, smk.input.mllogs)), out),
    }
    # The download and training stages own their log file (the child's output goes there).
    own_log = None if rule in ("dataset", "base_checkpoint", "train_seed") else log_path
    with stage_process(own_log):
        try:
            calls[rule]()
        except (launch.SeedFailed, mlrepro_config.ConfigError, *_user_errors()) as exc:
            logging.getLogger("mlrepro").error("%s", exc)
            sys.exit(1)
