# mini_gpt on 2 node(s) x 2 CPU rank(s), data-parallel only (TP1 PP1 CP1).
# DGXSYSTEM is this file's name without config_ and .sh.
export DGXSYSTEM=CPU_2x2x8xtp1pp1cp1
export DGXNNODES=2
export DGXNGPU=2
export WALLTIME_RUNANDTIME=${WALLTIME_RUNANDTIME:-5}   # minutes for one run
export WALLTIME=$((5 + ${NEXP:-1} * ($WALLTIME_RUNANDTIME + 5)))

export MAX_STEPS=${MAX_STEPS:-400}
export LR=${LR:-0.0006}
export MINIBS=${MINIBS:-8}   # per rank; global batch = MINIBS * DGXNNODES * DGXNGPU
export TP=1
export PP=1
export CP=1

source "$(dirname "${BASH_SOURCE[0]}")/config_common.sh"
