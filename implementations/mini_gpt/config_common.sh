# Settings shared by every mini_gpt system config (sourced by config_<SYSTEM>.sh).
# Calibrated so that one seed on two CPU ranks reaches the target in roughly 20-60 s of run time.

export TARGET_EVAL_LOSS=${TARGET_EVAL_LOSS:-3.495}   # validation loss (nats/token) on the miniature corpus
export EVAL_EVERY=${EVAL_EVERY:-10}                  # steps between evaluations
export EVAL_SAMPLES=${EVAL_SAMPLES:-256}
export WARMUP_STEPS=${WARMUP_STEPS:-20}
export SEQ_LEN=${SEQ_LEN:-64}
export N_LAYER=${N_LAYER:-4}
export N_EMBD=${N_EMBD:-192}
export N_HEAD=${N_HEAD:-4}
export SP=${SP:-0}
export SUBMISSION_BENCHMARK=${SUBMISSION_BENCHMARK:-mini_gpt}
# Checkpoints (into CHECKPOINT_DIR, which the launcher sets to the seed's folder): every
# CKPT_EVERY steps; kept: the last KEEP_LAST and the best KEEP_BEST by validation loss
# (the NeMo guide: KEEP_BEST=10 KEEP_LAST=1; the miniature keeps fewer: each checkpoint is ~20 MB).
export CKPT_EVERY=${CKPT_EVERY:-20}
export KEEP_LAST=${KEEP_LAST:-1}
export KEEP_BEST=${KEEP_BEST:-2}
# Time budget inside the run; the trainer stops with status "aborted" after it.
export MAX_MINUTES=${MAX_MINUTES:-${WALLTIME_RUNANDTIME:-5}}
export TORCH_NUM_THREADS=${TORCH_NUM_THREADS:-1}
