# Settings shared by every mini_lora system config (sourced by config_<SYSTEM>.sh).
# Hyper-parameters are calibrated so that one seed on two CPU ranks reaches the
# target in roughly 10-30 s of run time.

export TARGET_EVAL_LOSS=${TARGET_EVAL_LOSS:-0.925}   # same target as llama2_70b_lora
export EVAL_EVERY=${EVAL_EVERY:-10}                   # steps between evaluations
export WARMUP_STEPS=${WARMUP_STEPS:-0}
export WEIGHT_DECAY=${WEIGHT_DECAY:-0.0001}
export GRAD_CLIP=${GRAD_CLIP:-0.3}
export LORA_ALPHA=${LORA_ALPHA:-32}
export SP=${SP:-0}
export SUBMISSION_BENCHMARK=${SUBMISSION_BENCHMARK:-mini_lora}
# Time budget inside the run; the trainer stops with status "aborted" after it.
export MAX_MINUTES=${MAX_MINUTES:-${WALLTIME_RUNANDTIME:-5}}
# One intra-op thread per rank: ranks of a one-machine test cluster's "nodes" share its
# cores, and oversubscribed ranks spin in gloo's allreduce.
export TORCH_NUM_THREADS=${TORCH_NUM_THREADS:-1}
