"""Running an implementation's own download scripts (on the host or in its container) and their documented cleanups."""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from mlrepro.container.image import runtime_command
from mlrepro.util.secrets import redactor, secret_values
from mlrepro.data.checks import DataError
from mlrepro.util.proc import run_logged

log = logging.getLogger(__name__)



# ---------------------------------------------------------------------------
# an implementation's own download scripts
# ---------------------------------------------------------------------------

def container_command(
    container: str | os.PathLike,
    argv: Sequence[str],
    *,
    env_names: Iterable[str] = (),
    mounts: Mapping[str | os.PathLike, str] | None = None,
    workdir: str | None = None,
    engine: str = "podman",
) -> list[str]:
    """The command line that runs `argv` inside `container`.

    A path ending in .sqsh runs with `enroot start` (the image file directly);
    anything else is an image name for `engine run --rm`. Environment variables
    are passed by name only (`--env NAME`): the runtime copies the value from
    its own environment, so secrets never appear on a command line.
    `mounts` maps host paths to container paths; append ":ro" to the container
    path for a read-only mount.
    """
    container = str(container)
    mounts = mounts or {}
    if container.endswith(".sqsh"):
        cmd = ["enroot", "start", "--rw"]
        for name in env_names:
            cmd += ["--env", name]
        for host, inside in mounts.items():
            cmd += ["--mount", f"{Path(host).absolute()}:{inside}"]
        cmd.append(str(Path(container).absolute()))
        if workdir:
            # enroot has no workdir flag; change directory inside the container.
            return cmd + ["sh", "-c", f"cd {shlex.quote(workdir)} && exec \"$@\"", "sh", *argv]
        return cmd + list(argv)
    # The same podman as the container stage built the image with (its store, from MLREPRO_PODMAN_*).
    cmd = [*runtime_command(engine), "run", "--rm"]
    for name in env_names:
        cmd += ["--env", name]
    for host, inside in mounts.items():
        cmd += ["--volume", f"{Path(host).absolute()}:{inside}"]
    if workdir:
        cmd += ["--workdir", workdir]
    return cmd + [container, *argv]


def run_download_script(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    *,
    env: Mapping[str, str],
    log_path: str | os.PathLike,
    container: str | os.PathLike | None = None,
    mounts: Mapping[str | os.PathLike, str] | None = None,
    workdir: str | os.PathLike | None = None,
    python: str = "python3",
    secrets: Iterable[str] = (),
) -> Path:
    """Run an implementation's download script; its output goes, redacted, to `log_path`.

    `env` is added to this process's environment for the child (put HF_TOKEN
    here: it never goes on the command line, and an argument that contains a
    secret is refused). Values of secret-looking variables (..._TOKEN, ...SECRET,
    ...PASSWORD, ...KEY) and `secrets` are replaced by *** in the log. With
    `container`, the script path is the path inside the container and the
    command is wrapped by `container_command`. A non-zero exit raises DataError
    naming the log and showing its last lines.
    """
    child_env = {**os.environ, **env}
    hidden = secret_values(child_env) + [s for s in secrets if s]
    argv = [python, str(script), *map(str, args)]
    for a in argv:
        if redactor(child_env, hidden).text(a) != a:
            raise DataError("a secret value was given as a command-line argument of the download script; "
                            "pass it through the environment (env=) instead")
    if container is not None:
        cmd = container_command(container, argv, env_names=sorted(env), mounts=mounts,
                                workdir=str(workdir) if workdir else None)
        cwd = None
    else:
        cmd = argv
        cwd = workdir
    return run_logged(cmd, env=env, log_path=log_path, error=DataError, cwd=cwd, secrets=secrets,
                      what=f"download script {script}")


# ---------------------------------------------------------------------------
# documented cleanups (config/benchmarks/llama31_405b.yaml holds the one its README gives)
# ---------------------------------------------------------------------------

def apply_cleanup(folder: str | os.PathLike, cleanup: Mapping) -> list[str]:
    """Carry out a documented download cleanup in `folder`; safe to repeat.

    Removes the files listed under "remove" and replaces each folder under
    "unwrap" by the file of the given name inside it. Returns what was done.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"cannot clean up {folder}: it is not a folder")
    done = []
    for outer, inner in cleanup.get("unwrap", {}).items():
        outer_path = folder / outer
        if not outer_path.is_dir():
            continue
        inner_path = outer_path / inner
        if not inner_path.is_file():
            raise DataError(f"cleanup of {folder}: {outer_path} is a folder without {inner}; "
                            f"the download looks incomplete")
        staged = folder / f".{outer}.unwrap"
        os.replace(inner_path, staged)
        shutil.rmtree(outer_path)
        os.replace(staged, outer_path)
        done.append(f"unwrapped {outer}/{inner}")
    for name in cleanup.get("remove", []):
        target = folder / name
        if target.is_dir():
            shutil.rmtree(target)
            done.append(f"removed {name}/")
        elif target.exists():
            target.unlink()
            done.append(f"removed {name}")
    return done
