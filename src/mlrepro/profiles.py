"""`mlrepro profiles install`: the repository's profiles as Snakemake's named profiles.

`snakemake --profile slurm` looks for a folder named `slurm` in the working directory, then
in the user's config folder (~/.config/snakemake, or $XDG_CONFIG_HOME/snakemake), then in
/etc/xdg/snakemake; never in a repository's profiles/. Installing links
~/.config/snakemake/{local,slurm} -> <repository>/profiles/{local,slurm} makes the card's
`snakemake --profile slurm ...` work while profiles/ stays the one source of truth.

Safe to repeat. A user's own profile of the same name is never replaced: it is reported and
left as is. A link of ours (to some checkout's profiles/<name>) that no longer resolves is
replaced; one to another checkout that still exists is replaced only with --force.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NAMES = ("local", "slurm")


def user_profile_dir() -> Path:
    """Where Snakemake looks for named profiles of this user (the same lookup as its own)."""
    from snakemake.common import get_appdirs

    return Path(get_appdirs().user_config_dir)


def _ours(link: Path, name: str) -> bool:
    """A link to some checkout's profiles/<name>: what this command makes."""
    target = Path(os.readlink(link))
    return target.parts[-2:] == ("profiles", name)


def install(repo: Path, dest: Path | None = None, *, force: bool = False) -> list[tuple[str, str]]:
    """Link dest/<name> -> repo/profiles/<name> for each profile; returns (name, what happened)."""
    repo = Path(repo).resolve()
    dest = user_profile_dir() if dest is None else Path(dest)
    done = []
    for name in NAMES:
        source = repo / "profiles" / name
        if not (source / "config.yaml").is_file():
            raise FileNotFoundError(f"{source}/config.yaml not found: run this from the repository root")
        link = dest / name
        if link.is_symlink():
            if link.resolve() == source:
                done.append((name, f"{link} -> {source} (already installed)"))
                continue
            if not _ours(link, name):
                done.append((name, f"{link} is your own link to {os.readlink(link)}; left as is "
                                   f"(use --profile {source} to use mlrepro's)"))
                continue
            if link.exists() and not force:
                done.append((name, f"{link} points at another checkout's profile ({os.readlink(link)}); "
                                   f"left as is (mlrepro profiles install --force points it here)"))
                continue
        elif link.exists():
            done.append((name, f"{link} is your own profile; left as is: `--profile {name}` uses it, "
                               f"not mlrepro's (use --profile {source}, or move yours and run this again)"))
            continue
        dest.mkdir(parents=True, exist_ok=True)
        staged = dest / f".{name}.mlrepro-link"
        staged.unlink(missing_ok=True)
        staged.symlink_to(source, target_is_directory=True)
        os.replace(staged, link)  # atomic: a concurrent snakemake sees the old link or the new one
        done.append((name, f"{link} -> {source}"))
    return done


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("install",), help="install: link the named profiles local and slurm")
    parser.add_argument("--repo", type=Path, default=Path.cwd(), help="repository root (default: the working directory)")
    parser.add_argument("--force", action="store_true",
                        help="also re-point links to another checkout's profiles (never a profile of your own)")


def run(args: argparse.Namespace) -> int:
    try:
        done = install(args.repo, force=args.force)
    except (FileNotFoundError, OSError) as exc:
        print(f"mlrepro profiles: {exc}", file=sys.stderr)
        return 2
    for _, line in done:
        print(f"profile {line}")
    return 0
