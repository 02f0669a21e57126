"""Run pretrain_gpt.py with Megatron-LM's distributed optimizer made resumable without apex or TE.

Without apex or Transformer Engine, Megatron-LM (the pinned commit, and megatron-core 0.16) builds
its DistributedOptimizer over torch.optim.AdamW, which keeps a 0-dim `step` tensor per parameter
and creates it only at the first step. Three places of distrib_optimizer.py then break a resume:

  state_dict()        reads one common `step` out of the per-parameter state; on a fresh optimizer
                      (the template a torch_dist load is built from) there is none: AssertionError.
  _set_main_param_and_optimizer_states()
                      copies every tensor of the live per-parameter state, `step` included, from
                      the loaded parameter state, which never holds `step` (it lives in the saved
                      param_groups): KeyError 'step' with --ckpt-format torch.
  load_state_dict()   hands one `step` tensor to every parameter; AdamW's in-place `step += 1`
                      then advances it once per parameter per iteration, and the bias correction
                      after a resume is wrong (silently).

`apply()` patches the three in this process; nothing of Megatron-LM's files is edited. With apex
or TE (FusedAdam keeps `step` in its param_groups) it changes nothing.

    torchrun ... -m megatron_resume pretrain_gpt.py <flags>      (run in the Megatron-LM folder)

Standard library and torch only: the implementation imports nothing from mlrepro.
"""

from __future__ import annotations

import os
import runpy
import sys


def apply() -> bool:
    """Patch DistributedOptimizer for torch's AdamW; False when apex or TE make it unnecessary (or there is
    no Megatron-LM to patch)."""
    try:
        import torch
        from megatron.core.optimizer import distrib_optimizer
    except ImportError:  # not Megatron-LM's script after all: nothing of it to patch
        return False
    if distrib_optimizer.HAVE_APEX_OR_TE:
        return False
    cls = distrib_optimizer.DistributedOptimizer
    if getattr(cls, "_resumable_with_torch_adam", False):
        return True
    original_state_dict = cls.state_dict
    original_load_state_dict = cls.load_state_dict
    original_set_states = cls._set_main_param_and_optimizer_states

    def state_dict(self):
        if self.optimizer is None or len(self.optimizer.state) > 0:
            return original_state_dict(self)
        # A fresh optimizer only serves as the template of a load: its step is a placeholder that
        # the checkpoint's param_groups replace.
        inner = self.optimizer.state_dict()
        record = {"optimizer": {key: value for key, value in inner.items() if key != "state"}}
        for group in record["optimizer"]["param_groups"]:
            del group["params"]
            group["step"] = 0
        if self.grad_scaler:
            record["grad_scaler"] = self.grad_scaler.state_dict()
        return record

    def load_state_dict(self, state_dict):
        original_load_state_dict(self, state_dict)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                if isinstance(state.get("step"), torch.Tensor):
                    state["step"] = state["step"].detach().clone()

    def set_states(self, model_param, tensors):
        if self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            return original_set_states(self, model_param, tensors)
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        targets = {"param": main_param}
        # `step` was restored with the param_groups by load_state_dict.
        targets.update({key: value for key, value in self.optimizer.state[main_param].items()
                        if key != "step" and isinstance(value, torch.Tensor)})
        with torch.no_grad():
            for key, target in targets.items():
                if isinstance(tensors[key], torch.Tensor):
                    target.copy_(tensors[key])

    cls.state_dict = state_dict
    cls.load_state_dict = load_state_dict
    cls._set_main_param_and_optimizer_states = set_states
    cls._resumable_with_torch_adam = True
    return True


def main(argv: list[str]) -> None:
    if not argv:
        sys.exit("usage: python -m megatron_resume pretrain_gpt.py <flags>")
    script = os.path.abspath(argv[0])
    # pretrain_gpt.py imports its neighbours (gpt_builders, megatron) as a script run from its folder would.
    sys.path.insert(0, os.path.dirname(script))
    sys.argv = [script, *argv[1:]]
    apply()
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
