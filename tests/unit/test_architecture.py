"""The architecture: no module in an import cycle, no private name across modules; the leaves import nothing above them, the trainers nothing from mlrepro, and a trainer's own
reading and writing of the file formats agrees with mlrepro.formats; docs/architecture.md names every module."""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import numpy as np
import pytest

from mlrepro.formats import checkpoints, indexed

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "mlrepro"
TRAINER = ROOT / "implementations" / "mini_gpt" / "train.py"


def _mlrepro_imports(path: Path) -> set[str]:
    """Every mlrepro module `path` imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "mlrepro"}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlrepro":
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


@pytest.mark.parametrize("leaf", ["gpus.py", "formats/__init__.py", "formats/indexed.py", "formats/checkpoints.py"])
def test_a_leaf_imports_only_util(leaf):
    assert {m for m in _mlrepro_imports(SRC / leaf) if not m.startswith("mlrepro.util")} == set()


def test_config_imports_no_scoring():
    assert not [m for f in (SRC / "config").glob("*.py") for m in _mlrepro_imports(f) if m.startswith("mlrepro.scoring")]


def test_scoring_takes_gpu_figures_from_the_datasheets_not_the_planner():
    users = {p.name for p in (SRC / "scoring").glob("*.py") if any(
        m.startswith("mlrepro.plan") for m in _mlrepro_imports(p))}
    assert users == set()


@pytest.mark.parametrize("trainer", sorted((ROOT / "implementations").glob("*/*.py")), ids=lambda p: p.parent.name)
def test_trainers_import_nothing_from_mlrepro(trainer):
    assert _mlrepro_imports(trainer) == set()


@pytest.fixture(scope="module")
def train():
    spec = importlib.util.spec_from_file_location("mini_gpt_train", TRAINER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("dtype", [np.uint16, np.int32])
def test_the_trainers_reader_reads_what_mlrepro_writes(train, tmp_path, dtype):
    prefix = tmp_path / "corpus_text_document"
    writer = indexed.IndexedWriter(f"{prefix}.bin", dtype)
    docs = [[5, 6, 7], [], [1], list(range(100, 140))]  # an empty document adds no sequence
    for doc in docs:
        writer.add_document(doc)
    writer.finalize(f"{prefix}.idx")
    tokens = train.read_tokens(prefix)
    assert tokens.dtype == np.dtype(dtype)
    assert tokens.tolist() == [t for d in docs for t in d] == indexed.IndexedReader(prefix).tokens.tolist()


def test_the_trainers_reader_refuses_what_is_not_megatrons(train, tmp_path):
    prefix = tmp_path / "bad"
    writer = indexed.IndexedWriter(f"{prefix}.bin")
    writer.add_document([1, 2, 3])
    writer.finalize(f"{prefix}.idx")
    with open(f"{prefix}.bin", "ab") as fh:
        fh.write(b"\0\0")
    with pytest.raises(train.UsageError, match="its index describes 6"):
        train.read_tokens(prefix)
    Path(f"{prefix}.idx").write_bytes(b"NOTANIDX" + bytes(40))
    with pytest.raises(train.UsageError, match="not a Megatron index"):
        train.read_tokens(prefix)


def test_the_trainers_reader_names_a_truncated_index_or_a_fifo(train, tmp_path):
    """Issue 26's class of check in the trainer's own reader: no struct.error, no wait on a FIFO."""
    import os

    prefix = tmp_path / "cut"
    writer = indexed.IndexedWriter(f"{prefix}.bin")
    for doc in ([1, 2, 3], [4]):
        writer.add_document(doc)
    writer.finalize(f"{prefix}.idx")
    whole = Path(f"{prefix}.idx").read_bytes()
    for cut, words in ((20, "shorter than a Megatron index header"), (38, "2 sequences, but 1 lengths")):
        Path(f"{prefix}.idx").write_bytes(whole[:cut])
        with pytest.raises(train.UsageError, match=words):
            train.read_tokens(prefix)
    Path(f"{prefix}.idx").unlink()
    os.mkfifo(f"{prefix}.idx")
    with pytest.raises(train.UsageError, match="cut.idx: not a regular file"):
        train.read_tokens(prefix)


def test_the_trainers_checkpoints_are_the_folders_mlrepro_reads(train, tmp_path):
    for step, loss in [(20, 5.0), (40, 4.0), (60, 4.5), (80, 4.8)]:
        train.save_checkpoint(tmp_path, step, lambda d, s=step: (d / "state.pt").write_bytes(bytes([s])),
                              {"val_loss": loss, "samples": step * 16})
    (tmp_path / ".tmp_step_00000100.123").mkdir()  # a save killed halfway
    (tmp_path / "step_00000120").mkdir()  # no meta.json: not complete
    assert [c.step for c in checkpoints.listing(tmp_path)] == [20, 40, 60, 80]
    train.prune_checkpoints(tmp_path, keep_last=1, keep_best=1)
    # The same policy as mlrepro.formats.checkpoints.prune: the last one and the best by val_loss.
    assert [c.step for c in checkpoints.listing(tmp_path)] == [40, 80]
    last = checkpoints.latest(tmp_path)
    assert (last.step, (last.path / "state.pt").read_bytes()) == (80, bytes([80]))
    meta = json.loads((last.path / "meta.json").read_text())
    assert meta == {"step": 80, "val_loss": 4.8, "samples": 1280, "files": {"state.pt": 1}}
    assert checkpoints.problems(last) == []  # the sizes it lists are the ones mlrepro checks before a resume
    assert not (tmp_path / ".tmp_step_00000100.123").exists()
    assert [c[0] for c in train.checkpoints(tmp_path)] == [40, 80]


def _module_cycles(graph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_is_in_an_import_cycle():
    """import-linter's layers keep packages apart; this keeps modules inside a package acyclic too
    (an import inside a function counts: grimp reads every import statement)."""
    import grimp

    graph = grimp.build_graph("mlrepro", cache_dir=None)
    assert _module_cycles(graph) == []


def test_no_private_name_crosses_modules():
    """`from mlrepro.x import _y` or `x._y(...)` on an mlrepro module: a private name is its module's own."""
    crossing = []
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlrepro":
                crossing += [f"{path.relative_to(SRC)}: {node.module}.{a.name}"
                             for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                modules |= {a.asname or a.name for a in node.names}
            elif isinstance(node, ast.Import):
                modules |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("mlrepro")}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and node.attr.startswith("_") and not node.attr.startswith("__")):
                crossing.append(f"{path.relative_to(SRC)}:{node.lineno}: {node.value.id}.{node.attr}")
    assert crossing == []


def _listed_modules(doc: str) -> set[str]:
    """The modules docs/architecture.md's package listing names, as paths under src/mlrepro: a file
    on a package's line (`  launch/`) or on the lines below it belongs to that package."""
    block = doc.split("## The package, module by module", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    listed, package = set(), ""
    for line in block.splitlines():
        if len(line) - len(line.lstrip()) == 2:  # a package (`name/`) or a top-level module
            top = re.match(r"\s*(\w+)/", line)
            package = top.group(1) if top else ""
            listed |= {f"{package}/__init__.py"} if top else set()
        listed |= {f"{package}/{name}" if package else name for name in re.findall(r"\b(\w+\.py)\b", line)}
    return listed


def test_the_architecture_page_names_every_module():
    """A module docs/architecture.md does not name, in its package listing or as `package/module.py`
    anywhere on the page, is one a newcomer cannot find from it."""
    doc = (ROOT / "docs" / "architecture.md").read_text()
    named = _listed_modules(doc) | set(re.findall(r"[\w/]+\.py", doc))
    unnamed = [p.relative_to(SRC).as_posix() for p in sorted(SRC.rglob("*.py"))
               if p.relative_to(SRC).as_posix() not in named]
    assert unnamed == [], f"modules docs/architecture.md does not name: {unnamed}"
