"""The workflow's schemas (workflow/schemas/*.schema.yaml) applied to a config file's data: every problem
named by its key, defaults filled in, an integer an int, no NaN or infinity."""

from __future__ import annotations

import copy
import functools
import math
from pathlib import Path
from typing import Any

import jsonschema
import yaml

# The schemas belong to the workflow: a checkout validates its config with its own.
SCHEMA_SUBDIR = Path("workflow") / "schemas"


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file and the key."""


# libyaml's parser where PyYAML was built with it: the workflow reads every config file at parse time.
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.cache
def load_schema(schema_dir: Path, name: str) -> dict:
    return yaml.load((schema_dir / f"{name}.schema.yaml").read_text(), Loader=_SAFE_LOADER)


def _key_path(error: jsonschema.ValidationError) -> str:
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    return path.lstrip(".") or "(top level)"


def describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        where = _key_path(error)
        keys = ", ".join(f"'{k}'" for k in extra)
        prefix = "" if where == "(top level)" else f"{where}: "
        return f"{prefix}unknown key {keys} (allowed: {', '.join(allowed)})"
    return f"{_key_path(error)}: {error.message}"


def _fill_defaults(instance: Any, schema: dict, root: dict) -> None:
    """Insert `default` values of the schema's object properties into `instance`, in place."""
    if "$ref" in schema:
        ref = schema["$ref"].removeprefix("#/")
        target = root
        for part in ref.split("/"):
            target = target[part]
        schema = target
    if isinstance(instance, list) and "items" in schema:
        for item in instance:
            _fill_defaults(item, schema["items"], root)
        return
    if not isinstance(instance, dict):
        return
    for key, sub in schema.get("properties", {}).items():
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(instance[key], sub, root)


def _non_finite(data: Any, path: str = "") -> list[str]:
    """Key paths of NaN/infinite numbers in `data`: JSON Schema's `number` lets them through."""
    if isinstance(data, float) and not math.isfinite(data):
        return [f"{path.lstrip('.') or '(top level)'}: {data} is not a finite number"]
    if isinstance(data, dict):
        return [msg for k, v in data.items() for msg in _non_finite(v, f"{path}.{k}")]
    if isinstance(data, list):
        return [msg for i, v in enumerate(data) for msg in _non_finite(v, f"{path}[{i}]")]
    return []


# JSON Schema counts 3.0 as an integer; a count written 3.0 then reaches range() or a job name
# ("seed_1.0") and fails there, long after the dry run. Here an integer is an int.
_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool)))


def validate(data: Any, schema_name: str, source: str, root: Path) -> dict:
    """Validate `data` against <root>/workflow/schemas/<schema_name>.schema.yaml; return it with defaults filled."""
    schema = load_schema(root / SCHEMA_SUBDIR, schema_name)
    validator = _Validator(schema)
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    problems = _non_finite(data) + [describe(e) for e in errors]
    if problems:
        lines = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"{source} is invalid:\n{lines}")
    data = copy.deepcopy(data)
    _fill_defaults(data, schema, schema)
    return data
