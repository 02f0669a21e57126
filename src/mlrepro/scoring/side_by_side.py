"""Benchmarks that train the same model on the same corpus with different stacks, side by side (issue 34).

One row per benchmark, from one scored seed's run record (run.json): its stack (the record's
`source`), GPUs, tokens/s and TFLOP/s per GPU, MFU, peak memory, and the validation loss at equal
tokens with its gap to the first row, the reference stack.

Equal tokens, not equal iterations or samples: the stacks may batch differently, and tokens (samples
x sequence length) are the data each has seen. The points compared are the reference's evaluations
that every other evaluated run reaches; a run without an evaluation of its own at such a point is
interpolated linearly between its neighbours, never extrapolated. A value a record lacks is None
(n/a), so a run scored before a metric existed still has its row.

    python -m mlrepro.scoring.side_by_side REFERENCE_RUN_JSON OTHER_RUN_JSON...
"""

from __future__ import annotations

import argparse
import html
import sys
import textwrap
from typing import Iterable, Sequence

from mlrepro.scoring import eval_band
from mlrepro.scoring.records import RunRecord

THROUGHPUT = ("gpus", "tokens_per_s_per_gpu", "tflops_per_gpu", "tflops_source", "mfu", "peak_mem_gib")
# Which seed seed_run picks, in the words the report tells its reader.
WHICH_SEED = "each benchmark's first counted seed"


def loss_at_tokens(run: dict) -> list[tuple[float, float]]:
    """The run's validation losses by tokens seen, in order; none without a sequence length."""
    seq_length = (run.get("throughput") or {}).get("seq_length")
    if not seq_length:
        return []
    losses: dict[float, float] = {}
    for samples, loss in run.get("evals") or []:
        if samples is not None and loss is not None:
            # Megatron-LM evaluates once more after training, on another draw of the validation set, at
            # the point of its last periodic evaluation: the periodic ones are what every stack logs alike.
            losses.setdefault(samples * seq_length, loss)
    return sorted(losses.items())


def common_tokens(curves: Sequence[Sequence[tuple[float, float]]]) -> list[float]:
    """The reference's (first) evaluation points that every evaluated run's curve spans."""
    evaluated = [c for c in curves if c]
    if not curves or not curves[0]:
        return []
    start, end = max(c[0][0] for c in evaluated), min(c[-1][0] for c in evaluated)
    return [tokens for tokens, _ in curves[0] if start <= tokens <= end]


def rows(runs: Sequence[dict]) -> list[dict]:
    """The comparison rows of scored seeds (run.json records) of one model on one corpus; the first is the
    reference. `val_loss` and `val_loss_gap` map each compared token count to the loss and its gap to the
    reference's (None where a run has no evaluation there or around it)."""
    curves = [loss_at_tokens(run) for run in runs]
    tokens = common_tokens(curves)
    losses = [{t: eval_band.value_at(curve, t) for t in tokens} for curve in curves]
    out = []
    for run, loss in zip(runs, losses):
        measured = run.get("throughput") or {}
        gap = {t: None if loss[t] is None or losses[0][t] is None else loss[t] - losses[0][t] for t in tokens}
        out.append({"benchmark": run.get("benchmark"), "source": run.get("source"), "seed": run.get("seed"),
                    **{key: measured.get(key) for key in THROUGHPUT}, "val_loss": loss, "val_loss_gap": gap})
    return out


def seed_run(score_runs: Iterable[dict]) -> dict | None:
    """The run that stands for a benchmark: its first counted seed (score.json's `runs`), None without one.
    One seed rather than medians, so each row's loss and throughput are one run's and can be looked up."""
    counted = [r for r in score_runs if r.get("counted") and not r.get("duplicate")]
    return min(counted, key=lambda r: (r.get("seed") is None, r.get("seed") or 0), default=None)


def _number(x, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)


def _headers(table: Sequence[dict]) -> list[str]:
    tokens = list(table[0]["val_loss"]) if table else []
    return ["benchmark", "stack", "seed", "GPUs", "tokens/s/GPU", "TFLOP/s/GPU", "MFU", "peak mem (GiB)",
            *(f"val loss @ {t / 1e6:.3g}M tokens" for t in tokens)]


def _cells(row: dict, reference: bool) -> list[str]:
    losses = []
    for tokens, loss in row["val_loss"].items():
        gap = row["val_loss_gap"][tokens]
        losses.append(_number(loss, ".4f") + ("" if reference or gap is None else f" ({gap:+.4f})"))
    return [str(row["benchmark"] or "n/a"), str(row["source"] or "n/a"), _number(row["seed"], "d"),
            _number(row["gpus"], "g"), _number(row["tokens_per_s_per_gpu"], ",.0f"),
            _number(row["tflops_per_gpu"], ".1f") + (f" ({row['tflops_source']})" if row["tflops_source"] else ""),
            _number(row["mfu"], ".1%"), _number(row["peak_mem_gib"], ".1f"),
            *losses]


def _legend(table: Sequence[dict]) -> str:
    reference = table[0] if table else {}
    return (f"Validation loss at equal tokens (samples x sequence length), in parentheses its gap to the first row "
            f"({reference.get('benchmark') or 'n/a'}, {reference.get('source') or 'n/a'}); interpolated linearly between a run's own "
            "evaluations where it has none at the point, never extrapolated. TFLOP/s as the trainer logged it "
            "(logged) or counted from the run's model (model): Megatron-LM's count for both stacks' GPTs.")


def text(table: Sequence[dict]) -> str:
    """The rows as aligned text (names to the left, numbers to the right), with what the loss columns mean.
    Not pandas: the report stages that import this module load without it."""
    lines = [_headers(table), *(_cells(r, i == 0) for i, r in enumerate(table))]
    widths = [max(len(line[i]) for line in lines) for i in range(len(lines[0]))]
    aligned = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths))).rstrip()
               for line in lines]
    return "\n".join(aligned) + "\n\n" + textwrap.fill(_legend(table), 110) + "\n"


def section(groups: Sequence[tuple[str, Sequence[dict]]]) -> str:
    """The final report's section: a table per model and corpus (title, rows); empty without one."""
    if not groups:
        return ""
    parts = ["<h2 id='same-model'>Same model, same corpus</h2>"]
    for title, table in groups:
        numeric = set(range(2, len(_headers(table))))
        head = "".join(f"<th class='{'num' if i in numeric else ''}'>{html.escape(h)}</th>"
                       for i, h in enumerate(_headers(table)))
        body = "".join("<tr>" + "".join(f"<td class='{'num' if j in numeric else ''}'>{html.escape(c)}</td>"
                                         for j, c in enumerate(_cells(r, i == 0))) + "</tr>"
                       for i, r in enumerate(table))
        parts.append(f"<h3>{html.escape(title)}</h3><div class='scroll'><table class='same-model'><tr>{head}</tr>"
                     f"{body}</table></div><p class='small'>{html.escape(_legend(table))}</p>")
    parts.append(f"<p class='small'>One row per benchmark: {WHICH_SEED} (its run.json). MFU is against the GPU's "
                 "datasheet peak (dense BF16).</p>")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlrepro.scoring.side_by_side",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", metavar="RUN_JSON", help="scored seeds' run.json; the first is the reference")
    args = parser.parse_args(argv)
    print(text(rows([RunRecord.read(path).to_json() for path in args.runs])), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
