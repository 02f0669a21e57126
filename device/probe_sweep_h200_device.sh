#!/bin/bash
# One device call on an H200: the baseline probe's variants (docs/measurements/baseline_probe/probe_sweep_h200.yaml).
G=$PWD/.gpu/p12b
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $G/whl/*.whl > $OUT/pip.txt 2>&1
export PYTHONPATH=/tmp/site:$G/repo/src
cd $G/repo
nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.sm --format=csv > $OUT/gpu.csv 2>&1
( time timeout 230 python3 -m mlrepro baseline --system device-h200 --root . \
    --settings docs/measurements/baseline_probe/probe_sweep_h200.yaml --out $OUT/sweep ) > $OUT/sweep.log 2>&1
grep '^{' $OUT/sweep.log | cut -c1-400; tail -4 $OUT/sweep.log
