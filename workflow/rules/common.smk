import re
from pathlib import Path

from mlrepro import config as mlrepro_config
from mlrepro import kinds, paths
from mlrepro.kinds import systems as mlrepro_systems
from mlrepro.util.fsutil import private_umask
from mlrepro.launch import guard as run_guard
from mlrepro.baseline import megatron as baseline_megatron
from mlrepro.preflight import run as preflight_run


# Read strictly first: Snakemake's own loader names no file on a YAML error and keeps the
# last of two equal keys.
try:
    mlrepro_config.check_config_file("config/config.yaml")
    mlrepro_config.check_command_line(workflow.config_settings.config_args)
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


# Every process of the run dies with this snakemake process, however it dies (mlrepro.launch.guard).
# A dry run starts none.
if workflow.is_main_process and not workflow.dryrun:
    run_guard.guard_workflow(Path.cwd())
    run_guard.release_stale_lock(Path.cwd())  # a killed run's: the plain rerun needs no --unlock


def config_error(error):
    return WorkflowError(f"mlrepro configuration error:\n{error}")


def planning_error(error):
    """What an input function raises for a config error it finds (a benchmark the system cannot run).

    Snakemake wraps whatever an input function raises in InputFunctionException, with common.smk's
    stack frames under the message. While the DAG is still being built (no scheduler yet, no job
    started, in the dry run too) the run stops with the message alone, as a parse-time error does.
    Once jobs run (an implementation fetched by the checkpoint showing a config it lacks), Snakemake
    must still cancel them: there the error goes through it as before.
    """
    if workflow.scheduler is None:
        raise SystemExit(f"mlrepro configuration error:\n{error}")
    return config_error(error)


# Validation happens at parse time, so a bad key stops `snakemake` (and `-n`) before any job.
try:
    SETTINGS = mlrepro_config.load(config, workflow.basedir)
except mlrepro_config.ConfigError as error:
    raise config_error(error) from None
SYSTEM = SETTINGS.system


# Every config/benchmarks/<name>.yaml can be asked for by file target; `benchmarks:` in
# config.yaml is only what the default target reproduces.
wildcard_constraints:
    benchmark="|".join(map(re.escape, mlrepro_config.benchmark_names(SETTINGS.root))) or "(?!)",
    seed=r"\d+",


_CHECKED = {}


def bench(name):
    """The benchmark, once the chosen system is known to run it (see mlrepro.kinds.systems).

    Every input function goes through here, so a benchmark the system cannot run stops the
    DAG before any job, with one message; it is checked again once the implementation is fetched.
    """
    try:
        key = (name, mlrepro_systems.implementation_known(SETTINGS.root, SETTINGS.benchmark(name)))
        if key not in _CHECKED:
            checked = mlrepro_systems.check(SETTINGS, name)
            mlrepro_config.prebuilt_image(checked, SYSTEM)  # read by the container and seed rules
            _CHECKED[key] = checked
    except mlrepro_config.ConfigError as error:
        raise planning_error(error) from None
    return _CHECKED[key]


def slurm_resources():
    """Partition and account of the system, for the rules that go through the Slurm executor plugin."""
    named = {"slurm_partition": SYSTEM.partition, "slurm_account": SYSTEM.account}
    return {key: value for key, value in named.items() if value}


def seed_file(name):
    """A file of one seed's folder, as a pattern with {benchmark} and {seed} (see mlrepro.paths)."""
    return paths.seed_file_pattern(name)


def seed_files(name):
    """Input helper: one file per configured seed of the benchmark, e.g. seed_files("mllog.txt")."""
    return lambda wc: paths.seed_files(wc.benchmark, bench(wc.benchmark).seeds, name)


def seed_results(wc):
    """Input of the score: every seed's run.json and mllog.txt.

    Snakemake does not rebuild a missing intermediate of an up-to-date target, so a seed
    deleted to redo it would go unnoticed by `snakemake results/<b>/score.json`. When a
    seed's file is missing while the score exists, the folder it was deleted from (whose
    mtime the deletion set) is an input too: it is newer than the score, so the score is
    redone, and with it exactly the missing seeds. Once they are back it is not an input.
    """
    files = {name: seed_files(name)(wc) for name in ("run.json", "mllog.txt")}
    if Path(f"results/{wc.benchmark}/score.json").exists():
        for path in map(Path, files["run.json"] + files["mllog.txt"]):
            if not path.exists():
                folder = next((p for p in path.parents if p.is_dir()), None)
                if folder is not None and folder != Path(".") and str(folder) not in files.setdefault("deleted", []):
                    files["deleted"].append(str(folder))
    return {"runs": files["run.json"], "mllogs": files["mllog.txt"], "deleted": files.get("deleted", [])}


_PLANS = {}


def seed_plan(wc, attribute):
    """One attribute of the seed's plan as the DAG sees it (the kind's dag_plan, a
    mlrepro.launch.job.SeedPlan). Every listed seed of the benchmark is planned at once, the first
    time one is asked for (what they share, such as the config and the stages' places, is read once).

    Until a git implementation is fetched its configs are unknown: Snakemake asks before the
    checkpoint has run, gets a placeholder, and asks again once it has (a new key, planned anew).
    """
    b = bench(wc.benchmark)
    key = (wc.benchmark, mlrepro_systems.implementation_known(SETTINGS.root, b))
    if key not in _PLANS:
        _PLANS[key] = kinds.of(b).dag_plans(SETTINGS, wc.benchmark)
    plan = _PLANS[key].get(int(wc.seed))
    if plan is None:  # a seed the benchmark does not list: the kind says so
        plan = kinds.of(b).dag_plan(SETTINGS, wc.benchmark, int(wc.seed))
    value = getattr(plan, attribute)
    return value() if callable(value) else value


def planned_cost(wc):
    """The dry run's plan line (the score rule's message): the seeds at the wall-time and at the
    reference's run times (mlrepro.stages.score.planned_line)."""
    from mlrepro.stages import score as score_stage

    b = bench(wc.benchmark)
    if not mlrepro_systems.implementation_known(SETTINGS.root, b):
        return f"{wc.benchmark}: cost planned once the implementation is fetched"

    def work():
        plan = kinds.of(b).dag_plan(SETTINGS, wc.benchmark, b.seeds[0])
        return score_stage.planned_line(SETTINGS, wc.benchmark, plan)

    return per_benchmark("planned_cost", wc, work)


def all_targets():
    targets = []
    for name in SETTINGS.benchmarks:
        targets += [f"results/{name}/score.json", f"results/{name}/report.html"]
        if SETTINGS.benchmark(name).mlperf_benchmark:
            targets.append(f"results/{name}/submission")
    return targets + ["results/report.html"]


# What the input helpers below work out is the same for every seed of a benchmark, and Snakemake asks
# once per job: each is kept per benchmark once known. A checkpoint that has not run yet raises in
# .get (nothing is kept), so Snakemake asks again once it has.
_PER_BENCHMARK = {}


def per_benchmark(helper, wc, work):
    key = (helper, wc.benchmark)
    if key not in _PER_BENCHMARK:
        _PER_BENCHMARK[key] = work()
    return _PER_BENCHMARK[key]


def implementation_ready(wc):
    """Input helper: the fetched implementation of a git benchmark (nothing for a local folder)."""
    def work():
        if bench(wc.benchmark).implementation_git is None:
            return []
        return [str(f) for f in checkpoints.implementation.get(benchmark=wc.benchmark).output]

    return list(per_benchmark("implementation", wc, work))


def reference_runs(wc):
    """Input helper: the shipped reference runs of a benchmark that has them."""
    ref = bench(wc.benchmark).reference
    return sorted(str(p) for p in ref["runs"].iterdir() if p.is_file()) if ref else []


def container_ready(wc):
    """Input helper: the benchmark's container.json, as ancient() (see the container checkpoint)."""
    return ancient(per_benchmark("container", wc, lambda: str(checkpoints.container.get(benchmark=wc.benchmark).output[0])))


def seed_data(wc):
    """Input helper: what a seed trains on: the manifests of the dataset and checkpoint stages its
    benchmark configures (a model pretrained from scratch has no checkpoint), and the blend of its
    pretraining corpus (corpus.smk).

    Not ancient(): Snakemake never looks at a job whose only path from a job that must run goes
    through ancient() inputs (snakemake#4166), so a data stage redone after a killed run hid every
    seed, score and report behind it ("1 of 1 steps done", no score). A finished seed is still never
    retrained for a newer input: its job keeps the attempt it finished (mlrepro.launch.adopt)."""
    def work():
        b = bench(wc.benchmark)
        files = {stage: f"resources/{wc.benchmark}/{folder}/manifest.json"
                 for stage, folder in paths.STAGE_FOLDERS.items() if getattr(b, stage)}
        corpus = kinds.of(b).corpus_folder(Path("."), b)
        if corpus is not None:
            files["corpus"] = str(corpus / "data_prefix.json")
        return files

    return dict(per_benchmark("seed_data", wc, work))


def seed_implementation(wc):
    """Input helper of a seed's job: the fetched implementation, ancient() (nothing for a local folder).
    Apart from seed_data: until the implementation checkpoint has run this raises, and the data
    stages must still be planned."""
    return [ancient(f) for f in implementation_ready(wc)]


def trials_file(name):
    """results/<benchmark>/trials/trials.json (mlrepro.paths), as a pattern or for one benchmark."""
    return str(paths.trials_json(Path(), name))


def seed_trial(wc):
    """Input helper: the trial whose choice the seeds run (a benchmark with `pretrain: trial:`), else nothing."""
    return [trials_file(wc.benchmark)] if (bench(wc.benchmark).pretrain or {}).get("trial") else []


def seed_image(name):
    """The seed's image: container.json as a plain ancient() pattern, not through the container
    checkpoint. A seed's input that waits on a checkpoint makes Snakemake build every seed's job
    twice (once more after the DAG, in the dry run too); the score takes container_ready, so once a
    rebuilt container has run the score is evaluated again and with it every seed behind it."""
    return ancient(str(paths.container_json(Path(), name)))


def seed_line(wc):
    """The dry run's lines for a seed: its plan, ending with the exact sbatch command, then the
    image on a line of its own."""
    return f"{seed_plan(wc, 'describe')}\n    {wc.benchmark} seed {wc.seed} {image_line(wc)}"


def implementation_files(wc):
    """Input helper: the build context of the benchmark's image (the chosen implementation folder);
    for a prebuilt image only the implementation (nothing is built from its files)."""
    from mlrepro.container import context

    ready = implementation_ready(wc)
    b = bench(wc.benchmark)
    if mlrepro_config.prebuilt_image(b, SYSTEM):
        return ready
    folder = kinds.of(b).implementation_folder(b, SYSTEM)
    return ready + [str(folder / p) for p in context.context_files(folder)]


def image_line(wc):
    """What the dry run says of a benchmark's image: the prebuilt one named, or what is built."""
    from mlrepro.container import prebuilt

    return per_benchmark("image_line", wc, lambda: prebuilt.plan_line(
        mlrepro_config.prebuilt_image(bench(wc.benchmark), SYSTEM), SYSTEM.container_runtime,
        "the implementation's Dockerfile"))


# config/preflight.yaml validated at parse time: a bad key, or a Megatron layout the node cannot
# hold, stops the DAG before any job.
try:
    PREFLIGHT = preflight_run.load_settings(Path(workflow.basedir))
    MEGATRON_BASELINE = PREFLIGHT["baseline"]["megatron"]
    baseline_megatron.model_of(Path(workflow.basedir), MEGATRON_BASELINE["benchmark"])
    if SYSTEM.device == "cuda":
        baseline_megatron.check_layouts(MEGATRON_BASELINE, SYSTEM.gpus_per_node)
except mlrepro_config.ConfigError as error:
    raise config_error(error) from None


def megatron_baseline_rows(wc):
    """The Megatron rows the baseline reads: one run per precision on a CUDA system, none elsewhere
    (there baseline.json says 'not applicable' without starting Megatron-LM)."""
    if SYSTEM.device != "cuda":
        return []
    return paths.megatron_baseline_files(wc.system, MEGATRON_BASELINE["precisions"])


def previous_megatron_run(wc):
    """One Megatron run on the node at a time: each precision waits for the one before it."""
    precisions = MEGATRON_BASELINE["precisions"]
    i = precisions.index(wc.precision)
    return paths.megatron_baseline_files(wc.system, precisions[i - 1:i]) if i else []
