"""Implementation configs (config_<SYSTEM>.sh) and fetching an implementation at a pinned commit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mlrepro.implementation.configs import (
    ImplementationError,
    check_fits,
    list_configs,
    parse_name_shape,
    pick_config,
    read_config,
)
from mlrepro.implementation.fetch import FetchError, fetch_implementation
import workspace

REPO_ROOT = workspace.REPO
FIXTURES = workspace.FIXTURES / "nvidia_configs"

# Every NVIDIA v5.0 system config of both benchmarks (mlcommons/training_results_v5.0 at
# 0fdc28f), as reproduced by the fixture files: what each must parse to.
# benchmark, implementation folder, system, nodes, gpus/node, tp, pp, cp, minibs, gbs,
# WALLTIME (NEXP=1), WALLTIME_RUNANDTIME, MAX_STEPS, LR
PUBLISHED = [
    ("llama2_70b_lora", "nyx_n1_ngc25.04_nemo", "DGXB200_1x8x1xtp1pp1cp1", 1, 8, 1, 1, 1, 1, 8, 35, 25, 800, 0.00055),
    ("llama2_70b_lora", "tyche_ngpu8_ngc25.04_nemo", "GB200_2x4x1xtp1pp1cp1", 2, 4, 1, 1, 1, 1, 8, 35, 25, 800, 0.0005),
    ("llama2_70b_lora", "tyche_ngpu72_ngc25.04_nemo", "GB200_18x4x1xtp1pp1cp8", 18, 4, 1, 1, 8, 1, 9, 20, 10, 800, 0.0005),
    ("llama2_70b_lora", "tyche_ngpu144_ngc25.04_nemo", "GB200_36x4x1xtp1pp1cp8", 36, 4, 1, 1, 8, 1, 18, 20, 10, 700, 0.0004),
    ("llama2_70b_lora", "tyche_ngpu512_ngc25.04_nemo", "GB200_128x4x1xtp1pp1cp8", 128, 4, 1, 1, 8, 1, 64, 20, 10, 600, 0.0006),
    ("llama31_405b", "eos-dfw_n64_ngc25.01_nemo", "DGXH100_64x8x288xtp8pp8cp2", 64, 8, 8, 8, 2, 288, 1152, 430, 420, 300, None),
    ("llama31_405b", "eos-dfw_n256_ngc25.01_nemo", "DGXH100_256x8x72xtp8pp8cp2", 256, 8, 8, 8, 2, 72, 1152, 160, 150, 300, None),
    ("llama31_405b", "eos-dfw_n304_ngc25.01_nemo", "DGXH100_304x8x64xtp8pp8cp2", 304, 8, 8, 8, 2, 64, 1216, 160, 150, 300, None),
    ("llama31_405b", "eos-dfw_n320_ngc25.01_nemo", "DGXH100_320x8x56xtp8pp8cp2", 320, 8, 8, 8, 2, 56, 1120, 115, 105, 300, None),
    ("llama31_405b", "eos-dfw_n1024_ngc25.01_nemo", "DGXH100_1024x8x24xtp8pp8cp2", 1024, 8, 8, 8, 2, 24, 1536, 130, 120, 300, None),
    ("llama31_405b", "tyche_ngpu256_ngc25.04_nemo", "GB200_64x4x112xtp4pp8cp2_cg", 64, 4, 4, 8, 2, 112, 448, 230, 220, 500, None),
    ("llama31_405b", "tyche_ngpu512_ngc25.04_nemo", "GB200_128x4x112xtp4pp8cp2_cg_dplast", 128, 4, 4, 8, 2, 112, 896, 190, 180, 450, None),
]


def _fixture(benchmark: str, folder: str, system: str) -> Path:
    return FIXTURES / benchmark / folder / f"config_{system}.sh"


@pytest.mark.parametrize(
    "bench,folder,system,nodes,gpus,tp,pp,cp,minibs,gbs,walltime,runandtime,max_steps,lr",
    PUBLISHED,
    ids=[f"{row[0]}-{row[2]}" for row in PUBLISHED],
)
def test_published_config_parses_to_its_shape(bench, folder, system, nodes, gpus, tp, pp, cp, minibs, gbs,
                                              walltime, runandtime, max_steps, lr):
    config = read_config(_fixture(bench, folder, system))
    assert config.dgxsystem == system
    assert (config.nodes, config.gpus_per_node) == (nodes, gpus)
    assert (config.tp, config.pp, config.cp) == (tp, pp, cp)
    assert config.minibs == minibs
    assert config.gbs == gbs
    assert (config.walltime_min, config.walltime_runandtime_min) == (walltime, runandtime)
    assert config.max_steps == max_steps
    assert config.lr == (pytest.approx(lr) if lr is not None else None)
    # The launch environment carries what run.sub needs.
    assert config.env["DGXSYSTEM"] == system
    assert config.env["DGXNNODES"] == str(nodes)
    assert config.env["DGXNGPU"] == str(gpus)
    assert config.env["WALLTIME_RUNANDTIME"] == str(runandtime)
    # GBS is the data-parallel width times MINIBS, as both benchmarks compute it.
    assert config.gbs == config.minibs * nodes * gpus // (tp * pp * cp)


def test_fixture_set_is_exactly_the_published_list():
    on_disk = {(p.parents[1].name, p.parent.name, p.name) for p in FIXTURES.glob("*/*/config_*.sh")
               if p in list_configs(p.parent)}
    expected = {(b, f, f"config_{s}.sh") for b, f, s, *_ in PUBLISHED}
    assert on_disk == expected


def test_llama2_configs_take_pp_and_dgxsystem_from_config_common():
    config = read_config(_fixture("llama2_70b_lora", "tyche_ngpu72_ngc25.04_nemo", "GB200_18x4x1xtp1pp1cp8"))
    assert "PP=" not in config.path.read_text()  # it really does come from config_common.sh
    assert config.env["PP"] == "1"
    assert config.env["MBS"] == "1"


def test_walltime_follows_the_number_of_runs():
    path = _fixture("llama2_70b_lora", "tyche_ngpu72_ngc25.04_nemo", "GB200_18x4x1xtp1pp1cp8")
    assert read_config(path, env={"NEXP": "10"}).walltime_min == 5 + 10 * (10 + 5)
    assert read_config(path).env.get("NEXP") is None


def test_missing_helper_files_are_kept_as_warnings():
    gb256 = read_config(_fixture("llama31_405b", "tyche_ngpu256_ngc25.04_nemo", "GB200_64x4x112xtp4pp8cp2_cg"))
    assert any("config_common_blackwell.sh" in w for w in gb256.warnings)
    assert any("config_common_cg.sh" in w for w in gb256.warnings)
    assert "FULL_CUDA_GRAPH" not in gb256.env
    gb512 = read_config(_fixture("llama31_405b", "tyche_ngpu512_ngc25.04_nemo", "GB200_128x4x112xtp4pp8cp2_cg_dplast"))
    assert [w for w in gb512.warnings if "config_common_cg.sh" in w] == []
    assert gb512.env["FULL_CUDA_GRAPH"] == "True"


def test_dgxh100_configs_default_to_eight_gpus_per_node():
    path = _fixture("llama31_405b", "eos-dfw_n64_ngc25.01_nemo", "DGXH100_64x8x288xtp8pp8cp2")
    assert "DGXNGPU" not in path.read_text()
    assert read_config(path).gpus_per_node == 8


def test_sourcing_uses_a_clean_environment(monkeypatch):
    monkeypatch.setenv("MLREPRO_HOST_ONLY", "leak")
    monkeypatch.setenv("DGXNNODES", "999")
    config = read_config(_fixture("llama2_70b_lora", "nyx_n1_ngc25.04_nemo", "DGXB200_1x8x1xtp1pp1cp1"))
    assert "MLREPRO_HOST_ONLY" not in config.env
    assert config.nodes == 1
    assert "PATH" not in config.env and "PWD" not in config.env


def _write_config(folder: Path, system: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"config_{system}.sh"
    path.write_text(body)
    return path


GOOD_BODY = """
export DGXNNODES={nodes} DGXNGPU={gpus} MINIBS=1 TP=1 PP=1 CP={cp}
export WALLTIME_RUNANDTIME=10
export WALLTIME=$(( 5 + ${{NEXP:-1}} * (WALLTIME_RUNANDTIME + 5) ))
"""


def test_bash_failure_is_reported_with_its_stderr(tmp_path):
    path = _write_config(tmp_path, "X_1x8", GOOD_BODY.format(nodes=1, gpus=8, cp=1) + "if then fi\n")
    with pytest.raises(ImplementationError) as err:
        read_config(path)
    message = str(err.value)
    assert "config_X_1x8.sh" in message and "failed" in message
    assert "syntax error" in message


def test_config_that_exits_is_a_failure(tmp_path):
    path = _write_config(tmp_path, "X_1x8", 'echo "cannot find the cluster" >&2; exit 3\n')
    with pytest.raises(ImplementationError, match=r"(?s)exit status 3.*cannot find the cluster"):
        read_config(path)


def test_missing_variables_are_named(tmp_path):
    path = _write_config(tmp_path, "X_1x8", "export DGXNNODES=1 DGXNGPU=8 TP=1 PP=1\n")
    with pytest.raises(ImplementationError) as err:
        read_config(path)
    message = str(err.value)
    for name in ("WALLTIME_RUNANDTIME", "WALLTIME", "MINIBS", "CP or CONTEXT_PARALLEL"):
        assert name in message
    assert "DGXNNODES" not in message.split("export")[-1]


def test_name_and_values_must_agree(tmp_path):
    path = _write_config(tmp_path, "GB200_2x4x1xtp1pp1cp1", GOOD_BODY.format(nodes=4, gpus=4, cp=1))
    with pytest.raises(ImplementationError, match="the name says nodes=2 but DGXNNODES=4"):
        read_config(path)
    path = _write_config(tmp_path, "GB200_2x4x1xtp1pp1cp2", GOOD_BODY.format(nodes=2, gpus=4, cp=1))
    with pytest.raises(ImplementationError, match="the name says cp=2 but CP=1"):
        read_config(path)


def test_dgxsystem_must_match_the_file_name(tmp_path):
    path = _write_config(tmp_path, "X_1x8", GOOD_BODY.format(nodes=1, gpus=8, cp=1) + "export DGXSYSTEM=other\n")
    with pytest.raises(ImplementationError, match="DGXSYSTEM='other'"):
        read_config(path)


def test_gpu_count_must_divide_by_the_model_parallel_size(tmp_path):
    path = _write_config(tmp_path, "X_1x6", GOOD_BODY.format(nodes=1, gpus=6, cp=4))
    with pytest.raises(ImplementationError, match="6 GPUs is not a multiple of TP\\*PP\\*CP"):
        read_config(path)


def test_non_numeric_values_are_rejected(tmp_path):
    path = _write_config(tmp_path, "X_1x8", GOOD_BODY.format(nodes="one", gpus=8, cp=1))
    with pytest.raises(ImplementationError, match="DGXNNODES='one' is not a whole number"):
        read_config(path)


def test_a_name_without_a_shape_is_accepted(tmp_path):
    path = _write_config(tmp_path, "mycluster", GOOD_BODY.format(nodes=2, gpus=8, cp=2))
    config = read_config(path)
    assert config.name_shape is None
    assert (config.dgxsystem, config.nodes, config.gpus_per_node, config.gbs) == ("mycluster", 2, 8, 8)


@pytest.mark.parametrize("name,expected", [
    ("GB200_18x4x1xtp1pp1cp8", ("GB200", 18, 4, 1, 1, 1, 8, "")),
    ("GB200_64x4x112xtp4pp8cp2_cg", ("GB200", 64, 4, 112, 4, 8, 2, "cg")),
    ("GB200_128x4x112xtp4pp8cp2_cg_dplast", ("GB200", 128, 4, 112, 4, 8, 2, "cg_dplast")),
    ("DGXH100_1024x8x24xtp8pp8cp2", ("DGXH100", 1024, 8, 24, 8, 8, 2, "")),
    ("CPU_1x2", ("CPU", 1, 2, None, None, None, None, "")),
    ("CPU_1x2x4_fast", ("CPU", 1, 2, 4, None, None, None, "fast")),
])
def test_name_shape(name, expected):
    shape = parse_name_shape(name)
    assert (shape.platform, shape.nodes, shape.gpus_per_node, shape.minibs, shape.tp, shape.pp, shape.cp,
            shape.variant) == expected


def test_name_without_shape():
    assert parse_name_shape("mycluster") is None
    assert parse_name_shape("GB200") is None


def _impl_with(tmp_path: Path, shapes: list[tuple[str, int, int]]) -> Path:
    impl = tmp_path / "impl"
    for system, nodes, gpus in shapes:
        _write_config(impl, system, GOOD_BODY.format(nodes=nodes, gpus=gpus, cp=1))
    (impl / "config_common.sh").write_text("export SHARED=1\n")
    (impl / "config_mounts.sh").write_text("_cont_mounts=x\n")
    return impl


def test_list_configs_leaves_helpers_out(tmp_path):
    impl = _impl_with(tmp_path, [("B_2x4", 2, 4), ("A_1x8", 1, 8)])
    assert [p.name for p in list_configs(impl)] == ["config_A_1x8.sh", "config_B_2x4.sh"]
    with pytest.raises(ImplementationError, match="not found"):
        list_configs(tmp_path / "nowhere")


def test_pick_config_by_system_shape(tmp_path):
    impl = _impl_with(tmp_path, [("A_1x8", 1, 8), ("B_2x4", 2, 4), ("C_18x4", 18, 4)])
    config = pick_config(impl, nodes=2, gpus_per_node=4)
    assert config.dgxsystem == "B_2x4"
    assert "equals the system's" in config.selected_because


def test_pick_config_ties_go_to_the_first_name_and_say_so(tmp_path):
    impl = _impl_with(tmp_path, [("Z_1x8", 1, 8), ("A_1x8x1", 1, 8)])
    config = pick_config(impl, nodes=1, gpus_per_node=8)
    assert config.dgxsystem == "A_1x8x1"
    assert "config_Z_1x8.sh" in config.selected_because


def test_pick_config_falls_back_to_fewer_nodes(tmp_path):
    impl = _impl_with(tmp_path, [("A_1x4", 1, 4), ("B_2x4", 2, 4), ("C_1x8", 1, 8)])
    config = pick_config(impl, nodes=3, gpus_per_node=4)
    assert config.dgxsystem == "B_2x4"
    assert "2 of the 3 nodes" in config.selected_because


def test_pick_config_none_fits_lists_what_exists(tmp_path):
    impl = _impl_with(tmp_path, [("A_1x8", 1, 8), ("C_18x4", 18, 4)])
    with pytest.raises(ImplementationError) as err:
        pick_config(impl, nodes=1, gpus_per_node=4)
    message = str(err.value)
    assert "1 nodes x 4 GPUs" in message
    assert "config_A_1x8.sh (1x8)" in message and "config_C_18x4.sh (18x4)" in message


def test_pick_config_named_by_the_user(tmp_path):
    impl = _impl_with(tmp_path, [("A_1x8", 1, 8), ("B_2x4", 2, 4)])
    for requested in ("B_2x4", "config_B_2x4.sh", str(impl / "config_B_2x4.sh")):
        config = pick_config(impl, nodes=4, gpus_per_node=8, requested=requested)
        assert config.dgxsystem == "B_2x4"
        assert "named by the user" in config.selected_because
    with pytest.raises(ImplementationError, match=r"'D_9x9' not found .* config_A_1x8.sh, config_B_2x4.sh"):
        pick_config(impl, nodes=4, gpus_per_node=8, requested="D_9x9")


def test_pick_config_named_but_too_big(tmp_path):
    impl = _impl_with(tmp_path, [("C_18x4", 18, 4)])
    with pytest.raises(ImplementationError, match="needs 18 nodes but the system has 2"):
        pick_config(impl, nodes=2, gpus_per_node=4, requested="C_18x4")


def test_check_fits_names_both_sides():
    config = read_config(_fixture("llama2_70b_lora", "tyche_ngpu72_ngc25.04_nemo", "GB200_18x4x1xtp1pp1cp8"))
    check_fits(config, nodes=18, gpus_per_node=4)
    check_fits(config, nodes=20, gpus_per_node=8)
    with pytest.raises(ImplementationError) as err:
        check_fits(config, nodes=1, gpus_per_node=2)
    message = str(err.value)
    assert "18 nodes but the system has 1" in message
    assert "4 GPUs per node but the system has 2" in message


def test_picks_the_published_config_for_an_18x4_system():
    folder = FIXTURES / "llama2_70b_lora" / "tyche_ngpu72_ngc25.04_nemo"
    assert pick_config(folder, nodes=18, gpus_per_node=4).gbs == 9


MINI_LORA = REPO_ROOT / "implementations" / "mini_lora"
MINI_CONFIGS = sorted(MINI_LORA.glob("config_CPU_*.sh")) if MINI_LORA.is_dir() else []


@pytest.mark.skipif(not MINI_CONFIGS, reason="implementations/mini_lora has no config_CPU_*.sh yet")
@pytest.mark.parametrize("path", MINI_CONFIGS, ids=[p.name for p in MINI_CONFIGS])
def test_mini_lora_configs_parse(path):
    config = read_config(path)
    shape = config.name_shape
    assert shape is not None and shape.platform == "CPU"
    assert (config.nodes, config.gpus_per_node) == (shape.nodes, shape.gpus_per_node)
    assert config.gbs >= 1
    assert config.walltime_min >= config.walltime_runandtime_min >= 1


# --- fetching at a pinned commit ---------------------------------------------------


def _git(cwd: Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@example.org",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.org")
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def upstream(tmp_path):
    """A repository with an implementation folder, a neighbour folder, and two commits."""
    repo = tmp_path / "upstream"
    impl = repo / "NVIDIA" / "benchmarks" / "toy" / "implementations" / "v1"
    impl.mkdir(parents=True)
    (repo / "other").mkdir()
    (repo / "other" / "big.bin").write_bytes(b"\0" * 1000)
    (impl / "run.sub").write_text("#!/bin/bash\necho first\n")
    _write_config(impl, "X_1x8", GOOD_BODY.format(nodes=1, gpus=8, cp=1))
    _git(repo, "init", "-q", "-b", "main")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "first")
    first = _git(repo, "rev-parse", "HEAD")
    (impl / "run.sub").write_text("#!/bin/bash\necho second\n")
    _git(repo, "commit", "-q", "-am", "second")
    second = _git(repo, "rev-parse", "HEAD")
    return {"url": repo.as_uri(), "path": repo, "first": first, "second": second,
            "folder": "NVIDIA/benchmarks/toy/implementations/v1"}


def test_fetch_checks_out_the_pinned_commit(tmp_path, upstream):
    dest = tmp_path / "resources" / "toy"
    impl = fetch_implementation(upstream["url"], upstream["first"], upstream["folder"], dest)
    assert impl == dest / upstream["folder"]
    assert (impl / "run.sub").read_text() == "#!/bin/bash\necho first\n"
    assert _git(dest, "rev-parse", "HEAD") == upstream["first"]
    assert not (dest / "other" / "big.bin").exists()  # sparse: only the implementation folder
    assert read_config(impl / "config_X_1x8.sh").nodes == 1
    assert [p.name for p in dest.parent.iterdir()] == ["toy"]  # no staging folders left


def test_fetch_reuses_a_verified_checkout(tmp_path, upstream):
    dest = tmp_path / "toy"
    fetch_implementation(upstream["url"], upstream["first"], upstream["folder"], dest)
    inode = dest.stat().st_ino
    # Reuse must not touch the remote: an unreachable URL still succeeds.
    impl = fetch_implementation("file:///nonexistent/repo", upstream["first"], upstream["folder"], dest)
    assert dest.stat().st_ino == inode
    assert (impl / "run.sub").read_text().endswith("first\n")


def test_fetch_replaces_a_checkout_at_another_commit(tmp_path, upstream):
    dest = tmp_path / "toy"
    fetch_implementation(upstream["url"], upstream["first"], upstream["folder"], dest)
    impl = fetch_implementation(upstream["url"], upstream["second"], upstream["folder"], dest)
    assert (impl / "run.sub").read_text().endswith("second\n")
    assert _git(dest, "rev-parse", "HEAD") == upstream["second"]


def test_fetch_refreshes_a_locally_modified_checkout(tmp_path, upstream):
    dest = tmp_path / "toy"
    impl = fetch_implementation(upstream["url"], upstream["first"], upstream["folder"], dest)
    (impl / "run.sub").write_text("tampered\n")
    impl = fetch_implementation(upstream["url"], upstream["first"], upstream["folder"], dest)
    assert (impl / "run.sub").read_text().endswith("first\n")


def test_fetch_wrong_commit_is_a_clear_error(tmp_path, upstream):
    dest = tmp_path / "res" / "toy"
    missing = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(FetchError, match=f"commit {missing} is not in"):
        fetch_implementation(upstream["url"], missing, upstream["folder"], dest)
    assert not dest.exists()
    assert list(dest.parent.iterdir()) == []


def test_fetch_requires_a_full_sha(tmp_path, upstream):
    with pytest.raises(FetchError, match="not a full 40-character sha"):
        fetch_implementation(upstream["url"], upstream["first"][:10], upstream["folder"], tmp_path / "toy")
    with pytest.raises(FetchError, match="needs a pinned commit"):
        fetch_implementation(upstream["url"], None, upstream["folder"], tmp_path / "toy")


def test_fetch_missing_folder_is_a_clear_error(tmp_path, upstream):
    with pytest.raises(FetchError, match="has no folder 'NVIDIA/benchmarks/none'"):
        fetch_implementation(upstream["url"], upstream["first"], "NVIDIA/benchmarks/none", tmp_path / "toy")
    assert not (tmp_path / "toy").exists()


def test_fetch_unreachable_repository(tmp_path, upstream):
    with pytest.raises(FetchError, match="could not fetch"):
        fetch_implementation((tmp_path / "absent").as_uri(), upstream["first"], "", tmp_path / "toy")


def test_local_folder_source_is_copied_and_kept_in_step(tmp_path):
    source = tmp_path / "src_impl"
    _write_config(source / "impl", "X_1x8", GOOD_BODY.format(nodes=1, gpus=8, cp=1))
    dest = tmp_path / "resources" / "impl"
    copied = fetch_implementation(str(source), None, "impl", dest)
    assert copied == dest / "impl"
    assert read_config(copied / "config_X_1x8.sh").nodes == 1
    inode = dest.stat().st_ino
    assert fetch_implementation(str(source), None, "impl", dest) == copied
    assert dest.stat().st_ino == inode  # unchanged source: reused
    (source / "impl" / "run.sub").write_text("new\n")
    fetch_implementation(str(source), None, "impl", dest)
    assert (copied / "run.sub").read_text() == "new\n"
    with pytest.raises(FetchError, match="implementation folder not found"):
        fetch_implementation(str(source), None, "missing", tmp_path / "other")
