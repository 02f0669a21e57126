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
from mlrepro import launch, secrets
from mlrepro.fsutil import atomic_dir, atomic_write_json, private_umask

log = logging.getLogger("mlrepro.stages")


def implementation(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Fetch a git implementation at its pinned commit into resources/<benchmark>/implementation/."""
    from mlrepro import implementation as implementations

    bench = settings.benchmark(benchmark)
    git = bench.implementation_git
    dest = settings.root / "resources" / benchmark / "implementation"
    folder = implementations.fetch_implementation(git["url"], git["commit"], git["folder"], dest)
    atomic_write_json(out, {**git, "path": str(folder), "configs": [str(p) for p in implementations.list_configs(folder)]})


def container(settings: mlrepro_config.Settings, benchmark: str, out: Path) -> None:
    """Build the implementation's image (or, with runtime none, record this machine's environment)."""
    from mlrepro import container as containers

    bench = settings.benchmark(benchmark)
    folder = launch.implementation_config(bench, settings.system).path.parent
    runtime = settings.system.container_runtime
    containers.build_container(
        {
            "runtime": "podman" if runtime == "enroot" else runtime,
            "context": str(folder),
            "dockerfile": str(folder / "Dockerfile"),
            "tag": f"mlrepro/{benchmark}:{folder.name.lower()}",
            # pyxis/enroot clusters run a squashfs image (or pull a pushed one); podman runs the image itself.
            "sqsh": (str(settings.root / "resources" / benchmark / "image.sqsh")
                     if runtime == "enroot" and not settings.system.container_registry else None),
            "push": settings.system.container_registry,
        },
        out,
    )


# Where a source's files go inside the container, when the script runs in one.
CONTAINER_OUT = "/mlrepro/out"


def _download(settings: mlrepro_config.Settings, benchmark: str, stage: str, out: Path, log_path: Path) -> None:
    """Fill resources/<benchmark>/<stage>/ from the benchmark's sources, verify it, write its manifest."""
    from mlrepro import data

    bench = settings.benchmark(benchmark)
    spec = getattr(bench, stage)
    if spec is None:
        raise mlrepro_config.ConfigError(f"{bench.source}: {stage}: not configured")
    # Everything that can fail without downloading fails first.
    # A script in a container gets the token by name only (`--env HF_TOKEN`): its value stays
    # in the environment, off every command line and, redacted, out of every log.
    token_env = {TOKEN_ENV: data.require_token(TOKEN_ENV, purpose=f"the {benchmark} {stage}")} \
        if spec["needs_token"] else {}
    impl = launch.implementation_config(bench, settings.system).path.parent
    mounts_csv = impl / "expected-mounts.csv"
    expected = data.read_expected_mounts(mounts_csv) if mounts_csv.is_file() else []
    # Absolute: the implementation's scripts run from its own folder (or in a container).
    folder = out.resolve().parent
    needed, why = space_needed(settings.root, bench, stage)
    data.check_free_space(folder.parent, needed, why=why)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("")
    record: dict = {"benchmark": benchmark, "stage": stage, "sources": spec["sources"]}
    image = _stage_image(settings, benchmark)

    # What an interrupted attempt left is resumed only where the tools check it (data.resumable).
    with atomic_dir(folder, resume=data.resumable(spec["sources"])) as partial:
        for source in spec["sources"]:
            where = partial / source["into"] if source["into"] else partial
            if "user_path" in source:
                where = _user_folder(source)
                record["location"] = str(where)
                checked = where / source["into"] if source["into"] else where
            else:
                where.mkdir(parents=True, exist_ok=True)
                checked = where
                if "script" in source:
                    _run_script(source, impl, where, image, log_path, {**bench.env, **token_env})
                elif "hub" in source:
                    hub = source["hub"]
                    data.hub_download(hub["repo_id"], where, repo_type=hub["repo_type"], revision=hub.get("revision"),
                                      allow_patterns=hub.get("allow_patterns"), token_required=spec["needs_token"])
                else:
                    data.run_logged(["rclone", "copy", source["rclone"], str(where)], env={}, log_path=log_path)
                if source.get("cleanup"):
                    for line in data.apply_cleanup(where, source["cleanup"]):
                        log.info("%s cleanup: %s", stage, line)
            if source.get("expected_mounts"):
                entries = [e for e in expected if e.key == source["expected_mounts"]]
                if not entries:
                    raise data.DataError(f"{mounts_csv} has no rows for {source['expected_mounts']}")
                problems = data.verify_mounts(checked, entries)
                if problems:
                    raise data.DataError(
                        f"{stage} does not match {mounts_csv.name} ({source['expected_mounts']}):\n  "
                        + "\n  ".join(problems[:20]))
        for name in data.drop_transfer_state(partial):
            log.info("%s: removed transfer leftover %s", stage, name)
        total = sum(p.stat().st_size for p in partial.rglob("*") if p.is_file())
        # Hashing a 140 GB checkpoint would take longer than downloading it; sizes are checked.
        data.write_manifest(partial, partial / out.name, extra=record, hash=total < 2**30, final_root=folder)


TOKEN_ENV = "HF_TOKEN"
GB = 10**9


def _bytes_under(*folders: Path) -> int:
    return sum(f.stat().st_size for folder in folders if folder.is_dir() for f in folder.rglob("*") if f.is_file())


def space_needed(root: Path, bench: mlrepro_config.Benchmark, stage: str) -> tuple[int, str]:
    """Free bytes the stage needs before it starts, and why (NVIDIA's figures, in the benchmark's config).

    The benchmark's min_free_gb covers the dataset and the checkpoint together; the stage's own
    covers itself. What resources/<benchmark>/ already holds (a finished stage, a partial download)
    counts as had, and a stage used in place (user_path sources only) writes nothing here.
    """
    def in_place(spec) -> bool:
        return all("user_path" in source for source in spec["sources"])

    spec = getattr(bench, stage)
    if in_place(spec):
        return 0, f"{stage} is used in place"
    folders = {name: launch.stage_folder(root, bench.name, name) for name in launch.STAGE_FOLDERS}
    held = {name: _bytes_under(f, f.parent / f".{f.name}.partial") for name, f in folders.items()}
    others_in_place = sum(getattr(bench, name)["min_free_gb"] for name in folders
                          if getattr(bench, name) and in_place(getattr(bench, name)))
    total = bench.min_free_gb * GB - sum(held.values()) - others_in_place * GB
    own = spec["min_free_gb"] * GB - held[stage]
    why = [f"{bench.name} needs {bench.min_free_gb:g} GB for its dataset and checkpoint together"
           + (f", {others_in_place:g} GB of it used in place" if others_in_place else "")
           + f"; resources/{bench.name}/ holds {sum(held.values()) / GB:,.1f} GB of it"] if bench.min_free_gb else []
    if spec["min_free_gb"]:
        why.append(f"the {stage} alone needs {spec['min_free_gb']:g} GB, {held[stage] / GB:,.1f} GB of it there")
    return max(0, int(total), int(own)), "; ".join(why)


def _user_folder(source: dict) -> Path:
    from mlrepro import data

    name = source["user_path"]
    value = os.environ.get(name)
    if not value:
        raise data.DataError(f"{name} is not set: export {name}=<folder that holds {source['into'] or 'the files'}>")
    folder = Path(value).expanduser()
    if not folder.is_dir():
        raise data.DataError(f"{name}={value} is not a folder")
    return folder


def _stage_image(settings, benchmark: str) -> str | None:
    """The image download scripts run in: the .sqsh (enroot), the podman tag, or None (host)."""
    runtime = settings.system.container_runtime
    if runtime == "none":
        return None
    record = json.loads((settings.root / "results" / benchmark / "container.json").read_text())
    return (record.get("sqsh") or {}).get("path") or record["tag"]


def _run_script(source: dict, impl: Path, where: Path, image: str | None, log_path: Path, env: dict) -> None:
    from mlrepro import data

    if image is None:
        args = [a.replace("{out}", str(where)) for a in source["args"]]
        data.run_download_script(impl / source["script"], args, env={**os.environ, **env}, log_path=log_path, workdir=impl)
    else:
        # In the image the implementation is its working directory, as in NVIDIA's READMEs.
        args = [a.replace("{out}", CONTAINER_OUT) for a in source["args"]]
        data.run_download_script(source["script"], args, env=env, log_path=log_path, container=image,
                                 mounts={str(where): CONTAINER_OUT})


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
    launch.verify_inputs(plan, settings.root)
    from mlrepro.pretrain import segments

    chain = segments.limits(bench.pretrain, settings.system.max_job_minutes)
    for attempt in range(bench.retries + 1):
        try:
            if chain is None:
                run(plan, settings.system, log_path)
            else:
                segments.run_seed(plan, settings.system, log_path, run, chain)
            launch.finish_seed(plan, log_path, out, bench.not_converged)
            return
        except launch.SeedFailed as exc:
            if attempt == bench.retries or not exc.retry:
                raise
            log.warning("%s; retrying (%d of %d)", exc, attempt + 1, bench.retries)


def score_seed(settings, benchmark: str, seed: int, mllog_path: Path, out: Path) -> None:
    from mlrepro import scoring

    run = scoring.score_run(mllog_path, settings.benchmark(benchmark).scoring_rules())
    run["seed"] = seed if run.get("seed") is None else run["seed"]
    from mlrepro.pretrain import segments

    if chained := segments.summary(mllog_path.parent):
        run["segments"] = chained  # a pretraining seed run as a chain of time-limited jobs
    atomic_write_json(out, run)


def score(settings, benchmark: str, run_files: list[Path], mllogs: list[Path], out: Path, *,
          reference_file: Path, container_file: Path, verdict_out: Path, distribution: Path,
          report_html: Path, plot_dir: Path) -> None:
    """score.json of the seeds' runs, its verdict against the reference, and the report that shows both."""
    from mlrepro import scoring

    runs = [json.loads(Path(p).read_text()) for p in run_files]
    result = scoring.score_runs(mllogs, settings.benchmark(benchmark).scoring_rules(), runs=runs)
    atomic_write_json(out, result)
    verdict(settings, benchmark, out, reference_file, container_file, verdict_out, distribution)
    report(settings, benchmark, out, mllogs, report_html, plot_dir, verdict_out)


def report(settings, benchmark: str, score_file: Path, mllogs: list[Path], out: Path, plot_dir: Path,
           verdict_file: Path | None = None) -> None:
    from mlrepro import report as reports
    from mlrepro import verdict as verdicts

    section = None
    if verdict_file is not None:
        svg = plot_dir / "distribution.svg"
        section = verdicts.render_section(json.loads(Path(verdict_file).read_text()),
                                          svg.read_text() if svg.is_file() else None)
    reports.write_report(json.loads(Path(score_file).read_text()), mllogs, out, plot_dir=plot_dir,
                         verdict_html=section)


def reference(settings, benchmark: str, out: Path) -> None:
    """What the benchmark's runs are compared with, scored like them (see mlrepro.reference)."""
    from mlrepro import reference as references

    bench = settings.benchmark(benchmark)
    rules = bench.scoring_rules()
    if bench.reference:
        ref = references.local_reference(bench.reference["runs"], rules, bench.reference["description"])
    elif bench.implementation_git and bench.mlperf_benchmark:
        # The shape the runs used is the config's, which fits the system.
        config = launch.implementation_config(bench, settings.system)
        ref = references.fetch_published(
            bench.implementation_git, config.path.parent.name, config.nodes, config.gpus_per_node,
            settings.system.submission.get("accelerator_model_name"), rules,
            settings.root / "resources" / benchmark / "published")
    else:
        ref = references.no_reference(benchmark)
    atomic_write_json(out, ref)


def preflight_file(settings, benchmark: str) -> Path | None:
    """The system's preflight record, when one was made."""
    for path in (settings.root / "results" / "preflight" / settings.system.name / "preflight.json",
                 settings.root / "results" / benchmark / "preflight.json"):
        if path.is_file():
            return path
    return None


def verdict(settings, benchmark: str, score_file: Path, reference_file: Path, container_file: Path,
            out: Path, plot: Path) -> None:
    """Your score against the reference's (see mlrepro.verdict), with the runs' distributions plotted."""
    import dataclasses

    from mlrepro import verdict as verdicts
    from mlrepro.fsutil import atomic_write_text

    pre = preflight_file(settings, benchmark)
    environment = {"container": json.loads(Path(container_file).read_text()),
                   "preflight": json.loads(pre.read_text()) if pre else None}
    result = verdicts.compare(json.loads(Path(score_file).read_text()), json.loads(Path(reference_file).read_text()),
                              benchmark=benchmark, system=dataclasses.asdict(settings.system), environment=environment)
    atomic_write_json(out, result)
    atomic_write_text(plot, verdicts.distribution_plot(result))


def final_report(settings, verdict_files: list[Path], out_html: Path, out_csv: Path, out_json: Path) -> None:
    from mlrepro import summary

    summary.write_final_report(verdict_files, out_html, out_csv, out_json)


def submission(settings, benchmark: str, score_file: Path, mllogs: list[Path], out: Path) -> None:
    """The MLPerf submission package of the runs, as package_checker expects it."""
    from mlrepro import package

    bench = settings.benchmark(benchmark)
    score = json.loads(Path(score_file).read_text())
    system = settings.system
    made = package.write_submission_package(
        out, submitter=settings.submitter, system_name=system.name,
        system_desc=_with_generated_note(
            {"number_of_nodes": str(system.nodes), "accelerators_per_node": str(system.gpus_per_node),
             **system.submission}, bench, system),
        benchmark=bench.mlperf_benchmark, logs=mllogs, ruleset=bench.ruleset,
        scaling_factor=score["rcp"].get("scaling_factor"),
    )
    if made["empty_fields"]:
        log.warning("system description fields left empty (set them under `submission:` in config/systems/%s.yaml): %s",
                    system.name, ", ".join(made["empty_fields"]))


def _with_generated_note(desc: dict, bench, system) -> dict:
    """The system description, its sw_notes saying so when the config was generated by mlrepro plan."""
    from mlrepro.plan import generate

    try:
        config_path = launch.implementation_config(bench, system).path
    except mlrepro_config.ConfigError:
        return desc
    if not generate.is_generated(config_path):
        return desc
    note = f"{config_path.name} generated by mlrepro plan (no published config fits this system)"
    return {**desc, "sw_notes": "; ".join(n for n in (desc.get("sw_notes"), note) if n)}


def _user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message says everything: shown without a traceback."""
    from mlrepro import container as containers
    from mlrepro import data, implementation

    from mlrepro import reference

    return (data.DataError, implementation.ImplementationError, containers.ContainerError, reference.ReferenceError)


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
