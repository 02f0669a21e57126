#!/bin/bash
# Issue 24 on a lent 2-GPU machine (nvidia-h100-x2 or nvidia-h200-x2), no network: mini_lora's ten seeds
# through the workflow on device-<gpu>x2 (both GPUs per seed, one seed at a time: --cores 2), so that every
# attempt records the energy NVML's counters say its GPUs used, and score.json, summary.csv, the reports
# and `mlrepro status` add it up. Carried (device tool `carry`): C (default .gpu/en), whose whl/ holds
# device/multigpu_wheels.txt as device/multigpu_carry.sh downloads them, plus transformers, peft and
# huggingface_hub at the versions of the project's environment (the image's are older). One call:
#   bash device/energy_run.sh
# Back in $OUT: energy.tgz (score.json, verdict.json, report.html, summary.csv, results/report.html, each
# attempt.json) and energy.txt (what ran: the seeds' energy and GPU-hours, status, nvidia-smi's view).
set -u
C=${C:-$PWD/.gpu/en}
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SUMMARY=$OUT/energy.txt
T0=$(date +%s)
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$SUMMARY"; }
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$C"/whl/*.whl \
  > /tmp/pip.txt 2>&1 || { say "wheel install failed"; tail -5 /tmp/pip.txt | tee -a "$SUMMARY"; }
export PYTHONPATH=/tmp/site:$PWD/src
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in *H200*) SYS=device-h200x2 ;; *) SYS=device-h100x2 ;; esac
say "$(nvidia-smi -L | wc -l) x $NAME, driver $(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1); system $SYS"
nvidia-smi --query-gpu=index,energy.consumption,power.draw --format=csv >> "$SUMMARY" 2>&1 || true

W=/tmp/w; rm -rf "$W"; mkdir -p "$W"
cp -r Snakefile workflow config profiles implementations "$W"/
# NVML's power sampled beside the run: an independent look at what the counters add up to.
nvidia-smi --query-gpu=timestamp,index,power.draw,utilization.gpu --format=csv -lms 500 > /tmp/smi.csv 2>&1 &
SMI=$!
(cd "$W" && timeout --kill-after=20 "${BUDGET_S:-480}" python3 -m snakemake --profile profiles/local --cores 2 \
  results/mini_lora/score.json --config system="$SYS") > /tmp/snakemake.txt 2>&1
say "snakemake rc $?"
kill $SMI 2>/dev/null
tail -15 /tmp/snakemake.txt >> "$SUMMARY"
(cd "$W" && python3 - <<'EOF') >> "$SUMMARY" 2>&1
import json
from pathlib import Path
bench = Path("results/mini_lora")
for attempt in sorted(bench.glob("seed_*/attempt_*/attempt.json")):
    a = json.loads(attempt.read_text())
    keep = {k: a.get(k) for k in ("state", "elapsed_s", "gpu_hours", "energy_j", "device", "nodes", "gpus_per_node")}
    print(attempt.parent.parent.name, attempt.parent.name, json.dumps(keep))
score = json.loads((bench / "score.json").read_text()) if (bench / "score.json").exists() else {}
print("score.json cost:", json.dumps(score.get("cost"), indent=1)[:3000])
EOF
(cd "$W" && python3 -m mlrepro status results/mini_lora) >> "$SUMMARY" 2>&1
# NVML's counters per attempt against nvidia-smi's power over the attempt's own start..end.
python3 benchmarks/energy_crosscheck.py /tmp/smi.csv "$W"/results/mini_lora/seed_*/attempt_*/attempt.json >> "$SUMMARY" 2>&1
nvidia-smi --query-gpu=index,energy.consumption --format=csv >> "$SUMMARY" 2>&1 || true
cp /tmp/snakemake.txt /tmp/smi.csv "$W"/ 2>/dev/null
(cd "$W" && tar czf "$OUT/energy.tgz" snakemake.txt smi.csv results/mini_lora/score.json results/mini_lora/verdict.json \
  results/mini_lora/report.html results/report.html results/summary.csv results/mini_lora/seed_*/attempt_*/attempt.json 2>/dev/null)
say "done"
