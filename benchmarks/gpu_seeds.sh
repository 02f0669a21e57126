#!/bin/bash
# Time to train of the miniature on this machine's GPUs (torch.distributed over NCCL, one
# rank per GPU), seeds 1..N, next to the same seeds on CPU (gloo) when CPU_TOO=1; scored by
# `mlrepro score`, which prints the table.
#   bash benchmarks/gpu_seeds.sh [N]        (run from the repository root)
set -euo pipefail
N=${1:-3}
OUT=${OUT:-$(mktemp -d)}
impl=implementations/mini_lora
config=$impl/config_CPU_1x2x8xtp1pp1cp1.sh   # 1 node x 2 ranks: 2 GPUs when CUDA is there
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
python3 $impl/scripts/download_dataset.py --data-dir "$OUT/data" >/dev/null
python3 $impl/scripts/download_model.py --model-dir "$OUT/ckpt" >/dev/null
run() {  # $1: label, $2: seed, then env
    local label=$1 seed=$2; shift 2
    mkdir -p "$OUT/$label"
    ( set -a; source "$config"; DATADIR=$OUT/data MODEL=$OUT/ckpt SEED=$seed env "$@" bash $impl/run_and_time.sh ) \
        > "$OUT/$label/seed_$seed.log" 2>&1
}
for s in $(seq 1 "$N"); do
    run gpu "$s" NCCL_NVLS_ENABLE=0
    [[ -n "${CPU_TOO:-}" ]] && run cpu "$s" CUDA_VISIBLE_DEVICES=
done

for label in gpu ${CPU_TOO:+cpu}; do
    echo "== $label"
    python3 -m mlrepro score "$OUT/$label" --benchmark mini_lora --required-runs "$N" || true
done
