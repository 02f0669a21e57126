"""A prebuilt image named in the configuration: checked, described, never built.

Teams on a real cluster keep their images in a registry or as a shared enroot `.sqsh`, and the
login node often has no podman. A benchmark or system names such an image instead of a build:

    /shared/images/llama2_lora.sqsh                     an enroot squashfs file (what pyxis runs)
    nvcr.io/nvidia/pytorch:25.04-py3                    a registry reference (pyxis/enroot import it)
    nvcr.io#nvidia/pytorch:25.04-py3                    the same in enroot's spelling
    docker://registry.example.org/team/llama2:v5.0      the same with its transport
    podman://localhost/team/mini_lora:v1                a local podman image (container_runtime podman)

The container stage checks that it exists and records its digest and size in container.json as a
build does (`prebuilt: true`); nothing is built, pulled or converted. A registry reference is
checked through the registry's HTTP API (`HEAD /v2/<name>/manifests/<tag>`, with the anonymous
bearer token the registry offers), so no container tool is needed on the machine that checks it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from mlrepro.util.fsutil import sha256_file

log = logging.getLogger(__name__)

SQSH, PODMAN, REGISTRY = "sqsh", "podman", "registry"
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))
_INDEX_TYPES = ("application/vnd.oci.image.index.v1+json", "application/vnd.docker.distribution.manifest.list.v2+json")
_DEFAULT_REGISTRY = "registry-1.docker.io"
# Registries spoken to over plain HTTP: this machine only (a test registry, a local mirror).
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


class ImageError(Exception):
    """The named image does not exist or cannot be checked; the message names it and why."""


@dataclass(frozen=True)
class ImageRef:
    """A configured image, parsed: which kind it is and where it lives."""

    text: str          # as the configuration wrote it (what run.sub gets as CONT)
    kind: str          # sqsh | podman | registry
    path: Path | None = None        # sqsh
    reference: str | None = None    # podman: the local name; registry: registry/name:tag or @digest
    registry: str | None = None
    name: str | None = None
    tag: str | None = None          # a tag or a digest (sha256:...)


def parse(text: str, root: Path | None = None, runtime: str | None = None) -> ImageRef:
    """What `text` names. A path (absolute, ./, or ending .sqsh) is a file; `podman://` or, with
    runtime podman, a bare name is a local podman image; anything else a registry reference."""
    text = str(text).strip()
    if not text:
        raise ImageError("an empty image name")
    if text.startswith("podman://"):
        return ImageRef(text, PODMAN, reference=text.removeprefix("podman://"))
    if text.endswith(".sqsh") or text.startswith(("/", "./", "../")):
        path = Path(text)
        if not path.is_absolute() and root is not None:
            path = Path(root) / path
        return ImageRef(text, SQSH, path=path)
    if runtime == "podman" and "://" not in text:
        return ImageRef(text, PODMAN, reference=text)
    return parse_registry(text)


def parse_registry(text: str) -> ImageRef:
    """`[docker://][registry/ or registry#]name[:tag][@digest]` (Docker's and enroot's spellings)."""
    ref = text.removeprefix("docker://")
    if "#" in ref:
        registry, rest = ref.split("#", 1)
        registry = registry.rsplit("@", 1)[-1]  # enroot's USER@REGISTRY#IMAGE
    else:
        first, _, rest = ref.partition("/")
        if rest and ("." in first or ":" in first or first == "localhost"):
            registry = first
        else:
            registry, rest = _DEFAULT_REGISTRY, ref
    if "@" in rest:
        name, tag = rest.split("@", 1)
    else:
        match = re.fullmatch(r"(.+?)(?::([\w][\w.-]{0,127}))?", rest)
        if not match:
            raise ImageError(f"{text!r} is not an image reference")
        name, tag = match.group(1), match.group(2) or "latest"
    if registry == _DEFAULT_REGISTRY and "/" not in name:
        name = f"library/{name}"
    if not re.fullmatch(r"[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*", name):
        raise ImageError(f"{text!r}: {name!r} is not a valid image name (lower case, digits, . _ - and /)")
    return ImageRef(text, REGISTRY, reference=f"{registry}/{name}{'@' if tag.startswith('sha256:') else ':'}{tag}",
                    registry=registry, name=name, tag=tag)


# ---------------------------------------------------------------- the three kinds


def describe_sqsh(ref: ImageRef, previous: dict | None = None) -> dict:
    """The file's size and sha256; a hash recorded before for the same size and mtime is reused
    (a shared .sqsh is tens of GB, and the stage may run again with nothing changed)."""
    path = ref.path
    if not path.is_file():
        raise ImageError(f"image {ref.text}: {path} does not exist (or is not a file)")
    with open(path, "rb") as fh:
        magic = fh.read(4)
    if magic != b"hsqs":
        raise ImageError(f"image {ref.text}: {path} is not a squashfs file (enroot import or mksquashfs make one)")
    st = path.stat()
    old = (previous or {}).get("sqsh") or {}
    if old.get("path") == str(path) and old.get("size") == st.st_size and old.get("mtime_ns") == st.st_mtime_ns:
        digest = old["sha256"]
    else:
        log.info("hashing %s (%d bytes)", path, st.st_size)
        digest = sha256_file(path)
    return {"digest": f"sha256:{digest}", "size": st.st_size,
            "sqsh": {"path": str(path), "sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                     "method": "prebuilt"}}


def describe_podman(ref: ImageRef, podman: list[str]) -> dict:
    """`podman image exists`, then its inspect: id, digest, size (the command given, with its options)."""
    exists = subprocess.run([*podman, "image", "exists", ref.reference], capture_output=True, text=True)
    if exists.returncode == 1:
        raise ImageError(f"image {ref.text}: podman has no image {ref.reference!r} on this machine "
                         f"(podman images lists those it has)")
    if exists.returncode != 0:
        raise ImageError(f"image {ref.text}: podman image exists failed: {exists.stderr.strip()[-400:]}")
    proc = subprocess.run([*podman, "image", "inspect", ref.reference], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ImageError(f"image {ref.text}: podman image inspect failed: {proc.stderr.strip()[-400:]}")
    info = (json.loads(proc.stdout or "[]") or [{}])[0]
    return {"tag": ref.reference, "image_id": "sha256:" + str(info.get("Id", "")).removeprefix("sha256:"),
            "digest": info.get("Digest") or None, "repo_digests": info.get("RepoDigests") or [],
            "created": info.get("Created"), "size": info.get("Size")}


def _bearer_token(challenge: str, timeout: float) -> str | None:
    """The anonymous token a registry's `WWW-Authenticate: Bearer realm=...,service=...,scope=...` offers."""
    if not challenge.lower().startswith("bearer "):
        return None
    fields = dict(re.findall(r'(\w+)="([^"]*)"', challenge))
    realm = fields.pop("realm", None)
    if not realm:
        return None
    url = realm + ("&" if "?" in realm else "?") + urllib.parse.urlencode(fields)
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = json.loads(resp.read() or b"{}")
    return body.get("token") or body.get("access_token")


def _registry_get(url: str, method: str, timeout: float, token: str | None = None):
    req = urllib.request.Request(url, method=method, headers={"Accept": MANIFEST_TYPES,
                                                              "User-Agent": "mlrepro-container/1"})
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    return urllib.request.urlopen(req, timeout=timeout)


def _manifest(base: str, name: str, reference: str, timeout: float, token: str | None):
    """(digest, content type, manifest) of one manifest; the token challenge answered once."""
    url = f"{base}/v2/{name}/manifests/{reference}"
    try:
        resp = _registry_get(url, "GET", timeout, token)
    except urllib.error.HTTPError as err:
        if err.code != 401 or token:
            raise
        token = _bearer_token(err.headers.get("WWW-Authenticate", ""), timeout)
        if not token:
            raise
        resp = _registry_get(url, "GET", timeout, token)
    with resp:
        body = resp.read()
        digest = resp.headers.get("Docker-Content-Digest")
        kind = (resp.headers.get("Content-Type") or "").split(";")[0].strip()
    manifest = json.loads(body or b"{}")
    if not digest:
        import hashlib

        digest = "sha256:" + hashlib.sha256(body).hexdigest()
    return digest, kind or manifest.get("mediaType", ""), manifest, token


def describe_registry(ref: ImageRef, timeout: float = 30.0) -> dict:
    """The manifest's digest and the image's size (config + layers) for linux/amd64, from the registry."""
    scheme = "http" if ref.registry.split(":")[0] in _LOCAL_HOSTS else "https"
    base = f"{scheme}://{'registry-1.docker.io' if ref.registry == 'docker.io' else ref.registry}"
    try:
        digest, kind, manifest, token = _manifest(base, ref.name, ref.tag, timeout, None)
        platform_digest = None
        if kind in _INDEX_TYPES or "manifests" in manifest:
            entries = manifest.get("manifests") or []
            chosen = next((m for m in entries if (m.get("platform") or {}).get("architecture") == "amd64"
                           and (m.get("platform") or {}).get("os") == "linux"), entries[0] if entries else None)
            if chosen is None:
                raise ImageError(f"image {ref.text}: the registry's index lists no image")
            platform_digest, _, manifest, _ = _manifest(base, ref.name, chosen["digest"], timeout, token)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise ImageError(f"image {ref.text}: {ref.registry} has no {ref.name}:{ref.tag} (HTTP 404)") from None
        if err.code in (401, 403):
            raise ImageError(f"image {ref.text}: {ref.registry} refuses access (HTTP {err.code}); a private "
                             f"image is checked with the credentials enroot uses, which mlrepro does not read") from None
        raise ImageError(f"image {ref.text}: {ref.registry} answered HTTP {err.code} {err.reason}") from None
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        raise ImageError(f"image {ref.text}: cannot reach {ref.registry}: {reason}") from None
    except ValueError as err:
        raise ImageError(f"image {ref.text}: {ref.registry} sent a manifest that is not JSON ({err})") from None
    layers = manifest.get("layers") or []
    size = sum(int(x.get("size") or 0) for x in [manifest.get("config") or {}, *layers])
    return {"tag": ref.text, "digest": digest, "platform_digest": platform_digest, "size": size,
            "layers": len(layers), "registry": ref.registry, "repository": ref.name, "reference": ref.tag}


def describe(text: str, runtime: str, *, root: Path | None = None, podman: list[str] | None = None,
             previous: dict | None = None) -> dict:
    """container.json for a prebuilt image: what `text` names, checked, with digest and size.

    Raises ImageError naming the image when it does not exist or cannot be checked."""
    ref = parse(text, root, runtime)
    if ref.kind == SQSH:
        found = describe_sqsh(ref, previous)
    elif ref.kind == PODMAN:
        if podman is None:
            raise ImageError(f"image {ref.text}: a podman image needs podman on this machine")
        found = describe_podman(ref, podman)
    else:
        found = describe_registry(ref)
    return {"runtime": runtime, "prebuilt": True, "built": False, "image": text, "kind": ref.kind,
            "tag": found.pop("tag", ref.text), **found}


def record_matches(record: dict, image: str | None, runtime: str) -> bool:
    """Whether container.json (`record`) is of the image the configuration names now: the same
    prebuilt image, or a build (or the host) where none is named, for the same kind of runtime."""
    if image:
        return record.get("prebuilt") is True and record.get("image") == image and record.get("runtime") == runtime
    if record.get("prebuilt"):
        return False
    return (record.get("runtime", "none") == "none") == (runtime == "none")


def plan_line(text: str | None, runtime: str, build_from: str | os.PathLike | None) -> str:
    """What the dry run says of a seed's image: the prebuilt one named, or what will be built."""
    if runtime == "none":
        return "image: none (runs on the host's Python)"
    if text:
        return f"image: {text} (prebuilt, never built)"
    return f"image: built with podman from {build_from}" + (" and exported to .sqsh" if runtime == "enroot" else "")
