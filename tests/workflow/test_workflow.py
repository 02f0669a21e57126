"""The real snakemake on the real miniature: the whole DAG, reruns, kills, bad config.

One workspace runs the full 10-seed pipeline once (module fixture); the tests around it
check what a user relies on: a second invocation runs nothing, a deleted seed is the only
one recomputed, a killed workflow leaves no target a rerun would trust.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from workspace import make_workspace, planned_jobs, run_snakemake, snakemake_cmd

# The module's workspace runs the 10-seed miniature through four invocations (three of them killed):
# its setup is charged to the first test that uses it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

TARGET = "results/mini_lora/score.json"
PROFILE = ("--profile", "profiles/local")


def test_bad_config_stops_before_any_job(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    bench = ws / "config" / "benchmarks" / "mini_lora.yaml"
    data = yaml.safe_load(bench.read_text())
    data["required_runs"] = -3
    bench.write_text(yaml.safe_dump(data))
    proc = run_snakemake(ws, *PROFILE, TARGET, check=False, timeout=120)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "config/benchmarks/mini_lora.yaml" in out and "required_runs: -3" in out
    assert not (ws / "results").exists() and not (ws / "resources").exists()


def test_dry_run_plans_one_job_per_seed(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    proc = run_snakemake(ws, *PROFILE, TARGET, "-n", timeout=120)
    jobs = planned_jobs(proc.stdout)
    assert jobs["train_seed"] == 10 and jobs["score_seed"] == 10
    assert jobs["dataset"] == 1 and jobs["base_checkpoint"] == 1 and jobs["score"] == 1
    # the plan says what each seed will be given
    assert proc.stdout.count("1 node x 2 GPUs (CPU_1x2x8xtp1pp1cp1)") == 10
    assert not (ws / "results").exists()


# Secrets of every shape are exported for the whole run: none may end up in any file.
SECRETS = {
    "HF_TOKEN": "hf_wf_Secret_0a1b2c3d4e5f",
    "WANDB_API_KEY": "wandb 0123 with spaces",
    "DB_PASSWORD": "it's a \"quoted\" pass",
    "NPM_AUTH": "npm-auth-$(id)-`x`",
    "GH_PAT": "ghp_shortish",
}
# The trainer logs SUBMISSION_ORG in its MLLOG stream: set to a secret, it must come out
# redacted in run.log and mllog.txt, which must stay valid MLLOG.
ENV = {**SECRETS, "SUBMISSION_ORG": SECRETS["HF_TOKEN"]}


def _training(results: Path) -> Path | None:
    """A seed folder whose current attempt is training (run_start in its log) and not done."""
    for log in results.glob("seed_*/attempt_*/run.log"):
        seed_dir = log.parent.parent
        if '"run_start"' in log.read_text(errors="replace") and not (seed_dir / "mllog.txt").exists():
            return seed_dir
    return None


def _run_processes(ws: Path) -> list[str]:
    """Live processes of a workflow run in `ws` (tagged by its guard, mlrepro.launch.guard)."""
    from mlrepro.launch import guard

    found = []
    for entry in os.scandir("/proc"):
        try:
            env = Path(entry.path, "environ").read_bytes() if entry.name.isdigit() else b""
            if f"{guard.RUN_MARKER}=".encode() in env and str(ws) in os.readlink(Path(entry.path, "cwd")):
                command = Path(entry.path, "cmdline").read_bytes().replace(bytes(1), b" ")[:80]
                found.append(f"{entry.name} {command!r}")
        except OSError:
            continue
    return found


def _stop(ws: Path, signum: int, when, target: str = TARGET, timeout: float = 900, group: bool = True) -> dict:
    """Start the workflow and send `signum` once `when(results)` gives something (a seed folder, a
    stage): to its whole process group, or (`group=False`) to snakemake's own process alone, as a
    killed head-node process or an OOM kill does. What was running before, and what is left after."""
    from mlrepro.util import proctree

    proc = subprocess.Popen(snakemake_cmd(*PROFILE, target), cwd=ws, env={**os.environ, **ENV},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    results = ws / "results" / "mini_lora"
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None and (mid := when(results)) is None:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()
        marker = proctree.seed_marker(mid) if isinstance(mid, Path) else ""
        ranks = [p for p in proctree.find(marker) if "train.py" in p.command] if marker else []
        if group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)
        proc.wait(timeout=120)
        killed = time.monotonic()
        # SIGINT: the seed stops its processes itself; SIGKILL: the run's guard does, within a second.
        while ((left := proctree.find(marker) if marker else []) or _run_processes(ws)) \
                and time.monotonic() < killed + 15:
            time.sleep(0.2)
        return {"seed_dir": mid, "ranks": ranks, "left": left, "run_left": _run_processes(ws),
                "gone_after_s": time.monotonic() - killed}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _stop_mid_seed(ws: Path, signum: int, target: str = TARGET, timeout: float = 600, group: bool = True) -> dict:
    return _stop(ws, signum, _training, target, timeout, group)


def _checkpoint_running(results: Path):
    """The base checkpoint's stage, once it runs (its log is written as it starts)."""
    log = results.parent.parent / "logs" / "mini_lora" / "checkpoint.log"
    return "base_checkpoint" if log.exists() and not (results.parent.parent / "resources" / "mini_lora" /
                                                      "checkpoint" / "manifest.json").exists() else None


def _seed_finished_since(before: set):
    """A seed whose mllog.txt appeared after `before` was taken: the moment between two seeds."""
    def when(results: Path):
        return next((p.parent for p in results.glob("seed_*/mllog.txt") if p.parent not in before), None)
    return when


def _data_files(ws: Path) -> dict:
    """The data stages' files (not the stamp each seed's check of them rewrites)."""
    from mlrepro.data import manifest

    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in (ws / "resources" / "mini_lora").rglob("*")
            if p.is_file() and ".partial" not in str(p) and p.name != manifest.VERIFIED_STAMP}


def _attempts(results: Path) -> dict:
    return {p.name: sorted(a.name for a in p.glob("attempt_*")) for p in results.glob("seed_*")}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A workspace whose snakemake's process (alone, not its group) was killed in data preparation,
    mid-seed and between two seeds, each time rerun with the README's plain command, the last time
    to the end."""
    ws = make_workspace(tmp_path_factory.mktemp("mini") / "ws", quick=True)
    results = ws / "results" / "mini_lora"
    kills = {"data": _stop(ws, signal.SIGKILL, _checkpoint_running, group=False)}
    killed = kills["seed"] = _stop_mid_seed(ws, signal.SIGKILL, group=False)
    data = _data_files(ws)  # the data stages finished before any seed started
    mid = killed["seed_dir"]
    time.sleep(1)  # anything the kill left running would write now
    done = sorted(int(p.parent.name.split("_")[1]) for p in results.glob("seed_*/mllog.txt"))
    killed.update({"had_mllog": (mid / "mllog.txt").exists(), "done": done})
    # The dataset and checkpoint finished before any seed started; they must be trusted.
    killed["plan_after_kill"] = planned_jobs(run_snakemake(ws, *PROFILE, TARGET, "-n").stdout)
    before = {p.parent for p in results.glob("seed_*/mllog.txt")}
    kills["between"] = _stop(ws, signal.SIGKILL, _seed_finished_since(before), group=False)
    finished_at_kill = {p.parent.name: p.read_text() for p in results.glob("seed_*/mllog.txt")}
    attempts_at_kill = _attempts(results)
    started = time.monotonic()
    # The README's command: no --unlock, no --rerun-incomplete.
    run = run_snakemake(ws, *PROFILE, TARGET, "results/mini_lora/report.html", "results/report.html", env=ENV)
    return {"ws": ws, "killed": killed, "run": run, "seconds": time.monotonic() - started, "kills": kills,
            "data": data, "finished_at_kill": finished_at_kill, "attempts_at_kill": attempts_at_kill}


def test_killing_snakemakes_process_alone_leaves_nothing_and_the_plain_rerun_keeps_what_finished(finished):
    """Issue 26 items 5-7: a kill of snakemake's process (not its group) in data preparation, in a
    seed and between seeds left the run's processes alive and its lock; the plain rerun was refused
    (incomplete files), showed "1 of 1 steps done" with no score (ancient() hid the seeds behind a
    redone data stage), retrained finished seeds or downloaded finished data again."""
    ws, kills = finished["ws"], finished["kills"]
    results = ws / "results" / "mini_lora"
    for where, kill in kills.items():
        assert kill["run_left"] == [] and kill["left"] == [], f"kill in {where}: {kill}"
        assert kill["gone_after_s"] < 5, f"kill in {where}: processes lived {kill['gone_after_s']:.1f} s"
    assert kills["seed"]["ranks"], "the seed's torchrun ranks were not found while it trained"
    # No finished seed was trained again (the one caught between two seeds included), none overwritten.
    for name, text in finished["finished_at_kill"].items():
        assert (results / name / "mllog.txt").read_text() == text
        assert _attempts(results)[name] == finished["attempts_at_kill"][name], f"{name} was trained again"
    assert kills["between"]["seed_dir"].name in finished["finished_at_kill"]
    assert _data_files(ws) == finished["data"], "a finished data stage was done again"
    assert json.loads((ws / TARGET).read_text())["valid"] is True


def test_killed_seed_leaves_no_rank_and_its_rerun_logs_one_run(finished):
    killed = finished["killed"]
    assert killed["ranks"], "the seed's torchrun ranks were not found while it trained"
    assert killed["left"] == [], f"processes of the killed seed survived: {killed['left']}"
    seed_dir = killed["seed_dir"]
    assert sorted(p.name for p in seed_dir.glob("attempt_*")) == ["attempt_1", "attempt_2"]
    last = (seed_dir / "attempt_2" / "run.log").read_text()
    assert last.count('"run_start"') == 1 and last.count('"run_stop"') == 1
    assert (seed_dir / "run.log").read_text() == last
    mllog = (seed_dir / "mllog.txt").read_text()
    assert mllog.count('"run_start"') == 1 and mllog.count('"run_stop"') == 1


def test_no_file_holds_a_secret_and_every_file_is_private(finished):
    ws = finished["ws"]
    forms = {f for v in SECRETS.values() for f in (v, shlex.quote(v), json.dumps(v)[1:-1])}
    checked = 0
    for top in ("results", "resources", "logs", ".snakemake"):
        root = ws / top
        assert stat.S_IMODE(root.stat().st_mode) & 0o077 == 0, f"{root} is open to others"
        for path in root.rglob("*"):
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            checked += 1
            for form in forms:
                assert form.encode() not in data, f"a secret ({form[:6]}...) is in {path}"
            # snakemake makes .snakemake/log before it reads the Snakefile: shut in by the folder's mode
            if top != ".snakemake":
                mode = stat.S_IMODE(path.stat().st_mode)
                assert mode & 0o077 == 0, f"{path} has mode {oct(mode)}"
    assert checked > 50
    assert list((ws / "results/mini_lora").glob("seed_*/attempt_*/.submitit/*_submitted.pkl"))
    mllog = (ws / "results/mini_lora/seed_1/mllog.txt").read_text()
    assert '"key": "submission_org", "value": "***"' in mllog


def test_kill_mid_seed_leaves_no_trusted_target(finished):
    killed = finished["killed"]
    assert not killed["had_mllog"], "a killed seed left mllog.txt behind"
    plan = killed["plan_after_kill"]
    assert plan.get("train_seed") == 10 - len(killed["done"])
    assert "dataset" not in plan and "base_checkpoint" not in plan


def test_full_run_scores_ten_seeds(finished):
    ws = finished["ws"]
    score = json.loads((ws / TARGET).read_text())
    runs = score["runs"]
    assert len(runs) == 10
    assert sorted(r["seed"] for r in runs) == list(range(1, 11))
    converged = [r for r in runs if r["converged"]]
    assert len(converged) >= 9
    minutes = sorted(r["minutes"] for r in runs if r["converged"])
    assert score["valid"] is True
    # olympic mean by the rule: drop the fastest and slowest of the 10 times
    times = sorted(r["minutes"] if r["converged"] else float("inf") for r in runs)
    assert score["olympic_minutes"] == pytest.approx(sum(times[1:-1]) / 8, rel=1e-6)
    assert len(set(minutes)) > 1, "seeds should differ in time to train"
    for seed in range(1, 11):
        seed_dir = ws / "results" / "mini_lora" / f"seed_{seed}"
        assert ":::MLLOG" in (seed_dir / "mllog.txt").read_text()
        assert not (seed_dir / "failure.json").exists()
    manifest = json.loads((ws / "resources/mini_lora/checkpoint/manifest.json").read_text())
    assert any(f["path"].endswith(".safetensors") for f in manifest["files"])
    assert (ws / "results/mini_lora/report.html").stat().st_size > 1000


def test_second_invocation_runs_nothing(finished):
    ws = finished["ws"]
    for target in ((TARGET,), ()):  # the score, and the default target (every configured benchmark)
        proc = run_snakemake(ws, *PROFILE, *target, "-n")
        assert planned_jobs(proc.stdout) == {}
        assert "Nothing to be done" in proc.stdout + proc.stderr


def test_deleted_seed_is_the_only_one_recomputed(finished):
    """README's rerun: delete a seed's folder, run the card's explicit target: that seed, the
    score and the report run again, nothing else (and the default target plans the same)."""
    import shutil

    ws = finished["ws"]
    results = ws / "results" / "mini_lora"
    others = {p: p.stat().st_mtime_ns for p in results.glob("seed_*/mllog.txt") if "seed_4" not in str(p)}
    report = (results / "report.html").stat().st_mtime_ns
    shutil.rmtree(results / "seed_4")
    status = subprocess.run([sys.executable, "-m", "mlrepro", "status", "results/mini_lora", "--no-slurm"], cwd=ws,
                            capture_output=True, text=True, timeout=120)
    assert re.search(r"^4\s+missing\b", status.stdout, flags=re.M), status.stdout
    assert "10 seeds: 9 done, 1 missing" in status.stdout, status.stdout
    assert planned_jobs(run_snakemake(ws, *PROFILE, "-n").stdout) == {"train_seed": 1, "score_seed": 1, "score": 1,
                                                                     "final_report": 1, "all": 1}
    assert planned_jobs(run_snakemake(ws, *PROFILE, TARGET, "-n").stdout) == {"train_seed": 1, "score_seed": 1,
                                                                             "score": 1}
    run_snakemake(ws, *PROFILE, TARGET)
    assert (results / "seed_4" / "mllog.txt").exists()
    assert {p: p.stat().st_mtime_ns for p in others} == others
    assert (results / "report.html").stat().st_mtime_ns > report
    assert 4 in [r["seed"] for r in json.loads((ws / TARGET).read_text())["runs"]]
    # The benchmark's own target is complete; the default one only brings the final report
    # (every benchmark's verdict) up to date, and then neither plans anything.
    assert planned_jobs(run_snakemake(ws, *PROFILE, TARGET, "-n").stdout) == {}
    assert planned_jobs(run_snakemake(ws, *PROFILE, "-n").stdout) == {"final_report": 1, "all": 1}
    run_snakemake(ws, *PROFILE)
    for target in ((TARGET,), ()):
        assert planned_jobs(run_snakemake(ws, *PROFILE, *target, "-n").stdout) == {}


def test_snakemake_report_includes_score_and_plots(finished, tmp_path):
    import zipfile

    ws = finished["ws"]
    run_snakemake(ws, *PROFILE, "results/mini_lora/report.html", "--report", str(tmp_path / "report.zip"))
    names = [Path(n).name for n in zipfile.ZipFile(tmp_path / "report.zip").namelist()]
    for item in ("score.json", "report.html", "convergence.svg", "time_to_train.svg"):
        assert item in names, f"{item} missing from snakemake --report"


def test_fresh_checkout_reusing_resources_runs_its_seeds(finished, tmp_path):
    """Issue 15 item 5: a new checkout (every file newer than the results it is given) with an
    existing resources/ and container.json rebuilt only the container and exited 0 with no seed,
    score or report: the rebuilt container hid, behind ancient() inputs, the seeds that were missing."""
    import shutil

    old = finished["ws"]
    ws = make_workspace(tmp_path / "fresh", quick=True)
    for path in (ws / "implementations").rglob("*"):
        os.utime(path)  # a git checkout writes every file now
    shutil.copytree(old / "resources", ws / "resources")  # copy2: the old times stay
    (ws / "results" / "mini_lora").mkdir(parents=True)
    shutil.copy2(old / "results" / "mini_lora" / "container.json", ws / "results" / "mini_lora" / "container.json")
    bench = ws / "config" / "benchmarks" / "mini_lora.yaml"
    bench.write_text(bench.read_text().replace("required_runs: 10", "required_runs: 1"))
    manifests = {p: p.stat().st_mtime_ns for p in (ws / "resources" / "mini_lora").glob("*/manifest.json")}
    assert len(manifests) == 2
    proc = run_snakemake(ws, *PROFILE)
    results = ws / "results" / "mini_lora"
    for target in ("seed_1/run.json", "score.json", "report.html"):
        assert (results / target).exists(), f"{target} missing after exit 0:\n{proc.stderr[-3000:]}"
    assert "container" in proc.stderr  # the container was rebuilt, and the DAG looked again after it
    assert {p: p.stat().st_mtime_ns for p in manifests} == manifests, "the dataset or checkpoint was redone"


# Last: it leaves a seed unfinished.
def test_ctrl_c_leaves_no_train_py(finished):
    import shutil

    ws = finished["ws"]
    shutil.rmtree(ws / "results" / "mini_lora" / "seed_2")
    stopped = _stop_mid_seed(ws, signal.SIGINT, "results/mini_lora/seed_2/mllog.txt")
    assert stopped["ranks"], "the seed's torchrun ranks were not found while it trained"
    assert stopped["left"] == [], f"processes left after Ctrl-C: {stopped['left']}"
