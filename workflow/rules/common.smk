from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import launch
from mlrepro.fsutil import private_umask


# Read strictly first: Snakemake's own loader names no file on a YAML error and keeps the
# last of two equal keys.
try:
    mlrepro_config.check_config_file("config/config.yaml")
except mlrepro_config.ConfigError as error:
    raise WorkflowError(f"mlrepro configuration error:\n{error}") from None


configfile: "config/config.yaml"

# What the workflow writes (job records, logs, submitit's pickles) is the user's alone.
private_umask()
for _folder in (".snakemake", "results", "resources", "logs"):
    try:
        Path(_folder).chmod(0o700)
    except OSError:
        pass  # absent yet (created under the umask), or another user's


# Validation happens at parse time, so a bad key stops `snakemake` (and `-n`) before any job.
try:
    SETTINGS = mlrepro_config.load(config, workflow.basedir)
except mlrepro_config.ConfigError as error:
    raise WorkflowError(f"mlrepro configuration error:\n{error}") from None
SYSTEM = SETTINGS.system


def check_implementation_configs():
    """Fail before the DAG with a plain message when a benchmark has no config for this system."""
    for name, bench in SETTINGS.benchmarks.items():
        if implementation_fetched(name):
            try:
                launch.implementation_config(bench, SYSTEM)
            except mlrepro_config.ConfigError as error:
                raise WorkflowError(f"mlrepro configuration error:\n{error}") from None


wildcard_constraints:
    benchmark="|".join(SETTINGS.benchmarks),
    seed=r"\d+",


def slurm_resources():
    """Partition and account of the system, for the rules that go through the Slurm executor plugin."""
    named = {"slurm_partition": SYSTEM.partition, "slurm_account": SYSTEM.account}
    return {key: value for key, value in named.items() if value}


def seeds(benchmark):
    return SETTINGS.benchmark(benchmark).seeds


def seed_files(name):
    """Input helper: one file per configured seed of the benchmark, e.g. seed_files("mllog.txt")."""
    return lambda wc: [f"results/{wc.benchmark}/seed_{s}/{name}" for s in seeds(wc.benchmark)]


def seed_plan(wc, attribute):
    """One attribute of the seed's launch plan (see mlrepro.launch.SeedPlan).

    Until a git implementation is fetched its configs are unknown: Snakemake asks before the
    checkpoint has run, gets a placeholder, and asks again once it has.
    """
    if not implementation_fetched(wc.benchmark):
        return {"describe": "shape known once the implementation is fetched", "local_threads": 1,
                "local_mem_mb": 100, "walltime_minutes": 60}[attribute]
    value = getattr(launch.plan_seed(SETTINGS, wc.benchmark, int(wc.seed)), attribute)
    return value() if callable(value) else value


def implementation_fetched(benchmark):
    bench = SETTINGS.benchmark(benchmark)
    return bench.implementation_git is None or Path(f"resources/{benchmark}/implementation.json").exists()


check_implementation_configs()


def all_targets():
    # The seeds' own results are listed too: Snakemake does not rerun an up-to-date score
    # because an intermediate file went missing, but it does rebuild a missing target.
    # So deleting a seed's folder and running the default target redoes that seed only.
    targets = []
    for name, bench in SETTINGS.benchmarks.items():
        targets += [f"results/{name}/seed_{s}/run.json" for s in bench.seeds]
        targets += [f"results/{name}/score.json", f"results/{name}/report.html"]
        if SETTINGS.benchmark(name).mlperf_benchmark:
            targets.append(f"results/{name}/submission")
    return targets + ["results/report.html"]


def implementation_ready(wc):
    """Input helper: the fetched implementation of a git benchmark (nothing for a local folder)."""
    if SETTINGS.benchmark(wc.benchmark).implementation_git is None:
        return []
    return checkpoints.implementation.get(benchmark=wc.benchmark).output


def reference_runs(wc):
    """Input helper: the shipped reference runs of a benchmark that has them."""
    ref = SETTINGS.benchmark(wc.benchmark).reference
    return sorted(str(p) for p in ref["runs"].iterdir() if p.is_file()) if ref else []


def container_ready(wc):
    """Input helper: the benchmark's container.json, as ancient() (see the container checkpoint)."""
    return ancient(checkpoints.container.get(benchmark=wc.benchmark).output[0])


def implementation_files(wc):
    """Input helper: the build context of the benchmark's image (the chosen implementation folder)."""
    from mlrepro import container

    ready = implementation_ready(wc)
    folder = launch.implementation_config(SETTINGS.benchmark(wc.benchmark), SYSTEM).path.parent
    return ready + [str(folder / p) for p in container.context_files(folder)]
