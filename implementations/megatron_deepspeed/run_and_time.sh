#!/bin/bash
# A Megatron-DeepSpeed GPT run (deepspeedai/Megatron-DeepSpeed patched by patches/), started by mlrepro's launch
# backends, in the patched checkout (MEGATRON_DIR). On one machine (MEGATRON_LAUNCH_FILE): the seed's torchrun
# line; under run.sub (MEGATRON_ARGS_FILE): one rank's pretrain_gpt.py arguments, srun starting one per GPU.
# A chained seed (CHECKPOINT_DIR): the line saves to and loads from the seed's checkpoints/ in DeepSpeed's layout
# (global_step<N>/, latest); the job limit becomes the fork's own clock (--exit-duration-in-mins, whole minutes),
# since its signal handler catches SIGTERM only, and segment_end.py (the Megatron-LM kind's, which reads this
# fork's messages too) tells the chain how the job ended.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${MEGATRON_DIR:-/workspace/megatron-deepspeed}"
# DeepSpeed's pure-Python wheel (DS_BUILD_OPS=0) would try to JIT-build an op it is asked for; none is asked
# (ZeRO-1/2 over torch's AdamW), and this keeps a mistake from compiling for minutes on every rank.
export DS_BUILD_OPS=0 DS_SKIP_CUDA_CHECK=1

run() {
  if [ -z "${CHECKPOINT_DIR:-}" ]; then exec "$@"; fi
  if [ -n "${JOB_SECONDS:-}" ]; then
    minutes=$(( (${JOB_SECONDS%.*} - ${MARGIN_SECONDS:-0}) / 60 ))
    if [ "$minutes" -lt 1 ]; then
      echo "a job limit of ${JOB_SECONDS} s less a margin of ${MARGIN_SECONDS:-0} s is under one minute, --exit-duration-in-mins' smallest" >&2
      exit 2
    fi
    set -- "$@" --exit-duration-in-mins "$minutes"
  fi
  "$@" 2>&1 | python3 "$HERE/segment_end.py"
  exit "${PIPESTATUS[0]}"
}

if [ -n "${MEGATRON_LAUNCH_FILE:-}" ]; then
  eval "set -- $(cat "$MEGATRON_LAUNCH_FILE")"
  run "$@"
fi
: "${MEGATRON_ARGS_FILE:?MEGATRON_LAUNCH_FILE or MEGATRON_ARGS_FILE names the rendered launch}"
export RANK=${SLURM_PROCID:-${RANK:-0}} WORLD_SIZE=${SLURM_NTASKS:-${WORLD_SIZE:-1}}
export LOCAL_RANK=${SLURM_LOCALID:-${LOCAL_RANK:-0}}
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" 2>/dev/null | head -n1 || echo localhost)}
export MASTER_PORT=${MASTER_PORT:-29500}
eval "set -- $(cat "$MEGATRON_ARGS_FILE")"
run python pretrain_gpt.py "$@"
