"""implementations/megatron_gpt/megatron_resume.py against megatron-core's own DistributedOptimizer code
(the PyPI release in the test environment, CPU): without apex or TE, a resume of the distributed optimizer
over torch's AdamW fails in both checkpoint formats; patched, it continues exactly as an uninterrupted run.

The optimizer is built around its real methods with only the attributes they read (a whole Megatron
model needs CUDA); the save and load follow checkpointing.py's order for each format.
"""

from __future__ import annotations

import copy
import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
distrib_optimizer = pytest.importorskip("megatron.core.optimizer.distrib_optimizer")

HERE = Path(__file__).resolve().parents[3] / "implementations" / "megatron_gpt"
SHAPES = [(4, 3), (5,), (2, 2)]


@pytest.fixture(autouse=True)
def on_the_cpu(monkeypatch):
    # load_state_dict places the loaded state on torch.cuda.current_device(); here that is the CPU.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")


def optimizer():
    cls = distrib_optimizer.DistributedOptimizer
    opt = object.__new__(cls)
    opt.model_params = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i)))
                        for i, s in enumerate(SHAPES)]
    main = [p.detach().clone().view(-1) for p in opt.model_params]
    # The keys megatron-core tells its param groups apart by (param_group_identifier_keys).
    group = {"params": main, **dict.fromkeys(distrib_optimizer.param_group_identifier_keys, 1.0)}
    opt.optimizer = torch.optim.AdamW([group], lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt.config = types.SimpleNamespace(optimizer="adam", exp_avg_dtype=torch.float32, exp_avg_sq_dtype=torch.float32,
                                       use_precision_aware_optimizer_no_fp8_or_ds_fp8=False, fp16=False)
    opt.ddp_config = types.SimpleNamespace(use_megatron_fsdp=False)
    opt.grad_scaler = None
    opt.is_stub_optimizer = False
    opt.gbuf_ranges = [{torch.float32: [{"param_map": {p: {"gbuf_world": distrib_optimizer.Range(0, p.numel())}
                                                       for p in opt.model_params}}]}]
    opt.model_param_group_index_map = {p: (0, i) for i, p in enumerate(opt.model_params)}
    return opt


def train(opt, first, n):
    for it in range(first, first + n):
        for j, p in enumerate(opt.optimizer.param_groups[0]["params"]):
            p.grad = torch.randn(p.shape, generator=torch.Generator().manual_seed(1000 * it + j))
        opt.optimizer.step()


def states(opt):
    return [{k: v.detach().clone() for k, v in opt._get_main_param_and_optimizer_states(p).items()}
            for p in opt.model_params]


def resumed(fmt):
    """Train 3 steps, save as `fmt`, load into a fresh optimizer, train 3 more."""
    before = optimizer()
    train(before, 0, 3)
    saved = copy.deepcopy(before.state_dict())
    saved_params = [{k: v for k, v in t.items() if k in ("param", "exp_avg", "exp_avg_sq")} for t in states(before)]
    after = optimizer()
    if fmt == "torch":  # load_checkpoint: optimizer.load_state_dict, then the parameter state from DP rank 0
        after.load_state_dict(copy.deepcopy(saved))
        for p, t in zip(after.model_params, saved_params):
            after._set_main_param_and_optimizer_states(p, t)
    else:  # torch_dist: the template of a fresh optimizer first (sharded_state_dict), then the load
        after.state_dict()
        after.load_state_dict(copy.deepcopy(saved))
        for p, t in zip(after.model_params, saved_params):
            after._set_main_param_and_optimizer_states(p, t)
    train(after, 3, 3)
    return after


@pytest.fixture
def patched(monkeypatch):
    cls = distrib_optimizer.DistributedOptimizer
    for name in ("state_dict", "load_state_dict", "_set_main_param_and_optimizer_states"):
        monkeypatch.setattr(cls, name, cls.__dict__[name])  # restored after the test
    monkeypatch.setattr(cls, "_resumable_with_torch_adam", False, raising=False)
    monkeypatch.syspath_prepend(str(HERE))
    module = importlib.import_module("megatron_resume")
    assert module.apply() is True
    return module


@pytest.mark.parametrize("fmt, error", [("torch", KeyError), ("torch_dist", AssertionError)])
def test_unpatched_resume_fails_in_both_formats(fmt, error):
    assert not distrib_optimizer.HAVE_APEX_OR_TE
    with pytest.raises(error):
        resumed(fmt)


@pytest.mark.parametrize("fmt", ["torch", "torch_dist"])
def test_patched_resume_continues_exactly(patched, fmt):
    uninterrupted = optimizer()
    train(uninterrupted, 0, 6)
    want, got = states(uninterrupted), states(resumed(fmt))
    assert [g["step"].item() for g in got] == [6.0, 6.0, 6.0]
    for w, g in zip(want, got):
        for key in ("param", "exp_avg", "exp_avg_sq"):
            assert torch.equal(w[key], g[key]), key


def test_wrapper_runs_the_script_with_its_arguments(tmp_path):
    script = tmp_path / "pretrain_gpt.py"
    (tmp_path / "neighbour.py").write_text("VALUE = 'beside the script'\n")
    script.write_text("import sys, neighbour\nprint(sys.argv[1:], neighbour.VALUE)\n")
    out = subprocess.run([sys.executable, "-m", "megatron_resume", str(script), "--save", "x"], cwd=HERE,
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['--save', 'x'] beside the script"
