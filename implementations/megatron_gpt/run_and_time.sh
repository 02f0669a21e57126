#!/bin/bash
# A Megatron-LM GPT run, started by mlrepro's launch backends.
# On one machine (MEGATRON_LAUNCH_FILE): the planner's launch line (torchrun ... pretrain_gpt.py ...),
# run in the Megatron-LM checkout; torchrun starts one rank per GPU.
# Under run.sub (MEGATRON_ARGS_FILE): one rank of the run; srun starts one of these per GPU.
# A seed run as a chain of time-limited jobs (CHECKPOINT_DIR, and JOB_SECONDS/MARGIN_SECONDS where a job
# limit applies): the launch already saves to and loads from the checkpoint folder; the job limit becomes
# Megatron's own clock (--exit-duration-in-mins, counted from the program's start, whole minutes), and
# segment_end.py tells the chain how the job ended (a `segment:` line, or run_stop at the last iteration).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# sdpa_spec.py (--spec sdpa_spec ...) lives beside this script.
export PYTHONPATH="$HERE${PYTHONPATH:+:$PYTHONPATH}"
cd "${MEGATRON_DIR:-/workspace/megatron-lm}"

run() {
  if [ -z "${CHECKPOINT_DIR:-}" ]; then exec "$@"; fi
  if [ -n "${JOB_SECONDS:-}" ]; then
    minutes=$(( (${JOB_SECONDS%.*} - ${MARGIN_SECONDS:-0}) / 60 ))
    if [ "$minutes" -lt 1 ]; then
      echo "a job limit of ${JOB_SECONDS} s less a margin of ${MARGIN_SECONDS:-0} s is under one minute, Megatron-LM's smallest --exit-duration-in-mins" >&2
      exit 2
    fi
    set -- "$@" --exit-duration-in-mins "$minutes"
  fi
  "$@" 2>&1 | python3 "$HERE/segment_end.py"
  exit "${PIPESTATUS[0]}"
}

# SIGUSR1 asks Megatron-LM to save and exit (--exit-signal-handler --exit-signal SIGUSR1); Slurm's
# --signal reaches every process of the step and the local backend signals the run's whole tree, so this
# shell, torchrun and segment_end.py ignore it (torchrun would die of it) and the ranks install their handler.
trap '' USR1

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
# On the host (run.sub without a container): DATA_MOUNT=/data=<folder> puts the folder where the
# arguments, written for the container, name its mount.
if [ -n "${DATA_MOUNT:-}" ]; then
  args=()
  for a in "$@"; do
    case "$a" in "${DATA_MOUNT%%=*}"/*) a="${DATA_MOUNT#*=}${a#"${DATA_MOUNT%%=*}"}" ;; esac
    args+=("$a")
  done
  set -- "${args[@]}"
fi
# A run that saves to be resumed goes through megatron_resume.py (beside this script, on PYTHONPATH): without
# apex or TE, Megatron-LM's distributed optimizer cannot be resumed otherwise; with them it changes nothing.
if [ -n "${CHECKPOINT_DIR:-}" ]; then
  run python -m megatron_resume pretrain_gpt.py "$@"
fi
run python pretrain_gpt.py "$@"
