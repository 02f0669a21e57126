"""The data_prefix list training is given: weight, prefix, weight, prefix, ...

Weights are each dataset's share of the tokens (`tokens`), or all equal (`equal`, as seed
001's 0.0135 × 74). Megatron, NeMo and Megatron-DeepSpeed normalise the weights themselves.
"""

from __future__ import annotations

from pathlib import Path

from mlrepro.formats.indexed import IndexedReader
from mlrepro.util.fsutil import atomic_write_json, atomic_write_text


def blend(prefixes: list[str], weights: str = "tokens") -> dict:
    tokens = [int(IndexedReader(p).sequence_lengths.astype("int64").sum()) for p in prefixes]
    total = sum(tokens)
    if weights == "equal" or total == 0:
        shares = [1 / len(prefixes)] * len(prefixes)
    else:
        shares = [t / total for t in tokens]
    data_prefix: list = []
    for share, prefix in zip(shares, prefixes):
        data_prefix += [round(share, 6), prefix]
    return {"data_prefix": data_prefix, "tokens": dict(zip(prefixes, tokens)), "total_tokens": total,
            "weights": weights}


def write_blend(prefixes: list[str], out_json: Path, weights: str = "tokens") -> dict:
    """data_prefix.json, and beside it data_prefix.txt for Megatron's --data-path."""
    record = blend(prefixes, weights)
    atomic_write_json(out_json, record)
    atomic_write_text(out_json.with_suffix(".txt"), " ".join(map(str, record["data_prefix"])) + "\n")
    return record
