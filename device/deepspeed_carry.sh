#!/bin/bash
# Build what a Megatron-DeepSpeed seed needs on a GPU node without network (issue 34), on a machine with one:
#   device/deepspeed_carry.sh [DEST] [BENCHMARK]
# DEST (default .gpu/ds, git-ignored) gets, for config/benchmarks/BENCHMARK.yaml (default gpt_126m_deepspeed):
#   megatron-deepspeed.tar.gz  deepspeedai/Megatron-DeepSpeed at the pinned commit with implementations/
#                              megatron_deepspeed/patches applied (megatron/, tools/, pretrain_gpt.py,
#                              mlrepro_patches.json): config.yaml's `pretrain: megatron:` takes it
#   whl/                       DeepSpeed at the pinned version as a pure-Python wheel (DS_BUILD_OPS=0: no op is
#                              compiled, ZeRO-1/2 over torch's AdamW needs none) and what it imports that the device
#                              image lacks (hjson, pydantic and its three; the image has einops, msgpack, ninja,
#                              numpy, packaging, psutil, py-cpuinfo, tqdm, pybind11, regex, six, tensorboard)
#   versions.txt               the commit, the patches and the wheels, for the run's record
# The source comes from MIRROR (a bare git directory holding the commit) where given or present, else is fetched.
set -euo pipefail
DEST=${1:-.gpu/ds}
BENCH=${2:-gpt_126m_deepspeed}
PY=${PY:-.venv/bin/python}
MIRROR=${MIRROR:-/work/.mirror/deepspeedai+Megatron-DeepSpeed/repo}
mkdir -p "$DEST/whl"
read -r URL COMMIT VERSION < <(PYTHONPATH=src $PY -c "
from pathlib import Path; from mlrepro import config
p = config.load_yaml(Path('config/benchmarks/$BENCH.yaml'))['pretrain']
print(p['megatron']['url'], p['megatron']['commit'], p['deepspeed'])")
if [ ! -s "$DEST/megatron-deepspeed.tar.gz" ]; then
  SRC=$(mktemp -d)
  if [ -d "$MIRROR" ] && git -C "$MIRROR" cat-file -e "$COMMIT^{commit}" 2>/dev/null; then
    git -C "$MIRROR" archive "$COMMIT" | tar -x -C "$SRC"
    PYTHONPATH=src $PY -c "
import json; from pathlib import Path; from mlrepro.pretrain import megatron_deepspeed as m
applied = m.apply_patches(Path('.'), Path('$SRC'))
Path('$SRC/mlrepro_patches.json').write_text(json.dumps({'commit': '$COMMIT', 'patches': applied}) + '\n')"
  else
    rmdir "$SRC"
    PYTHONPATH=src $PY -c "
from pathlib import Path; from mlrepro.pretrain import megatron_deepspeed as m
m.fetch(Path('.'), '$URL', '$COMMIT', Path('$SRC'))"
  fi
  PYTHONPATH=src $PY -c "
from pathlib import Path; from mlrepro.pretrain import megatron_deepspeed as m
m.pack(Path('$SRC'), Path('$DEST/megatron-deepspeed.tar.gz'))"
  rm -rf "$SRC"
fi
if ! ls "$DEST"/whl/deepspeed-"$VERSION"-*.whl >/dev/null 2>&1; then
  DS_BUILD_OPS=0 python3 -m pip wheel -q --no-deps --no-binary deepspeed -w "$DEST/whl" "deepspeed==$VERSION"
fi
for wheel in hjson==3.1.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated_types==0.8.0 typing_inspection==0.4.5; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DEST/whl" "$wheel"
done
{ echo "megatron-deepspeed $URL $COMMIT"; tar -xzOf "$DEST/megatron-deepspeed.tar.gz" mlrepro_patches.json
  (cd "$DEST/whl" && sha256sum ./*.whl); } > "$DEST/versions.txt"
du -sh "$DEST"
