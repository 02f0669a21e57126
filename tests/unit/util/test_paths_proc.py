"""mlrepro.paths (paths and record readers) and mlrepro.util.proc (the one command runner), on real files and processes."""

from __future__ import annotations

import sys

import pytest

from mlrepro import paths
from mlrepro.util import proc


def test_seed_folders_are_found_and_named_in_one_place(tmp_path):
    for name in ("seed_3", "seed_10", "seed_x", "notes"):
        (tmp_path / "results" / "b" / name).mkdir(parents=True)
    (tmp_path / "results" / "b" / "seed_4").write_text("a file, not a seed folder")
    assert paths.seed_dirs(tmp_path / "results" / "b") == {3: tmp_path / "results/b/seed_3",
                                                             10: tmp_path / "results/b/seed_10"}
    assert paths.seed_dir(tmp_path, "b", 7) == tmp_path / "results/b/seed_7"
    assert paths.seed_file_pattern("run.json") == "results/{benchmark}/seed_{seed}/run.json"
    assert paths.seed_files("b", (1, 2), "mllog.txt") == ["results/b/seed_1/mllog.txt", "results/b/seed_2/mllog.txt"]


def test_a_missing_or_half_written_record_reads_as_none(tmp_path):
    assert paths.read_json_if_exists(tmp_path / "job.json") is None
    (tmp_path / "job.json").write_text('{"job_id": "12')
    assert paths.read_job(tmp_path) is None
    (tmp_path / "failure.json").write_text('{"reason": "timeout"}')
    assert paths.read_failure(tmp_path) == {"reason": "timeout"}
    (tmp_path / "failure.json").write_text('["not", "an", "object"]')
    assert paths.read_failure(tmp_path) is None


def test_what_a_system_measured_lives_under_results_by_system(tmp_path):
    assert paths.preflight_json(tmp_path, "h100") == tmp_path / "results/preflight/h100/preflight.json"
    assert paths.baseline_json(tmp_path, "h100") == tmp_path / "results/baseline/h100/baseline.json"
    assert paths.preflight_files(tmp_path, "h100", "b")[0] == paths.preflight_json(tmp_path, "h100")


def test_the_image_a_job_runs_in(tmp_path):
    podman = {"runtime": "podman", "tag": "mlrepro/b:x", "push": {"ref": "registry/b:x"}}
    assert paths.container_image(podman, pushed=False) == "mlrepro/b:x"  # on this host: the built tag
    assert paths.container_image(podman, pushed=True) == "registry/b:x"  # on compute nodes: the pushed copy
    enroot = {**podman, "sqsh": {"path": "/r/image.sqsh"}}
    assert paths.container_image(enroot, pushed=True) == "/r/image.sqsh"
    assert paths.container_image({"runtime": "none"}, pushed=True) is None
    assert paths.container_image({}, pushed=False) is None
    bench = tmp_path / "results" / "b"
    bench.mkdir(parents=True)
    (bench / "container.json").write_text('{"runtime": "podman", "tag": "t"}')
    assert paths.read_container(tmp_path, "b") == {"runtime": "podman", "tag": "t"}
    assert paths.read_container(tmp_path, "other") == {}


class ToolError(Exception):
    pass


def test_a_failure_raises_the_callers_error_with_secrets_redacted():
    env = {"PATH": "/usr/bin:/bin", "HF_TOKEN": "hf_secretvalue_123456"}
    code = "import os, sys; print('token is', os.environ['HF_TOKEN'], file=sys.stderr); sys.exit(3)"
    with pytest.raises(ToolError) as caught:
        proc.run([sys.executable, "-c", code], error=ToolError, env=env, what="the tool", timeout=60)
    message = str(caught.value)
    assert message.startswith("the tool failed (exit 3): token is ")
    assert "hf_secretvalue_123456" not in message and "hf_secretvalue_123456" not in caught.value.stderr
    done = proc.run([sys.executable, "-c", "print('ok')"], error=ToolError, timeout=60)
    assert done.stdout == "ok\n"
    assert proc.run([sys.executable, "-c", "raise SystemExit(5)"], check=False, timeout=60).returncode == 5


def test_a_missing_program_or_a_hang_is_the_callers_error():
    with pytest.raises(ToolError, match="no-such-program-xyz is not installed"):
        proc.run(["no-such-program-xyz"], error=ToolError)
    with pytest.raises(ToolError, match="did not finish within 1 s"):
        proc.run([sys.executable, "-c", "import time; time.sleep(30)"], error=ToolError, timeout=1)


def test_a_streamed_log_is_redacted_and_a_failure_names_it(tmp_path):
    log = tmp_path / "logs" / "download.log"
    code = "import os; print('got', os.environ['MY_API_KEY']); raise SystemExit(2)"
    with pytest.raises(ToolError, match=f"failed with exit status 2; see {log}"):
        proc.run_logged([sys.executable, "-c", code], env={"MY_API_KEY": "k3y-value-98765"}, log_path=log,
                        error=ToolError)
    text = log.read_text()
    assert "got ***" in text and "k3y-value-98765" not in text
