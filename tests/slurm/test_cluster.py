"""mlrepro cluster: the generated configuration, and the real cluster's idempotence."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mlrepro.slurm import testcluster as cluster


def conf_lines(text: str, key: str) -> list[dict[str, str]]:
    """Lines of a Slurm config that start with KEY=, as dicts of their KEY=value words."""
    rows = []
    for line in text.splitlines():
        if line.startswith(f"{key}="):
            rows.append(dict(word.split("=", 1) for word in line.split()))
    return rows


def settings(text: str) -> dict[str, str]:
    return {line.split("=", 1)[0]: line.split("=", 1)[1] for line in text.splitlines()
            if "=" in line and not line.startswith("#") and " " not in line}


def test_slurm_conf_declares_two_nodes_with_four_gpus_each(tmp_path):
    layout = cluster.Layout(tmp_path)
    text = cluster.slurm_conf_text(layout, "myhost")
    nodes = conf_lines(text, "NodeName")
    assert [n["NodeName"] for n in nodes] == ["node1", "node2"]
    assert {n["Port"] for n in nodes} == {"17001", "17002"}
    assert all(n["Gres"] == "gpu:4" and n["NodeHostname"] == "myhost" and n["NodeAddr"] == "127.0.0.1"
               and n["CPUs"] == "8" for n in nodes)
    (partition,) = conf_lines(text, "PartitionName")
    assert partition["PartitionName"] == "debug" and partition["Nodes"] == "node1,node2"
    assert partition["Default"] == "YES"
    conf = settings(text)
    assert conf["SlurmdParameters"] == "config_overrides"
    assert conf["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert conf["ProctrackType"] == "proctrack/linuxproc" and conf["TaskPlugin"] == "task/none"
    assert conf["SelectType"] == "select/cons_tres" and conf["GresTypes"] == "gpu"
    assert conf["SlurmctldHost"] == "myhost(127.0.0.1)"
    # everything the daemons write goes under the state folder
    for key in ("StateSaveLocation", "SlurmdSpoolDir", "SlurmctldPidFile", "SlurmdPidFile", "SlurmctldLogFile"):
        assert conf[key].startswith(str(tmp_path)), key


def test_gres_conf_points_each_node_at_its_own_gpu_files(tmp_path):
    text = cluster.gres_conf_text(cluster.Layout(tmp_path))
    assert "AutoDetect=off" in text.splitlines()
    lines = conf_lines(text, "NodeName")
    assert [(g["NodeName"], g["Name"]) for g in lines] == [("node1", "gpu"), ("node2", "gpu")]
    assert lines[0]["File"] == f"{tmp_path}/gpus/node1/gpu[0-3]"


def test_slurmdbd_conf_uses_the_private_mariadb(tmp_path):
    conf = settings(cluster.slurmdbd_conf_text(cluster.Layout(tmp_path), "s3cret"))
    assert conf["StorageType"] == "accounting_storage/mysql"
    assert conf["StoragePort"] == str(cluster.MARIADB_PORT) and conf["StoragePass"] == "s3cret"


def test_etc_links_back_up_and_restore_a_foreign_config(tmp_path, monkeypatch):
    etc = tmp_path / "etc-slurm"
    etc.mkdir()
    (etc / "slurm.conf").write_text("ClusterName=theirs\n")
    monkeypatch.setattr(cluster, "SLURM_ETC", etc)
    layout = cluster.Layout(tmp_path / "state")
    layout.etc.mkdir(parents=True)
    for name in ("slurm.conf", "gres.conf", "slurmdbd.conf"):
        (layout.etc / name).write_text(f"# ours: {name}\n")

    cluster.link_etc_slurm(layout)
    cluster.link_etc_slurm(layout)  # twice: still one backup, still our links
    assert (etc / "slurm.conf").read_text() == "# ours: slurm.conf\n"
    assert (etc / "gres.conf").is_symlink()
    assert (layout.etc_backup / "slurm.conf").read_text() == "ClusterName=theirs\n"

    cluster.unlink_etc_slurm(layout)
    assert (etc / "slurm.conf").read_text() == "ClusterName=theirs\n"
    assert not (etc / "slurm.conf").is_symlink()
    assert not (etc / "gres.conf").exists() and not (etc / "slurmdbd.conf").exists()


def test_running_pid_ignores_stale_and_foreign_pid_files(tmp_path):
    layout = cluster.Layout(tmp_path)
    layout.run.mkdir()
    layout.pid_file("slurmctld").write_text(f"{os.getpid()}\n")  # alive, but python, not slurmctld
    assert cluster.running_pid(layout, "slurmctld") is None
    proc = subprocess.Popen(["true"])
    proc.wait()
    layout.pid_file("slurmdbd").write_text(f"{proc.pid}\n")  # gone
    assert cluster.running_pid(layout, "slurmdbd") is None


def mlrepro(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlrepro", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture
def cluster_up(slurm_cluster):
    return slurm_cluster


@pytest.mark.slurm
def test_second_up_is_fast_and_status_shows_idle_nodes(cluster_up):
    t0 = time.monotonic()
    again = mlrepro("cluster", "up")
    took = time.monotonic() - t0
    assert again.returncode == 0, again.stderr
    assert took < 20, f"a second `cluster up` took {took:.1f} s"
    status = mlrepro("cluster", "status", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    rows = [line.split() for line in status.stdout.splitlines() if line.startswith("node")]
    # other tests may have jobs on the nodes: in service is what counts
    assert [(r[0], r[5]) for r in rows] == [("node1", "gpu:4"), ("node2", "gpu:4")]
    assert all(r[2] in ("idle", "mixed", "allocated", "completing") for r in rows), rows
    assert "accounting (sacct): answers" in status.stdout
    assert Path("/etc/slurm/slurm.conf").resolve() == (cluster.state_dir_from_env() / "etc" / "slurm.conf").resolve()


@pytest.mark.slurm
def test_down_of_another_state_folder_leaves_the_cluster_alone(cluster_up, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mlrepro", "cluster", "down"], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, MLREPRO_CLUSTER_DIR=str(tmp_path / "other")))
    assert proc.returncode == 0, proc.stderr
    assert "stopped nothing" in proc.stderr
    assert Path("/etc/slurm/slurm.conf").is_symlink()
    sinfo = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=60)
    assert sinfo.returncode == 0 and len(sinfo.stdout.split()) == 4


def test_cli_rejects_an_unknown_action():
    proc = mlrepro("cluster", "sideways", timeout=60)
    assert proc.returncode == 2 and "invalid choice" in proc.stderr
