"""What a reproduction is compared with: the published result, scored like the user's runs.

For a benchmark whose implementation comes from an MLPerf results repository at a pinned
commit (NVIDIA's training_results_v5.0), the submitter's own logs of the chosen system sit
in the same repository, ``<submitter>/results/<system>/<benchmark>/result_*.txt``, next to
``<submitter>/systems/<system>.json``. They are fetched at the same commit and scored with
mlrepro.scoring.score, the scorer of the user's runs, so the reference is MLCommons' number for
that system (llama2_70b_lora on one DGX B200: 11.275 min), never a typed-in figure.

The implementation folders of such a repository are named after the published systems
(``implementations/nyx_n1_ngc25.04_nemo`` holds the config of ``results/nyx_n1_ngc25.04_nemo``),
so the chosen config names its published result. When the user's system differs from it,
or the config is not one the submitter published, the nearest published system is used and
the differences are listed.

A benchmark without a published counterpart (the miniatures) may ship reference runs from a
known-good machine (`reference.runs` in its config); otherwise it has no reference at all.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

from mlrepro.implementation import fetch as implementation
from mlrepro.scoring import score as scoring
from mlrepro.scoring.logs import collect_logs
from mlrepro.scoring.rules import Rules

# How each kind of reference is described to the reader.
PUBLISHED = "published"
REFERENCE_RUNS = "reference runs"
NONE = "none"


class ReferenceError(ValueError):
    """The reference cannot be found where the configuration says it is."""


def submission_parts(folder: str) -> tuple[str, str]:
    """(submitter, benchmark) of an implementations folder such as
    ``NVIDIA/benchmarks/llama2_70b_lora/implementations``."""
    parts = Path(folder.strip("/")).parts
    if len(parts) < 4 or parts[1] != "benchmarks" or parts[3] != "implementations":
        raise ReferenceError(f"{folder!r} is not <submitter>/benchmarks/<benchmark>/implementations of an MLPerf "
                             "results repository, so it names no published result")
    return parts[0], parts[2]


def _int(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def published_shape(desc: dict) -> tuple[int | None, int | None]:
    """(nodes, accelerators per node) of a submission's system description."""
    return _int(desc.get("number_of_nodes")), _int(desc.get("accelerators_per_node"))


def same_accelerator(yours: str | None, published: str | None) -> bool:
    """Whether two accelerator names name the same model ("NVIDIA B200" and
    "NVIDIA Blackwell GPU (B200-SXM-180GB)" do; B200 and GB200 do not)."""
    def models(name: str | None) -> set[str]:
        return {t for t in re.findall(r"[a-z0-9]+", str(name or "").lower()) if re.search(r"[a-z]", t)
                and re.search(r"\d", t) and not t.endswith(("gb", "mib", "gib"))}

    return bool(models(yours) & models(published))


def choose_published(chosen_system: str, nodes: int, gpus_per_node: int, accelerator: str | None,
                     published: dict[str, dict]) -> dict:
    """Which published system the user's runs are compared with, and how it differs.

    `chosen_system` is the folder of the implementation config in use, `nodes` x
    `gpus_per_node` the user's shape, `accelerator` the user's accelerator model (if
    known), `published` maps each published system name to its systems/<name>.json.
    The config's own folder wins when it was published; otherwise the published system
    with the closest GPU count (ties: the same accelerator, then the name) is taken.
    """
    if not published:
        raise ReferenceError("the submission publishes no systems")
    gpus = nodes * gpus_per_node
    if chosen_system in published:
        name, because = chosen_system, f"the implementation config in use ({chosen_system}) is the published one"
    else:
        def distance(item: tuple[str, dict]) -> tuple[float, int, str]:
            n, g = published_shape(item[1])
            total = (n or 0) * (g or 0)
            far = abs(math.log(total / gpus)) if total > 0 and gpus > 0 else math.inf
            same_accel = 0 if same_accelerator(accelerator, item[1].get("accelerator_model_name")) else 1
            return far, same_accel, item[0]

        name = min(published.items(), key=distance)[0]
        because = (f"the implementation config in use ({chosen_system}) was not published; {name} is the published "
                   f"system nearest in GPU count")
    desc = published[name]
    pub_nodes, pub_gpus = published_shape(desc)
    differences = []
    if name != chosen_system:
        differences.append(f"config: yours from {chosen_system}, published from {name}")
    if (pub_nodes, pub_gpus) != (nodes, gpus_per_node):
        differences.append(f"shape: yours {nodes} nodes x {gpus_per_node} GPUs = {gpus} GPUs, published "
                           f"{pub_nodes} x {pub_gpus} = {(pub_nodes or 0) * (pub_gpus or 0)} GPUs")
    pub_accel = str(desc.get("accelerator_model_name") or "")
    if accelerator and not same_accelerator(accelerator, pub_accel):
        differences.append(f"accelerator: yours {accelerator}, published {pub_accel}")
    return {"system": name, "exact": not differences, "because": because, "differences": differences}


def score_reference(logs: Iterable[str | os.PathLike], rules: Rules) -> dict:
    """The reference runs scored exactly as the user's runs are (score_runs, compliance included)."""
    logs = list(logs)
    if not logs:
        raise ReferenceError("no reference logs to score")
    return scoring.score_runs(logs, rules)


def _log_files(folder: Path) -> list[Path]:
    files, notes = collect_logs([folder])
    if not files:
        raise ReferenceError(f"no MLLOG logs in {folder}" + (f" ({'; '.join(notes)})" if notes else ""))
    return files


def fetch_published(git: dict, chosen_system: str, nodes: int, gpus_per_node: int, accelerator: str | None,
                    rules: Rules, dest: Path) -> dict:
    """Fetch the submitter's systems and the chosen system's result logs at the pinned commit; score them."""
    submitter, benchmark = submission_parts(git["folder"])
    try:
        systems_dir = implementation.fetch_implementation(git["url"], git["commit"], f"{submitter}/systems",
                                                          dest / "systems")
    except implementation.FetchError as exc:
        # A repository that publishes no results (an implementation-only fork) is a fact, not a
        # failure; anything else (no network) must fail, or a missing reference would be cached.
        if "has no folder" not in str(exc):
            raise
        return no_reference(benchmark, f"{git['url']} at {git['commit']} publishes no {submitter}/systems, so "
                                       "there is no published result to compare with")
    published = {p.stem: json.loads(p.read_text()) for p in sorted(systems_dir.glob("*.json"))}
    match = choose_published(chosen_system, nodes, gpus_per_node, accelerator, published)
    results_folder = f"{submitter}/results/{match['system']}/{benchmark}"
    try:
        logs_dir = implementation.fetch_implementation(git["url"], git["commit"], results_folder, dest / "results")
    except implementation.FetchError as exc:
        if "has no folder" not in str(exc):
            raise
        return no_reference(benchmark, f"{git['url']} at {git['commit']} has no {results_folder}")
    return {
        "kind": PUBLISHED,
        "label": f"{submitter} {match['system']} (published)",
        "source": {"url": git["url"], "commit": git["commit"], "folder": results_folder},
        "submitter": submitter,
        "system": match["system"],
        "match": match,
        "system_desc": published[match["system"]],
        "score": score_reference(_log_files(logs_dir), rules),
    }


def local_reference(runs: Path, rules: Rules, description: str) -> dict:
    """Reference runs shipped with a benchmark (a known-good machine's logs, not an MLPerf publication).

    Beside the logs, `system.json` describes that machine and `environment.json` holds its
    container.json, when present.
    """
    if not runs.is_dir():
        raise ReferenceError(f"reference runs folder {runs} does not exist")

    def read(name: str) -> dict:
        path = runs / name
        return json.loads(path.read_text()) if path.is_file() else {}

    return {
        "kind": REFERENCE_RUNS,
        "label": description or f"reference runs in {runs.name}",
        "source": {"folder": str(runs)},
        "submitter": None,
        "system": read("system.json").get("system_name"),
        "match": {"exact": None, "because": "no published MLPerf result exists for this benchmark; "
                  "reference runs from a known-good machine stand in", "differences": []},
        "system_desc": read("system.json"),
        "environment": read("environment.json"),
        "score": score_reference(_log_files(runs), rules),
    }


def no_reference(benchmark: str, why: str | None = None) -> dict:
    why = why or f"{benchmark} has no published result and ships no reference runs"
    return {"kind": NONE, "label": "none",
            "match": {"exact": None, "because": f"{why}: its seeds are compared with each other only",
                      "differences": []},
            "score": None}
