"""Megatron-LM pretrain_gpt.py command lines: the model and layout flags, data, logging, and the launchers.

The model and parallel-layout flags come from the planner (`plan.writer.megatron_args`); this adds
what a run needs besides: the blend (`--data-path` from the corpus stages' data_prefix), the
tokenizer files, iterations, the logging that `scoring.megatron_log` parses, and the flags that
let Megatron-LM run without Transformer Engine or apex (`--transformer-impl local`, fusions off).
Two launchers: torchrun for one machine, and srun (one task per GPU, pyxis container flags) for
NVIDIA's run.sub.
"""

from __future__ import annotations

import dataclasses
import shlex
import types

from mlrepro.plan import models, workloads
from mlrepro.plan.layout import Layout
from mlrepro.plan.writer import megatron_args

# Without apex/TE: Megatron's fused kernels (masked softmax, bias-gelu, bias-dropout, gradient
# accumulation into fp32 main grads, persistent layer norm) need compiled extensions.
LOCAL_IMPL = ["--transformer-impl", "local", "--no-masked-softmax-fusion", "--no-bias-gelu-fusion",
              "--no-bias-dropout-fusion", "--no-gradient-accumulation-fusion", "--no-persist-layer-norm"]
# Data parallelism that scales (issue 35: GPT-126M at DP2 reached 84.5% of twice one GPU): the gradient
# reduce runs bucket by bucket during the backward pass instead of after it (Megatron's DDP buckets,
# max(40M, 1M x DP) parameters by default), and with the distributed optimizer the parameters' all-gather
# runs during the next forward. The planner prices the rest (mlrepro.plan.cost: the last bucket).
OVERLAP_GRAD_REDUCE = ["--overlap-grad-reduce"]
OVERLAP_PARAM_GATHER = ["--overlap-param-gather"]
# The carried torch-SDPA attention (implementations/megatron_gpt/sdpa_spec.py).
SDPA_SPEC = ["--spec", "sdpa_spec", "sdpa_layer_spec"]


@dataclasses.dataclass(frozen=True)
class Run:
    model: str  # a planner model name, e.g. gpt-126m
    layout: Layout
    train_iters: int
    data_prefix: tuple = ()  # Megatron's --data-path: weight, prefix, weight, prefix ...
    vocab_file: str = ""
    merge_file: str = ""
    # Data already tokenized by the preprocess stage: Megatron needs only the vocabulary size and
    # the EOD id (the last id of a GPT-2 BPE), so NullTokenizer avoids its HuggingFace download.
    pretokenized_vocab: int | str = 0  # a dry run's UNPREPARED before the corpus stages trained the tokenizer
    lr: float = 6e-4
    min_lr: float = 6e-5
    warmup_iters: int = 0
    log_interval: int = 10
    eval_interval: int = 100
    eval_iters: int = 10
    split: str = "98,2,0"
    save: str = ""
    save_interval: int = 0
    seed: int = 1234
    local_impl: bool = True
    sdpa: bool = False
    precision: str = "bf16"  # bf16 | fp16 (loss-scaled) | fp8 (Transformer Engine's hybrid E4M3/E5M2 over bf16)
    # Megatron-LM's --deterministic-mode: torch's deterministic algorithms, NCCL_ALGO=Ring and a fixed cuBLAS
    # workspace (megatron/training/determinism.py), so a resumed chain can be compared bit for bit.
    deterministic: bool = False
    # Megatron-LM's own TensorBoard event files (its last rank writes them), read back by mlrepro.scoring.tfevents.
    tensorboard_dir: str = ""
    extra: tuple = ()


def model_args(model: str, layout: Layout) -> list[str]:
    """The planner's flags for a model shape and a layout (one owner: plan.writer.megatron_args)."""
    shape = models.model(model)
    w = workloads.gpt(shape.name, layout.gbs)

    args = megatron_args(types.SimpleNamespace(workload=w, layout=layout))  # reads only these two
    if shape.mlp == "swiglu":  # the 7b_improved/Llama family: SwiGLU, no linear biases
        args += ["--swiglu", "--disable-bias-linear"]
    if not shape.learned_positions:
        args += ["--position-embedding-type", "rope"]
    if not shape.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    return args


def pretrain_args(run: Run) -> list[str]:
    """Every pretrain_gpt.py flag of a run, in a stable order."""
    lay = run.layout
    args = model_args(run.model, lay)
    if run.precision == "fp16":  # the planner writes --bf16; fp16 is the same recipe with a dynamic loss scale
        args = ["--fp16" if a == "--bf16" else a for a in args]
    elif run.precision == "fp8":
        args += ["--fp8-format", "hybrid"]
    args += ["--train-iters", str(run.train_iters), "--lr", str(run.lr), "--min-lr", str(run.min_lr),
             "--lr-decay-style", "cosine", "--lr-warmup-iters", str(run.warmup_iters),
             "--weight-decay", "0.1", "--adam-beta1", "0.9", "--adam-beta2", "0.95", "--clip-grad", "1.0",
             "--init-method-std", "0.02", "--seed", str(run.seed)]
    if run.data_prefix:
        args += ["--data-path", *map(str, run.data_prefix), "--split", run.split]
    else:
        args += ["--mock-data"]
    if run.pretokenized_vocab:
        args += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(run.pretokenized_vocab)]
    elif run.vocab_file:
        args += ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", run.vocab_file, "--merge-file", run.merge_file]
    else:
        args += ["--tokenizer-type", "NullTokenizer", "--vocab-size", str(models.model(run.model).vocab)]
    args += ["--log-interval", str(run.log_interval), "--eval-interval", str(run.eval_interval),
             "--eval-iters", str(run.eval_iters), "--log-throughput",
             "--timing-log-level", "0"]
    if run.tensorboard_dir:
        # --log-timers-to-tensorboard adds 'iteration-time'; the losses are written whenever a folder is given.
        args += ["--tensorboard-dir", run.tensorboard_dir, "--log-timers-to-tensorboard"]
    if run.save:
        args += ["--save", run.save, "--load", run.save, "--save-interval", str(run.save_interval or run.train_iters),
                 # SIGUSR1 (Slurm's --signal, or the local backend before the job's limit): save, then exit 0.
                 "--exit-signal-handler", "--exit-signal", "SIGUSR1"]
        if run.local_impl:
            # The legacy format: one file per rank, read back without a template. Either format resumes
            # the distributed optimizer over torch's AdamW only through RESUME_MODULE (see it).
            args += ["--ckpt-format", "torch"]
    if run.local_impl:
        # Sequence parallelism needs Transformer Engine's or apex's LayerNorm: Megatron's local layer
        # (torch LayerNorm) refuses it ("sequence parallel not supported by torch LayerNorm"), so TP runs
        # without it here, as the planner's memory model then counts.
        args = [a for a in args if a != "--sequence-parallel"] + LOCAL_IMPL
    if lay.dp > 1:
        args += OVERLAP_GRAD_REDUCE
        # Not for a run that saves to be resumed: RESUME_MODULE reloads the distributed optimizer's state
        # by hand, which the delayed all-gather was not tried with.
        if "--use-distributed-optimizer" in args and not run.save:
            args += OVERLAP_PARAM_GATHER
    if run.sdpa:
        args += SDPA_SPEC
    if run.deterministic:
        args.append("--deterministic-mode")
    return args + list(run.extra)


# implementations/megatron_gpt/megatron_resume.py: without apex or TE, Megatron-LM's distributed optimizer
# over torch's AdamW cannot be resumed (KeyError 'step' in the torch format, an assertion in torch_dist, and a
# shared step tensor after a load); a run that saves to resume is launched through it.
RESUME_MODULE = "megatron_resume"


def launched(run: Run, script: str) -> list[str]:
    """What a rank runs: the script, or, for a run that saves to be resumed, the script through RESUME_MODULE."""
    return ["-m", RESUME_MODULE, script] if run.save and run.local_impl else [script]


def torchrun_line(run: Run, script: str = "pretrain_gpt.py", nproc: int | None = None) -> str:
    """One machine: torchrun with one process per GPU of the layout."""
    n = nproc or run.layout.gpus
    return shlex.join(["torchrun", "--standalone", f"--nproc-per-node={n}", *launched(run, script),
                       *pretrain_args(run)])


def srun_line(run: Run, image: str, mounts: str, script: str = "/workspace/megatron-lm/pretrain_gpt.py",
              gpus_per_node: int = 8) -> str:
    """Slurm: one task per GPU in a pyxis container, as NVIDIA's run.sub launches its trainers."""
    nodes = max(1, run.layout.gpus // gpus_per_node)
    per_node = min(run.layout.gpus, gpus_per_node)
    return shlex.join(["srun", "--mpi=pmix", f"--nodes={nodes}", f"--ntasks-per-node={per_node}",
                       f"--container-image={image}", f"--container-mounts={mounts}",
                       "--container-workdir=/workspace/megatron-lm", "--no-container-mount-home",
                       "python", *launched(run, script), *pretrain_args(run)])
