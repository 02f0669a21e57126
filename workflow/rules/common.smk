from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import launch


configfile: "config/config.yaml"


# Validation happens at parse time, so a bad key stops `snakemake` (and `-n`) before any job.
try:
    SETTINGS = mlrepro_config.load(config, workflow.basedir)
except mlrepro_config.ConfigError as error:
    raise WorkflowError(f"mlrepro configuration error:\n{error}") from None
SYSTEM = SETTINGS.system


wildcard_constraints:
    benchmark="|".join(SETTINGS.benchmarks),
    seed=r"\d+",


def seeds(benchmark):
    return SETTINGS.benchmark(benchmark).seeds


def seed_files(name):
    """Input helper: one file per configured seed of the benchmark, e.g. seed_files("mllog.txt")."""
    return lambda wc: [f"results/{wc.benchmark}/seed_{s}/{name}" for s in seeds(wc.benchmark)]


def seed_plan(wc):
    return launch.plan_seed(SETTINGS, wc.benchmark, int(wc.seed))


def all_targets():
    targets = []
    for name in SETTINGS.benchmarks:
        targets += [f"results/{name}/score.json", f"results/{name}/report.html"]
    return targets


def implementation_files(wc):
    """The build context of the benchmark's image: its implementation folder's files."""
    from mlrepro import container

    folder = SETTINGS.benchmark(wc.benchmark).implementation_dir
    return [str(folder / p) for p in container.context_files(folder)] if folder.is_dir() else []
