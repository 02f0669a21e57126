"""Real PyTorch profiler traces made on this machine's CPU, for the tests of formats.torch_trace and the
baseline's profile."""

from __future__ import annotations

import torch


def cpu_trace(path, steps: int = 4):
    """A torch.profiler trace of a few CPU training steps, exported as Megatron-LM exports its own."""
    model = torch.nn.Linear(64, 64)
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=steps, repeat=1)
    with torch.profiler.profile(schedule=schedule, on_trace_ready=lambda p: p.export_chrome_trace(str(path))) as prof:
        for _ in range(steps + 2):
            model(torch.randn(32, 64)).sum().backward()
            prof.step()
    return path
