#!/bin/bash
# One rank of a Megatron-LM GPT run: pretrain_gpt.py with the arguments mlrepro rendered
# (MEGATRON_ARGS_FILE, one shell-quoted line); run.sub starts one of these per GPU through srun.
set -euo pipefail
: "${MEGATRON_ARGS_FILE:?MEGATRON_ARGS_FILE names the rendered pretrain_gpt.py arguments}"
export RANK=${SLURM_PROCID:-${RANK:-0}} WORLD_SIZE=${SLURM_NTASKS:-${WORLD_SIZE:-1}}
export LOCAL_RANK=${SLURM_LOCALID:-${LOCAL_RANK:-0}}
export MASTER_ADDR=${MASTER_ADDR:-$(scontrol show hostnames "${SLURM_JOB_NODELIST:-localhost}" 2>/dev/null | head -n1 || echo localhost)}
export MASTER_PORT=${MASTER_PORT:-29500}
eval "set -- $(cat "$MEGATRON_ARGS_FILE")"
cd "${MEGATRON_DIR:-/workspace/megatron-lm}"
exec python pretrain_gpt.py "$@"
