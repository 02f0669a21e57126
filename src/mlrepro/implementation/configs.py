"""An implementation's config_<SYSTEM>.sh files: sourcing them as run.sub does, reading the shape, picking one for a system.

An implementation folder (NVIDIA's training_results_v5.0 layout, or our own
`implementations/mini_lora`) holds one `config_<SYSTEM>.sh` per system shape.
The launcher sources it and passes the exported variables to `run.sub`, so the
only faithful way to know what a config sets is to source it the same way: in a
clean bash, from its own folder, so that its `source .../config_common.sh`
lines find their neighbours. Parsing the text instead would miss arithmetic
such as WALLTIME=$((5 + NEXP * (WALLTIME_RUNANDTIME + 5))).

Facts the published v5.0 configs rely on (checked against all twelve NVIDIA
configs of llama2_70b_lora and llama31_405b):

* The file name encodes the shape: `<PLATFORM>_<nodes>x<gpus>x<minibs>[xtp<T>pp<P>cp<C>][_<variant>]`.
  The third number is MINIBS (run.sub names its logs `${DGXNNODES}x${DGXNGPU}x${MINIBS}`),
  e.g. `GB200_64x4x112xtp4pp8cp2_cg` has MINIBS=112.
* llama2_70b_lora spells the parallelism TP, PP, CP (PP comes from config_common.sh);
  llama31_405b spells it TENSOR_MODEL_PARALLEL, PIPELINE_MODEL_PARALLEL, CONTEXT_PARALLEL.
* The DGXH100 405b configs do not set DGXNGPU; run.sub defaults it to 8.
* Global batch size: llama2_70b_lora uses MINIBS * (GPUs // (TP*PP)) // CP, llama31_405b
  uses MINIBS * (GPUs // (TP*PP*CP)). Both agree whenever the GPU count is a multiple of
  TP*PP*CP, which Megatron requires anyway, so we insist on that and use one formula.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Mapping


log = logging.getLogger(__name__)

# run.sub's own default when a config leaves DGXNGPU unset (the DGXH100 405b configs do).
DEFAULT_GPUS_PER_NODE = 8

# Helper scripts that sit beside the system configs but describe no system.
_HELPER_PREFIXES = ("config_common", "config_mounts")

_NAME_SHAPE = re.compile(
    r"^(?P<platform>[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*)_"
    r"(?P<nodes>\d+)x(?P<gpus>\d+)"
    r"(?:x(?P<minibs>\d+))?"
    r"(?:xtp(?P<tp>\d+)pp(?P<pp>\d+)(?:cp(?P<cp>\d+))?)?"
    r"(?P<variant>_.+)?$"
)

# Variables the sourcing shell itself sets; they say nothing about the config.
_SHELL_VARIABLES = frozenset({"PWD", "OLDPWD", "SHLVL", "_"})

# Each setting and the spellings the published configs use for it, preferred first.
_SPELLINGS: dict[str, tuple[str, ...]] = {
    "tp": ("TP", "TENSOR_MODEL_PARALLEL"),
    "pp": ("PP", "PIPELINE_MODEL_PARALLEL"),
    "cp": ("CP", "CONTEXT_PARALLEL"),
    "sp": ("SP", "SEQ_PARALLEL", "SEQUENCE_PARALLEL"),
}


class ImplementationError(Exception):
    """A problem with an implementation folder or one of its configs, in the user's words."""


@dataclasses.dataclass(frozen=True)
class NameShape:
    """What a config's file name promises about the system it is for."""

    platform: str
    nodes: int
    gpus_per_node: int
    minibs: int | None
    tp: int | None
    pp: int | None
    cp: int | None
    variant: str


@dataclasses.dataclass(frozen=True)
class ImplementationConfig:
    """A sourced config_<SYSTEM>.sh: the shape it launches and the environment it exports."""

    path: Path
    dgxsystem: str  # NVIDIA's DGXSYSTEM, derived from the file name as config_common.sh does
    nodes: int  # DGXNNODES
    gpus_per_node: int  # DGXNGPU
    walltime_min: int  # WALLTIME: the sbatch time limit, minutes
    walltime_runandtime_min: int  # WALLTIME_RUNANDTIME: budget of one run, minutes
    minibs: int
    tp: int
    pp: int
    cp: int
    sp: int | None
    max_steps: int | None
    lr: float | None
    gbs: int
    name_shape: NameShape | None
    env: dict[str, str]  # every exported variable, for the launch environment
    warnings: tuple[str, ...] = ()  # what bash printed on stderr while sourcing
    selected_because: str = ""  # set by pick_config

    @property
    def total_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def data_parallel(self) -> int:
        return self.total_gpus // (self.tp * self.pp * self.cp)

def dgxsystem_of(config_path: str | os.PathLike) -> str:
    """DGXSYSTEM for a config file: its name without `config_` and `.sh`."""
    name = Path(config_path).name
    if not (name.startswith("config_") and name.endswith(".sh")) or len(name) <= len("config_.sh"):
        raise ImplementationError(f"{name}: a system config must be named config_<SYSTEM>.sh")
    return name[len("config_") : -len(".sh")]


def parse_name_shape(dgxsystem: str) -> NameShape | None:
    """The shape a DGXSYSTEM name encodes, or None for a name that encodes none (e.g. a custom one)."""
    m = _NAME_SHAPE.match(dgxsystem)
    if not m:
        return None

    def opt(key: str) -> int | None:
        return int(m[key]) if m[key] is not None else None

    return NameShape(
        platform=m["platform"],
        nodes=int(m["nodes"]),
        gpus_per_node=int(m["gpus"]),
        minibs=opt("minibs"),
        tp=opt("tp"),
        pp=opt("pp"),
        cp=opt("cp"),
        variant=(m["variant"] or "")[1:],
    )


def _clean_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
    }
    if extra:
        env.update({str(k): str(v) for k, v in extra.items()})
    return env


# The config's own stdout is moved to stderr so that fd 3 carries nothing but the
# NUL-separated environment dump; `source` returns the status of the config's last command.
_SOURCE_SCRIPT = 'exec 3>&1 1>&2; source "./$1"; status=$?; env -0 >&3; exit $status'


def source_config(config_path: str | os.PathLike, env: Mapping[str, str] | None = None) -> tuple[dict[str, str], str]:
    """Source a config in a clean bash from its own folder; return (exported variables, stderr)."""
    path = Path(config_path)
    if not path.is_file():
        raise ImplementationError(f"config file not found: {path}")
    base = _clean_env(env)
    try:
        proc = subprocess.run(
            ["bash", "--noprofile", "--norc", "-c", _SOURCE_SCRIPT, "mlrepro-source", path.name],
            cwd=path.resolve().parent,
            env=base,
            capture_output=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired as exc:
        raise ImplementationError(f"{path.name}: sourcing it did not finish within 60 s") from exc
    stderr = proc.stderr.decode(errors="replace").strip()
    if proc.returncode != 0:
        raise ImplementationError(
            f"{path.name}: sourcing it in a clean bash failed (exit status {proc.returncode}).\n"
            f"bash said:\n{stderr or '(nothing on stderr)'}"
        )
    exported: dict[str, str] = {}
    for item in proc.stdout.decode(errors="replace").split("\0"):
        if "=" not in item:
            continue
        key, value = item.split("=", 1)
        if key in _SHELL_VARIABLES or base.get(key) == value and key not in (env or {}):
            continue
        exported[key] = value
    return exported, stderr


def _integer(config: str, key: str, value: str) -> int:
    try:
        number = int(value.strip())
    except ValueError:
        raise ImplementationError(f"{config}: {key}={value!r} is not a whole number") from None
    if number < 0:
        raise ImplementationError(f"{config}: {key}={value!r} must not be negative")
    return number


def _lookup(exported: Mapping[str, str], setting: str) -> tuple[str, str] | None:
    for key in _SPELLINGS[setting]:
        if exported.get(key, "") != "":
            return key, exported[key]
    return None


def _required(label: str, exported: Mapping[str, str], stderr: str) -> dict[str, tuple[str, str]]:
    """The parallelism settings as (name, value) by tp/pp/cp; an error naming every required variable left unset."""
    missing = [key for key in ("DGXNNODES", "WALLTIME_RUNANDTIME", "WALLTIME", "MINIBS") if exported.get(key, "") == ""]
    parallel: dict[str, tuple[str, str]] = {}
    for setting in ("tp", "pp", "cp"):
        found = _lookup(exported, setting)
        if found is None:
            missing.append(" or ".join(_SPELLINGS[setting]))
        else:
            parallel[setting] = found
    if missing:
        raise ImplementationError(
            f"{label}: sourcing it did not export {', '.join(missing)}; "
            "a system config must set the node count, run budget, batch size and parallelism"
            + (f".\nbash said:\n{stderr}" if stderr else "")
        )

    return parallel


def _check_values(label: str, parallel: Mapping[str, tuple[str, str]], *, nodes: int, gpus_per_node: int,
                  minibs: int, tp: int, pp: int, cp: int, runandtime: int, walltime: int) -> None:
    """Raise unless the config's numbers make a launchable run (Megatron's and run.sub's conditions)."""
    for key, value in (("DGXNNODES", nodes), ("DGXNGPU", gpus_per_node), ("MINIBS", minibs),
                       (parallel["tp"][0], tp), (parallel["pp"][0], pp), (parallel["cp"][0], cp),
                       ("WALLTIME_RUNANDTIME", runandtime), ("WALLTIME", walltime)):
        if value == 0:
            raise ImplementationError(f"{label}: {key} must be at least 1")
    total = nodes * gpus_per_node
    if total % (tp * pp * cp):
        raise ImplementationError(
            f"{label}: {nodes} nodes x {gpus_per_node} GPUs = {total} GPUs is not a multiple of "
            f"TP*PP*CP = {tp}*{pp}*{cp} = {tp * pp * cp}"
        )
    if walltime < runandtime:
        raise ImplementationError(
            f"{label}: WALLTIME={walltime} min is shorter than one run's budget WALLTIME_RUNANDTIME={runandtime} min"
        )


def read_config(config_path: str | os.PathLike, env: Mapping[str, str] | None = None) -> ImplementationConfig:
    """Source config_<SYSTEM>.sh and describe the system shape and environment it sets.

    `env` adds variables to the clean shell before sourcing (e.g. NEXP, which the
    published configs use to size WALLTIME). Raises ImplementationError when bash
    fails, a required variable is missing or malformed, or the values contradict the
    shape that the file name encodes.
    """
    path = Path(config_path)
    dgxsystem = dgxsystem_of(path)
    exported, stderr = source_config(path, env)
    label = path.name

    parallel = _required(label, exported, stderr)
    nodes = _integer(label, "DGXNNODES", exported["DGXNNODES"])
    gpn_raw = exported.get("DGXNGPU", "")
    gpus_per_node = _integer(label, "DGXNGPU", gpn_raw) if gpn_raw else DEFAULT_GPUS_PER_NODE
    walltime = _integer(label, "WALLTIME", exported["WALLTIME"])
    runandtime = _integer(label, "WALLTIME_RUNANDTIME", exported["WALLTIME_RUNANDTIME"])
    minibs = _integer(label, "MINIBS", exported["MINIBS"])
    tp, pp, cp = (_integer(label, *parallel[s]) for s in ("tp", "pp", "cp"))
    sp_found = _lookup(exported, "sp")
    sp = _integer(label, *sp_found) if sp_found else None
    max_steps = _integer(label, "MAX_STEPS", exported["MAX_STEPS"]) if exported.get("MAX_STEPS") else None
    lr = None
    if exported.get("LR"):
        try:
            lr = float(exported["LR"])
        except ValueError:
            raise ImplementationError(f"{label}: LR={exported['LR']!r} is not a number") from None

    _check_values(label, parallel, nodes=nodes, gpus_per_node=gpus_per_node, minibs=minibs, tp=tp, pp=pp, cp=cp,
                  runandtime=runandtime, walltime=walltime)
    total = nodes * gpus_per_node
    gbs = minibs * (total // (tp * pp * cp))

    sourced_system = exported.get("DGXSYSTEM")
    if sourced_system and sourced_system != dgxsystem:
        raise ImplementationError(
            f"{label}: it sets DGXSYSTEM={sourced_system!r} but its file name says {dgxsystem!r}"
        )
    shape = parse_name_shape(dgxsystem)
    if shape is not None:
        _cross_check(label, shape, {
            "nodes": ("DGXNNODES", nodes),
            "gpus_per_node": ("DGXNGPU", gpus_per_node),
            "minibs": ("MINIBS", minibs),
            "tp": (parallel["tp"][0], tp),
            "pp": (parallel["pp"][0], pp),
            "cp": (parallel["cp"][0], cp),
        })

    launch_env = dict(exported)
    launch_env["DGXSYSTEM"] = dgxsystem
    launch_env.setdefault("DGXNGPU", str(gpus_per_node))
    warnings = tuple(line for line in stderr.splitlines() if line.strip())
    for line in warnings:
        log.warning("%s: %s", label, line)
    return ImplementationConfig(
        path=path.resolve(), dgxsystem=dgxsystem, nodes=nodes, gpus_per_node=gpus_per_node,
        walltime_min=walltime, walltime_runandtime_min=runandtime, minibs=minibs,
        tp=tp, pp=pp, cp=cp, sp=sp, max_steps=max_steps, lr=lr, gbs=gbs,
        name_shape=shape, env=launch_env, warnings=warnings,
    )


def _cross_check(label: str, shape: NameShape, values: Mapping[str, tuple[str, int]]) -> None:
    problems = []
    for field, (key, actual) in values.items():
        promised = getattr(shape, field)
        if promised is not None and promised != actual:
            problems.append(f"the name says {field}={promised} but {key}={actual}")
    if problems:
        raise ImplementationError(f"{label}: file name and values disagree: " + "; ".join(problems))


def list_configs(impl_dir: str | os.PathLike) -> list[Path]:
    """The system configs of an implementation folder, sorted by name (helpers left out).

    A submission publishes one implementation folder per system (e.g.
    llama2_70b_lora/implementations/{nyx_n1,tyche_ngpu72,...}); given the folder that
    holds them, the configs of all of them are candidates, and the one chosen brings
    its own folder (run.sub, Dockerfile, scripts) along.
    """
    folder = Path(impl_dir)
    if not folder.is_dir():
        raise ImplementationError(f"implementation folder not found: {folder}")

    def configs_in(d: Path) -> list[Path]:
        return [p for p in d.glob("config_*.sh") if p.is_file() and not p.name.startswith(_HELPER_PREFIXES)]

    found = configs_in(folder)
    if not found:
        found = [p for sub in sorted(folder.iterdir()) if sub.is_dir() for p in configs_in(sub)]
    return sorted(found, key=lambda p: (p.name, str(p)))


def check_fits(config: ImplementationConfig, nodes: int, gpus_per_node: int) -> None:
    """Raise when `config` needs more nodes or GPUs per node than the system has."""
    problems = []
    if config.nodes > nodes:
        problems.append(f"{config.nodes} nodes but the system has {nodes}")
    if config.gpus_per_node > gpus_per_node:
        problems.append(f"{config.gpus_per_node} GPUs per node but the system has {gpus_per_node}")
    if problems:
        raise ImplementationError(
            f"config {config.path.name} (DGXSYSTEM {config.dgxsystem}) does not fit this system: it needs "
            + " and ".join(problems)
        )


def _resolve_requested(impl_dir: Path, requested: str) -> Path:
    candidates = [Path(requested), impl_dir / requested, impl_dir / f"config_{requested}.sh"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    wanted = {requested, f"config_{requested}.sh"}
    for config in list_configs(impl_dir):
        if config.name in wanted:
            return config
    names = ", ".join(p.name for p in list_configs(impl_dir)) or "none"
    raise ImplementationError(
        f"config {requested!r} not found in {impl_dir}; it has: {names}"
    )


def pick_config(
    impl_dir: str | os.PathLike,
    nodes: int,
    gpus_per_node: int,
    requested: str | None = None,
    env: Mapping[str, str] | None = None,
) -> ImplementationConfig:
    """The config to launch on a system of `nodes` x `gpus_per_node` GPUs.

    `requested` (a system name such as GB200_18x4x1xtp1pp1cp8, a config file name,
    or a path) wins when given, after checking that it fits. Otherwise the choice is:
    the configs whose nodes and GPUs per node equal the system's; if there are none,
    those with the same GPUs per node and fewer nodes, largest first. Ties go to the
    alphabetically first file name, so the choice never depends on directory order.
    The reason is recorded in `selected_because`.
    """
    folder = Path(impl_dir)
    if requested:
        config = read_config(_resolve_requested(folder, requested), env)
        check_fits(config, nodes, gpus_per_node)
        return dataclasses.replace(config, selected_because=f"named by the user ({requested})")

    paths = list_configs(folder)
    if not paths:
        raise ImplementationError(f"{folder} has no config_<SYSTEM>.sh files")
    configs = [read_config(p, env) for p in paths]
    exact = [c for c in configs if c.nodes == nodes and c.gpus_per_node == gpus_per_node]
    if exact:
        chosen = exact[0]
        reason = f"its shape {chosen.nodes}x{chosen.gpus_per_node} equals the system's"
        if len(exact) > 1:
            others = ", ".join(c.path.name for c in exact[1:])
            reason += f"; first by name among {len(exact)} that match (also: {others})"
    else:
        smaller = [c for c in configs if c.gpus_per_node == gpus_per_node and c.nodes <= nodes]
        if not smaller:
            listing = "; ".join(f"{c.path.name} ({c.nodes}x{c.gpus_per_node})" for c in configs)
            raise ImplementationError(
                f"no config in {folder} fits a system of {nodes} nodes x {gpus_per_node} GPUs per node; "
                f"it has: {listing}. Name one explicitly, or add a config_<SYSTEM>.sh for this shape."
            )
        smaller.sort(key=lambda c: (-c.nodes, c.path.name))
        chosen = smaller[0]
        reason = (
            f"no config matches {nodes}x{gpus_per_node} exactly; the largest that fits uses "
            f"{chosen.nodes} of the {nodes} nodes"
        )
    log.info("picked %s: %s", chosen.path.name, reason)
    return dataclasses.replace(chosen, selected_because=reason)
