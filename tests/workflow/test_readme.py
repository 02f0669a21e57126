"""Issue 8, point 3 and issue 22: every shell command README.md and docs/*.md show runs, in the order each shows them.

The commands are the lines of the ```bash blocks: README.md's first, then each docs/*.md page's (sorted
by name). Documented placeholders are substituted; what cannot run here as written runs in a stated
form (`as_run`): a run that would take long is a dry run (`snakemake -n`, `make -n`), the suite is
collected, not run (`pytest --collect-only`), and `mlrepro cluster status` is its `--help` where no
Slurm exists. The environment is the README's: the project's venv activated (its bin first on PATH)
and the named profiles installed by the set-up (in a private XDG_CONFIG_HOME). A page that shows a
command that does not run, or a placeholder this test does not know, fails here.

Two kinds of page show commands that ran elsewhere and are not run here: the records of
docs/measurements/ and the GPU node's set-up, device/README.md (no GPU, no such node here). For those
the scripts and files their commands name must exist (`test_device_pages_name_scripts_that_exist`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import logs_factory
from mlrepro.corpus import minicorpus
from workspace import REPO, make_workspace

COMMAND_WORDS = ("snakemake", "mlrepro", "make", "python", "sudo", "export", "source", "rm", "cp", "pip")


def readme_commands(text: str) -> list[str]:
    """The command lines of the ```bash blocks, continuation lines joined."""
    commands = []
    for block in re.findall(r"^\s*```bash\n(.*?)^\s*```", text, flags=re.M | re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.strip().startswith("#"):
                commands.append(line.strip())
    return commands


def inline_commands(text: str) -> list[str]:
    """Inline code spans outside the blocks that look like whole commands."""
    prose = re.sub(r"^\s*```.*?^\s*```", "", text, flags=re.M | re.S)
    return [span for span in re.findall(r"`([^`\n]+)`", prose)
            if span.split()[0] in COMMAND_WORDS and len(span.split()) > 1]


# The pages whose commands run here, in the order they run: README.md, then docs/*.md by name.
def run_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


# The pages whose commands ran on a GPU node without network (recorded runs, the node's set-up): not run here.
def device_pages() -> list[Path]:
    return [REPO / "device" / "README.md", *sorted((REPO / "docs" / "measurements").rglob("*.md"))]


def test_every_markdown_page_is_classified():
    """A new page of the guide is run by this test or named as a record; none falls between."""
    pages = {p for p in REPO.glob("*.md")} | set((REPO / "docs").rglob("*.md")) | set((REPO / "device").rglob("*.md"))
    assert pages == set(run_pages()) | set(device_pages()), sorted(map(str, pages ^ (set(run_pages()) | set(device_pages()))))
    assert (REPO / "README.md").read_text().count("\n") <= 150, "README.md is the front door: at most 150 lines"


def test_readme_shows_commands_only_where_they_are_run():
    commands = {page: readme_commands(page.read_text()) for page in run_pages()}
    assert len(commands[REPO / "README.md"]) >= 8 and sum(map(len, commands.values())) >= 40, commands
    shown = " \n ".join(c for page in commands.values() for c in page)
    for page in run_pages():
        untested = [span for span in inline_commands(page.read_text()) if span not in shown]
        assert untested == [], f"commands in {page.name}'s prose that no block shows (and no test runs): {untested}"
    # The user's command on a real cluster stays on the front door.
    assert "snakemake --profile slurm results/llama2_lora/score.json" in " ".join(commands[REPO / "README.md"])
    for command in (c for page in commands.values() for c in page):
        words = shlex.split(command, comments=True)
        if words[0] == "snakemake" and "--config" in words:
            after = words[words.index("--config") + 1:]
            assert not any(w.startswith(("results/", "resources/")) for w in after), \
                f"a file target after --config is read as a config entry: {command}"


def test_device_pages_name_scripts_that_exist():
    """device/README.md and the records: their commands ran on a GPU node, so here each script, settings
    file and record they name in the repository is checked to exist, where it now lives."""
    named = []
    for page in device_pages():
        text = page.read_text()
        for command in readme_commands(text):
            named += [w for w in shlex.split(command, comments=True) if w.startswith("device/")]
        named += re.findall(r"`(device/[\w./-]+)`", text)
        named += re.findall(r"`(docs/measurements/[\w./*-]+)`", text)
    assert named, "the device pages name no script"
    missing = [n for n in named if not list(REPO.glob(n.replace("[_h100]", "*")))]
    assert missing == [], f"named by device/README.md or docs/measurements/ but not in the repository: {missing}"


# Run for real, from the clean state of a fresh checkout (issue 27): the pretraining miniature, with its
# corpus served by the workflow itself. Every other snakemake command is a dry run.
REAL_RUNS = ("snakemake --profile profiles/local results/mini_gpt/score.json",)


def as_run(command: str, placeholders: dict[str, str]) -> str:
    for placeholder, value in placeholders.items():
        command = command.replace(placeholder, value)
    left = re.findall(r"<[^>]+>", command.split("#")[0])
    assert not left, f"README placeholder(s) {left} that this test does not know: {command}"
    words = shlex.split(command, comments=True)
    # The command as documented, shell syntax (a redirection, a pipe) and all, a word added where it
    # must not do the real thing.
    if words[0] == "snakemake" and shlex.join(words) in REAL_RUNS:
        return shlex.join(words)
    if words[0] in ("snakemake", "make") and "-n" not in words and "--unlock" not in words:
        # a real run takes minutes to hours, `make` installs and runs everything: the plan instead
        return re.sub(rf"^{words[0]} ", f"{words[0]} -n ", command.strip())
    if words[:3] == ["mlrepro", "cluster", "status"] and shutil.which("sinfo") is None:
        return "mlrepro cluster --help"  # no Slurm on this machine to ask
    return command.strip()


@pytest.mark.slow
def test_every_readme_command_runs(tmp_path):
    ws = make_workspace(tmp_path / "ws")
    for name in ("Makefile", "pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, ws / name)
    shutil.copytree(REPO / "tests", ws / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    (ws / ".venv").symlink_to(Path(sys.prefix))  # the project's venv: the one running the tests
    logs = tmp_path / "nvidia-logs"
    logs_factory.write_runs(logs, logs_factory.ten_runs())
    (tmp_path / "405b").mkdir()
    vocab, merges = minicorpus.train_gpt2_bpe(minicorpus.documents(300, seed=1), tmp_path / "tokenizer", vocab_size=500)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in minicorpus.documents(50)))
    placeholders = {
        "<benchmark>": "mini_lora",
        "<system>": "local",  # this CPU machine: preflight's GPU parts read "not applicable"
        "<name>": "local-slurm",
        "<your Hugging Face token>": "hf_readme_test_token_000000",
        "path/to/logs": str(logs),
        "/path/holding/405b": str(tmp_path / "405b"),
        "<corpus.jsonl>": str(corpus),
        "<vocab.json>": str(vocab),
        "<merges.txt>": str(merges),
        # a checkout of mlcommons/training_results_v5.0: the sample tree the scoring tests use
        "mlrepro score training_results_v5.0": f"mlrepro score {REPO / 'tests' / 'fixtures' / 'mlperf_v5_sample'}",
    }
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": sys.prefix, "XDG_CONFIG_HOME": str(tmp_path / "xdg"), "PYTHONUNBUFFERED": "1"}
    # The set-up (`make mini` / `make test`) installs the named profiles; the make commands below are dry runs.
    setup = subprocess.run([sys.executable, "-m", "mlrepro", "profiles", "install"], cwd=ws, env=env,
                           capture_output=True, text=True, timeout=120)
    assert setup.returncode == 0, setup.stderr

    ran = []
    for command in (c for page in run_pages() for c in readme_commands(page.read_text())):
        run = as_run(command, placeholders)
        words = shlex.split(run, comments=True)
        if words[:2] == ["rm", "-r"]:
            for path in words[2:]:  # the state the README's example starts from
                (ws / path).mkdir(parents=True, exist_ok=True)
        if words[:3] == ["python", "-m", "pytest"]:
            run = shlex.join([*words, "--collect-only", "-q"])  # the suite itself is what CI runs
        proc = subprocess.run(["bash", "-c", run], cwd=ws, env=env, capture_output=True, text=True,
                              timeout=1800 if run in REAL_RUNS else 300)
        assert proc.returncode == 0, f"documented command failed: {command}\n(ran: {run})\n" \
                                     f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        ran.append(run)
    assert any(r.startswith("snakemake -n --profile slurm results/llama2_lora/score.json") for r in ran), ran
    assert (ws / "score.json").is_file(), "mlrepro score --json wrote nothing"
    assert (ws / "corpus_text_document.idx").is_file(), "mlrepro preprocess wrote nothing"
    assert (ws / "results/preflight/local/preflight.json").is_file(), "mlrepro preflight wrote nothing"
    # mini_gpt from nothing: the corpus written and served by its own stages, three seeds, a valid score
    assert REAL_RUNS[0] in ran and (ws / "resources/corpora/mini_corpus/origin/origin.json").is_file()
    score = json.loads((ws / "results/mini_gpt/score.json").read_text())
    assert score["valid"], score["reasons"]
    assert (ws / "results/mini_gpt/report.html").is_file()
