"""Dry-run plans of the GPT pretraining benchmarks: nodes x GPUs, layout, wall time and the exact launch line.

A benchmark's `pretrain:` block (config/benchmarks/gpt_*.yaml) names the model, the training
tokens, the global batch and its layouts (the Megatron-DeepSpeed guide's DP/PP/TP table); a layout is checked
against a system by the planner (plan.search: divisibility, heads, layers, memory) before
anything is scheduled, and refused with the planner's reason. Three launchers render: Megatron-LM's
pretrain_gpt.py (srun with pyxis, one task per GPU, inside NVIDIA's run.sub; or torchrun on one
machine), Megatron-DeepSpeed (the Megatron-DeepSpeed guide: `deepspeed pretrain_gpt.py ... --deepspeed_config
ds_config.json`) and the NeMo launcher (the NeMo guide: `main.py stages=[training] training=gpt3/...`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import NamedTuple

from mlrepro import config as mlrepro_config
from mlrepro import paths
from mlrepro.launch import chain
from mlrepro.plan import goodput, hardware, search, workloads
from mlrepro.plan.layout import Layout
from mlrepro.pretrain import megatron_deepspeed, megatron_launch

NEMO_MAIN = "/opt/NeMo-Megatron-Launcher/launcher_scripts/main.py"
MEGATRON_IMAGE = "${CONT}"  # the image the implementation's Dockerfile builds (Megatron-LM at the pinned commit)
NOT_LAUNCHED = ("mlrepro trains seeds with Megatron-LM (launcher: megatron) and Megatron-DeepSpeed "
                "(launcher: megatron-deepspeed) only")
UNPREPARED = "UNPREPARED"  # stands in a dry run's line for what the corpus stages have not written yet
# What a run reads of a corpus folder (the corpus stages write them): the blend and the tokenizer's files.
BLEND, VOCAB, MERGES = "data_prefix.json", "tokenizer/vocab.json", "tokenizer/merges.txt"


TRIAL_ITERATIONS = 20  # a trial candidate's iterations where `pretrain: trial:` gives none


class Refused(ValueError):
    """The layout cannot run on the system; the message says why."""


@dataclasses.dataclass(frozen=True)
class Variant:
    benchmark: str
    name: str  # the Megatron-DeepSpeed guide's YAML name, e.g. gpt-1-3b-4xdp-4xpp
    model: str
    tokens: float
    gbs: int
    tp: int | None = None  # None: the planner chooses
    pp: int | None = None
    dp: int | None = None
    launcher: str = "megatron"  # megatron | megatron-deepspeed | nemo
    nemo_training: str | None = None  # NeMo launcher config, e.g. gpt3/7b_improved
    zero_stage: int = 1
    ds_config: str = ""  # JSON of the layout's `ds_config:` block, set over the generated ds_config.json


@dataclasses.dataclass(frozen=True)
class Planned:
    variant: Variant
    facts: hardware.SystemFacts
    layout: Layout
    memory_gb: float
    step_s: float
    iterations: int

    @property
    def hours(self) -> float:
        return self.step_s * self.iterations / 3600


def benchmark_corpus_dir(root: Path, bench: mlrepro_config.Benchmark) -> Path:
    """resources/corpora/<corpus>/ of the benchmark's `corpus:` (mini_corpus when it names none)."""
    return paths.corpus_dir(root, bench.corpus or "mini_corpus")


def variants(bench: mlrepro_config.Benchmark) -> dict[str, Variant]:
    """The layouts the benchmark's `pretrain:` block lists (schema-validated), by name."""
    pre = bench.pretrain
    if not pre:
        raise Refused(f"config/benchmarks/{bench.name}.yaml has no pretrain: block")
    out = {}
    for lay in pre["layouts"]:
        out[lay["name"]] = Variant(
            benchmark=bench.name, name=lay["name"], model=pre["model"], tokens=float(pre["tokens"]),
            gbs=int(lay.get("gbs", pre["gbs"])), tp=lay.get("tp"), pp=lay.get("pp"), dp=lay.get("dp"),
            launcher=lay.get("launcher", pre.get("launcher", "megatron")), nemo_training=pre.get("nemo_training"),
            zero_stage=int(lay.get("zero_stage", 1)), ds_config=json.dumps(lay.get("ds_config") or {}))
    return out


def plan(v: Variant, facts: hardware.SystemFacts) -> Planned:
    """The variant's layout on the system, priced by the planner; Refused naming why it cannot run."""
    w = workloads.gpt(v.model, v.gbs)
    fixed = {k: getattr(v, k) for k in ("tp", "pp", "dp") if getattr(v, k) is not None}
    if len(fixed) == 3:
        gpus = v.tp * v.pp * v.dp
        if gpus > facts.gpus:
            raise Refused(f"{v.name} needs {gpus} GPUs (TP{v.tp} x PP{v.pp} x DP{v.dp}); "
                          f"{facts.name} has {facts.gpus}")
        try:
            facts = facts.with_gpus(gpus)
        except ValueError as exc:
            raise Refused(f"{v.name}: {exc}") from None
        m = w.model
        broken = search.broken_rule(m, gpus, v.tp, 1, v.pp)
        if broken:
            raise Refused(f"{v.name} (TP{v.tp} PP{v.pp} DP{v.dp}) breaks a rule: {search.REASONS[broken]} "
                          f"({m.name}: {m.heads} heads, {m.pipeline_units} layers)")
        if v.tp > facts.nvlink_domain:
            raise Refused(f"{v.name}: {search.REASONS['nvlink']} (TP{v.tp} > {facts.nvlink_domain} GPUs)")
    try:
        p = search.plan(w, facts, fixed=fixed or None, top=1)
    except search.PlanError as exc:
        raise Refused(f"{v.name} ({_fixed(fixed)}) on {facts.name}: {exc}") from None
    best = p.best
    iterations = math.ceil(v.tokens / (v.gbs * w.model.seq))
    return Planned(v, facts, best.layout, best.memory_gb, float(p.table.iloc[0]["step_s"]), iterations)


def shaped(p: Planned, overrides: dict) -> Planned:
    """The plan with the workflow's `pretrain:` micro/global batch and iterations, where given
    (Settings.pretrain_overrides): the shape the seed runs, and the one its dry run shows."""
    lay = p.layout
    mbs = int(overrides.get("mbs") or lay.mbs)
    gbs = int(overrides.get("gbs") or lay.gbs)
    if gbs % (mbs * lay.dp):
        raise mlrepro_config.ConfigError(f"pretrain: gbs {gbs} is not a multiple of mbs {mbs} x DP{lay.dp}")
    lay = dataclasses.replace(lay, mbs=mbs, ga=gbs // (mbs * lay.dp))
    return dataclasses.replace(p, layout=lay, iterations=int(overrides.get("train_iters") or p.iterations))


def job_minutes(p: Planned, overrides: dict) -> int:
    """A seed's job time limit: the workflow's `pretrain: walltime_minutes`, else the planned wall time
    and 10 minutes for start-up and the last checkpoint."""
    return int(overrides.get("walltime_minutes") or math.ceil(p.hours * 60) + 10)


def _fixed(fixed: dict) -> str:
    return " ".join(f"{k.upper()}{n}" for k, n in fixed.items()) or "layout chosen by the planner"


def _walltime(hours: float) -> str:
    minutes = max(1, math.ceil(hours * 60))
    return f"{minutes // 1440}-{minutes % 1440 // 60:02d}:{minutes % 60:02d}:00"


def data_mount(corpus_dir: Path, scheduler: str) -> str:
    """Where a seed's ranks see the corpus: /data in run.sub's container on Slurm (DATADIR is
    mounted there), the corpus folder itself on one machine."""
    return "/data" if scheduler == "slurm" else str(corpus_dir.resolve())


def seed_run(p: Planned, seed: int, corpus_dir: Path, scheduler: str, attention: str | None = None, *,
             prepared: bool = True, save: str = "", save_interval: int = 0,
             deterministic: bool = False, tensorboard_dir: str = "") -> megatron_launch.Run:
    """Seed `seed`'s Megatron-LM run of the planned benchmark. The one builder: the seed runs it
    (mlrepro.kinds.megatron.plan_seed) and the dry run and the plan command show it (launch_line), so what
    a plan shows is what the seed runs.

    The data is the corpus stages' blend and tokenizer; it is already tokenized, so Megatron gets
    only the vocabulary size (NullTokenizer). A dry run comes before the corpus stages: with
    prepared=False, what they have not written yet shows as UNPREPARED; a seed (prepared=True)
    refuses to start without it. `save`: the checkpoint folder of a chained seed (--save and --load),
    written every `save_interval` iterations. `deterministic`: Megatron-LM's bit-reproducible mode (the
    workflow's `pretrain: {deterministic: true}`). `tensorboard_dir`: where Megatron-LM writes its event files."""
    missing = unprepared(corpus_dir)
    if missing and prepared:
        raise mlrepro_config.ConfigError(f"{missing[0]} is missing: run the corpus stages")
    mount = data_mount(corpus_dir, scheduler)
    prefix, _, _ = data_prefix_of(corpus_dir, mount)
    vocab = UNPREPARED if corpus_dir / VOCAB in missing else len(json.loads((corpus_dir / VOCAB).read_text()))
    return megatron_launch.Run(p.variant.model, p.layout, p.iterations,
                               data_prefix=tuple(prefix or unprepared_prefix(mount)), pretokenized_vocab=vocab,
                               seed=seed, warmup_iters=max(1, p.iterations // 10), sdpa=attention == "sdpa",
                               save=save, save_interval=save_interval, deterministic=deterministic,
                               tensorboard_dir=tensorboard_dir)


def ds_config(p: Planned) -> dict:
    """Megatron-DeepSpeed's ds_config.json for the layout (the Megatron-DeepSpeed guide), with the
    benchmark layout's `ds_config:` block over it (a nested block merged key by key)."""
    lay = p.layout
    cfg = {"train_batch_size": lay.gbs, "train_micro_batch_size_per_gpu": lay.mbs,
           "gradient_accumulation_steps": lay.ga, "steps_per_print": 10, "gradient_clipping": 1.0,
           "zero_optimization": {"stage": p.variant.zero_stage}, "bf16": {"enabled": True},
           "wall_clock_breakdown": False}
    for key, value in json.loads(p.variant.ds_config or "{}").items():
        cfg[key] = {**cfg[key], **value} if isinstance(value, dict) and isinstance(cfg.get(key), dict) else value
    return cfg


def ds_where(v: Variant) -> str:
    """Where a Megatron-DeepSpeed layout's ds_config comes from, as its batch-size check names it."""
    return f"config/benchmarks/{v.benchmark}.yaml layout {v.name}"


def launch_line(p: Planned, scheduler: str, corpus_dir: Path, seed: int, attention: str | None = None,
                max_time_margin_min: int = 30, *, deterministic: bool = False, tensorboard_dir: str = "",
                save: str = "", save_interval: int = 0) -> str:
    """The exact command that starts seed `seed` of the run, on the corpus in corpus_dir (UNPREPARED
    standing for what the corpus stages have not written yet); `save`, `save_interval`: a chained seed's."""
    v, per_node = p.variant, p.facts.gpus_per_node
    if v.launcher == "megatron-deepspeed":  # the line kinds.megatron_deepspeed runs, its files named relative
        run = seed_run(p, seed, corpus_dir, scheduler, attention, prepared=False, save=save, save_interval=save_interval)
        args = megatron_deepspeed.seed_args(run, ds_config(p), zero_stage=v.zero_stage, where=ds_where(v))
        return megatron_deepspeed.launch_line(args, scheduler, p.layout.gpus, per_node, MEGATRON_IMAGE)
    if v.launcher == "megatron":
        run = seed_run(p, seed, corpus_dir, scheduler, attention, prepared=False, deterministic=deterministic,
                       tensorboard_dir=tensorboard_dir, save=save, save_interval=save_interval)
        if scheduler == "slurm":
            return megatron_launch.srun_line(run, MEGATRON_IMAGE, "${DATADIR}:/data:ro,${LOGDIR}:/results:rw",
                                             gpus_per_node=per_node)
        return megatron_launch.torchrun_line(run)
    prefix, vocab, merges = data_prefix_of(corpus_dir)
    prefix = prefix or unprepared_prefix("/data")
    return nemo_line(p, prefix, vocab, merges, max_time_margin_min)


def nemo_line(p: Planned, data_prefix: list, vocab: str, merges: str, margin_min: int = 30) -> str:
    """The NeMo guide's launcher command: stages=[training], max_time `margin_min` before the job limit."""
    limit_min = max(math.ceil(p.hours * 60), margin_min + 1)
    stop = limit_min - margin_min
    prefix = "[" + ",".join(f"{w}" if i % 2 == 0 else f"'{w}'" for i, w in enumerate(data_prefix)) + "]"
    nodes = max(1, p.layout.gpus // p.facts.gpus_per_node)
    parts = [
        "python3", NEMO_MAIN, "stages=[training]", f"training={p.variant.nemo_training}",
        "launcher_scripts_path=/opt/NeMo-Megatron-Launcher/launcher_scripts", "data_dir=/data",
        "base_results_dir=/results", f"training.run.name=\"{p.variant.benchmark}\"",
        f"training.run.time_limit=\"{_walltime(limit_min / 60)}\"",
        f"training.trainer.max_time=\"{stop // 1440}:{stop % 1440 // 60:02d}:{stop % 60:02d}:00\"",
        f"training.trainer.num_nodes={nodes}",
        f"training.model.tensor_model_parallel_size={p.layout.tp}",
        f"training.model.pipeline_model_parallel_size={p.layout.pp}",
        f"training.model.tokenizer.vocab_file={vocab}", f"training.model.tokenizer.merge_file={merges}",
        f"training.model.data.data_prefix={prefix}",
    ]
    return " ".join(parts)


def data_prefix_of(corpus_dir: Path, mount: str = "/data") -> tuple[list | None, str, str]:
    """The blend and tokenizer the corpus stages wrote under corpus_dir, as the container sees them
    under `mount`; the blend is None while the corpus stages have not written data_prefix.json."""
    blend = corpus_dir / BLEND
    prefix = None
    if blend.is_file():
        record = json.loads(blend.read_text())
        prefix = [x if i % 2 == 0 else f"{mount}/preprocessed/{Path(x).name}"
                  for i, x in enumerate(record["data_prefix"])]
    return prefix, f"{mount}/{VOCAB}", f"{mount}/{MERGES}"


def unprepared(corpus_dir: Path) -> list[Path]:
    """What a seed reads of the corpus that the corpus stages have not written yet: the blend, the tokenizer."""
    return [f for f in (corpus_dir / BLEND, corpus_dir / VOCAB) if not f.is_file()]


def unprepared_prefix(mount: str) -> list:
    """A blend that stands for the one the corpus stages will write, in a dry run's launch line."""
    return [1.0, f"{mount}/preprocessed/{UNPREPARED}"]


class Failures(NamedTuple):
    """A seed's expected failures: the checkpoint interval it runs with and what failures are expected to cost."""
    saves: bool  # the benchmark has a segments: block (Megatron-LM's --save/--load)
    interval_iterations: int  # the save interval chosen (or set); for a run that does not save, the one it would use
    chosen_by: str
    job: goodput.Job  # the run as it saves (or would)
    expected: goodput.Expectation  # the run as it is: with its saves, or, without, restarted from the beginning
    if_saved: goodput.Expectation  # the run saving at interval_iterations
    model: goodput.FailureModel  # the system's, with the seeds' measured costs in place (its sources say which)
    checkpoint_bytes: float


def failures(p: Planned, bench: mlrepro_config.Benchmark, system: mlrepro_config.System,
             overrides: dict | None = None, measured: dict | None = None) -> Failures:
    """The plan's expected failures on the system (mlrepro.plan.goodput): its nodes, the system's failure
    model and the benchmark's hang rule, the checkpoint's size from the memory model's bytes per parameter,
    and the interval: config.yaml's `pretrain: save_interval`, else the benchmark's, else Young/Daly's
    in whole iterations of the plan's step time. `measured`: what the benchmark's seeds measured so far
    (mlrepro.scoring.goodput.benchmark_goodput, read by the kind): its restart and checkpoint costs replace
    the configured ones."""
    overrides, measured = overrides or {}, measured or {}
    lay, step = p.layout, p.step_s
    model = goodput.FailureModel.of(system.failures, f"config/systems/{system.name}.yaml", hang=bench.hang)
    model = model.with_measured(restart_seconds=measured.get("restart_cost_s"),
                                checkpoint_seconds=measured.get("checkpoint_cost_s"))
    size = goodput.checkpoint_bytes(workloads.gpt(p.variant.model, lay.gbs))
    limits = chain.limits(bench.segments, system.max_job_minutes)
    span = limits.training_seconds if limits is not None else None
    job = model.job(nodes=max(1, lay.gpus // p.facts.gpus_per_node), gpus=lay.gpus, work_s=step * p.iterations,
                    checkpoint_bytes=size, progress_interval_s=step * megatron_launch.Run.log_interval, job_limit_s=span)
    given = overrides.get("save_interval") or (bench.pretrain or {}).get("save_interval")
    if given:
        iterations = int(given)
        chosen_by = ("config.yaml's pretrain: save_interval" if overrides.get("save_interval")
                     else f"config/benchmarks/{bench.name}.yaml's pretrain: save_interval")
    else:
        iterations = max(1, round(goodput.young_daly_interval(job) / step)) if step > 0 else 1
        chosen_by = "Young/Daly"
    if_saved = goodput.expected(job, iterations * step)
    as_is = if_saved if limits is not None else goodput.expected(dataclasses.replace(job, saves=False))
    return Failures(limits is not None, iterations, chosen_by, job, as_is, if_saved, model, size)


def _hours(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def failures_line(p: Planned, f: Failures) -> str:
    """The dry run's line of expected failures, next to the planned GPU-hours."""
    job, e, minutes = f.job, f.expected, f.interval_iterations * p.step_s / 60
    planned = p.layout.gpus * p.hours
    head = f"failures: {goodput.costs_words(f.model, job, f.checkpoint_bytes)}"
    if f.saves:
        body = (f"checkpoint every {f.interval_iterations:,} iterations ({minutes:.1f} min, {f.chosen_by}); "
                f"expected {e.interruptions:.1f} interruptions, effective training time {e.effective:.1%}")
    else:
        # A run that never saves starts over after each failure: beyond a few MTBFs it does not finish.
        if e.effective < 0.01:
            outcome = (f"the chance of no failure in {p.hours:,.0f} h is {math.exp(-job.work_s / job.mtbf_s):.2g}: "
                       "expected never to finish")
        else:
            outcome = (f"expected {e.interruptions:.3g} interruptions, each restarting the run from its beginning, "
                       f"effective training time {e.effective:.1%}")
        body = (f"no checkpoints (no segments: block): {outcome}; saving every {f.interval_iterations:,} iterations "
                f"({minutes:.1f} min, {f.chosen_by}) would keep {f.if_saved.effective:.1%} "
                f"({f.if_saved.interruptions:.1f} interruptions, {_hours(f.if_saved.lost_gpu_hours)} GPU-hours lost)")
        e = e if e.effective >= 0.01 else dataclasses.replace(e, lost_gpu_hours=math.inf)
    lost = "all of them" if not math.isfinite(e.lost_gpu_hours) else f"{_hours(e.lost_gpu_hours)} GPU-hours"
    return f"{head}: {body}; planned {_hours(planned)} GPU-hours, expected lost to failures {lost}"


def describe(p: Planned, scheduler: str, corpus_dir: Path, seed: int, attention: str | None = None,
             expected_failures: Failures | None = None, *, deterministic: bool = False,
             tensorboard_dir: str = "", save: str = "") -> list[str]:
    """The plan's lines: shape, layout, memory, wall time, the expected failures (where given), then the
    exact launch line(s) of seed `seed` (writing its event files into `tensorboard_dir`, its seed folder's;
    a chained seed saving to and loading from `save` at the expected failures' interval)."""
    v, lay, facts = p.variant, p.layout, p.facts
    nodes, per_node = max(1, lay.gpus // facts.gpus_per_node), min(lay.gpus, facts.gpus_per_node)
    # Megatron-LM's line carries the seed number (--seed): say whose line it is. The other launchers'
    # commands are the NeMo and Megatron-DeepSpeed guides' own, rendered for review: the workflow does not start them.
    whose = (f"; launch line of seed {seed}" if v.launcher in ("megatron", "megatron-deepspeed")
             else f"; {v.launcher}'s own command, for review: {NOT_LAUNCHED}")
    out = [f"{v.name} on {facts.name}: {nodes} node(s) x {per_node} GPUs ({lay.gpus} x {facts.gpu}); "
           f"layout TP{lay.tp} PP{lay.pp} DP{lay.dp} MBS{lay.mbs} GA{lay.ga} (GBS {lay.gbs}); "
           f"{p.memory_gb:.1f} GB/GPU predicted; {p.iterations:,} iterations x {p.step_s:.3f} s = "
           f"wall time {_walltime(p.hours)}{whose}"]
    if expected_failures is not None:
        out.append("  " + failures_line(p, expected_failures))
    if v.launcher == "megatron-deepspeed":
        out.append(f"  ds_config.json ({v.name}.yaml): {json.dumps(ds_config(p), sort_keys=True)}")
    elif v.launcher == "megatron" and scheduler == "slurm":
        out.append(f"  sbatch -N {nodes} --ntasks-per-node={per_node} --gpus-per-node={per_node} "
                   f"-t {math.ceil(p.hours * 60) + 10} implementations/megatron_gpt/run.sub")
    interval = expected_failures.interval_iterations if save and expected_failures is not None else 0
    out.append("  " + launch_line(p, scheduler, corpus_dir, seed, attention, deterministic=deterministic,
                                  tensorboard_dir=tensorboard_dir, save=save if interval else "", save_interval=interval))
    return out


def render(root: Path, benchmark: str, system: str, variant: str | None = None,
           corpus_dir: Path | None = None, seed: int | None = None) -> tuple[str, list[str]]:
    """The plans of a benchmark's layouts on a system, with the launch lines of `seed` (the
    benchmark's first seed by default), and the refusals (each naming why)."""
    sysconf = mlrepro_config.load_system(root, system)
    facts = hardware.from_system(sysconf, root)
    bench = mlrepro_config.load_benchmark(root, benchmark)
    table = variants(bench)
    if variant and variant not in table:
        raise Refused(f"{benchmark} has no layout {variant!r}; it has {', '.join(table)}")
    corpus_dir = corpus_dir or benchmark_corpus_dir(root, bench)
    out, refused = [], []
    if missing := unprepared(corpus_dir):
        out.append(f"(no {' or '.join(map(str, missing))} yet: the corpus stages write them; "
                   f"{UNPREPARED} stands for them below)")
    for v in ([table[variant]] if variant else table.values()):
        try:
            planned = plan(v, facts)
            shown = bench.seeds[0] if seed is None else seed
            out += describe(planned, sysconf.scheduler, corpus_dir, shown,
                            expected_failures=failures(planned, bench, sysconf),
                            tensorboard_dir=str(paths.SeedPaths.of(root, bench.name, shown).tensorboard))
        except Refused as exc:
            refused.append(str(exc))
    return "\n".join(out), refused


class DryRun(NamedTuple):
    """What `snakemake -n` shows of a seed: the plan's lines, one string, and the job's time limit."""
    describe: str
    walltime_minutes: int


def first_fit(root: Path, bench: mlrepro_config.Benchmark, system: str) -> Planned:
    """The benchmark's first layout that fits the system; Refused (naming every layout's reason) when
    none fits, so the DAG stops before any job."""
    facts = hardware.from_system(mlrepro_config.load_system(root, system), root)
    reasons = []
    for v in variants(bench).values():
        try:
            return plan(v, facts)
        except Refused as exc:
            reasons.append(str(exc))
    raise Refused(f"{bench.name} cannot run on system {system!r}: " + "; ".join(reasons))


def trial_of(bench: mlrepro_config.Benchmark) -> dict | None:
    """The benchmark's opt-in trial (`pretrain: trial: {candidates, iterations}`), None without one."""
    return (bench.pretrain or {}).get("trial")


def trial_gbs(bench: mlrepro_config.Benchmark, overrides: dict | None = None) -> int:
    """The global batch the trial's candidates run at: the seeds' (the workflow's `pretrain: gbs`, else the benchmark's)."""
    return int((overrides or {}).get("gbs") or bench.pretrain["gbs"])


def read_layout(short: str) -> Layout:
    """Layout.short() read back (trials.json names its layouts so)."""
    fields = dict.fromkeys(("TP", "PP", "CP", "DP", "MBS", "GA", "VPP"), 1)
    parts = short.replace("(", " ").replace(")", " ").split()
    for part in parts:
        for key in sorted(fields, key=len, reverse=True):
            if part.startswith(key) and part[len(key):].isdigit():
                fields[key] = int(part[len(key):])
                break
    recompute = next((part.split("=")[1] for part in parts if part.startswith("recompute=")), "none")
    return Layout(tp=fields["TP"], pp=fields["PP"], cp=fields["CP"], dp=fields["DP"], mbs=fields["MBS"],
                  ga=fields["GA"], vpp=fields["VPP"], sp="SP" in parts, recompute=recompute)


def trial_choice(root: Path, bench: mlrepro_config.Benchmark, system: str,
                 overrides: dict | None = None) -> tuple[Layout, dict] | None:
    """The layout the benchmark's trial chose and its row of trials.json; None while no trial has chosen.
    A trial of another system or global batch is refused: what it measured is not what the seeds run."""
    record = paths.read_json_if_exists(paths.trials_json(root, bench.name)) or {}
    tag = (record.get("chosen") or {}).get("tag")
    row = next((r for r in record.get("candidates") or [] if r.get("tag") == tag), None)
    if row is None:
        return None
    gbs = trial_gbs(bench, overrides)
    if (record.get("system"), record.get("gbs")) != (system, gbs):
        raise Refused(f"{paths.trials_json(root, bench.name)} is a trial on {record.get('system')} at GBS "
                      f"{record.get('gbs')}; the seeds run on {system} at GBS {gbs}: delete "
                      f"{paths.trials_dir(root, bench.name)} to run the trial again")
    return read_layout(row["layout"]), row


def _trial_planned(root: Path, bench: mlrepro_config.Benchmark, system: str, lay: Layout, row: dict) -> Planned:
    """The trial's choice as a plan: its layout exactly, priced at the step it measured on this system."""
    first = next(iter(variants(bench).values()))
    v = dataclasses.replace(first, name=f"{bench.name}-trial-{row['tag']}", tp=lay.tp, pp=lay.pp, dp=lay.dp,
                            gbs=lay.gbs)
    facts = hardware.from_system(mlrepro_config.load_system(root, system), root).with_gpus(lay.gpus)
    iterations = math.ceil(v.tokens / (v.gbs * workloads.gpt(v.model, v.gbs).model.seq))
    return Planned(v, facts, lay, float(row.get("memory_gb") or 0.0), float(row["measured_s"]), iterations)


def chosen(root: Path, bench: mlrepro_config.Benchmark, system: str, overrides: dict | None = None) -> Planned:
    """The layout a seed runs: the one the workflow's `pretrain: layout` names (Refused, naming why,
    when it does not fit the system), else the one the benchmark's trial chose (trial_choice), else the
    benchmark's first that fits (first_fit; also while the trial has not run: the dry run says so)."""
    name = (overrides or {}).get("layout")
    if not name and trial_of(bench) and (choice := trial_choice(root, bench, system, overrides)):
        return _trial_planned(root, bench, system, *choice)
    if not name:
        return first_fit(root, bench, system)
    table = variants(bench)
    if name not in table:
        raise Refused(f"pretrain: layout {name!r}: {bench.name} has no such layout; it has {', '.join(table)}")
    return plan(table[name], hardware.from_system(mlrepro_config.load_system(root, system), root))


def dry_run(root: Path, bench: mlrepro_config.Benchmark, system: str, overrides: dict | None = None,
            corpus_dir: Path | None = None, seed: int | None = None, planned: Planned | None = None,
            measured: dict | None = None) -> DryRun:
    """The dry run's one-line plan of seed `seed` (the benchmark's first by default): the layout the seed
    runs (see chosen; or `planned`, already shaped), shaped by the workflow's `pretrain:` overrides, and
    the launch line seed_run builds for it, as mlrepro.kinds.megatron runs them; its failures priced with
    the seeds' `measured` costs (see failures)."""
    overrides = overrides or {}
    p = planned or shaped(chosen(root, bench, system, overrides), overrides)
    sysconf = mlrepro_config.load_system(root, system)
    seed = bench.seeds[0] if seed is None else seed
    files = paths.SeedPaths.of(root, bench.name, seed)
    chained = chain.limits(bench.segments, sysconf.max_job_minutes) is not None
    lines = describe(p, sysconf.scheduler, corpus_dir or benchmark_corpus_dir(root, bench),
                     seed, overrides.get("attention"),
                     expected_failures=failures(p, bench, sysconf, overrides, measured),
                     deterministic=bool(overrides.get("deterministic")),
                     tensorboard_dir=str(files.tensorboard), save=str(files.checkpoints) if chained else "")
    if (trial := trial_of(bench)) and not overrides.get("layout") and not trial_choice(root, bench, system, overrides):
        lines.insert(0, f"layout chosen by the trial before the seeds (pretrain: trial: the planner's "
                        f"{trial['candidates']} best layouts at GBS {trial_gbs(bench, overrides)}, "
                        f"{trial.get('iterations', TRIAL_ITERATIONS)} iterations each as jobs, the measured fastest); "
                        f"until it has run, the benchmark's first layout that fits")
    return DryRun(" | ".join(x.strip() for x in lines), job_minutes(p, overrides))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlrepro.pretrain.megatron_plan", description=__doc__.splitlines()[0])
    parser.add_argument("benchmark", help="config/benchmarks/<name>.yaml with a pretrain: block, e.g. gpt_13b")
    parser.add_argument("--system", required=True)
    parser.add_argument("--variant", help="one of the benchmark's layouts (default: all)")
    parser.add_argument("--corpus-dir", type=Path,
                        help="resources/corpora/<name> whose blend and tokenizer feed the run (default: mini_corpus)")
    parser.add_argument("--seed", type=int, help="whose Megatron-LM launch line to show (default: the benchmark's first seed)")
    parser.add_argument("--root", type=Path, default=Path.cwd())
    args = parser.parse_args(argv)
    try:
        text, refused = render(args.root, args.benchmark, args.system, args.variant, args.corpus_dir, args.seed)
    except (Refused, hardware.HardwareUnknown, mlrepro_config.ConfigError) as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 2
    if text:
        print(text)
    for reason in refused:
        print(f"refused: {reason}", file=sys.stderr)
    return 2 if refused and (args.variant or not text) else 0


if __name__ == "__main__":
    sys.exit(main())
