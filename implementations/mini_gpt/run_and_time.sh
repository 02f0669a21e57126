#!/bin/bash
# Runs one mini_gpt training run (one seed) and times it, NVIDIA-style.
#
# Under srun (SLURM_PROCID set) this script is one rank: run.sub launches it once
# per rank and provides MASTER_ADDR/MASTER_PORT. Otherwise it is the local path:
# torchrun starts all DGXNNODES x DGXNGPU ranks on this machine.
#
# Required: DATADIR (the corpus folder with data_prefix.json) SEED DGXNGPU (and the config's MAX_STEPS LR MINIBS ...).
# Exit status: 0 when the run ended with run_stop (success or aborted) or stopped
# before its job's limit with a checkpoint to resume from, non-zero
# on a crash or bad settings. Only rank 0 prints MLLOG lines (stdout).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

missing=()
for var in DATADIR SEED DGXNGPU; do
    [[ -n "${!var:-}" ]] || missing+=("$var")
done
if [[ -n "${SLURM_PROCID:-}" ]]; then
    for var in MASTER_ADDR MASTER_PORT; do
        [[ -n "${!var:-}" ]] || missing+=("$var")
    done
fi
if (( ${#missing[@]} )); then
    echo "run_and_time.sh: required environment variable(s) not set: ${missing[*]}" >&2
    echo "  (source config_<SYSTEM>.sh and set DATADIR and SEED)" >&2
    exit 2
fi
for var in TP PP CP; do
    if [[ "${!var:-1}" != 1 ]]; then
        echo "run_and_time.sh: $var=${!var}: mini_gpt is data-parallel only; tensor, pipeline and context" \
             "parallelism are not implemented (use a config with tp1pp1cp1)" >&2
        exit 2
    fi
done
for var in DATADIR; do
    if [[ ! -d "${!var}" ]]; then
        echo "run_and_time.sh: $var=${!var} is not a folder" >&2
        exit 2
    fi
done

# Ranks share the node's cores: one intra-op thread pool per rank, sized by the trainer.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export PYTHONUNBUFFERED=1
PYTHON=${PYTHON:-python3}

if [[ -n "${SLURM_PROCID:-}" ]]; then
    export RANK=$SLURM_PROCID
    export WORLD_SIZE=$SLURM_NTASKS
    export LOCAL_RANK=${SLURM_LOCALID:-0}
    export LOCAL_WORLD_SIZE=${SLURM_NTASKS_PER_NODE:-$DGXNGPU}
    LAUNCH=("$PYTHON" -u "$HERE/train.py")
else
    RANK=0
    # All of the system's ranks on this one machine, so the global batch (and with
    # it the convergence) is the one the config's name promises.
    nranks=$(( ${DGXNNODES:-1} * DGXNGPU ))
    LAUNCH=("$PYTHON" -m torch.distributed.run --standalone --nnodes=1 --nproc_per_node="$nranks" "$HERE/train.py")
fi

# SIGUSR1 asks the trainer to save and stop before the job's limit (Slurm's --signal reaches every
# process of the step; the local backend signals the run's whole tree): this shell and torchrun ignore
# it, the trainer installs its own handler.
trap '' USR1
start=$(date +%s)
if [[ "$RANK" == 0 ]]; then
    echo "STARTING TIMING RUN AT $(date -d "@$start" '+%Y-%m-%d %r') (seed $SEED)" >&2
fi
set +e
"${LAUNCH[@]}"
ret=$?
set -e
end=$(date +%s)
if [[ "$RANK" == 0 ]]; then
    echo "ENDING TIMING RUN AT $(date -d "@$end" '+%Y-%m-%d %r')" >&2
    echo "RESULT,MINI_GPT,$SEED,$((end - start)),${SUBMISSION_ORG:-mlrepro},$(date -d "@$start" '+%Y-%m-%d %r')" >&2
fi
exit $ret
