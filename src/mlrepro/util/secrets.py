"""The one definition of a secret, and the redaction every log and message goes through.

A secret is the value of an environment variable whose name says it is one: a name made of
words (split at `_`, `-`, `.`) of which one is, or ends with, a secret word (HF_TOKEN,
DB_PASS, SSH_PRIVATE, AZURE_CREDENTIAL, OPENAI_APIKEY, GH_PAT, NPM_AUTH, MYSQLPASSWORD ...).
Words are matched whole so that TOKENIZERS_PARALLELISM or PATH are not secrets; a few
names the system sets for every login (XDG_SESSION_ID, SSH_AUTH_SOCK ...) are not either.

Values of any length count. Redaction replaces a value, its shell-quoted form (as
shlex.join writes it) and its JSON-escaped form, and each word of a value that holds
spaces; a value shorter than MIN_ANYWHERE characters is replaced only where it stands as a
whole word, since a fragment of a longer word is no disclosure and replacing every "a" or
"1" of a log would destroy it. MLLOG lines keep their JSON: only their strings are redacted.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from functools import lru_cache
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from mlrepro.util.fsutil import atomic_write_bytes

REDACTED = "***"

# A name word equal to one of these marks a secret...
_WORDS = {"TOKEN", "TOKENS", "SECRET", "SECRETS", "PASSWORD", "PASSWORDS", "PASSWD", "PASS", "PASSPHRASE",
          "PWD", "KEY", "KEYS", "APIKEY", "CREDENTIAL", "CREDENTIALS", "CREDS", "PRIVATE", "PAT", "AUTH",
          "COOKIE", "COOKIES", "SESSION", "SIGNATURE", "JWT", "BEARER"}
# ...and so does a word ending with one of these (HFTOKEN, MYSQLPASSWORD, OPENAIAPIKEY).
_SUFFIXES = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY",
             "CREDENTIAL", "CREDENTIALS", "COOKIE")
# Set by the system for every login; their values are ids and socket paths.
_NOT_SECRET = re.compile(r"^(XDG_SESSION_\w+|DBUS_SESSION_BUS_ADDRESS|SSH_AUTH_SOCK|GNOME_KEYRING_\w+|PWD|OLDPWD"
                         r"|KEYTIMEOUT|SESSION_MANAGER|DESKTOP_SESSION)$")

MIN_ANYWHERE = 4


def is_secret_name(name: str) -> bool:
    """True for environment variable names that hold secrets (HF_TOKEN, WANDB_API_KEY, DB_PASS, ...)."""
    upper = str(name).upper()
    if _NOT_SECRET.match(upper):
        return False
    for word in re.split(r"[_\-.]+", upper):
        if word in _WORDS or (word and word.endswith(_SUFFIXES)):
            return True
    return False


def secret_values(env: Mapping[str, object] | None = None) -> list[str]:
    """The values of `env` (default: this process's environment) whose names are secret, longest first."""
    env = os.environ if env is None else env
    values = {str(v) for k, v in env.items() if v is not None and str(v) != "" and is_secret_name(k)}
    return sorted(values, key=len, reverse=True)


def public_env(env: Mapping[str, object]) -> dict[str, str]:
    """`env` without its secret variables: what may be written to a file (a pickle, a job record)."""
    return {str(k): str(v) for k, v in env.items() if not is_secret_name(k)}


def redact_env(env: Mapping[str, object]) -> dict[str, str]:
    """A copy of `env` fit for logs: secret values replaced by ***."""
    return {str(k): (REDACTED if is_secret_name(k) else str(v)) for k, v in env.items()}


def _forms(value: str) -> set[str]:
    """The ways `value` shows up in text: raw, shell-quoted, JSON-escaped, and its words."""
    forms = {value, shlex.quote(value), json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1]}
    forms |= {w for w in value.split() if w}
    return {f for f in forms if f}


class Redactor:
    """Replaces a fixed set of secret values; built once, applied to many lines."""

    def __init__(self, values: Iterable[str | None]):
        forms: set[str] = set()
        for value in values:
            if value:
                forms |= _forms(str(value))
        anywhere = sorted((f for f in forms if len(f) >= MIN_ANYWHERE), key=len, reverse=True)
        short = sorted((f for f in forms if len(f) < MIN_ANYWHERE), key=len, reverse=True)
        parts = [re.escape(f) for f in anywhere]
        # A short value only as a whole word: not touching a letter, digit or underscore.
        parts += [rf"(?<![\w]){re.escape(f)}(?![\w])" for f in short]
        self.empty = not parts
        self._pattern = re.compile("|".join(parts)) if parts else None
        self._bytes = re.compile("|".join(parts).encode()) if parts else None
        self._values = frozenset(forms)

    def text(self, text: str) -> str:
        if self._pattern is None or not text:
            return text
        return "\n".join(self._line(line) for line in text.split("\n"))

    def _line(self, line: str) -> str:
        if ":::MLLOG" in line and self._pattern.search(line):
            head, _, body = line.partition(":::MLLOG")
            try:
                record = json.loads(body)
            except ValueError:
                return self._pattern.sub(REDACTED, line)
            # Only the strings: a short secret equal to a number must not break the record.
            return f"{self._pattern.sub(REDACTED, head)}:::MLLOG {json.dumps(self._strings(record))}"
        return self._pattern.sub(REDACTED, line)

    def _strings(self, obj):
        if isinstance(obj, str):
            return self._pattern.sub(REDACTED, obj)
        if isinstance(obj, dict):
            return {self._strings(k): self._strings(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._strings(v) for v in obj]
        return obj

    def line_bytes(self, line: bytes) -> bytes:
        """One line of a child's output (bytes, newline kept)."""
        if self._bytes is None or not self._bytes.search(line):
            return line
        end = b"\n" if line.endswith(b"\n") else b""
        return self._line(line[: len(line) - len(end)].decode("utf-8", "surrogateescape")).encode(
            "utf-8", "surrogateescape") + end


_ASSIGNMENT = re.compile(r"""\b([A-Za-z_][A-Za-z0-9_]*)=('[^']*'|"(?:[^"\\]|\\.)*"|\S+)""")


@lru_cache(maxsize=8)
def _environment_redactor(items: frozenset) -> Redactor:
    return Redactor(v for _, v in items)


def redactor(env: Mapping[str, object] | None = None, extra: Iterable[str | None] = ()) -> Redactor:
    """A Redactor for the secrets of `env` (default: this process's environment) and `extra`."""
    env = os.environ if env is None else env
    extra = [e for e in extra if e]
    if not extra:
        secret = frozenset((k, str(v)) for k, v in env.items() if v is not None and is_secret_name(k))
        return _environment_redactor(secret)
    return Redactor([*secret_values(env), *extra])


def redact(text: str, extra: Iterable[str | None] = (), env: Mapping[str, object] | None = None) -> str:
    """`text` with every secret value of `env` (default: os.environ) and of `extra` replaced by ***,
    and the value of every NAME=value whose NAME is a secret name, whatever it is."""
    text = redactor(env, extra).text(str(text))
    return _ASSIGNMENT.sub(lambda m: f"{m.group(1)}={REDACTED}" if is_secret_name(m.group(1)) else m.group(0), text)


def redact_command(command: Sequence[object], env: Mapping[str, object] | None = None) -> list[str]:
    """A command line fit for logs (see `redact`)."""
    return [redact(str(arg), env=env) for arg in command]


def redact_file(path: str | os.PathLike, extra: Iterable[str | None] = (),
                env: Mapping[str, object] | None = None) -> bool:
    """Redact a log file in place (atomically); True when something was replaced."""
    path = Path(path)
    rd = redactor(env, extra)
    if rd.empty:
        return False
    data = path.read_bytes()
    lines = data.splitlines(keepends=True)
    new = b"".join(rd.line_bytes(line) for line in lines)
    if new == data:
        return False
    atomic_write_bytes(path, new)
    return True


class RedactingFilter:
    """A logging filter that redacts each record's message (and its traceback) before any handler writes it."""

    def filter(self, record) -> bool:
        message = record.getMessage()
        if record.exc_info and not record.exc_text:
            import logging

            record.exc_text = logging.Formatter().formatException(record.exc_info)
        record.msg, record.args = redact(message), None
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True
