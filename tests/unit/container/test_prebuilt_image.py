"""A prebuilt image is checked for real: a squashfs file made by mksquashfs, an image in a podman
store, and a registry speaking the distribution API (with its anonymous bearer-token dance) on localhost."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from mlrepro.container import prebuilt
from mlrepro.container.prebuilt import ImageError
import workspace


# ---------------------------------------------------------------- names


@pytest.mark.parametrize("text, kind, registry, name, tag", [
    ("nvcr.io/nvidia/pytorch:25.04-py3", "registry", "nvcr.io", "nvidia/pytorch", "25.04-py3"),
    ("nvcr.io#nvidia/pytorch:25.04-py3", "registry", "nvcr.io", "nvidia/pytorch", "25.04-py3"),
    ("me@nvcr.io#nvidia/pytorch:25.04-py3", "registry", "nvcr.io", "nvidia/pytorch", "25.04-py3"),
    ("docker://localhost:5000/team/mini_lora", "registry", "localhost:5000", "team/mini_lora", "latest"),
    ("python:3.11-slim", "registry", "registry-1.docker.io", "library/python", "3.11-slim"),
    ("ghcr.io/org/img@sha256:" + "a" * 64, "registry", "ghcr.io", "org/img", "sha256:" + "a" * 64),
])
def test_registry_references_in_docker_and_enroot_spelling(text, kind, registry, name, tag):
    ref = prebuilt.parse(text, runtime="enroot")
    assert (ref.kind, ref.registry, ref.name, ref.tag) == (kind, registry, name, tag)
    assert ref.text == text  # run.sub gets CONT as the configuration spells it


def test_paths_and_podman_names(tmp_path):
    assert prebuilt.parse("images/x.sqsh", root=tmp_path).path == tmp_path / "images" / "x.sqsh"
    assert prebuilt.parse("/shared/x.sqsh").kind == "sqsh"
    assert prebuilt.parse("podman://localhost/team/x:v1").reference == "localhost/team/x:v1"
    assert prebuilt.parse("localhost/team/x:v1", runtime="podman").kind == "podman"
    with pytest.raises(ImageError, match="not a valid image name"):
        prebuilt.parse("nvcr.io/NVIDIA/PyTorch:1", runtime="enroot")


def test_plan_line_says_which_image_and_whether_it_is_built():
    assert prebuilt.plan_line("/s/x.sqsh", "enroot", None) == "image: /s/x.sqsh (prebuilt, never built)"
    assert "built with podman from impl" in prebuilt.plan_line(None, "enroot", "impl")
    assert "none" in prebuilt.plan_line(None, "none", "impl")


# ---------------------------------------------------------------- .sqsh


def _squash(folder: Path, out: Path) -> Path:
    subprocess.run(["mksquashfs", str(folder), str(out), "-all-root", "-no-progress", "-quiet", "-noappend"],
                   check=True, capture_output=True)
    return out


@pytest.mark.skipif(shutil.which("mksquashfs") is None, reason="apt-get install -y squashfs-tools")
def test_a_sqsh_file_is_described_and_its_hash_reused_while_unchanged(tmp_path, monkeypatch):
    rootfs = tmp_path / "rootfs" / "workspace" / "ft-llm"
    rootfs.mkdir(parents=True)
    (rootfs / "run_and_time.sh").write_text("#!/bin/bash\necho hi\n")
    sqsh = _squash(tmp_path / "rootfs", tmp_path / "team.sqsh")
    record = prebuilt.describe(str(sqsh), "enroot")
    digest = hashlib.sha256(sqsh.read_bytes()).hexdigest()
    assert record["prebuilt"] is True and record["built"] is False and record["kind"] == "sqsh"
    assert record["digest"] == f"sha256:{digest}" and record["size"] == sqsh.stat().st_size
    assert record["sqsh"]["path"] == str(sqsh)

    calls = []
    monkeypatch.setattr(prebuilt, "sha256_file", lambda p: calls.append(p) or "x")
    assert prebuilt.describe(str(sqsh), "enroot", previous=record)["digest"] == f"sha256:{digest}"
    assert calls == []  # same size and mtime: not hashed again
    os.utime(sqsh, ns=(1, 1))
    assert prebuilt.describe(str(sqsh), "enroot", previous=record)["digest"] == "sha256:x"


def test_a_missing_or_foreign_sqsh_is_a_clear_error(tmp_path):
    with pytest.raises(ImageError, match=r"missing\.sqsh does not exist"):
        prebuilt.describe(str(tmp_path / "missing.sqsh"), "enroot")
    (tmp_path / "tar.sqsh").write_bytes(b"ustar" + b"\0" * 100)
    with pytest.raises(ImageError, match="not a squashfs file"):
        prebuilt.describe(str(tmp_path / "tar.sqsh"), "enroot")


# ---------------------------------------------------------------- podman


@pytest.fixture(scope="module")
def podman(tmp_path_factory):
    if shutil.which("podman") is None:
        pytest.skip("apt-get install -y podman")
    root = tmp_path_factory.mktemp("podman")
    context = root / "context"
    context.mkdir()
    (context / "hello.txt").write_text("a prebuilt image\n")
    (context / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /workspace/hello.txt\n")
    with workspace.podman_store(root / "store") as store:
        subprocess.run([*store.cmd, "build", "-t", "localhost/team/mini:v1", str(context)], check=True,
                       capture_output=True)
        yield store.cmd


def test_a_local_podman_image_is_found_by_reference(podman):
    record = prebuilt.describe("localhost/team/mini:v1", "podman", podman=podman)
    inspected = subprocess.run([*podman, "image", "inspect", "--format", "{{.Id}} {{.Size}}", "localhost/team/mini:v1"],
                               capture_output=True, text=True, check=True).stdout.split()
    assert record["image_id"] == "sha256:" + inspected[0] and record["size"] == int(inspected[1])
    assert record["tag"] == "localhost/team/mini:v1" and record["kind"] == "podman" and record["built"] is False


def test_a_podman_image_that_is_not_there_is_named(podman):
    with pytest.raises(ImageError, match="podman has no image 'localhost/team/mini:v2'"):
        prebuilt.describe("podman://localhost/team/mini:v2", "podman", podman=podman)


# ---------------------------------------------------------------- a registry on localhost


LAYERS = [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + "1" * 64, "size": 1000},
          {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": "sha256:" + "2" * 64, "size": 234}]
MANIFEST = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                                  "digest": "sha256:" + "3" * 64, "size": 66},
                       "layers": LAYERS}).encode()
MANIFEST_DIGEST = "sha256:" + hashlib.sha256(MANIFEST).hexdigest()
INDEX = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [
    {"digest": "sha256:" + "9" * 64, "size": 10, "platform": {"architecture": "arm64", "os": "linux"}},
    {"digest": MANIFEST_DIGEST, "size": len(MANIFEST), "platform": {"architecture": "amd64", "os": "linux"}},
]}).encode()


@pytest.fixture
def registry():
    """The distribution API's manifest endpoint behind an anonymous bearer token, as Docker Hub and nvcr.io answer."""
    seen = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def _send(self, code, body=b"", headers=()):
            self.send_response(code)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            seen.append((self.path, self.headers.get("Authorization"), self.headers.get("Accept")))
            port = self.server.server_address[1]
            if self.path.startswith("/token?"):
                return self._send(200, json.dumps({"token": "anon-123"}).encode())
            if self.headers.get("Authorization") != "Bearer anon-123":
                return self._send(401, headers=[("WWW-Authenticate", f'Bearer realm="http://127.0.0.1:{port}/token",'
                                                 f'service="test",scope="repository:team/mini:pull"')])
            if self.path == "/v2/team/mini/manifests/v1":
                return self._send(200, INDEX, [("Content-Type", "application/vnd.oci.image.index.v1+json"),
                                               ("Docker-Content-Digest", "sha256:" + hashlib.sha256(INDEX).hexdigest())])
            if self.path == f"/v2/team/mini/manifests/{MANIFEST_DIGEST}":
                return self._send(200, MANIFEST, [("Content-Type", "application/vnd.oci.image.manifest.v1+json"),
                                                  ("Docker-Content-Digest", MANIFEST_DIGEST)])
            self._send(404, b'{"errors":[{"code":"MANIFEST_UNKNOWN"}]}')

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1], seen
    server.shutdown()


def test_a_registry_image_is_checked_through_the_distribution_api(registry):
    port, seen = registry
    record = prebuilt.describe(f"127.0.0.1:{port}/team/mini:v1", "enroot")
    assert record["digest"] == "sha256:" + hashlib.sha256(INDEX).hexdigest()
    assert record["platform_digest"] == MANIFEST_DIGEST  # the linux/amd64 image of the index
    assert record["size"] == 1000 + 234 + 66 and record["layers"] == 2
    assert record["tag"] == f"127.0.0.1:{port}/team/mini:v1"
    assert [p for p, _, _ in seen][:3] == ["/v2/team/mini/manifests/v1", "/token?service=test&scope=repository%3Ateam%2Fmini%3Apull",
                                           "/v2/team/mini/manifests/v1"]
    assert "application/vnd.oci.image.index.v1+json" in seen[0][2]


def test_enroot_spelling_reaches_the_same_registry(registry):
    port, _ = registry
    assert prebuilt.describe(f"127.0.0.1:{port}#team/mini:v1", "enroot")["size"] == 1300


def test_an_image_the_registry_lacks_or_an_unreachable_registry_is_named(registry):
    port, _ = registry
    with pytest.raises(ImageError, match=rf"127.0.0.1:{port} has no team/mini:v2 \(HTTP 404\)"):
        prebuilt.describe(f"127.0.0.1:{port}/team/mini:v2", "enroot")
    with pytest.raises(ImageError, match="cannot reach 127.0.0.1:9"):
        prebuilt.describe("127.0.0.1:9/team/mini:v1", "enroot")


def test_a_record_matches_only_the_image_configured_now():
    sqsh = {"prebuilt": True, "image": "/s/x.sqsh", "runtime": "enroot"}
    assert prebuilt.record_matches(sqsh, "/s/x.sqsh", "enroot")
    assert not prebuilt.record_matches(sqsh, "/s/y.sqsh", "enroot")  # another image named
    assert not prebuilt.record_matches(sqsh, None, "enroot")  # the image dropped: a build
    host = {"runtime": "none", "environment": {}}
    assert prebuilt.record_matches(host, None, "none") and prebuilt.record_matches({}, None, "none")
    assert not prebuilt.record_matches(host, "/s/x.sqsh", "enroot")  # the seeds would run on the host
    built = {"runtime": "podman", "tag": "mlrepro/mini_lora:x"}
    assert prebuilt.record_matches(built, None, "enroot") and not prebuilt.record_matches(built, None, "none")
