#!/bin/bash
# Issue 23 on a lent multi-GPU machine (nvidia-h200-x2/-x4, nvidia-h100-x2/-x4), no network, through the
# workflow. Carried (device tool `carry`): the folder device/multigpu_carry.sh builds (C, default .gpu/mg):
# megatron.tar.gz (Megatron-LM at the pinned commit), whl/ (the wheels the device image lacks), stubs/,
# and tree.tar.gz (the repository at the commit under test, for a node whose checkout is another). One
# device call per part, from the checkout's root:
#   bash device/multigpu_run.sh PART
#   mkdir -p /tmp/t && tar xzf .gpu/mg/tree.tar.gz -C /tmp/t && T=/tmp/t bash /tmp/t/device/multigpu_run.sh PART
# PART node:  5 preflights of the 2-GPU system (GPUs 0,1), the degraded-GPU preflight (a matmul loop on
#             GPU1), 2 preflights of the 4-GPU system (x4 only), the baseline checklist's baseline on 2 GPUs (DP2, TP2,
#             the planner's layout; the probe) and, on GPUs 2,3 at the same time (x4; else after), GPT-126M
#             through the workflow at TP1 DP1, TP2 DP1, TP1 DP2 on the corpus stages' data.
# PART train: the chained GPT-126M seed (GPU0, 1-minute clock, --save/--load, one segment killed mid-way)
#             next to the same seed uninterrupted (GPU1) and a second uninterrupted run (GPU2, x4): the
#             run-to-run spread of the final validation loss the chain is held to.
# PART resume: the chained seed at LAYOUT (default gpt-125m-2xdp, GPUS 0,1) with one segment killed, then the
#             same seed uninterrupted on the same GPUs: the final validation losses side by side.
# PART repeat: the same seed uninterrupted at LAYOUT, RUNS (2) times: the run-to-run spread.
# PART determinism: (x4) the chained GPT-126M seed at DP2 with --deterministic-mode (GPUs 0,1, one segment killed)
#             next to the same seed uninterrupted twice (GPUs 2,3).
# PART deepspeed: (x4) gpt_126m_deepspeed chained on 1 GPU, at 2xdp, and gpt_126m beside it; the trial mode
#             (carry .gpu/ds beside .gpu/mg).
# PART planner: (x4) GPT-126M through the workflow on 1 GPU and at DP2 (GBS 16 and 32), then `mlrepro plan --trial 3`.
# PART sweep: (x4) issue 35's layout sweep: GEMM/SDPA shapes (device/gemm_shapes_sweep.py), a preflight, the baseline
#             stage's Megatron-LM runs of 8-10 layouts each of GPT-1.3B GBS16 and GBS64 and GPT-126M GBS16.
# PART profile: issue 35's traced baseline: GPT-126M and GPT-1.3B at GBS 16 over micro-batch sizes with profile: true
#             (1 GPU: the 1-GPU system's DP1 rows; 2 or more: DP2, TP2 and PP2 rows on GPUs 0,1), each run's trace kept.
# PART halftp: (1 GPU) GPT-126M with one TP2 rank's shapes at TP1, MBS 4 and 8, traced, beside the whole model.
# PART four:  (x4) GPT-126M at DP4 and the baseline checklist's baseline at TP4 and DP4, on all 4 GPUs.
# Back in $OUT: PART.tgz (the records: preflight.json, baseline.json and report, score/run json, segments,
# Megatron's logs) and PART.txt (what ran, with timings). Ends well inside the 10-minute call.
set -u
PART=${1:?node, train or four}
C=${C:-$PWD/.gpu/mg}
T=${T:-$(cd "$(dirname "$0")/.." && pwd)}  # the repository under test: this script's own, or an unpacked tree.tar.gz
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
REC=/tmp/rec/$PART; mkdir -p "$REC"
SUMMARY=$OUT/$PART.txt
T0=$(date +%s)
DEADLINE=$(( T0 + ${BUDGET_S:-550} ))  # every step ends before this: the records are packed after it
say() { echo "[$(( $(date +%s) - T0 ))s] $*" | tee -a "$SUMMARY"; }
# NVLink multicast stays off on these shared hosts (KINDS.md); Megatron wants one CUDA connection.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CUDA_DEVICE_MAX_CONNECTIONS=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$C"/whl/*.whl \
  > /tmp/pip.txt 2>&1 || { say "wheel install failed"; tail -5 /tmp/pip.txt | tee -a "$SUMMARY"; }
export PYTHONPATH=/tmp/site:$C/stubs:$T/src
# Megatron builds its dataset helpers with make, which asks python3-config (absent from the image).
mkdir -p /tmp/bin
printf '#!/bin/sh\nexec python3 -c "import sysconfig; print(sysconfig.get_config_var(\\"EXT_SUFFIX\\"))"\n' > /tmp/bin/python3-config
chmod +x /tmp/bin/python3-config; export PATH=/tmp/bin:$PATH
NGPU=$(nvidia-smi -L | wc -l)
NAME=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$NAME" in *H200*) M=h200 ;; *H100*) M=h100 ;; *) M=h100 ;; esac
SYS2=device-${M}x2 SYS4=device-${M}x4
say "$PART on $NGPU x $NAME ($(nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1)); systems $SYS2 $SYS4"
nvidia-smi topo -m > "$REC/topo.txt" 2>&1
# The miniature corpus the corpus stages download (config/corpora/mini_corpus.yaml), served on localhost.
# (A warm machine keeps /tmp between calls but not the processes: start it unless ours still runs.)
if ! { [ -f /tmp/mcs.pid ] && kill -0 "$(cat /tmp/mcs.pid)" 2>/dev/null; }; then
  python3 -m mlrepro.corpus.minicorpus serve --dir /tmp/mcs --port 18765 > /tmp/mcs.log 2>&1 &
  echo $! > /tmp/mcs.pid
fi
for _ in $(seq 60); do
  python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:18765/tokenizer/vocab.json')" 2>/dev/null && break
  sleep 0.5
done

# A scratch copy of the repository per lane (own results/, resources/, .snakemake/).
lane() { rm -rf "/tmp/lanes/$1"; mkdir -p /tmp/lanes; cp -r "$T" "/tmp/lanes/$1"; }
smk() {  # lane, seconds (at most what is left before DEADLINE), snakemake arguments...
  local l=$1 s=$2 left=$(( DEADLINE - $(date +%s) )); shift 2
  [ "$left" -lt "$s" ] && s=$left
  [ "$s" -lt 10 ] && { say "skipped (no time left): snakemake $*"; return 1; }
  (cd "/tmp/lanes/$l" && timeout --kill-after=20 "$s" python3 -m snakemake -c16 --scheduler greedy "$@") \
    >> "$REC/$l.snakemake.txt" 2>&1
}
preflight_yaml() {  # lane, then the baseline block (YAML)
  cat > "/tmp/lanes/$1/config/preflight.yaml" <<EOF
# issue 23's device run: the baseline checklist's sweep extended to 4 GiB (256 MiB, 1 GiB, 4 GiB against DESIGN.md's 2x H200 figures)
sweep: {begin: 8, end: 4294967296, factor: 2}
compute_seconds: 2.0
quick_seconds: 0.3
baseline: $2
EOF
}
gpt126m() {  # lane, layout, system, iterations, extra pretrain keys[, MBS (8; GBS is 16)]
  lane "$1"
  cat > "/tmp/lanes/$1/device.yaml" <<EOF
benchmarks: [gpt_126m]
corpora: [mini_corpus]
pretrain: {layout: $2, train_iters: $4, gbs: ${GBS:-16}, mbs: ${6:-8}, attention: sdpa, megatron: $C/megatron.tar.gz, walltime_minutes: 9$5}
EOF
}
keep() {  # lane, what to keep of its results (globs under the lane)
  local l=$1; shift
  mkdir -p "$REC/$l"
  (cd "/tmp/lanes/$l" && for g in "$@"; do for f in $g; do [ -e "$f" ] && mkdir -p "$REC/$l/$(dirname "$f")" && cp -r "$f" "$REC/$l/$f"; done; done)
}
seed_files="results/gpt_126m*/seed_1/run.json results/gpt_126m*/seed_1/mllog.txt results/gpt_126m*/seed_1/launch.sh \
  results/gpt_126m*/seed_1/segments.json results/gpt_126m*/seed_1/attempt_*/run.log results/gpt_126m*/score.json
  results/gpt_126m*/verdict.json logs/train"

if [ "$PART" = node ]; then
  lane pf2; preflight_yaml pf2 "{}"
  if [ "$NGPU" -ge 4 ]; then
    lane pf4; preflight_yaml pf4 "{}"
    for i in ${PF4:-1}; do
      smk pf4 120 "results/preflight/$SYS4/preflight.json" --config system=$SYS4 --forcerun preflight
      cp /tmp/lanes/pf4/results/preflight/$SYS4/preflight.json "$REC/preflight4_$i.json" 2>/dev/null
      say "4-GPU preflight $i: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['summary']['verdict'], [(g['index'], g['matmul_bf16_tflops'], g['verdict']) for g in d['hosts'][0]['gpus']], d['seconds'], 's')" "$REC/preflight4_$i.json" 2>&1)"
    done
  fi
  gpus_b="2,3"; [ "$NGPU" -ge 4 ] || gpus_b=""
  run_126m() {
    for spec in "m1 gpt-125m" "tp2 gpt-125m-2xtp" "dp2 gpt-125m-2xdp"; do
      set -- $spec
      gpt126m "g$1" "$2" "$SYS2" 300 ""
      smk "g$1" 420 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2
      keep "g$1" $seed_files
      say "GPT-126M $2: $(cat /tmp/lanes/g$1/results/gpt_126m/seed_1/run.json 2>/dev/null | head -c 400)"
    done
  }
  if [ -n "$gpus_b" ]; then (export CUDA_VISIBLE_DEVICES=$gpus_b; run_126m) & B=$!; fi
  (
    export CUDA_VISIBLE_DEVICES=0,1
    for i in 1 2 3 4 5; do
      smk pf2 120 "results/preflight/$SYS2/preflight.json" --config system=$SYS2 --forcerun preflight
      cp /tmp/lanes/pf2/results/preflight/$SYS2/preflight.json "$REC/preflight2_$i.json" 2>/dev/null
      say "2-GPU preflight $i: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); h=d['hosts'][0]; print(d['summary']['verdict'], [(g['index'], g['matmul_bf16_tflops'], g['verdict']) for g in h['gpus']], [(a['bytes']>>20, a['busbw_gbps']) for a in h['allreduce'] if a['bytes'] in (16<<20, 256<<20, 1<<30, 4<<30)], d['seconds'], 's')" "$REC/preflight2_$i.json" 2>&1)"
    done
    # The degraded GPU: a bf16 matmul loop of another process on GPU1 while the preflight measures.
    CUDA_VISIBLE_DEVICES=1 python3 -c "
import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 60:
    a @ a
" & LOAD=$!
    sleep 5
    (cd /tmp/lanes/pf2 && timeout 120 python3 -m mlrepro preflight --system $SYS2 --out "$REC/degraded" > "$REC/degraded.txt" 2>&1)
    kill $LOAD 2>/dev/null; wait $LOAD 2>/dev/null
    say "degraded: $(grep -E 'GPU[0-9]' "$REC/degraded.txt" | tr '\n' ' ')"
    lane bl2
    preflight_yaml bl2 "{runs: [{model: gpt-1.3b, precision: bf16, mbs: 16, ga: 4, attention: flash, residual: bf16, compile_scope: model}], steps: 3, warmup: 2, budget_s: 120, megatron: {benchmark: gpt_1p3b, precisions: [bf16], mbs: 4, gbs: 16, iterations: 20, attention: sdpa, timeout_s: 200, layouts: [{tp: 1}, {tp: 2}, {planner: true}]}}"
    printf 'benchmarks: [gpt_126m]\npretrain: {megatron: %s}\n' "$C/megatron.tar.gz" > /tmp/lanes/bl2/device.yaml
    smk bl2 420 "results/baseline/$SYS2/baseline.json" --configfile device.yaml --config system=$SYS2
    keep bl2 "results/baseline/$SYS2" "results/preflight/$SYS2/preflight.json" logs/baseline logs/preflight
    say "baseline 2 GPUs: $(grep -h '^|' /tmp/lanes/bl2/results/baseline/$SYS2/baseline_report.md 2>/dev/null | head -8)"
    say "planner: $(cd /tmp/lanes/bl2 && timeout 60 python3 -m mlrepro plan --model gpt-1.3b --system $SYS2 --gbs 16 --top 6 2>&1 | head -14)"
  )
  [ -n "$gpus_b" ] && wait $B
  [ -n "$gpus_b" ] || (export CUDA_VISIBLE_DEVICES=0,1; run_126m)
fi

if [ "$PART" = train ]; then
  ITERS=${ITERS:-650}  # about 75 s of training: 3-4 one-minute segments (Megatron starts in about 30 s)
  gpt126m ref1 gpt-125m "$SYS2" "$ITERS" ""
  gpt126m chain gpt-125m "$SYS2" "$ITERS" ", save_interval: 100"
  # The chained benchmark: gpt_126m with a 100 s job limit less a 30 s margin (Megatron's clock: 1 minute).
  sed -e 's/^name: gpt_126m/name: gpt_126m_chain/' /tmp/lanes/chain/config/benchmarks/gpt_126m.yaml > /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  echo "segments: {job_seconds: 100, margin_seconds: 30, max_stalls: 2}" >> /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  sed -i 's/benchmarks: \[gpt_126m\]/benchmarks: [gpt_126m_chain]/' /tmp/lanes/chain/device.yaml
  (export CUDA_VISIBLE_DEVICES=1; smk ref1 480 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; say "uninterrupted (GPU1) done") &
  R1=$!
  if [ "$NGPU" -ge 4 ]; then
    gpt126m ref2 gpt-125m "$SYS2" "$ITERS" ""
    (export CUDA_VISIBLE_DEVICES=2; smk ref2 480 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; say "uninterrupted (GPU2) done") &
    R2=$!
  fi
  (export CUDA_VISIBLE_DEVICES=0; smk chain 540 results/gpt_126m_chain/score.json --configfile device.yaml --config system=$SYS2; say "chain done") &
  CH=$!
  (cd /tmp/lanes/chain && timeout $(( DEADLINE - $(date +%s) )) python3 "$T/device/multigpu_kill.py" results/gpt_126m_chain/seed_1 2 100 480 > "$REC/kill.json" 2>&1)
  say "kill: $(cat "$REC/kill.json")"
  wait $CH $R1 ${R2:-}
  for l in chain ref1 ref2; do [ -d /tmp/lanes/$l ] && keep $l $seed_files; done
  say "segments: $(cat /tmp/lanes/chain/results/gpt_126m_chain/seed_1/segments.json 2>/dev/null)"
  for l in chain ref1 ref2; do say "$l: $(grep -h 'validation loss at iteration' /tmp/lanes/$l/results/gpt_126m*/seed_1/mllog.txt 2>/dev/null | tail -2 | tr '\n' ' ')"; done
fi

if [ "$PART" = resume ]; then
  # The chained seed at LAYOUT (default DP2 on GPUs 0,1): one segment killed mid-way, then the same seed
  # uninterrupted on the same GPUs; each attempt's class, GPU-seconds and work lost in segments.json.
  ITERS=${ITERS:-650}; LAYOUT=${LAYOUT:-gpt-125m-2xdp}; GPUS=${GPUS:-0,1}
  gpt126m chain "$LAYOUT" "$SYS2" "$ITERS" ", save_interval: 100"
  sed -e 's/^name: gpt_126m/name: gpt_126m_chain/' /tmp/lanes/chain/config/benchmarks/gpt_126m.yaml > /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  echo "segments: {job_seconds: 100, margin_seconds: 30}" >> /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  sed -i 's/benchmarks: \[gpt_126m\]/benchmarks: [gpt_126m_chain]/' /tmp/lanes/chain/device.yaml
  (export CUDA_VISIBLE_DEVICES=$GPUS; smk chain ${CHAIN_S:-400} results/gpt_126m_chain/score.json --configfile device.yaml --config system=$SYS2; say "chain done") &
  CH=$!
  (cd /tmp/lanes/chain && timeout 390 python3 "$T/device/multigpu_kill.py" results/gpt_126m_chain/seed_1 2 100 380 > "$REC/kill.json" 2>&1)
  say "kill: $(cat "$REC/kill.json")"
  wait $CH
  keep chain $seed_files
  gpt126m ref "$LAYOUT" "$SYS2" "$ITERS" ""
  (export CUDA_VISIBLE_DEVICES=$GPUS; smk ref ${REF_S:-150} results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; say "uninterrupted done")
  keep ref $seed_files
  say "segments: $(cd /tmp/lanes/chain && python3 -c "import json; [print(s['index'], s['from_step'], s['to_step'], s.get('class'), s.get('gpu_s'), s.get('lost_steps'), s.get('lost_s'), s.get('val_loss')) for s in json.load(open('results/gpt_126m_chain/seed_1/segments.json'))['segments']]" 2>&1 | tr '\n' ';')"
  for l in chain ref; do say "$l: $(grep -h 'validation loss at iteration' /tmp/lanes/$l/results/gpt_126m*/seed_1/mllog.txt 2>/dev/null | tail -2 | tr '\n' ' ')"; done
fi

if [ "$PART" = repeat ]; then
  # The same seed uninterrupted at LAYOUT, RUNS times one after another: the run-to-run spread of its final
  # validation loss, which a resumed chain is compared within.
  ITERS=${ITERS:-650}; LAYOUT=${LAYOUT:-gpt-125m-2xdp}; GPUS=${GPUS:-0,1}
  for i in $(seq 1 "${RUNS:-2}"); do
    gpt126m "rep$i" "$LAYOUT" "$SYS2" "$ITERS" ""
    (export CUDA_VISIBLE_DEVICES=$GPUS; smk "rep$i" 200 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2)
    keep "rep$i" $seed_files
    say "rep$i: $(grep -h 'validation loss at iteration' /tmp/lanes/rep$i/results/gpt_126m/seed_1/mllog.txt 2>/dev/null | tail -2 | tr '\n' ' ')"
  done
fi

if [ "$PART" = four ] && [ "$NGPU" -ge 4 ]; then
  gpt126m g4 gpt-125m-4xdp "$SYS4" 300 "" 4   # GBS 16 over DP4: MBS 4
  smk g4 300 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS4
  keep g4 $seed_files
  say "GPT-126M DP4: $(head -c 400 /tmp/lanes/g4/results/gpt_126m/seed_1/run.json 2>/dev/null)"
  lane bl4
  preflight_yaml bl4 "{runs: [], megatron: {benchmark: gpt_1p3b, precisions: [bf16], mbs: 4, gbs: 16, iterations: 20, attention: sdpa, timeout_s: 180, layouts: [{tp: 4}, {tp: 1}]}}"
  printf 'benchmarks: [gpt_126m]\npretrain: {megatron: %s}\n' "$C/megatron.tar.gz" > /tmp/lanes/bl4/device.yaml
  smk bl4 330 "results/baseline/$SYS4/baseline.json" --configfile device.yaml --config system=$SYS4
  keep bl4 "results/baseline/$SYS4" "results/preflight/$SYS4/preflight.json" logs/baseline
  say "baseline 4 GPUs: $(grep -h '^|' /tmp/lanes/bl4/results/baseline/$SYS4/baseline_report.md 2>/dev/null | head -6)"
fi

if [ "$PART" = final ] && [ "$NGPU" -ge 4 ]; then
  # Everything of issue 23's 2-GPU list in one call of a 4-GPU machine, lanes on disjoint GPUs:
  #   GPUs 0,1: 5 preflights, the degraded GPU, the baseline checklist's baseline (DP2, TP2, the planner's layout, a probe), GPT-126M TP2
  #   GPU 2:    the chained seed (650 iterations, one-minute Megatron clock, attempt 2 killed), then with GPU 3: GPT-126M DP2
  #   GPU 3:    GPT-126M TP1 DP1 uninterrupted over the same 650 iterations (item 3's 1-GPU row), then again (run-to-run)
  ITERS=${ITERS:-650}
  gpt126m chain gpt-125m "$SYS2" "$ITERS" ", save_interval: 100"
  sed -e 's/^name: gpt_126m/name: gpt_126m_chain/' /tmp/lanes/chain/config/benchmarks/gpt_126m.yaml > /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  echo "segments: {job_seconds: 100, margin_seconds: 30, max_stalls: 2}" >> /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  sed -i 's/benchmarks: \[gpt_126m\]/benchmarks: [gpt_126m_chain]/' /tmp/lanes/chain/device.yaml
  (export CUDA_VISIBLE_DEVICES=2; smk chain 420 results/gpt_126m_chain/score.json --configfile device.yaml --config system=$SYS2; say "chain done"
   keep chain $seed_files
   (cd /tmp/lanes/chain && say "segments: $(python3 -c "import json; [print(s['index'], s['from_step'], s['to_step'], s['status'], s.get('val_loss'), s.get('wall_s')) for s in json.load(open('results/gpt_126m_chain/seed_1/segments.json'))['segments']]" 2>&1 | tr '\n' ';')")
   export CUDA_VISIBLE_DEVICES=2,3
   gpt126m gdp2 gpt-125m-2xdp "$SYS2" 300 ""
   smk gdp2 200 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; keep gdp2 $seed_files
   say "GPT-126M DP2: $(python3 -c "import json; d=json.load(open('/tmp/lanes/gdp2/results/gpt_126m/seed_1/run.json')); print(d['throughput'], d['evals'][-1])" 2>&1)") &
  CH=$!
  (cd /tmp/lanes/chain && timeout 400 python3 "$T/device/multigpu_kill.py" results/gpt_126m_chain/seed_1 2 100 390 > "$REC/kill.json" 2>&1; say "kill: $(cat "$REC/kill.json")") &
  KW=$!
  (export CUDA_VISIBLE_DEVICES=3
   for l in gm1 ref2; do
     gpt126m $l gpt-125m "$SYS2" "$ITERS" ""
     smk $l 240 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; keep $l $seed_files
     say "GPT-126M TP1 DP1 ($l): $(python3 -c "import json; d=json.load(open('/tmp/lanes/$l/results/gpt_126m/seed_1/run.json')); print(d['throughput'], d['evals'][-1])" 2>&1)"
   done) &
  R=$!
  (
    export CUDA_VISIBLE_DEVICES=0,1
    lane pf2; preflight_yaml pf2 "{}"
    for i in 1 2 3 4 5; do
      smk pf2 90 "results/preflight/$SYS2/preflight.json" --config system=$SYS2 --forcerun preflight
      cp /tmp/lanes/pf2/results/preflight/$SYS2/preflight.json "$REC/preflight2_$i.json" 2>/dev/null
      say "2-GPU preflight $i: $(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); h=d['hosts'][0]; print(d['summary']['verdict'], [(g['index'], g['matmul_bf16_tflops'], g['verdict']) for g in h['gpus']], [(a['bytes']>>20, a['busbw_gbps']) for a in h['allreduce'] if a['bytes'] in (16<<20, 256<<20, 1<<30, 4<<30)], d['seconds'], 's')" "$REC/preflight2_$i.json" 2>&1 | tail -1)"
    done
    cp -r /tmp/lanes/pf2/results/preflight/$SYS2 "$REC/preflight2_last" 2>/dev/null
    CUDA_VISIBLE_DEVICES=1 python3 -c "
import torch, time
a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)
t = time.time()
while time.time() - t < 60:
    a @ a
" & LOAD=$!
    sleep 5
    (cd /tmp/lanes/pf2 && timeout 90 python3 -m mlrepro preflight --system $SYS2 --out "$REC/degraded" > "$REC/degraded.txt" 2>&1)
    kill $LOAD 2>/dev/null; wait $LOAD 2>/dev/null
    say "degraded: $(grep -E 'GPU[0-9]' "$REC/degraded.txt" | tr '\n' ' ')"
    lane bl2
    preflight_yaml bl2 "{runs: [{model: gpt-1.3b, precision: bf16, mbs: 8, ga: 2, attention: flash, residual: bf16, compile_scope: block}], steps: 3, warmup: 2, budget_s: 60, megatron: {benchmark: gpt_1p3b, precisions: [bf16], mbs: 4, gbs: 16, iterations: 20, attention: sdpa, timeout_s: 150, layouts: [{tp: 1}, {tp: 2}, {planner: true}]}}"
    printf 'benchmarks: [gpt_126m]\npretrain: {megatron: %s}\n' "$C/megatron.tar.gz" > /tmp/lanes/bl2/device.yaml
    smk bl2 330 "results/baseline/$SYS2/baseline.json" --configfile device.yaml --config system=$SYS2
    keep bl2 "results/baseline/$SYS2" "results/preflight/$SYS2/preflight.json" logs/baseline
    say "baseline 2 GPUs: $(grep -h '^|' /tmp/lanes/bl2/results/baseline/$SYS2/baseline_report.md 2>/dev/null | cut -c1-260 | head -6)"
    gpt126m gtp2 gpt-125m-2xtp "$SYS2" 300 ""
    smk gtp2 200 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; keep gtp2 $seed_files
    say "GPT-126M TP2: $(python3 -c "import json; d=json.load(open('/tmp/lanes/gtp2/results/gpt_126m/seed_1/run.json')); print(d['throughput'], d['evals'][-1])" 2>&1)"
  )
  wait $CH $R
  kill $KW 2>/dev/null
fi

bl() {  # lane, benchmark, GBS, layouts (YAML list), seconds: the baseline stage's Megatron-LM runs of each layout (ITERS)
  # on BL_SYS (default the 2-GPU system), with BL_KEYS added to the megatron block (e.g. ", profile: true")
  local sys=${BL_SYS:-$SYS2}
  lane "$1"
  preflight_yaml "$1" "{runs: [], megatron: {benchmark: $2, precisions: [bf16], mbs: 4, gbs: $3, iterations: $ITERS, attention: sdpa, timeout_s: 120, layouts: $4${BL_KEYS:-}}}"
  printf 'benchmarks: [gpt_126m]\npretrain: {megatron: %s}\n' "$C/megatron.tar.gz" > "/tmp/lanes/$1/device.yaml"
  smk "$1" "$5" "results/baseline/$sys/baseline.json" --configfile device.yaml --config system=$sys
  keep "$1" "results/baseline/$sys" "results/preflight/$sys/preflight.json" logs/baseline
  rm -rf "$REC/$1/results/baseline/$sys"/*.profile  # traces come back as files of their own (PART profile)
  say "$1 ($2 GBS $3): $(grep -h '^| megatron' /tmp/lanes/$1/results/baseline/$sys/baseline_report.md 2>/dev/null | awk -F'|' '{print $3, "mbs", $7, $9, "s"}' | tr '\n' ';')"
}

if [ "$PART" = determinism ] && [ "$NGPU" -ge 4 ]; then
  # Issue 32 at DP2 with Megatron-LM's --deterministic-mode: the chained seed (GPUs 0,1; one segment killed mid-way)
  # next to the same seed uninterrupted twice (GPUs 2,3), so the chain is held to a run-to-run spread of zero.
  ITERS=${ITERS:-650}; LAYOUT=${LAYOUT:-gpt-125m-2xdp}
  gpt126m chain "$LAYOUT" "$SYS2" "$ITERS" ", save_interval: 100, deterministic: true"
  sed -e 's/^name: gpt_126m/name: gpt_126m_chain/' /tmp/lanes/chain/config/benchmarks/gpt_126m.yaml > /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  echo "segments: {job_seconds: 100, margin_seconds: 30}" >> /tmp/lanes/chain/config/benchmarks/gpt_126m_chain.yaml
  sed -i 's/benchmarks: \[gpt_126m\]/benchmarks: [gpt_126m_chain]/' /tmp/lanes/chain/device.yaml
  (export CUDA_VISIBLE_DEVICES=0,1; smk chain 450 results/gpt_126m_chain/score.json --configfile device.yaml --config system=$SYS2; say "chain done") &
  CH=$!
  (cd /tmp/lanes/chain && timeout 440 python3 "$T/device/multigpu_kill.py" results/gpt_126m_chain/seed_1 2 100 430 > "$REC/kill.json" 2>&1; say "kill: $(cat "$REC/kill.json")") &
  KW=$!
  (export CUDA_VISIBLE_DEVICES=2,3
   for l in ref1 ref2; do
     gpt126m $l "$LAYOUT" "$SYS2" "$ITERS" ", deterministic: true"
     smk $l 230 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; keep $l $seed_files
     say "$l done"
   done
   # The layouts the sweep's call had no time left for (SWEEP2, e.g. "gpt_126m 16 [{tp: 1, mbs: 4}]"; ITERS=10).
   if [ -n "${SWEEP2:-}" ]; then ITERS=10; IFS=';' read -ra S2 <<< "$SWEEP2"; i=0
     for spec in "${S2[@]}"; do i=$((i+1)); set -- $spec; bl "s2_$i" "$1" "$2" "${*:3}" 200; done; fi) &
  R=$!
  wait $CH $R
  kill $KW 2>/dev/null
  keep chain $seed_files
  say "segments: $(cd /tmp/lanes/chain && python3 -c "import json; [print(s['index'], s['from_step'], s['to_step'], s.get('class'), s.get('gpu_s'), s.get('lost_steps'), s.get('lost_s'), s.get('val_loss')) for s in json.load(open('results/gpt_126m_chain/seed_1/segments.json'))['segments']]" 2>&1 | tr '\n' ';')"
  for l in chain ref1 ref2; do say "$l: $(grep -h 'validation loss at iteration' /tmp/lanes/$l/results/gpt_126m*/seed_1/mllog.txt 2>/dev/null | tail -2 | tr '\n' ' ')"; done
  say "lm loss at 600: $(for l in chain ref1 ref2; do grep -h ' iteration  *600/' /tmp/lanes/$l/results/gpt_126m*/seed_1/mllog.txt 2>/dev/null | grep -o 'lm loss: [0-9.E+-]*' | head -1; done | tr '\n' ' ')"
fi

if [ "$PART" = deepspeed ]; then
  # Issue 34's acceptance: gpt_126m_deepspeed (deepspeedai/Megatron-DeepSpeed, patched; DeepSpeed's pure-Python
  # wheel, carried in DS from device/deepspeed_carry.sh) through the workflow on the miniature corpus, ITERS
  # iterations at GBS 16: on one GPU as a chained seed (GPU0; a DS_JOB_S job limit less 30 s, so the fork's clock
  # ends the first job and the second resumes from DeepSpeed's checkpoint), Megatron-LM's gpt_126m beside it on
  # GPU1 (the side-by-side), and the 2xdp layout on GPUs 2,3 (on x2: GPUs 0,1 after them); then (issue 35) the
  # trial mode on the same pair.
  DS=${DS:-$PWD/.gpu/ds}; ITERS=${ITERS:-400}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$DS"/whl/*.whl \
    > /tmp/pip_ds.txt 2>&1 || { say "DeepSpeed wheels failed"; tail -5 /tmp/pip_ds.txt | tee -a "$SUMMARY"; }
  say "deepspeed: $(python3 -c 'import deepspeed; print(deepspeed.__version__)' 2>&1 | tail -1); numpy, pybind11: $(python3 -c 'import numpy, pybind11; print(numpy.__version__, pybind11.__version__)' 2>&1 | tail -1); $(g++ --version 2>&1 | head -1)"
  dsyaml() {  # lane, benchmark, layout
    printf 'benchmarks: [%s]\ncorpora: [mini_corpus]\npretrain: {layout: %s, train_iters: %s, gbs: 16, mbs: 8, save_interval: 100, megatron: %s, walltime_minutes: 9}\n' \
      "$2" "$3" "$ITERS" "$DS/megatron-deepspeed.tar.gz" > "/tmp/lanes/$1/device.yaml"
  }
  lane dsc
  sed -e 's/^name: gpt_126m_deepspeed/name: gpt_126m_deepspeed_chain/' /tmp/lanes/dsc/config/benchmarks/gpt_126m_deepspeed.yaml \
    > /tmp/lanes/dsc/config/benchmarks/gpt_126m_deepspeed_chain.yaml
  echo "segments: {job_seconds: ${DS_JOB_S:-100}, margin_seconds: 30, max_stalls: 2}" >> /tmp/lanes/dsc/config/benchmarks/gpt_126m_deepspeed_chain.yaml
  dsyaml dsc gpt_126m_deepspeed_chain gpt-125m
  smk dsc 150 resources/corpora/mini_corpus/data_prefix.json --configfile device.yaml --config system=$SYS2
  say "corpus: $(ls /tmp/lanes/dsc/resources/corpora/mini_corpus/preprocessed 2>&1 | tr '\n' ' ')"
  for l in mg ds2; do rm -rf "/tmp/lanes/$l"; cp -r /tmp/lanes/dsc "/tmp/lanes/$l"; done  # the corpus made once
  dsyaml ds2 gpt_126m_deepspeed gpt-125m-2xdp
  printf 'benchmarks: [gpt_126m]\ncorpora: [mini_corpus]\npretrain: {layout: gpt-125m, train_iters: %s, gbs: 16, mbs: 8, attention: sdpa, megatron: %s, walltime_minutes: 9}\n' \
    "$ITERS" "$C/megatron.tar.gz" > /tmp/lanes/mg/device.yaml
  (export CUDA_VISIBLE_DEVICES=0; smk dsc 420 results/gpt_126m_deepspeed_chain/score.json --configfile device.yaml --config system=$SYS2; say "DeepSpeed chained (GPU0) done") &
  A=$!
  (export CUDA_VISIBLE_DEVICES=1; smk mg 300 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; say "Megatron-LM (GPU1) done") &
  B=$!
  if [ "$NGPU" -lt 4 ]; then wait $A $B; PAIR=0,1; else PAIR=2,3; fi  # x2: the 2xdp lane after the other two
  (export CUDA_VISIBLE_DEVICES=$PAIR; smk ds2 300 results/gpt_126m_deepspeed/score.json --configfile device.yaml --config system=$SYS2; say "DeepSpeed 2xdp (GPUs $PAIR) done"
   keep ds2 $seed_files "results/gpt_126m*/seed_1/ds_config.json" "results/gpt_126m*/seed_1/tensorboard" results/tensorboard
   # Issue 35: the trial mode's steady-state measurement (no evaluation, a log line every iteration) on a GPU.
   mkdir -p /tmp/lanes/ds2/results/baseline/$SYS2 /tmp/lanes/ds2/results/preflight/$SYS2
   S=/tmp/lanes/ds2/docs/measurements/planner/h200x2_sweep
   cp $S/baseline.json /tmp/lanes/ds2/results/baseline/$SYS2/baseline.json
   python3 -c "import json,sys; p=json.load(open(sys.argv[1])); p['gemm']=json.load(open(sys.argv[2])); json.dump(p, open(sys.argv[3],'w'))" $S/preflight.json $S/gemm_sweep.json /tmp/lanes/ds2/results/preflight/$SYS2/preflight.json
   cd /tmp/lanes/ds2 && python3 -c "from pathlib import Path; from mlrepro.plan import calibration; r=calibration.calibrate_system(Path('.'), '$SYS2'); print('calibrated on', len(r['rows']), 'rows')" >> "$SUMMARY" 2>&1
   left=$(( DEADLINE - $(date +%s) - 15 )) && [ "$left" -gt 60 ] && \
     timeout "$left" python3 -m mlrepro plan --benchmark gpt_126m --gbs 16 --system $SYS2 --trial 3 --trial-iterations 30 \
       --configfile /tmp/lanes/mg/device.yaml > "$REC/trial.txt" 2>&1
   say "trial: $(tail -20 "$REC/trial.txt" 2>&1)"; keep ds2 "results/gpt_126m/trials" "results/plan") &
  D=$!
  wait $A $B $D
  keep dsc $seed_files "results/gpt_126m*/seed_1/ds_config.json" "results/gpt_126m*/seed_1/tensorboard" results/tensorboard
  keep mg $seed_files "results/gpt_126m*/seed_1/tensorboard" results/tensorboard
  for l in dsc mg ds2; do
    say "$l: $(cd /tmp/lanes/$l && python3 -c "
import glob, json
for f in sorted(glob.glob('results/gpt_126m*/seed_1/run.json')):
    d = json.load(open(f)); t = d.get('throughput') or {}
    print(f, d.get('status'), 'target', d.get('target_reached'), 'evals', d.get('evals', [])[-3:], 'tok/s/gpu', t.get('tokens_per_s_per_gpu'), 'mfu', t.get('mfu'), 'mem', t.get('peak_mem_gib'))
" 2>&1 | tail -3)"
  done
  say "checkpoints: $(ls /tmp/lanes/dsc/results/gpt_126m_deepspeed_chain/seed_1/checkpoints 2>&1 | tr "\n" " ")"
  say "segments: $(cd /tmp/lanes/dsc && python3 -c "import json; [print(s['index'], s['from_step'], s['to_step'], s.get('class'), s.get('gpu_s'), s.get('val_loss')) for s in json.load(open('results/gpt_126m_deepspeed_chain/seed_1/segments.json'))['segments']]" 2>&1 | tr '\n' ';')"
  for l in dsc mg ds2; do say "$l snakemake tail: $(grep -v '^Reason' "$REC/$l.snakemake.txt" 2>/dev/null | tail -4 | cut -c1-300)"; done
fi

if [ "$PART" = deepspeed_sdpa ]; then
  # Issue 34, the fork's attention on torch's SDPA (patch 0011, `attention: sdpa` -> --use-flash-attn-v2):
  # gpt_126m_deepspeed on GPU0, then its 2xdp layout on GPUs 0,1, ITERS iterations at GBS 16 as before.
  DS=${DS:-$PWD/.gpu/ds}; ITERS=${ITERS:-400}
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$DS"/whl/*.whl \
    > /tmp/pip_ds.txt 2>&1 || { say "DeepSpeed wheels failed"; tail -5 /tmp/pip_ds.txt | tee -a "$SUMMARY"; }
  lane s1
  for l in s1 s2; do
    [ "$l" = s2 ] && { rm -rf /tmp/lanes/s2; cp -r /tmp/lanes/s1 /tmp/lanes/s2; }
    lay=gpt-125m; [ "$l" = s2 ] && lay=gpt-125m-2xdp
    printf 'benchmarks: [gpt_126m_deepspeed]\ncorpora: [mini_corpus]\npretrain: {layout: %s, train_iters: %s, gbs: 16, mbs: 8, attention: sdpa, megatron: %s, walltime_minutes: 9}\n' \
      "$lay" "$ITERS" "$DS/megatron-deepspeed.tar.gz" > "/tmp/lanes/$l/device.yaml"
    rm -rf "/tmp/lanes/$l/results/gpt_126m_deepspeed" "/tmp/lanes/$l/resources/gpt_126m_deepspeed"
    gpus=0; [ "$l" = s2 ] && gpus=0,1
    (export CUDA_VISIBLE_DEVICES=$gpus; smk "$l" 240 results/gpt_126m_deepspeed/score.json --configfile device.yaml --config system=$SYS2)
    keep "$l" $seed_files "results/gpt_126m*/seed_1/ds_config.json" "results/gpt_126m*/seed_1/tensorboard"
    say "$l ($lay, SDPA): $(cd /tmp/lanes/$l && python3 -c "
import json; d = json.load(open('results/gpt_126m_deepspeed/seed_1/run.json')); t = d['throughput']
print(d['status'], 'target', d.get('target_reached'), 'evals', d['evals'][-2:], 's/it', t.get('iter_time_s'), 'tok/s/gpu', t.get('tokens_per_s_per_gpu'), 'mfu', t.get('mfu'), 'mem', t.get('peak_mem_gib'))" 2>&1 | tail -2)"
    say "$l snakemake tail: $(grep -v '^Reason' "$REC/$l.snakemake.txt" 2>/dev/null | tail -3 | cut -c1-300)"
  done
fi

if [ "$PART" = trial ]; then
  # Issue 35: `mlrepro plan --trial 3` on GPUs 0,1 with the seeds' settings (--configfile: attention sdpa), the
  # planner calibrated on the recorded sweep; each candidate's steady iterations (no evaluation, every one logged).
  gpt126m tr gpt-125m "$SYS2" 100 ""
  smk tr 150 resources/corpora/mini_corpus/data_prefix.json --configfile device.yaml --config system=$SYS2
  mkdir -p /tmp/lanes/tr/results/baseline/$SYS2 /tmp/lanes/tr/results/preflight/$SYS2
  S=/tmp/lanes/tr/docs/measurements/planner/h200x2_sweep
  cp $S/baseline.json /tmp/lanes/tr/results/baseline/$SYS2/baseline.json
  python3 -c "import json,sys; p=json.load(open(sys.argv[1])); p['gemm']=json.load(open(sys.argv[2])); json.dump(p, open(sys.argv[3],'w'))" $S/preflight.json $S/gemm_sweep.json /tmp/lanes/tr/results/preflight/$SYS2/preflight.json
  cd /tmp/lanes/tr && python3 -c "from pathlib import Path; from mlrepro.plan import calibration; r=calibration.calibrate_system(Path('.'), '$SYS2'); print('calibrated on', len(r['rows']), 'rows')" >> "$SUMMARY" 2>&1
  left=$(( DEADLINE - $(date +%s) - 15 ))
  (export CUDA_VISIBLE_DEVICES=0,1; timeout "$left" python3 -m mlrepro plan --benchmark gpt_126m --gbs 16 --system $SYS2 --trial 3 \
     --trial-iterations 30 --configfile device.yaml > "$REC/trial.txt" 2>&1)
  say "trial (rc $?): $(tail -12 "$REC/trial.txt")"
  keep tr "results/gpt_126m/trials" "results/plan"
fi

if [ "$PART" = planner ] && [ "$NGPU" -ge 4 ]; then
  # Issue 35 through the workflow: GPT-126M on one GPU (GPU0) and at DP2 (GPUs 2,3; GBS 16, then GBS 32: the same
  # work per GPU as the one-GPU run) with the launch line's gradient-reduce overlap; then the trial mode on GPUs 0,1
  # (`mlrepro plan --trial 3`) on the one-GPU lane's corpus, the planner calibrated on the recorded sweep.
  (export CUDA_VISIBLE_DEVICES=0
   gpt126m g1 gpt-125m "$SYS2" 300 ""
   smk g1 200 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; keep g1 $seed_files
   say "GPT-126M 1 GPU GBS16: $(python3 -c "import json; d=json.load(open('/tmp/lanes/g1/results/gpt_126m/seed_1/run.json')); print(d['throughput'])" 2>&1 | tail -1)"
   mkdir -p /tmp/lanes/g1/results/baseline/$SYS2 /tmp/lanes/g1/results/preflight/$SYS2
   S=/tmp/lanes/g1/docs/measurements/planner/h200x2_sweep
   cp $S/baseline.json /tmp/lanes/g1/results/baseline/$SYS2/baseline.json
   python3 -c "import json,sys; p=json.load(open(sys.argv[1])); p['gemm']=json.load(open(sys.argv[2])); json.dump(p, open(sys.argv[3],'w'))" $S/preflight.json $S/gemm_sweep.json /tmp/lanes/g1/results/preflight/$SYS2/preflight.json
   cd /tmp/lanes/g1 && python3 -c "from pathlib import Path; from mlrepro.plan import calibration; r=calibration.calibrate_system(Path('.'), '$SYS2'); print('calibrated on', len(r['rows']), 'rows')" >> "$SUMMARY" 2>&1
   export CUDA_VISIBLE_DEVICES=0,1
   left=$(( DEADLINE - $(date +%s) - 15 ))
   (cd /tmp/lanes/g1 && timeout "$left" python3 -m mlrepro plan --benchmark gpt_126m --gbs 16 --system $SYS2 --trial 3 --trial-iterations 20 --megatron "$C/megatron.tar.gz" > "$REC/trial.txt" 2>&1)
   say "trial (rc $?): $(tail -25 "$REC/trial.txt")"
   keep g1 "results/gpt_126m/trials" "results/plan") &
  A=$!
  (export CUDA_VISIBLE_DEVICES=2,3
   for g in 16 32; do
     GBS=$g gpt126m "d$g" gpt-125m-2xdp "$SYS2" 300 ""
     smk "d$g" 200 results/gpt_126m/score.json --configfile device.yaml --config system=$SYS2; keep "d$g" $seed_files
     say "GPT-126M DP2 GBS$g: $(python3 -c "import json; d=json.load(open('/tmp/lanes/d$g/results/gpt_126m/seed_1/run.json')); print(d['throughput'])" 2>&1 | tail -1)"
   done) &
  B=$!
  wait $A $B
fi

if [ "$PART" = sweep ] && [ "$NGPU" -ge 4 ]; then
  # Issue 35's measurements, two lanes of 2 GPUs: the GEMM/SDPA shapes of GPT-126M and GPT-1.3B layers (GPU0),
  # a preflight (collectives), and the baseline stage's Megatron-LM runs of the layouts below (ITERS each).
  ITERS=${ITERS:-10}
  L13_16="[{tp: 1, mbs: 1}, {tp: 1, mbs: 2}, {tp: 1, mbs: 4}, {tp: 1, mbs: 8}, {tp: 2, mbs: 4}, {pp: 2, mbs: 1}, {pp: 2, vpp: 2, mbs: 2}, {pp: 2, vpp: 4, mbs: 1}]"
  L13_64="[{tp: 1, mbs: 2}, {tp: 1, mbs: 4}, {tp: 1, mbs: 8}, {tp: 2, mbs: 8}, {pp: 2, mbs: 4}, {pp: 2, vpp: 2, mbs: 4}, {pp: 2, vpp: 4, mbs: 1}]"
  L126A="[{tp: 1, mbs: 1}, {tp: 1, mbs: 2}, {tp: 1, mbs: 4}, {tp: 1, mbs: 8}]"
  L126B="[{tp: 2, mbs: 8}, {pp: 2, mbs: 2}, {pp: 2, vpp: 2, mbs: 2}]"
  (export CUDA_VISIBLE_DEVICES=0,1
   CUDA_VISIBLE_DEVICES=0 timeout 90 python3 "$T/device/gemm_shapes_sweep.py" "$REC/gemm_sweep.json" > "$REC/gemm_sweep.txt" 2>&1
   say "gemm sweep: $(tail -1 "$REC/gemm_sweep.txt")"
   bl b13_16 gpt_1p3b 16 "$L13_16" 360
   bl b126a gpt_126m 16 "$L126A" 200) &
  A=$!
  (export CUDA_VISIBLE_DEVICES=2,3
   bl b13_64 gpt_1p3b 64 "$L13_64" 400
   bl b126b gpt_126m 16 "$L126B" 200) &
  B=$!
  wait $A $B
  say "planner now: $(cd /tmp/lanes/b13_16 && timeout 60 python3 -m mlrepro plan --model gpt-1.3b --system $SYS2 --gbs 16 --top 6 2>&1 | head -12)"
fi

if [ "$PART" = profile ]; then
  # Issue 35: where a step's time goes. The baseline stage's Megatron-LM runs with profile: true (two more
  # iterations traced by PyTorch's profiler per run): GPT-126M and GPT-1.3B at GBS 16 over micro-batch sizes,
  # on the node's GPUs (one GPU: the 1-GPU system; two: DP2, TP2 and PP2 rows as the sweep's). Traces
  # come back as files of their own ($OUT/<lane>.<run>.rank-<r>.json.gz, the runs TRACES names), and each rank's
  # summary with its 15 heaviest kernels is in PART.txt.
  ITERS=${ITERS:-10}; BL_KEYS=", profile: true"
  if [ "$NGPU" -ge 2 ]; then BL_SYS=$SYS2
    P126=${P126:-"[{tp: 1, mbs: 1}, {tp: 1, mbs: 8}, {tp: 2, mbs: 1}, {tp: 2, mbs: 4}, {tp: 2, mbs: 8}, {pp: 2, vpp: 2, mbs: 8}]"}
    P13=${P13:-"[{tp: 1, mbs: 8}, {tp: 2, mbs: 8}]"}
  else BL_SYS=device-$M
    P126=${P126:-"[{mbs: 1}, {mbs: 4}, {mbs: 8}]"}
    P13=${P13:-"[{mbs: 8}]"}
  fi
  export CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( NGPU > 2 ? 1 : NGPU - 1 )))
  bl p126 gpt_126m 16 "$P126" 300
  bl p13 gpt_1p3b 16 "$P13" 200
  for l in p126 p13; do
    say "$l: $(python3 -c "
import json,sys
for r in json.load(open(sys.argv[1]))['runs']:
    if r.get('workload') != 'megatron': continue
    p = (r.get('profile') or {}).get('rank0') or {}
    print(r['model'], 'tp', r['tp'], 'pp', r['pp'], 'dp', r['dp'], 'mbs', r['mbs'], r.get('iter_time_s'), 'traced', p.get('step_s'), 'busy', p.get('gpu_busy_s'), p.get('kernel_s'), r.get('error', ''))
" /tmp/lanes/$l/results/baseline/$BL_SYS/baseline.json 2>&1 | tr '\n' ';')"
    for f in $(find /tmp/lanes/$l/results/baseline -name 'rank-*.json.gz' | sort); do
      run=$(basename "$(dirname "$(dirname "$f")")" .profile); run=${run#megatron_bf16.}; r=$(basename "$f" .json.gz)
      python3 -m mlrepro.formats.torch_trace --top 15 "$f" >> "$SUMMARY" 2>&1
      # Every rank's trace of the runs TRACES names comes back as a file of its own (at most 6: the device
      # returns 8 files, this part's .txt and .tgz among them).
      if [[ "$run" =~ ^(${TRACES:-tp2pp1dp1mbs8|tp2pp1dp1mbs4|tp1pp1dp2mbs8|tp1pp1dp1mbs8|tp1pp1dp1mbs1})$ ]] \
          && [ "$(ls "$OUT"/*.json.gz 2>/dev/null | wc -l)" -lt 6 ] && [ "$(stat -c%s "$f")" -lt 15000000 ]; then
        cp "$f" "$OUT/$l.$run.$r.json.gz"
      fi
    done
  done
fi

if [ "$PART" = halftp ]; then
  # Issue 35 on one GPU: a TP2 rank's computation without its peer. GPT-126M at TP1 with one TP2 rank's shapes
  # (6 heads of 64, FFN 1536, vocabulary 25152: the QKV, projection, FC1/FC2, attention and logits of a rank of 2)
  # at MBS 4 and 8, traced; beside it the whole model at MBS 8 through the baseline stage. What a TP2 rank's GPU
  # does apart from its all-reduces and its waits on the peer.
  ITERS=10; BL_SYS=device-$M; BL_KEYS=", profile: true"; export CUDA_VISIBLE_DEVICES=0
  bl p126 gpt_126m 16 "[{mbs: 8}]" 150
  L=/tmp/lanes/p126; B=$L/results/baseline/$BL_SYS
  MD=$(dirname "$(find "$L/resources" -name pretrain_gpt.py | head -1)")
  for mbs in 4 8; do
    sed -e "s/--num-attention-heads 12 /--num-attention-heads 6 --kv-channels 64 /" -e "s/--ffn-hidden-size 3072 /--ffn-hidden-size 1536 /" \
        -e "s/--vocab-size 50304 /--vocab-size 25152 /" -e "s/--micro-batch-size 8 /--micro-batch-size $mbs /" \
        -e "s#megatron_bf16.tp1pp1dp1mbs8.profile#half_mbs$mbs.profile#" "$B/megatron_bf16.tp1pp1dp1mbs8.launch.sh" > "$REC/half_mbs$mbs.launch.sh"
    (cd "$MD" && MEGATRON_DIR=$MD MEGATRON_LAUNCH_FILE=$REC/half_mbs$mbs.launch.sh timeout 150 bash "$L/implementations/megatron_gpt/run_and_time.sh") > "$REC/half_mbs$mbs.log" 2>&1
    say "half MBS$mbs: $(grep -o 'elapsed time per iteration (ms): [0-9.]*' "$REC/half_mbs$mbs.log" | awk '{print $NF}' | tr '\n' ' ')"
    f=$B/half_mbs$mbs.profile/torch_profile/rank-0.json.gz
    python3 -m mlrepro.formats.torch_trace --top 12 "$f" >> "$SUMMARY" 2>&1; cp "$f" "$OUT/half_mbs$mbs.json.gz"
  done
  cp "$B/megatron_bf16.tp1pp1dp1mbs8.profile/torch_profile/rank-0.json.gz" "$OUT/whole_mbs8.json.gz"
fi

tar czf "$OUT/$PART.tgz" -C /tmp/rec "$PART"
say "$PART done; $(du -h "$OUT/$PART.tgz" | cut -f1) of records"
