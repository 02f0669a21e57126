#!/bin/bash
# A Megatron-LM GPT run, started by mlrepro's launch backends.
# On one machine (MEGATRON_LAUNCH_FILE): the planner's launch line (torchrun ... pretrain_gpt.py ...),
# run in the Megatron-LM checkout; torchrun starts one rank per GPU.
# Under run.sub (MEGATRON_ARGS_FILE): one rank of the run; srun starts one of these per GPU.
set -euo pipefail
# sdpa_spec.py (--spec sdpa_spec ...) lives beside this script.
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
cd "${MEGATRON_DIR:-/workspace/megatron-lm}"
if [ -n "${MEGATRON_LAUNCH_FILE:-}" ]; then
  eval "set -- $(cat "$MEGATRON_LAUNCH_FILE")"
  exec "$@"
fi
: "${MEGATRON_ARGS_FILE:?MEGATRON_LAUNCH_FILE or MEGATRON_ARGS_FILE names the rendered launch}"
export RANK=${SLURM_PROCID:-${RANK:-0}} WORLD_SIZE=${SLURM_NTASKS:-${WORLD_SIZE:-1}}
export LOCAL_RANK=${SLURM_LOCALID:-${LOCAL_RANK:-0}}
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" 2>/dev/null | head -n1 || echo localhost)}
export MASTER_PORT=${MASTER_PORT:-29500}
eval "set -- $(cat "$MEGATRON_ARGS_FILE")"
exec python pretrain_gpt.py "$@"
