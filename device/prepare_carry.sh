#!/bin/bash
# Build the folder run_device.sh expects (carried to the device machine as .gpu/<branch>):
#   prepare_carry.sh DEST MEGATRON_GIT_URL CORPUS_JSONL VOCAB_JSON MERGES_TXT
# Megatron-LM at the benchmarks' pinned commit (fetched sparse, packed), cp312 wheels of what the
# device image lacks, the corpus preprocessed by the preprocess stage's command and blended, and
# the launch lines rendered by mlrepro.pretrain.megatron_launch. Run from the repository root.
set -euo pipefail
DEST=$1 URL=$2 JSONL=$3 VOCAB=$4 MERGES=$5
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-.venv/bin/python}
COMMIT=$($PY -c "from mlrepro import config; print(config.load_yaml(__import__('pathlib').Path('config/benchmarks/gpt_126m.yaml'))['pretrain']['megatron']['commit'])")
mkdir -p "$DEST/whl" "$DEST/data" "$DEST/stubs/transformers"
$PY -c "
from mlrepro.pretrain import megatron_source as m
m.pack(m.fetch('$URL', '$COMMIT', '$DEST/.megatron'), '$DEST/megatron.tar.gz')"
rm -rf "$DEST/.megatron"
for p in einops==0.8.1 pybind11==3.0.1 regex==2025.11.3 pyyaml==6.0.3 nvidia-ml-py==13.580.82 tqdm==4.67.1; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DEST/whl" "$p"
done
cp "$VOCAB" "$DEST/data/vocab.json"; cp "$MERGES" "$DEST/data/merges.txt"
$PY -m mlrepro preprocess --input "$JSONL" --output-prefix "$DEST/data/corpus" --json-keys text \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$DEST/data/vocab.json" --merge-file "$DEST/data/merges.txt" \
  --append-eod --workers 2
$PY - "$DEST" <<'PY'
import json, sys
from pathlib import Path
from mlrepro.corpus.blend import write_blend
from mlrepro.plan.layout import Layout
from mlrepro.pretrain.megatron_launch import Run, torchrun_line
dest = Path(sys.argv[1])
record = write_blend([str(dest / "data" / "corpus_text_document")], dest / "data_prefix.json")
prefix = tuple(x if i % 2 == 0 else f"/tmp/data/{Path(x).name}" for i, x in enumerate(record["data_prefix"]))
vocab = len(json.loads((dest / "data" / "vocab.json").read_text()))
for arm, layout, sdpa in (("sdpa", Layout(mbs=8, ga=2), True), ("unfused", Layout(mbs=8, ga=2), False),
                          ("sdpa_dp2", Layout(dp=2, mbs=8, ga=1), True)):
    run = Run("gpt-126m", layout, 300, data_prefix=prefix, pretokenized_vocab=vocab, warmup_iters=30, sdpa=sdpa)
    (dest / f"launch_{arm}.sh").write_text(torchrun_line(run) + "\n")
PY
cp "$HERE/run_device.sh" "$DEST/"; cp "$HERE/../implementations/megatron_gpt/sdpa_spec.py" "$DEST/"
cp "$HERE/stubs/transformers/__init__.py" "$DEST/stubs/transformers/"
du -sh "$DEST"
