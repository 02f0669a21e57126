# The two commands of README.md: `make mini` (install + reproduce the miniature) and
# `make test` (install everything the tests use + run them). Both are safe to repeat.
#
# Everything Python goes into the project's own virtual environment .venv/, made from $(PY):
# a distribution's python3 refuses `pip install` into itself (PEP 668), and a pyenv or conda
# Python works the same way. Nothing is installed with --break-system-packages.
PY ?= python3
# Two pytest workers: most tests wait on a subprocess (snakemake, Slurm, a trainer) for much of their
# time; the ones that share the local Slurm cluster run on one worker (tests/conftest.py).
TEST_WORKERS ?= 2
VENV := .venv
VPY := $(VENV)/bin/python
# Reinstalled when pyproject.toml changes (the stamp lives in the venv: a new venv reinstalls).
STAMP := $(VENV)/.mlrepro-installed
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := chromium podman squashfs-tools

.PHONY: venv install profiles system-deps cluster mini test lint

$(VPY):
	@# Debian/Ubuntu ship venv's pip bootstrap (ensurepip) separately, in python3-venv.
	$(PY) -m venv $(VENV) || { \
	  command -v apt-get >/dev/null && rm -rf $(VENV) && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && \
	  $(PY) -m venv $(VENV); }

venv: $(VPY)

$(STAMP): pyproject.toml | $(VPY)
	$(VPY) -m pip install -q -e '.[test]'
	@# pyproject's `deepspeed` extra, built without ops against the venv's CPU torch (pyproject.toml says why).
	DS_BUILD_OPS=0 $(VPY) -m pip install -q --no-build-isolation $$($(VPY) -c "import tomllib; \
	  print(' '.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['deepspeed']))")
	touch $(STAMP)

# Snakemake's named profiles (`--profile local`, `--profile slurm`) point at profiles/.
profiles: $(STAMP)
	$(VPY) -m mlrepro profiles install

install: $(STAMP) profiles

system-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

cluster: install
	$(SUDO) $(VPY) -m mlrepro cluster up

mini: install
	$(VPY) -m snakemake --profile profiles/local

test: install system-deps cluster
	$(VPY) -m pytest tests -n $(TEST_WORKERS) --dist loadgroup --durations=40

lint: install
	$(VPY) -m ruff check src tests benchmarks
	$(VENV)/bin/lint-imports
	$(VPY) .ci/snakemake_lint.py
