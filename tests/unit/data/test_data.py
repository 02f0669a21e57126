"""mlrepro.data (http, hub, mounts, manifest, scripts) against a real HTTP server on 127.0.0.1 and real files and processes."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from fixtures.http_server import LocalHTTPServer, Misbehaviour

from mlrepro.data.checks import DataError, DownloadError, MissingTokenError, check_free_space, require_token
from mlrepro.data.http import http_download
from mlrepro.data.hub import hub_download
from mlrepro.data.manifest import write_manifest
from mlrepro.data.mounts import ExpectedEntry, read_expected_mounts, verify_mounts
from mlrepro.data.scripts import apply_cleanup, container_command, run_download_script
import workspace

TOKEN = "hf_TESTtoken_5f1d9c2e7a"
BLOB = os.urandom(3 * 1024 * 1024 + 123)  # several read chunks, odd tail
BLOB_SHA = hashlib.sha256(BLOB).hexdigest()

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def server():
    with LocalHTTPServer() as srv:
        yield srv


def _all_text_under(folder: Path) -> str:
    return "\n".join(p.read_bytes().decode("latin-1") for p in folder.rglob("*") if p.is_file())


# --------------------------------------------------------------------------- http_download

def test_download_cut_midway_resumes_with_range(server, tmp_path):
    url = server.add_file("/blob.bin", BLOB)
    server.misbehave("/blob.bin", Misbehaviour(cut_after=1_000_000))
    dest = http_download(url, tmp_path / "blob.bin", expected_size=len(BLOB), sha256=BLOB_SHA,
                         backoff=0.01, chunk_size=64 * 1024)
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == BLOB_SHA
    assert not (tmp_path / "blob.bin.part").exists()
    reqs = server.requests_to("/blob.bin")
    assert len(reqs) == 2
    assert "range" not in reqs[0].headers
    start = int(reqs[1].headers["range"].removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= 1_000_000


def test_download_resumes_part_left_by_earlier_process(server, tmp_path):
    url = server.add_file("/blob.bin", BLOB)
    (tmp_path / "blob.bin.part").write_bytes(BLOB[:777_777])
    dest = http_download(url, tmp_path / "blob.bin", sha256=BLOB_SHA)
    assert dest.read_bytes() == BLOB
    (req,) = server.requests_to("/blob.bin")
    assert req.headers["range"] == "bytes=777777-"


def test_download_already_complete_makes_no_request(server, tmp_path):
    url = server.add_file("/blob.bin", BLOB)
    (tmp_path / "blob.bin").write_bytes(BLOB)
    http_download(url, tmp_path / "blob.bin", expected_size=len(BLOB), sha256=BLOB_SHA)
    assert server.requests_to("/blob.bin") == []


def test_429_with_retry_after_then_success(server, tmp_path):
    url = server.add_file("/blob.bin", BLOB)
    server.misbehave("/blob.bin", Misbehaviour(status=429, headers={"Retry-After": "1"}),
                     Misbehaviour(status=503))
    t0 = time.monotonic()
    dest = http_download(url, tmp_path / "blob.bin", sha256=BLOB_SHA, backoff=0.05)
    waited = time.monotonic() - t0
    assert dest.read_bytes() == BLOB
    assert len(server.requests_to("/blob.bin")) == 3
    assert waited >= 1.0, "Retry-After: 1 must be honoured"


def test_retries_exhausted_is_a_clear_error(server, tmp_path):
    url = server.add_file("/blob.bin", BLOB)
    server.misbehave("/blob.bin", *[Misbehaviour(status=502)] * 3)
    with pytest.raises(DownloadError, match=r"after 2 retries: HTTP 502"):
        http_download(url, tmp_path / "blob.bin", retries=2, backoff=0.01)
    assert not (tmp_path / "blob.bin").exists()


@pytest.mark.parametrize("kind", ["size", "sha256"])
def test_wrong_size_or_hash_is_rejected_and_target_absent(server, tmp_path, kind):
    url = server.add_file("/blob.bin", BLOB)
    kwargs = {"expected_size": len(BLOB) - 1} if kind == "size" else {"sha256": "0" * 64}
    with pytest.raises(DownloadError, match=kind if kind == "sha256" else "size"):
        http_download(url, tmp_path / "blob.bin", retries=1, backoff=0.01, **kwargs)
    assert not (tmp_path / "blob.bin").exists()
    assert not (tmp_path / "blob.bin.part").exists()


def test_token_sent_in_header_but_never_in_errors_logs_or_files(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="mlrepro.data.http")
    with LocalHTTPServer(require_token=TOKEN) as srv:
        url = srv.add_file("/gated.bin", BLOB)
        srv.misbehave("/gated.bin", Misbehaviour(cut_after=10_000), Misbehaviour(status=429))
        dest = http_download(url + f"?sig={TOKEN}", tmp_path / "gated.bin", token=TOKEN,
                             sha256=BLOB_SHA, backoff=0.01)
        assert dest.read_bytes() == BLOB
        assert {r.headers.get("authorization") for r in srv.requests_to("/gated.bin")} == {f"Bearer {TOKEN}"}

        # Wrong token: refused, and the message must not carry the (wrong) secret.
        with pytest.raises(DownloadError) as bad:
            http_download(url + f"?sig={TOKEN}", tmp_path / "other.bin", token=TOKEN + "x")
        assert "401" in str(bad.value)
        assert TOKEN not in str(bad.value)

        # A corrupt download names the URL in its error: no token there either.
        with pytest.raises(DownloadError) as corrupt:
            http_download(url + f"?sig={TOKEN}", tmp_path / "c.bin", token=TOKEN, sha256="1" * 64)
        assert TOKEN not in str(corrupt.value) and "gated.bin" in str(corrupt.value)

    assert caplog.records, "the interruption and 429 should have been logged"
    assert TOKEN not in caplog.text
    assert TOKEN not in _all_text_under(tmp_path).replace(BLOB.decode("latin-1"), "")


def test_token_dropped_when_redirected_to_another_host(tmp_path):
    with LocalHTTPServer() as srv:
        srv.add_file("/real.bin", BLOB)
        url = srv.add_file("/start.bin", b"unused")
        # 127.0.0.1 -> localhost is a different host as far as credentials go.
        srv.misbehave("/start.bin", Misbehaviour(redirect_to=srv.url("/real.bin", host="localhost")))
        dest = http_download(url, tmp_path / "r.bin", token=TOKEN, sha256=BLOB_SHA)
        assert dest.read_bytes() == BLOB
        (first,) = srv.requests_to("/start.bin")
        (second,) = srv.requests_to("/real.bin")
        assert first.headers["authorization"] == f"Bearer {TOKEN}"
        assert "authorization" not in second.headers


def test_404_fails_fast_without_retrying(server, tmp_path):
    with pytest.raises(DownloadError, match="404"):
        http_download(server.url("/nope.bin"), tmp_path / "n.bin", retries=5, backoff=10)
    assert len(server.requests_to("/nope.bin")) == 1


# --------------------------------------------------------------------------- tokens and the Hub

def test_missing_token_fails_before_any_request(server, tmp_path, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    server.add_hub_repo("org/gated", {"w.bin": b"w" * 100})
    with pytest.raises(MissingTokenError, match="HF_TOKEN"):
        hub_download("org/gated", tmp_path / "m", endpoint=server.url(""), token_required=True)
    assert server.requests == []
    assert not (tmp_path / "m").exists()


def test_require_token_names_the_variable():
    with pytest.raises(MissingTokenError, match="MY_TOKEN is not set"):
        require_token("MY_TOKEN", environ={"MY_TOKEN": "  "})
    assert require_token("MY_TOKEN", environ={"MY_TOKEN": "abc"}) == "abc"


def test_hub_download_against_local_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    files = {"data/train.parquet": os.urandom(5000), "README.md": b"readme"}
    with LocalHTTPServer(require_token=TOKEN) as srv:
        srv.add_hub_repo("org/ds", files, repo_type="dataset")
        out = hub_download("org/ds", tmp_path / "ds", repo_type="dataset", endpoint=srv.url(""),
                           allow_patterns=["*.parquet"], token_required=True)
        assert (out / "data/train.parquet").read_bytes() == files["data/train.parquet"]
        assert not (out / "README.md").exists()
        assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in srv.requests)

        monkeypatch.setenv("HF_TOKEN", "hf_wrong_token_123456")
        with pytest.raises(DownloadError, match="set HF_TOKEN") as err:
            hub_download("org/ds", tmp_path / "ds2", repo_type="dataset", endpoint=srv.url(""))
        assert "hf_wrong_token_123456" not in str(err.value)
    manifest = write_manifest(out, tmp_path / "ds.manifest.json", extra={"repo": "org/ds"})
    assert [f["path"] for f in manifest["files"]] == ["data/train.parquet"]  # no .cache/huggingface


# --------------------------------------------------------------------------- expected mounts

CSV = """key,type,relative_path,num_files,num_bytes
DATADIR,file,train.npy,1,10
DATADIR,file,validation.npy,1,4
DATADIR,dir,.,2,14
MODEL,file,context/model.yaml,1,3
MODEL,file,weights/a/0.0,1,5
MODEL,dir,weights/a,1,5
MODEL,dir,weights,1,5
MODEL,dir,.,2,8
"""


def _make_tree(root: Path) -> dict[str, Path]:
    d, m = root / "gov_report", root / "model"
    (d).mkdir(parents=True)
    (d / "train.npy").write_bytes(b"t" * 10)
    (d / "validation.npy").write_bytes(b"v" * 4)
    (m / "context").mkdir(parents=True)
    (m / "context/model.yaml").write_bytes(b"abc")
    (m / "weights/a").mkdir(parents=True)
    (m / "weights/a/0.0").write_bytes(b"12345")
    (m / "weights/.metadata").write_bytes(b"hidden files are not counted")
    return {"DATADIR": d, "MODEL": m}


def test_read_expected_mounts(tmp_path):
    (tmp_path / "expected-mounts.csv").write_text(CSV)
    rows = read_expected_mounts(tmp_path / "expected-mounts.csv")
    assert rows[0] == ExpectedEntry("DATADIR", "file", "train.npy", 1, 10)
    assert len(rows) == 8 and {r.key for r in rows} == {"DATADIR", "MODEL"}
    (tmp_path / "bad.csv").write_text("path,size\na,1\n")
    with pytest.raises(DataError, match="expected the header key,type,relative_path,num_files,num_bytes"):
        read_expected_mounts(tmp_path / "bad.csv")


def test_verify_mounts_passes_then_catches_missing_and_wrong_size(tmp_path):
    (tmp_path / "expected-mounts.csv").write_text(CSV)
    expected = read_expected_mounts(tmp_path / "expected-mounts.csv")
    roots = _make_tree(tmp_path)
    assert verify_mounts(roots, expected) == []
    assert verify_mounts(roots["DATADIR"], expected, key="DATADIR") == []

    (roots["DATADIR"] / "validation.npy").unlink()
    (roots["MODEL"] / "weights/a/0.0").write_bytes(b"123456")
    problems = verify_mounts(roots, expected)
    text = "\n".join(problems)
    assert "missing file" in text and "validation.npy" in text
    assert "0.0 is 6 bytes, expected 5" in text
    assert any("holds 1 files, expected 2" in p for p in problems)  # DATADIR root count
    with pytest.raises(ValueError, match="several keys"):
        verify_mounts(roots["MODEL"], expected)


def test_write_manifest_atomic_with_and_without_hash(tmp_path):
    roots = _make_tree(tmp_path)
    out = tmp_path / "out" / "data.manifest.json"
    m = write_manifest(roots["DATADIR"], out, extra={"source": "test"})
    on_disk = json.loads(out.read_text())
    assert on_disk == json.loads(json.dumps(m))
    assert on_disk["num_bytes"] == 14 and on_disk["source"] == "test"
    assert on_disk["files"][0]["sha256"] == hashlib.sha256(b"t" * 10).hexdigest()
    quick = write_manifest(roots["MODEL"], tmp_path / "model.json", hash=False)
    assert quick["hashed"] is False and all("sha256" not in f for f in quick["files"])
    assert not list(out.parent.glob(".*tmp"))


# --------------------------------------------------------------------------- free space

def test_free_space_check(tmp_path):
    assert check_free_space(tmp_path / "not" / "yet", 1) > 0
    with pytest.raises(DataError, match=r"need 1,000,000,000.0 GB, only [\d,.]+ GB free .*\(the reason\)"):
        check_free_space(tmp_path, 10**18, why="the reason")


# --------------------------------------------------------------------------- download scripts

CHILD = """
import os, sys
tok = os.environ["HF_TOKEN"]
print("using token", tok, flush=True)
print("stderr also", tok, file=sys.stderr, flush=True)
open(os.path.join(sys.argv[1], "out.txt"), "w").write("done")
sys.exit(int(sys.argv[2]))
"""


def test_run_download_script_redacts_token_and_checks_exit(tmp_path):
    script = tmp_path / "download_dataset.py"
    script.write_text(CHILD)
    logp = tmp_path / "logs" / "dl.log"
    run_download_script(script, [str(tmp_path), "0"], env={"HF_TOKEN": TOKEN}, log_path=logp)
    text = logp.read_text()
    assert "using token ***" in text and "stderr also ***" in text
    assert TOKEN not in text
    assert (tmp_path / "out.txt").read_text() == "done"

    with pytest.raises(DataError) as err:
        run_download_script(script, [str(tmp_path), "3"], env={"HF_TOKEN": TOKEN}, log_path=logp)
    assert "exit status 3" in str(err.value) and str(logp) in str(err.value)
    assert TOKEN not in str(err.value) and TOKEN not in logp.read_text()

    with pytest.raises(DataError, match="command-line"):
        run_download_script(script, [TOKEN], env={"HF_TOKEN": TOKEN}, log_path=logp)


def test_container_command_lines_keep_secrets_off_argv(tmp_path, monkeypatch):
    if shutil.which("podman") is None:
        pytest.skip("podman is not installed (apt-get install -y podman)")
    # the store the container stage built the image in
    monkeypatch.setenv("MLREPRO_PODMAN_ROOT", str(tmp_path / "store"))
    argv = ["python3", "scripts/download_model.py", "--model_dir", "/data/model"]
    podman = container_command("mlperf-nvidia:llama2_70b_lora-pyt", argv, env_names=["HF_TOKEN"],
                               mounts={tmp_path: "/data"}, workdir="/workspace/ft-llm")
    assert Path(podman[0]).name == "podman" and podman[1:3] == ["--root", str(tmp_path / "store")]
    assert podman[3:5] == ["run", "--rm"]
    assert podman[podman.index("--env") + 1] == "HF_TOKEN"
    assert f"{tmp_path}:/data" in podman
    assert podman[-5:] == ["mlperf-nvidia:llama2_70b_lora-pyt", *argv]

    sqsh = container_command(tmp_path / "image.sqsh", argv, env_names=["HF_TOKEN"],
                             mounts={tmp_path: "/data:ro"})
    assert sqsh[:3] == ["enroot", "start", "--rw"]
    assert ["--env", "HF_TOKEN"] == sqsh[3:5]
    assert str(tmp_path / "image.sqsh") in sqsh and sqsh[-4:] == argv
    assert all("=" not in a for a in podman + sqsh if a.startswith("HF_TOKEN"))


# --------------------------------------------------------------------------- llama31_405b

def test_405b_cleanup_leaves_the_documented_files(tmp_path):
    import yaml

    bench = yaml.safe_load((workspace.REPO / "config/benchmarks/llama31_405b.yaml").read_text())
    c4 = next(s for s in bench["dataset"]["sources"] if s.get("into") == "c4")
    d = tmp_path / "c4"
    d.mkdir()
    for i in range(8):
        for e in ("bin", "idx"):
            (d / f"c4-train.en_{i}_text_document.{e}").write_bytes(b"x")
    for e in ("bin", "idx"):
        (d / f"c4-validation-small.en_text_document.{e}").write_bytes(b"x")
        (d / f"c4-validation.en_text_document.{e}").write_bytes(b"x")
        wrapped = d / f"c4-validation-91205-samples.en_text_document.{e}"
        wrapped.mkdir()
        (wrapped / f"c4-validationn-91205-samples.en_text_document.{e}").write_bytes(e.encode())
    done = apply_cleanup(d, c4["cleanup"])
    assert len(done) == 2 + 16
    # what the README says remains: training shards 6 and 7 and the 91205-sample validation set
    assert sorted(p.name for p in d.iterdir()) == sorted(
        [f"c4-train.en_{i}_text_document.{e}" for i in (6, 7) for e in ("bin", "idx")]
        + [f"c4-validation-91205-samples.en_text_document.{e}" for e in ("bin", "idx")])
    assert (d / "c4-validation-91205-samples.en_text_document.idx").read_bytes() == b"idx"
    assert apply_cleanup(d, c4["cleanup"]) == []  # repeatable
