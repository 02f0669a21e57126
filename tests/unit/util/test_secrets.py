"""mlrepro.util.secrets: the one definition of a secret and the redaction every log goes through."""

from __future__ import annotations

import json
import logging
import shlex

import pytest

from mlrepro.util import secrets
from mlrepro.util.secrets import REDACTED, is_secret_name, redact

SECRET_NAMES = ["HF_TOKEN", "WANDB_API_KEY", "DB_PASSWORD", "DB_PASS", "SSH_PRIVATE", "AZURE_CREDENTIAL",
                "OPENAI_APIKEY", "GH_PAT", "AUTH_HEADER", "NPM_AUTH", "MY_SECRET", "SESSION_COOKIE",
                "AWS_SECRET_ACCESS_KEY", "GITHUB_TOKEN", "HFTOKEN", "MYSQLPASSWORD", "db_passwd", "X-Api-Key"]
PUBLIC_NAMES = ["SEED", "DGXNNODES", "PATH", "PYTHONPATH", "TOKENIZERS_PARALLELISM", "PWD", "OLDPWD",
                "XDG_SESSION_ID", "SSH_AUTH_SOCK", "DBUS_SESSION_BUS_ADDRESS", "PASSENGER_APP", "KEYBOARD",
                "AUTHOR", "PATTERN", "MAX_STEPS"]


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_secret_names(name):
    assert is_secret_name(name)


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_public_names(name):
    assert not is_secret_name(name)


@pytest.mark.parametrize("name", SECRET_NAMES)
def test_every_secret_name_is_redacted_whatever_its_length(name):
    for value in ("x9", "s3cr3t-value-0123456789"):
        env = {name: value, "SEED": "7"}
        out = redact(f"value {value} here; SEED=7", env=env)
        assert value not in out and "SEED=7" in out and REDACTED in out


def test_value_with_spaces_is_redacted_whole_and_by_words():
    env = {"HF_TOKEN": "abc def"}
    assert redact("token=abc def end", env=env) == "token=*** end"
    # a tool that splits words prints the parts apart; neither part may show
    out = redact("argv: ['abc', 'def'] abcdef", env=env)
    assert "'abc'" not in out and "'def'" not in out
    # a short word inside a longer one is no disclosure and is left alone
    assert "abcdef" in out


@pytest.mark.parametrize("value", ["it's-a-secret", 'say "hi" now', "back\\slash$and`tick"])
def test_value_with_quotes_redacted_raw_shell_quoted_and_json_escaped(value):
    env = {"DB_PASSWORD": value}
    shell = shlex.join(["mysql", f"--password={value}", value])
    out = redact(shell, env=env)
    assert value not in out and shlex.quote(value) not in out
    assert "mysql" in out
    as_json = json.dumps({"password": value})
    assert json.dumps(value)[1:-1] not in redact(as_json, env=env)


def test_assignment_of_a_secret_name_is_hidden_even_when_unknown():
    assert redact("MY_SECRET=zzz OTHER=1", env={}) == "MY_SECRET=*** OTHER=1"
    assert redact("DB_PASS='a b c' N=2", env={}) == "DB_PASS=*** N=2"
    assert redact('GH_PAT="x y" N=2', env={}) == "GH_PAT=*** N=2"


def test_mllog_lines_stay_json_when_a_short_secret_equals_a_number():
    line = ':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", "key": "seed", "value": 7, ' \
           '"metadata": {"note": "pw 7 and hunter2"}}'
    out = secrets.Redactor(["7", "hunter2"]).text(line)
    record = json.loads(out.partition(":::MLLOG")[2])
    assert record["value"] == 7 and record["metadata"]["note"] == "pw *** and ***"


def test_redact_file_and_bytes_lines(tmp_path):
    log = tmp_path / "run.log"
    log.write_bytes(b"rank 0: token hf_zzzzzz\n\xff binary ok\nlast line without newline hf_zzzzzz")
    assert secrets.redact_file(log, env={"HF_TOKEN": "hf_zzzzzz"})
    assert log.read_bytes() == b"rank 0: token ***\n\xff binary ok\nlast line without newline ***"
    assert not secrets.redact_file(log, env={"HF_TOKEN": "hf_zzzzzz"})


def test_public_env_drops_secrets_and_redact_env_masks_them():
    env = {"HF_TOKEN": "t", "SEED": "7", "GH_PAT": "p"}
    assert secrets.public_env(env) == {"SEED": "7"}
    assert secrets.redact_env(env) == {"HF_TOKEN": REDACTED, "SEED": "7", "GH_PAT": REDACTED}
    assert secrets.redact_command(["x", "--token=t0k3n-value"], {"NPM_AUTH": "t0k3n-value"}) == ["x", "--token=***"]


def test_logging_filter_redacts_messages_and_tracebacks(monkeypatch, caplog):
    monkeypatch.setenv("AZURE_CREDENTIAL", "Az0re k3y 'q'")
    logger = logging.getLogger("mlrepro.test_secrets")
    logger.addFilter(secrets.RedactingFilter())
    with caplog.at_level(logging.INFO, logger="mlrepro.test_secrets"):
        logger.info("value is %s", "Az0re k3y 'q'")
        try:
            raise RuntimeError(shlex.join(["--cred", "Az0re k3y 'q'"]))
        except RuntimeError:
            logger.exception("failed")
    text = caplog.text
    assert "Az0re k3y 'q'" not in text and shlex.quote("Az0re k3y 'q'") not in text
    assert "value is ***" in text and "RuntimeError" in text
