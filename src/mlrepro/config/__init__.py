"""Load and validate the workflow's configuration.

config/config.yaml picks the benchmarks and the system; each benchmark is described by
config/benchmarks/<name>.yaml and each system by config/systems/<name>.yaml. All three are
validated against workflow/schemas/*.schema.yaml before anything is scheduled, and an error
names the file and the key, so a typo never turns into a half-submitted run.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema

from mlrepro import paths
from mlrepro.config.schema import SCHEMA_SUBDIR, ConfigError, describe, load_schema, validate
from mlrepro.util import confine, safe_yaml

# What a benchmark's run_env values may name: the folders of those stages (see kinds.mlperf.plan_seed).
RUN_ENV_PLACEHOLDERS = ("dataset", "checkpoint", "corpus")


def load_yaml(path: Path) -> Any:
    """The YAML file at `path`: UTF-8, no key given twice, no alias bomb (mlrepro.util.safe_yaml);
    anything else is a ConfigError naming the file."""
    try:
        return safe_yaml.load_file(path)
    except safe_yaml.YamlError as exc:
        raise ConfigError(str(exc)) from None


def check_config_file(path: str | Path) -> None:
    """Read config/config.yaml as strictly as the other files, before Snakemake loads it
    (whose own message names no file and which keeps the last of two equal keys)."""
    data = load_yaml(Path(path))
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}, not a mapping of keys"
        raise ConfigError(f"{path}: {what} (it names the benchmarks and the system: see README.md)")


def check_command_line(entries) -> None:
    """`--config system=a system=b`: Snakemake keeps the last without a word; refused, naming both."""
    if not isinstance(entries, (list, tuple)):
        return
    seen: dict[str, str] = {}
    for entry in entries:
        key = str(entry).split("=", 1)[0].strip()
        if key in seen:
            raise ConfigError(f"--config: key '{key}' is given twice ({seen[key]} and {entry}); give it once")
        seen[key] = str(entry)


def _check_run_env(run_env: dict, rel: Path) -> None:
    allowed = ", ".join("{%s}" % p for p in RUN_ENV_PLACEHOLDERS)
    for key, value in run_env.items():
        try:
            fields = [(name, spec, conv) for _, name, spec, conv in string.Formatter().parse(value) if name is not None]
        except ValueError as exc:
            raise ConfigError(f"{rel}: run_env.{key}: {value!r} is not a valid template ({exc}); "
                              f"placeholders are {allowed}, and a literal brace is written {{{{ or }}}}") from None
        for name, spec, conv in fields:
            if name not in RUN_ENV_PLACEHOLDERS or spec or conv:
                raise ConfigError(f"{rel}: run_env.{key}: unknown placeholder {{{name}}} in {value!r} "
                                  f"(known: {allowed})")


def _check_scripts(data: dict, impl_dir: Path | None, rel: Path) -> None:
    """Every download script stays inside the implementation's folder (it runs there, or in the
    container that mounts it; `impl_dir` None: a git implementation not fetched yet, checked by name),
    and every file a cleanup removes inside the stage's folder."""
    for stage in ("dataset", "checkpoint"):
        for i, source in enumerate((data.get(stage) or {}).get("sources") or []):
            script = source.get("script") if isinstance(source, dict) else None
            if script is not None:
                why = confine.outside(impl_dir or Path("/nonexistent-implementation"), script)
                if why:
                    raise ConfigError(f"{rel}: {stage}.sources[{i}].script: {why} (the implementation's folder); "
                                      f"a download script is the implementation's own")
                # Else the dry run passes and the stage's job fails once it is scheduled. A git
                # implementation's scripts are known only once it is fetched.
                if impl_dir is not None and not (impl_dir / script).is_file():
                    raise ConfigError(f"{rel}: {stage}.sources[{i}].script: '{script}' does not exist in {impl_dir} "
                                      f"(or is not a file)")
            # The cleanup removes files of the stage's own folder, never one beside it.
            cleanup = source.get("cleanup") or {} if isinstance(source, dict) else {}
            named = [("remove", n) for n in cleanup.get("remove", [])]
            named += [("unwrap", n) for pair in cleanup.get("unwrap", {}).items() for n in pair]
            for key, name in named:
                why = confine.outside(Path(f"/the-{stage}-folder"), name)
                if why:
                    raise ConfigError(f"{rel}: {stage}.sources[{i}].cleanup.{key}: {why}")


@dataclass(frozen=True)
class System:
    name: str
    scheduler: str
    nodes: int
    gpus_per_node: int
    device: str = "cpu"
    partition: str | None = None
    account: str | None = None
    exclude_nodes: tuple[str, ...] = ()
    container_runtime: str = "none"
    container_registry: str | None = None
    container_images: dict = field(default_factory=dict)  # benchmark -> prebuilt image (mlrepro.container.prebuilt)
    implementation_configs: dict = field(default_factory=dict)
    slurm_status_command: str = "sacct"
    slurm_poll_seconds: float = 30.0
    submission: dict = field(default_factory=dict)
    hardware: dict = field(default_factory=dict)  # for mlrepro.plan
    max_job_minutes: float | None = None  # the longest a job may run here (see mlrepro.launch.chain)
    early_stop: Any = None  # the opt-in early stop (see mlrepro.scoring.running_verdict.early_stop_policy)
    cores: int | None = None  # CPU cores a local seed may use (None: all)
    failures: dict = field(default_factory=dict)  # the failure model (mlrepro.plan.goodput.FailureModel.of)


@dataclass(frozen=True)
class Benchmark:
    name: str
    implementation_dir: Path
    implementation_git: dict | None
    mlperf_benchmark: str | None
    ruleset: str | None
    required_runs: int
    seeds: tuple[int, ...]
    target: dict
    retries: int
    not_converged: str
    dataset: dict | None
    checkpoint: dict | None
    run_env: dict
    env: dict
    source: Path
    corpus: str | None = None
    reference: dict | None = None  # reference runs for a benchmark with no published result
    requires: dict = field(default_factory=dict)
    min_free_gb: float = 0
    segments: dict | None = None  # checkpointed, time-limited segments (see mlrepro.launch.chain)
    hang: dict | None = None  # when a running attempt counts as hung (mlrepro.launch.attempt.HangRule)
    inject_failures: dict | None = None  # attempts killed at a set rate (mlrepro.launch.attempt.Injection)
    pretrain: dict | None = None  # GPT pretraining: model, tokens, layouts (see mlrepro.pretrain.megatron_plan)
    early_stop: Any = None  # the opt-in early stop; wins over the system's
    container_image: str | None = None  # a prebuilt image instead of a build (mlrepro.container.prebuilt)

    @property
    def is_pretrain(self) -> bool:
        """Planned and launched by mlrepro.pretrain (no published config_<SYS>.sh)."""
        return self.pretrain is not None


# A benchmark's name names folders, Slurm jobs and a wildcard's pattern (workflow/schemas: name).
BENCHMARK_NAME = re.compile(r"[A-Za-z0-9_]+")


def benchmark_names(root: Path) -> list[str]:
    """Every benchmark that has a config/benchmarks/<name>.yaml; a stray file whose name is no
    benchmark name (`mini(.yaml`, an editor's `#x.yaml#`) is not one."""
    return sorted(p.stem for p in (Path(root) / "config" / "benchmarks").glob("*.yaml")
                  if BENCHMARK_NAME.fullmatch(p.stem))


@dataclass(frozen=True)
class Settings:
    root: Path
    benchmarks: dict[str, Benchmark]  # those under `benchmarks:`, the default target
    system: System
    submitter: str
    corpora: dict[str, dict] = field(default_factory=dict)  # every corpus a rule may build (any benchmark file's)
    default_corpora: tuple[str, ...] = ()  # those `corpora:` and the listed benchmarks name: the default target
    # config.yaml's `pretrain:` key: what the workflow changes in a GPT seed's run (train_iters, gbs, mbs,
    # attention, megatron, image, walltime_minutes; see mlrepro.kinds.megatron). Not
    # Benchmark.pretrain, the benchmark's own model and layouts.
    pretrain_overrides: dict = field(default_factory=dict)
    # Any other config/benchmarks/<name>.yaml is loaded (and validated) when first asked for:
    # a file target names its benchmark, listed or not.
    _others: dict[str, Benchmark] = field(default_factory=dict, repr=False, compare=False)

    def benchmark(self, name: str) -> Benchmark:
        if name in self.benchmarks:
            return self.benchmarks[name]
        if name not in self._others:
            if name not in benchmark_names(self.root):
                raise ConfigError(f"benchmark '{name}': config/benchmarks/{name}.yaml not found "
                                  f"(known benchmarks: {', '.join(benchmark_names(self.root))})")
            self._others[name] = load_benchmark(self.root, name)
        return self._others[name]


def _load_named(root: Path, folder: str, schema: str, name: str) -> tuple[dict, Path]:
    """config/<folder>/<name>.yaml validated against its schema, whose `name` must be the file's."""
    path = root / "config" / folder / f"{name}.yaml"
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    data = validate(load_yaml(path), schema, str(rel), root)
    if data["name"] != name:
        raise ConfigError(f"{rel}: name: '{data['name']}' does not match the file name '{name}'")
    return data, rel


# The repository this package belongs to: its schemas, when the config is elsewhere (`mlrepro score`).
PACKAGE_ROOT = Path(__file__).resolve().parents[3]
SCORING_KEYS = ("required_runs", "target")


def benchmark_scoring(root: Path, name: str) -> dict:
    """required_runs and target of config/benchmarks/<name>.yaml, checked against the benchmark schema.

    For `mlrepro score` on loose logs: only the keys scoring needs are read, so a file that holds
    just those is enough; each is checked as the workflow checks it. {} when there is no such file.
    """
    path = Path(root) / "config" / "benchmarks" / f"{name}.yaml"
    if not path.is_file():
        return {}
    schema_root = root if (Path(root) / SCHEMA_SUBDIR).is_dir() else PACKAGE_ROOT
    data = load_yaml(path)
    full = load_schema(schema_root / SCHEMA_SUBDIR, "benchmark")
    schema = {"type": "object", "properties": {k: full["properties"][k] for k in SCORING_KEYS}}
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(data if isinstance(data, dict) else {}))
    if errors:
        lines = "\n".join(f"  - {describe(e)}" for e in errors)
        raise ConfigError(f"{path} is invalid:\n{lines}")
    return {k: data[k] for k in SCORING_KEYS if k in data}


def load_benchmark(root: Path, name: str) -> Benchmark:
    data, rel = _load_named(root, "benchmarks", "benchmark", name)
    impl = data["implementation"]
    if "path" in impl:
        impl_dir = Path(impl["path"])
        impl_dir = impl_dir if impl_dir.is_absolute() else root / impl_dir
        if not impl_dir.is_dir():
            raise ConfigError(f"{rel}: implementation.path: folder '{impl['path']}' does not exist")
        # run.sub runs it on every rank; missing, a seed would fail only once it is scheduled.
        if not (impl_dir / "run_and_time.sh").is_file():
            raise ConfigError(f"{rel}: implementation.path: '{impl['path']}' has no run_and_time.sh "
                              f"(an MLPerf implementation folder holds run.sub, run_and_time.sh and config_<SYSTEM>.sh)")
        git = None
    else:
        git = impl["git"]
        why = confine.outside(paths.implementation_dir(root, name), git["folder"])
        if why:
            raise ConfigError(f"{rel}: implementation.git.folder: {why} (the fetched repository)")
        impl_dir = paths.implementation_dir(root, name) / git["folder"]
    _check_run_env(data["run_env"], rel)
    _check_scripts(data, impl_dir if git is None else None, rel)
    seeds = tuple(data.get("seeds") or range(1, data["required_runs"] + 1))
    if len(seeds) < data["required_runs"]:
        raise ConfigError(
            f"{rel}: seeds: {len(seeds)} seeds given but required_runs is {data['required_runs']}"
        )
    return Benchmark(
        name=name,
        implementation_dir=impl_dir,
        implementation_git=git,
        mlperf_benchmark=data["mlperf_benchmark"],
        ruleset=data["ruleset"],
        required_runs=data["required_runs"],
        seeds=seeds,
        target=data["target"],
        retries=data["retries"],
        not_converged=data["not_converged"],
        dataset=data.get("dataset"),
        checkpoint=data.get("checkpoint"),
        run_env=data["run_env"],
        env={k: str(v) for k, v in data["env"].items()},
        source=root / rel,
        corpus=data.get("corpus"),
        reference=_reference(root, rel, data.get("reference")),
        requires=data["requires"],
        min_free_gb=data["min_free_gb"],
        segments=data.get("segments"),
        hang=data.get("hang"),
        inject_failures=data.get("inject_failures"),
        pretrain=data.get("pretrain"),
        early_stop=data.get("early_stop"),
        container_image=data.get("container_image"),
    )


def _reference(root: Path, rel: Path, reference: dict | None) -> dict | None:
    if reference is None:
        return None
    runs = Path(reference["runs"])
    runs = runs if runs.is_absolute() else root / runs
    if not runs.is_dir():
        raise ConfigError(f"{rel}: reference.runs: folder '{reference['runs']}' does not exist")
    return {"runs": runs, "description": reference.get("description", "")}


def load_system(root: Path, name: str) -> System:
    path = root / "config" / "systems" / f"{name}.yaml"
    rel = path.relative_to(root) if path.is_relative_to(root) else path
    if not path.is_file():
        known = sorted(p.stem for p in (root / "config" / "systems").glob("*.yaml"))
        raise ConfigError(f"system '{name}': {rel} not found (known systems: {', '.join(known)})")
    data = validate(load_yaml(path), "system", str(rel), root)
    if data["name"] != name:
        raise ConfigError(f"{rel}: name: '{data['name']}' does not match the file name '{name}'")
    slurm = data["slurm"]
    return System(
        name=data["name"],
        scheduler=data["scheduler"],
        nodes=data["nodes"],
        gpus_per_node=data["gpus_per_node"],
        device=data["device"],
        partition=data["partition"],
        account=data["account"],
        exclude_nodes=tuple(data["exclude_nodes"]),
        container_runtime=data["container_runtime"],
        container_registry=data["container_registry"],
        container_images=dict(data["container_images"]),
        implementation_configs=dict(data["implementation_configs"]),
        slurm_status_command=slurm.get("status_command", "sacct"),
        slurm_poll_seconds=float(slurm.get("poll_seconds", 30)),
        submission=dict(data["submission"]),
        hardware=dict(data.get("hardware") or {}),
        max_job_minutes=data.get("max_job_minutes"),
        early_stop=data.get("early_stop"),
        cores=data.get("cores"),
        failures=dict(data["failures"]),
    )


def _check_benchmark_keys(root: Path, system: System) -> None:
    """The system's per-benchmark keys name benchmarks that exist: a misspelt one is otherwise never
    looked up, and the benchmark runs with the config or image it picks by itself."""
    known = benchmark_names(root)
    for key in ("implementation_configs", "container_images"):
        for name in getattr(system, key):
            if name not in known:
                raise ConfigError(f"config/systems/{system.name}.yaml: {key}.{name}: no benchmark '{name}' "
                                  f"(no config/benchmarks/{name}.yaml; known benchmarks: {', '.join(known)})")


def load_corpus(root: Path, name: str) -> dict:
    """config/corpora/<name>.yaml, validated, defaults filled (see mlrepro.corpus)."""
    return _load_named(root, "corpora", "corpus", name)[0]


def _corpora_of_benchmark_files(root: Path) -> list[str]:
    """The corpora that any config/benchmarks/<name>.yaml trains on: a file target names a benchmark
    that `benchmarks:` may not list, and its corpus stages must be in the workflow all the same.
    A file that does not read is skipped here; it is reported when its benchmark is asked for."""
    names = []
    for path in sorted((root / "config" / "benchmarks").glob("*.yaml")):
        try:
            corpus = (load_yaml(path) or {}).get("corpus")
        except (ConfigError, AttributeError):
            continue
        if isinstance(corpus, str) and (root / "config" / "corpora" / f"{corpus}.yaml").is_file():
            names.append(corpus)
    return names


_COMMAND_LINE_SCALARS = {"integer": int, "number": float}


def _typed_as_in_schema(value: Any, schema: dict) -> Any:
    """`value` with the numbers inside a --config mapping made numbers again, where the schema asks for one.

    Snakemake reads a --config value that is not a plain number with YAML's BaseLoader, which keeps
    every scalar inside a mapping a string: --config pretrain='{train_iters: 300}' gives
    {'train_iters': '300'}. A string the schema wants as a number is converted when it reads as one;
    anything else is left for validation to report.
    """
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: _typed_as_in_schema(v, props[k]) if k in props else v for k, v in value.items()}
    kind = schema.get("type")
    convert = _COMMAND_LINE_SCALARS.get(kind) if isinstance(kind, str) else None
    if convert is not None and isinstance(value, str):
        try:
            return convert(value)
        except ValueError:
            return value
    return value


def load(config: dict, root: str | Path) -> Settings:
    """Validate the workflow config (config.yaml plus --config overrides) and everything it names."""
    root = Path(root).resolve()
    schema = load_schema(root / SCHEMA_SUBDIR, "config")
    config = _typed_as_in_schema(config, schema)
    data = validate(config, "config", "config/config.yaml (with --config overrides)", root)
    system = load_system(root, data["system"])
    overrides = {k: data[k] for k in ("partition", "account") if data.get(k)}
    if overrides:
        system = System(**{**system.__dict__, **overrides})
    _check_benchmark_keys(root, system)
    benchmarks = {name: load_benchmark(root, name) for name in data["benchmarks"]}
    listed = dict.fromkeys([*data["corpora"], *(b.corpus for b in benchmarks.values() if b.corpus)])
    corpora = {name: load_corpus(root, name) for name in dict.fromkeys([*listed, *_corpora_of_benchmark_files(root)])}
    return Settings(root=root, benchmarks=benchmarks, system=system, submitter=data["submitter"], corpora=corpora,
                    default_corpora=tuple(listed),
                    pretrain_overrides=dict(data.get("pretrain") or {}))


def prebuilt_image(bench: Benchmark, system: System) -> str | None:
    """The prebuilt image `bench` runs in on `system` (the system's container_images, else the
    benchmark's container_image), or None: the implementation's Dockerfile is built."""
    image = system.container_images.get(bench.name) or bench.container_image
    if image and system.container_runtime == "none":
        where = (f"config/systems/{system.name}.yaml: container_images.{bench.name}" if system.container_images.get(bench.name)
                 else f"config/benchmarks/{bench.name}.yaml: container_image")
        raise ConfigError(f"{bench.name} names the image {image!r} ({where}), but system {system.name} has "
                          f"container_runtime none (seeds run on the host): set container_runtime enroot or podman "
                          f"in config/systems/{system.name}.yaml, or drop the image")
    return image
