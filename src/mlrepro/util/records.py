"""The one way a JSON record is typed: a frozen dataclass read by `from_json` (`read(path)` for a
file) and written whole by `to_json` (`write(path)`, one atomic write), whose unknown keys are kept in
`extra` and written back as read, never refused.

It lives in util, the lowest layer, so that every layer's records (paths.JobRecord, the scoring
records) share it. A record says how its keys read and write through small hooks (`_from_json_values`,
`_to_json_value`, `_keys_to_write`) rather than its own reader and writer.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from mlrepro.util.fsutil import atomic_write_json


class _Absent:
    """The value of a field whose key the record's JSON does not hold."""

    _one: ClassVar[_Absent | None] = None

    def __new__(cls) -> _Absent:
        if cls._one is None:
            cls._one = super().__new__(cls)
        return cls._one

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"

    def __reduce__(self) -> str:
        return "ABSENT"  # pickled (score_tree's worker processes) as the one instance


# None is written as null, so a record whose keys say what made it needs another "not there".
ABSENT: Any = _Absent()

R = TypeVar("R", bound="Record")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Record:
    """A JSON object as a frozen dataclass: the keys are the fields' names."""

    # Keys this version does not know, written back as they were read.
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    # Fields that are not keys of the JSON.
    _NOT_KEYS: ClassVar[frozenset[str]] = frozenset({"extra"})

    @classmethod
    def _keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in cls._NOT_KEYS]

    @classmethod
    def _from_json_values(cls, known: dict[str, Any]) -> dict[str, Any]:
        """Hook: the known keys as the fields hold them (a record whose fields are not JSON's types)."""
        return known

    def _to_json_value(self, key: str, value: Any) -> Any:
        """Hook: a field's value as its key is written (the inverse of `_from_json_values`)."""
        return value

    def _keys_to_write(self) -> list[str]:
        """Hook: the keys `to_json` writes, in order; by default every key the record holds."""
        return [key for key in self._keys() if getattr(self, key) is not ABSENT]

    @classmethod
    def _fields_of(cls, data: dict) -> dict[str, Any]:
        """The known keys of `data` as constructor arguments, the others under `extra`."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: not a JSON object but {type(data).__name__}")
        known = set(cls._keys())
        return {**cls._from_json_values({k: v for k, v in data.items() if k in known}),
                "extra": {k: v for k, v in data.items() if k not in known}}

    @classmethod
    def from_json(cls: type[R], data: dict) -> R:
        return cls(**cls._fields_of(data))

    @classmethod
    def read(cls: type[R], path: str | Path) -> R:
        return cls.from_json(json.loads(Path(path).read_text()))

    def to_json(self) -> dict[str, Any]:
        """The record as JSON holds it: the keys it writes, the unknown ones first, as read."""
        out = dict(self.extra)
        for key in self._keys_to_write():
            out[key] = self._to_json_value(key, getattr(self, key))
        return out

    def write(self, path: str | Path) -> None:
        atomic_write_json(path, self.to_json())

    def as_written(self) -> dict[str, Any]:
        """The JSON a reader of the written file gets (keys sorted, paths as text, tuples as lists), for
        pages that show the record as it was written, in the order it was written."""
        return json.loads(json.dumps(self.to_json(), sort_keys=True, default=str, allow_nan=False))

    def replace(self: R, **changes: Any) -> R:
        return dataclasses.replace(self, **changes)
