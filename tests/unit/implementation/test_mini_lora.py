"""The embedded miniature benchmark implementations/mini_lora, exercised for real:
its data and checkpoint scripts, its configs, and its trainer through
run_and_time.sh (torchrun, two CPU ranks), read back as an MLLOG stream."""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import workspace

IMPL = workspace.REPO / "implementations" / "mini_lora"
SCRIPTS = IMPL / "scripts"
CONFIGS = sorted(IMPL.glob("config_CPU_*.sh"))

REQUIRED_KEYS = {
    "cache_clear", "init_start", "init_stop", "run_start", "run_stop",
    "submission_benchmark", "submission_org", "submission_division", "submission_status",
    "submission_platform", "seed", "global_batch_size", "train_samples", "eval_samples",
    "opt_base_learning_rate", "opt_adamw_weight_decay", "opt_gradient_clip_norm",
    "opt_learning_rate_training_steps", "opt_learning_rate_warmup_factor", "lora_rank",
    "lora_alpha", "gradient_accumulation_steps", "max_steps", "block_start", "block_stop",
    "eval_start", "eval_stop", "eval_accuracy",
}


def mllog_events(text: str) -> list[dict]:
    return [json.loads(line.split(":::MLLOG", 1)[1]) for line in text.splitlines() if ":::MLLOG" in line]


def config_env(config: Path) -> dict[str, str]:
    out = subprocess.run(
        ["env", "-i", "bash", "-c", f'set -eu; source "{config}"; env -0'],
        capture_output=True, check=True,
    ).stdout.decode()
    return dict(item.split("=", 1) for item in out.split("\0") if "=" in item)


def run_and_time(env_extra: dict[str, str], config: Path = IMPL / "config_CPU_1x2x8xtp1pp1cp1.sh", timeout=240):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_", "RANK", "WORLD_SIZE", "LOCAL_"))}
    env.update(config_env(config))
    # run_and_time.sh's python3 is the test's own (the project venv need not be activated).
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(env_extra)
    return subprocess.run([str(IMPL / "run_and_time.sh")], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mini_lora") / "data"
    subprocess.run([sys.executable, str(SCRIPTS / "download_dataset.py"), "--data-dir", str(out)], check=True,
                   capture_output=True)
    return out


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mini_lora") / "model"
    subprocess.run([sys.executable, str(SCRIPTS / "download_model.py"), "--model-dir", str(out)], check=True,
                   capture_output=True, timeout=180)
    return out


# ---------------------------------------------------------------- data and checkpoint

def test_dataset_is_deterministic_and_follows_the_govreport_contract(tmp_path):
    for name in ("a", "b"):
        subprocess.run([sys.executable, str(SCRIPTS / "download_dataset.py"), "--data-dir", str(tmp_path / name)],
                       check=True, capture_output=True)
    subprocess.run([sys.executable, str(SCRIPTS / "download_dataset.py"), "--data-dir", str(tmp_path / "c"),
                    "--seed", "7"], check=True, capture_output=True)
    for split in ("train", "validation"):
        a = (tmp_path / "a" / f"{split}.npy").read_bytes()
        assert a == (tmp_path / "b" / f"{split}.npy").read_bytes(), f"{split}.npy differs between two generations"
        assert a != (tmp_path / "c" / f"{split}.npy").read_bytes(), "another --seed must draw other documents"
    assert not [p for p in (tmp_path / "a").iterdir() if p.name.startswith(".")], "temporary files left behind"

    # Plain arrays: loadable without unpickling anything.
    train = np.load(tmp_path / "a" / "train.npy", allow_pickle=False)
    val = np.load(tmp_path / "a" / "validation.npy", allow_pickle=False)
    assert not train.dtype.hasobject and not val.dtype.hasobject and len(train) > len(val) > 0
    train_docs = {tuple(r["input_ids"].tolist()) for r in train}
    assert not any(tuple(r["input_ids"].tolist()) in train_docs for r in val), "validation overlaps train"
    for record in list(train[:50]) + list(val[:50]):
        assert set(record.dtype.names) == {"input_ids", "loss_mask", "seq_start_id"}
        ids, mask = record["input_ids"], record["loss_mask"].tolist()
        assert ids.dtype == np.int64
        assert set(mask) <= {0, 1} and len(mask) == len(ids)
        assert record["seq_start_id"].tolist() == [0]
        scored = [i for i, m in enumerate(mask) if m]
        # The summary is one contiguous span after the prompt, ending in EOS (2).
        assert scored == list(range(scored[0], scored[-1] + 1)) and scored[0] > 10
        assert ids[scored[-1]] == 2


class _Payload:
    """Unpickling this runs code: it creates the file named in the test."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_trainer_refuses_a_pickled_data_file_without_running_it(dataset, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.npy").write_bytes((dataset / "train.npy").read_bytes())
    marker = tmp_path / "payload-ran"
    array = np.empty(1, dtype=object)
    array[0] = _Payload(marker)
    np.save(data / "validation.npy", array, allow_pickle=True)
    res = run_and_time({"DATADIR": str(data), "MODEL": str(tmp_path), "SEED": "1"}, timeout=120)
    assert res.returncode != 0
    assert "validation.npy is not a plain array file" in res.stderr and "refusing to unpickle" in res.stderr
    assert not marker.exists(), "the pickle payload ran"


def test_dataset_rejects_bad_arguments(tmp_path):
    res = subprocess.run([sys.executable, str(SCRIPTS / "download_dataset.py"), "--data-dir", str(tmp_path),
                          "--seed", "-1"], capture_output=True, text=True)
    assert res.returncode != 0 and "--seed" in res.stderr and "Traceback" not in res.stderr


@pytest.mark.slow
def test_checkpoint_is_a_safetensors_llama_with_a_manifest(checkpoint):
    import safetensors
    import torch
    from transformers import LlamaForCausalLM

    files = {p.name for p in checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "manifest.json"} <= files
    assert not any(name.endswith((".bin", ".pt")) for name in files), "weights must be safetensors only"
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    assert manifest["produced_by"]["method"] == "pretraining"
    import hashlib
    for row in manifest["files"]:
        data = (checkpoint / row["path"]).read_bytes()
        assert len(data) == row["size"] and hashlib.sha256(data).hexdigest() == row["sha256"]
    with safetensors.safe_open(str(checkpoint / "model.safetensors"), framework="pt") as fh:
        assert any("q_proj" in key for key in fh.keys())
    model = LlamaForCausalLM.from_pretrained(checkpoint)
    assert model.config.model_type == "llama" and model.config.num_hidden_layers >= 2
    # Pretraining really happened: its loss is far below chance over the vocabulary.
    assert manifest["produced_by"]["final_loss"] < 0.6 * np.log(model.config.vocab_size)
    with torch.no_grad():
        assert torch.isfinite(model(input_ids=torch.tensor([[1, 5, 6, 7]])).logits).all()


@pytest.mark.slow
def test_checkpoint_copies_from_a_folder_and_downloads_over_http(checkpoint, tmp_path):
    copied = tmp_path / "copied"
    subprocess.run([sys.executable, str(SCRIPTS / "download_model.py"), "--model-dir", str(copied), "--source",
                    str(checkpoint)], check=True, capture_output=True)
    assert (copied / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(checkpoint))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/"
        fetched = tmp_path / "fetched"
        subprocess.run([sys.executable, str(SCRIPTS / "download_model.py"), "--model-dir", str(fetched), "--source",
                        url], check=True, capture_output=True)
        assert (fetched / "model.safetensors").read_bytes() == (checkpoint / "model.safetensors").read_bytes()
        missing = subprocess.run([sys.executable, str(SCRIPTS / "download_model.py"), "--model-dir",
                                  str(tmp_path / "nope"), "--source", url + "missing/"],
                                 capture_output=True, text=True)
        assert missing.returncode != 0 and "cannot download" in missing.stderr
        assert not (tmp_path / "nope").exists(), "a failed download must not leave the target folder"
    finally:
        server.shutdown()


# ---------------------------------------------------------------- configs and launch scripts

@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_configs_are_sourceable_alone_and_match_their_names(config):
    env = config_env(config)
    system = config.name[len("config_"):-len(".sh")]
    nodes, ranks = map(int, re.match(r"CPU_(\d+)x(\d+)x", system).groups())
    assert env.get("DGXSYSTEM", system) == system
    assert int(env["DGXNNODES"]) == nodes and int(env["DGXNGPU"]) == ranks
    assert int(env["WALLTIME"]) == 5 + 1 * (int(env["WALLTIME_RUNANDTIME"]) + 5)
    for key in ("MAX_STEPS", "LR", "MINIBS", "TP", "PP", "CP", "TARGET_EVAL_LOSS", "EVAL_EVERY"):
        assert env.get(key), f"{config.name} does not export {key}"
    assert (env["TP"], env["PP"], env["CP"]) == ("1", "1", "1")
    assert float(env["TARGET_EVAL_LOSS"]) <= 0.925


def test_config_names_cover_the_three_shapes():
    assert {c.name for c in CONFIGS} >= {
        "config_CPU_1x2x8xtp1pp1cp1.sh", "config_CPU_2x1x8xtp1pp1cp1.sh", "config_CPU_2x2x4xtp1pp1cp1.sh"}


def test_run_sub_and_run_and_time_fail_clearly_on_missing_settings():
    assert subprocess.run(["bash", "-n", str(IMPL / "run.sub")]).returncode == 0
    res = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", str(IMPL / "run.sub")], capture_output=True,
                         text=True)
    assert res.returncode != 0 and "CONT is not set" in res.stderr
    res = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "CONT=none", "DGXSYSTEM=CPU_1x2x8xtp1pp1cp1", "bash",
                          str(IMPL / "run.sub")], capture_output=True, text=True)
    assert res.returncode != 0 and "WALLTIME_RUNANDTIME is not set" in res.stderr

    env = {"PATH": os.environ["PATH"], "DGXNGPU": "2", "MODEL": "/tmp"}
    res = subprocess.run([str(IMPL / "run_and_time.sh")], env=env, capture_output=True, text=True)
    assert res.returncode == 2 and "DATADIR" in res.stderr and "SEED" in res.stderr


def test_tensor_parallel_config_is_refused_clearly(dataset, tmp_path):
    res = run_and_time({"DATADIR": str(dataset), "MODEL": str(tmp_path), "SEED": "1", "TP": "2"}, timeout=120)
    assert res.returncode != 0
    assert "TP=2" in res.stderr and "not implemented" in res.stderr
    assert "run_start" not in res.stdout


# ---------------------------------------------------------------- training runs

@pytest.mark.slow
def test_one_seed_converges_with_rank0_only_mllog(dataset, checkpoint):
    res = run_and_time({"DATADIR": str(dataset), "MODEL": str(checkpoint), "SEED": "3"})
    assert res.returncode == 0, res.stderr[-3000:]
    events = mllog_events(res.stdout)
    keys = [e["key"] for e in events]
    assert REQUIRED_KEYS <= set(keys), f"missing {REQUIRED_KEYS - set(keys)}"
    for once in ("run_start", "run_stop", "init_start", "init_stop", "submission_benchmark", "seed"):
        assert keys.count(once) == 1, f"{once} logged {keys.count(once)} times (only rank 0 may log)"
    by_key = {e["key"]: e for e in events}
    assert by_key["submission_benchmark"]["value"] == "mini_lora"
    assert by_key["seed"]["value"] == 3
    assert by_key["global_batch_size"]["value"] == 2 * int(config_env(CONFIGS[0])["MINIBS"])
    assert by_key["lora_rank"]["value"] == 16
    assert by_key["run_stop"]["metadata"]["status"] == "success"
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("run_stop")

    evals = [e for e in events if e["key"] == "eval_accuracy"]
    counts = [e["metadata"]["samples_count"] for e in evals]
    assert counts == sorted(counts) and counts[0] > 0
    assert evals[-1]["value"] <= 0.925 < evals[0]["value"], "the fine-tune must lower the eval loss to the target"
    assert by_key["run_stop"]["metadata"]["samples_count"] == counts[-1]
    minutes = (by_key["run_stop"]["time_ms"] - by_key["run_start"]["time_ms"]) / 60000
    assert 0 < minutes < 2


@pytest.mark.slow
def test_step_budget_ends_with_run_stop_aborted(dataset, checkpoint):
    res = run_and_time({"DATADIR": str(dataset), "MODEL": str(checkpoint), "SEED": "1", "MAX_STEPS": "4"})
    assert res.returncode == 0, res.stderr[-3000:]
    events = mllog_events(res.stdout)
    stop = [e for e in events if e["key"] == "run_stop"]
    assert len(stop) == 1 and stop[0]["metadata"]["status"] == "aborted"
    assert stop[0]["metadata"]["samples_count"] == 4 * 2 * int(config_env(CONFIGS[0])["MINIBS"])
    evals = [e for e in events if e["key"] == "eval_accuracy"]
    assert len(evals) == 1 and evals[0]["value"] > 0.925


@pytest.mark.slow
def test_log_pretending_to_be_llama2_70b_lora_passes_the_compliance_checker(dataset, checkpoint, tmp_path):
    # At a higher learning rate (logged as opt_base_learning_rate, which the checker only requires once)
    # the same target is reached in a third of the time; the checker's subject is the log's shape.
    res = run_and_time({"DATADIR": str(dataset), "MODEL": str(checkpoint), "SEED": "5",
                        "SUBMISSION_BENCHMARK": "llama2_70b_lora", "LR": workspace.QUICK_LR})
    assert res.returncode == 0, res.stderr[-3000:]
    log = tmp_path / "result_0.txt"
    log.write_text(res.stdout)
    check = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                            "--ruleset", "5.0.0", str(log)], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS" in check.stdout + check.stderr

    # The checker is not a rubber stamp: the same log with the run_start line gone fails.
    broken = tmp_path / "broken.txt"
    broken.write_text("\n".join(line for line in res.stdout.splitlines() if '"run_start"' not in line) + "\n")
    check = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                            "--ruleset", "5.0.0", str(broken)], cwd=tmp_path, capture_output=True, text=True)
    assert check.returncode != 0
