"""YAML for files a user edits: strict UTF-8, no key given twice, and no alias bomb.

PyYAML's safe_load shares the object an alias names instead of copying it, so a 9-line file whose
aliases expand to 10^9 values loads at once; it is whoever walks the result (schema validation, a
deep copy, a search for NaN) that never ends. The document is therefore measured before it is
built: the number of values it holds once every alias is expanded, counted on the composed node
graph with each shared node counted once per use (linear in the file's size), and a recursive
alias, which no configuration needs, is refused outright.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import os
import stat

import yaml

# Far above any configuration file (the largest in config/ expands to about 300 values), far below
# what makes a walk over the result slow (10^7 values took 8.9 s).
MAX_VALUES = 100_000


class YamlError(ValueError):
    """A YAML file that cannot be used; the message names the file."""


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
    """safe_load that refuses a key given twice in one mapping (plain YAML keeps the last). libyaml's
    parser where PyYAML has it: every `snakemake` reads the configuration, and the pure-Python one
    took a third of a second for config/."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # `<<: *base` brings keys that the mapping may then override
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark.line + 1)
            except TypeError:
                continue  # an unhashable key: construct_mapping reports it
            if first != key_node.start_mark.line + 1:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' is given twice (lines {first} and {key_node.start_mark.line + 1})",
                    key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def expanded_size(node: yaml.Node, limit: int = MAX_VALUES) -> int:
    """The number of values `node` holds with every alias expanded (stops counting past `limit`).

    Raises ValueError on a node that contains itself (a recursive alias)."""
    sizes: dict[int, int] = {}
    on_path: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in on_path:
            line = n.start_mark.line + 1 if n.start_mark else "?"
            raise ValueError(f"line {line}: a recursive alias (a value that contains itself)")
        on_path.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            children = n.value
        elif isinstance(n, yaml.MappingNode):
            children = [child for pair in n.value for child in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > limit:
                break
        on_path.discard(key)
        sizes[key] = min(total, limit + 1)
        return sizes[key]

    # Recursion goes as deep as the document nests, as the composer's own did to build it.
    return size(node)


def decode(data: bytes, source: str) -> str:
    """`data` as UTF-8 text; a byte that is not UTF-8 is named by line and column."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise YamlError(f"{source}: not UTF-8 text (byte 0x{data[exc.start]:02x} at line {line}, "
                        f"column {column})") from None


def loads(text: str, source: str, *, max_values: int = MAX_VALUES) -> Any:
    """The YAML document in `text` (None when empty); YamlError naming `source` otherwise."""
    try:
        loader = _StrictLoader(text)  # the reader refuses a control character (a NUL) right here
    except yaml.YAMLError as exc:
        raise YamlError(f"{source}: not valid YAML: {exc}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        try:
            n = expanded_size(node, max_values)
        except ValueError as exc:
            raise YamlError(f"{source}: {exc}; aliases may only name a value defined before them") from None
        except RecursionError:
            raise YamlError(f"{source}: nested too deeply") from None
        if n > max_values:
            raise YamlError(f"{source}: its aliases (*name) expand to more than {max_values:,} values; "
                            f"a configuration file is far smaller (an alias bomb?)")
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        raise YamlError(f"{source}: not valid YAML: {exc}") from None
    except RecursionError:
        raise YamlError(f"{source}: nested too deeply") from None
    finally:
        loader.dispose()


def load_file(path: str | Path, *, max_values: int = MAX_VALUES) -> Any:
    """The YAML file at `path` (None when empty); YamlError naming the file when it cannot be used."""
    path = Path(path)
    try:
        # O_NONBLOCK: a FIFO put where a file should be is refused, not waited on forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise YamlError(f"{path}: not a regular file")
            os.set_blocking(fd, True)
            data = fh.read()
    except FileNotFoundError:
        raise YamlError(f"{path}: file not found") from None
    except OSError as exc:
        raise YamlError(f"{path}: cannot read: {exc.strerror or exc}") from None
    return loads(decode(data, str(path)), str(path), max_values=max_values)
