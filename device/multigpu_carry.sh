#!/bin/bash
# Build what device/multigpu_run.sh needs on a GPU node without network (issue 23), on a machine with one:
#   device/multigpu_carry.sh [DEST] [REF] [MEGATRON_GIT_URL]
# DEST (default .gpu/mg, git-ignored through .git/info/exclude) gets:
#   tree.tar.gz      `git archive REF` of this repository (default HEAD): the code under test, and the commit it is
#   megatron.tar.gz  Megatron-LM at the commit config/benchmarks/gpt_126m.yaml pins (mlrepro.pretrain.megatron_source)
#   whl/             device/multigpu_wheels.txt for CPython 3.12 manylinux x86-64 (what the device image lacks);
#                    pulp keeps only its x86-64 Linux CBC (the other platforms' solvers are 13 MB)
#   stubs/           a `transformers` that refuses to import: the image's transformers wants huggingface-hub<2
#                    and fails at import; Megatron-LM treats a missing transformers as optional
# About 32 MB in all: under the device tool's 64 MiB with the checkout that travels beside it.
set -euo pipefail
DEST=${1:-.gpu/mg}
REF=${2:-HEAD}
URL=${3:-https://github.com/NVIDIA/Megatron-LM}
PY=${PY:-.venv/bin/python}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$DEST/whl" "$DEST/stubs/transformers"
git archive --format=tar.gz -o "$DEST/tree.tar.gz" "$REF"
git rev-parse "$REF" > "$DEST/commit.txt"
COMMIT=$(PYTHONPATH=src $PY -c "from pathlib import Path; from mlrepro import config; print(config.load_yaml(Path('config/benchmarks/gpt_126m.yaml'))['pretrain']['megatron']['commit'])")
if [ ! -s "$DEST/megatron.tar.gz" ]; then
  PYTHONPATH=src $PY -c "
from mlrepro.pretrain import megatron_source as m
m.pack(m.fetch('$URL', '$COMMIT', '$DEST/.megatron'), '$DEST/megatron.tar.gz')"
  rm -rf "$DEST/.megatron"
fi
grep -v '^#' "$HERE/multigpu_wheels.txt" | while read -r wheel; do
  [ -n "$wheel" ] || continue
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$DEST/whl" "$wheel" 2>/dev/null \
  || python3 -m pip wheel -q --no-deps -w "$DEST/whl" "$wheel"  # an sdist-only pure-Python package
done
for w in "$DEST"/whl/pulp-*.whl; do
  zip -q -d "$w" 'pulp/solverdir/cbc/linux/arm64/*' 'pulp/solverdir/cbc/linux/i32/*' 'pulp/solverdir/cbc/osx/*' \
    'pulp/solverdir/cbc/win/*' 'pulp/tests/*' 2>/dev/null || true
done
cat > "$DEST/stubs/transformers/__init__.py" <<'EOF'
# The device image's transformers refuses to import (it wants huggingface-hub<2, the image has 2.4);
# the pre-tokenized Megatron runs need no HF tokenizer, and Megatron treats a missing transformers as optional.
raise ModuleNotFoundError("transformers is stubbed out for the pre-tokenized Megatron run", name="transformers")
EOF
du -sh "$DEST"
