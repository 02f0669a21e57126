"""mlrepro.util.safe_yaml (alias bombs, strict UTF-8, repeated keys, no FIFO) and mlrepro.util.confine
(a path a config names stays inside its root): issue 26."""

from __future__ import annotations

import os
import time

import pytest

from mlrepro.util import confine, safe_yaml


# ---------------------------------------------------------------- safe_yaml

def bomb(levels: int, width: int = 10) -> str:
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    lines += [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("levels", [6, 9, 30])
def test_an_alias_bomb_is_refused_at_once(levels):
    start = time.monotonic()
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: its aliases"):
        safe_yaml.loads(bomb(levels), "f.yaml")
    assert time.monotonic() - start < 1.0


def test_aliases_that_stay_small_load_as_plain_yaml():
    text = "base: &b {lr: 0.1, steps: [1, 2]}\nrun1: *b\nrun2: {<<: *b, lr: 0.2}\n" + bomb(3)
    data = safe_yaml.loads(text, "f.yaml")
    assert data["run1"] == {"lr": 0.1, "steps": [1, 2]} and data["run2"]["lr"] == 0.2
    assert len(data["l2"]) == 10 and data["l2"][0][0] == ["x"] * 10


def test_the_limit_counts_expanded_values():
    assert safe_yaml.expanded_size(safe_yaml._StrictLoader(bomb(4)).get_single_node()) > 10_000
    with pytest.raises(safe_yaml.YamlError):
        safe_yaml.loads(bomb(4), "f.yaml", max_values=10_000)
    assert safe_yaml.loads(bomb(4), "f.yaml", max_values=20_000)["l0"] == ["x"] * 10


@pytest.mark.parametrize("text", ["a: &a [*a]", "a: &a {b: *a}", "- &x [1, [2, *x]]"])
def test_a_recursive_alias_is_refused(text):
    with pytest.raises(safe_yaml.YamlError, match="recursive alias"):
        safe_yaml.loads(text, "f.yaml")


def test_a_repeated_key_and_bad_yaml_name_the_file():
    with pytest.raises(safe_yaml.YamlError, match=r"f.yaml: .*key 'a' is given twice \(lines 1 and 3\)"):
        safe_yaml.loads("a: 1\nb: 2\na: 3\n", "f.yaml")
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: not valid YAML"):
        safe_yaml.loads("a: [1, 2\n", "f.yaml")


def test_a_control_character_names_the_file():
    """Found by the property tests: PyYAML's reader refuses a NUL when the loader is made."""
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: not valid YAML: unacceptable character #x0000"):
        safe_yaml.loads("a: 1\n# \x00\n", "f.yaml")


def test_deep_nesting_is_an_error_not_a_crash():
    with pytest.raises(safe_yaml.YamlError, match="f.yaml: nested too deeply"):
        safe_yaml.loads("[" * 20_000 + "]" * 20_000, "f.yaml")


def test_files_strict_utf8_empty_and_not_regular(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: 1\nname: caf\xe9\n")
    with pytest.raises(safe_yaml.YamlError, match=r"bad.yaml: not UTF-8 text \(byte 0xe9 at line 2, column 10\)"):
        safe_yaml.load_file(bad)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# only a comment\n")
    assert safe_yaml.load_file(empty) is None
    with pytest.raises(safe_yaml.YamlError, match="missing.yaml: file not found"):
        safe_yaml.load_file(tmp_path / "missing.yaml")
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(safe_yaml.YamlError, match="fifo.yaml: not a regular file"):
        safe_yaml.load_file(fifo)


# ---------------------------------------------------------------- confine

@pytest.mark.parametrize("relative, inside", [
    ("scripts/download.py", True), ("./a/../b.py", True), ("a/b/../../c", True),
    ("../x", False), ("a/../../x", False), ("/bin/true", False), ("", False), ("a\x00b", False), ("..", False),
])
def test_paths_that_stay_inside(tmp_path, relative, inside):
    assert (confine.outside(tmp_path, relative) is None) == inside


def test_a_link_out_of_the_root(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "out.py").symlink_to("/bin/true")
    (tmp_path / "root" / "in.py").symlink_to(tmp_path / "root" / "real.py")
    assert "resolves to" in confine.outside(tmp_path / "root", "out.py")
    assert confine.outside(tmp_path / "root", "in.py") is None
