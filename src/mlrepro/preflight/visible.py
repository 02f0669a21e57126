"""Which of a node's GPUs this process was given: CUDA_VISIBLE_DEVICES read against NVML's list.

NVML lists every GPU of the node whatever CUDA_VISIBLE_DEVICES says, while torch numbers only the
visible ones. A job given 2 GPUs of a 4-GPU node (Slurm's --gpus, a device lent with 4 GPUs running
2-GPU items) would otherwise measure torch devices 2 and 3 that do not exist, judge GPUs that belong
to someone else, and call their processes "other processes use this GPU".
"""

from __future__ import annotations

from typing import Callable


def nvml_indices(value: str | None, count: int, uuid_of: Callable[[int], str]) -> list[int]:
    """NVML indices of the GPUs CUDA_VISIBLE_DEVICES=`value` makes visible, in torch's order.

    Unset: all `count`. Entries are indices (in NVML's PCI order, as Slurm writes them) or UUIDs
    (`GPU-...`, a unique prefix is enough, as CUDA accepts). Like CUDA, the list ends at the first
    entry that names no GPU; a GPU named twice makes CUDA see none, so that gives [] too.
    """
    if value is None:
        return list(range(count))
    out: list[int] = []
    uuids = None
    for entry in (e.strip() for e in value.split(",")):
        if entry.isdigit() or (entry.startswith("-") and entry[1:].isdigit()):
            i = int(entry)
            if not 0 <= i < count:
                break
        elif entry.upper().startswith("GPU-"):
            if uuids is None:
                uuids = [uuid_of(i).upper() for i in range(count)]
            hits = [i for i, u in enumerate(uuids) if u.startswith(entry.upper())]
            if len(hits) != 1:
                break
            i = hits[0]
        else:
            break
        if i in out:
            return []
        out.append(i)
    return out
