# The two commands of README.md: `make mini` (install + reproduce the miniature) and
# `make test` (install everything the tests use + run them). Both are safe to repeat.
PY ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := chromium podman squashfs-tools

.PHONY: install system-deps cluster mini test

install:
	$(PY) -m pip install -q -e '.[test]'

system-deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

cluster: install
	$(SUDO) $(PY) -m mlrepro cluster up

mini: install
	$(PY) -m snakemake --profile profiles/local

test: install system-deps cluster
	$(PY) -m pytest tests
