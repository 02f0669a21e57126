"""One parallel layout of a training run: how the GPUs and the batch are split."""

from __future__ import annotations

import dataclasses

RECOMPUTE = ("none", "selective", "full")


@dataclasses.dataclass(frozen=True)
class Layout:
    tp: int = 1  # tensor parallel
    pp: int = 1  # pipeline parallel
    cp: int = 1  # context parallel
    dp: int = 1  # data parallel
    mbs: int = 1  # micro-batch, sequences
    ga: int = 1  # micro-batches per step on each pipeline (gradient accumulation)
    sp: bool = False  # sequence parallelism (with TP)
    recompute: str = "none"  # none | selective (core attention) | full (every layer)
    vpp: int = 1  # virtual pipeline stages per GPU (interleaved schedule)
    fp8_act: bool = False  # store the SwiGLU input in FP8 (NVIDIA FP8_ACT)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    @property
    def gbs(self) -> int:
        return self.mbs * self.ga * self.dp

    def short(self) -> str:
        extra = "".join([" SP" if self.sp else "", f" VPP{self.vpp}" if self.vpp > 1 else "",
                         f" recompute={self.recompute}" if self.recompute != "none" else "",
                         " FP8_ACT" if self.fp8_act else ""])
        return (f"TP{self.tp} PP{self.pp} CP{self.cp} DP{self.dp} MBS{self.mbs} GA{self.ga} "
                f"(GBS {self.gbs}){extra}")
