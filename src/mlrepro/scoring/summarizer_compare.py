"""Our tree scores against the official summarizer's: its detailed CSV, and the two tables joined.

benchmarks/score_speed.py and the tests use it to show that `mlrepro score TREE` gives
``mlperf_logging.result_summarizer``'s numbers for every benchmark folder.
"""

from __future__ import annotations

import os

from mlrepro.scoring import rules as rules_mod


def summarizer_rows(detailed_csv: str | os.PathLike, usage: str = rules_mod.USAGE, ruleset: str | None = None):
    """The summarizer's ``*_detailed.csv`` (one row per system, columns ``<benchmark>:<metric>``)
    as one row per system and benchmark that has a time to train or an RCP verdict."""
    import pandas as pd

    wide = pd.read_csv(detailed_csv)
    benches = sorted({c.split(":", 1)[0] for c in wide.columns if ":" in c})
    rows = []
    for _, r in wide.iterrows():
        for b in benches:
            ttt, rcp = r.get(f"{b}:time_to_train"), r.get(f"{b}:RCP")
            if pd.isna(ttt) and (not isinstance(rcp, str) or not rcp):
                continue
            rows.append({"details_url": r["details_url"], "benchmark": b, "time_to_train": ttt,
                         "GBS": r.get(f"{b}:GBS"), "samples_to_converge": r.get(f"{b}:samples_to_converge"),
                         "RCP": rcp if isinstance(rcp, str) and rcp else None,
                         "rcp_scaling_factor": r.get(f"{b}:rcp_scaling_factor")})
    return pd.DataFrame(rows, columns=["details_url", "benchmark", "time_to_train", "GBS", "samples_to_converge",
                                       "RCP", "rcp_scaling_factor"])


def compare_with_summarizer(ours, official, tolerance_min: float = 0.001):
    """Join our table with ``summarizer_rows`` on (details_url, benchmark).

    Returns a DataFrame with one row per benchmark folder of either side and a column
    ``same``: both have no score, or the times to train differ by at most `tolerance_min`
    and GBS, samples to converge, RCP verdict and applied scaling factor agree.
    """
    import pandas as pd

    mine = ours[ours["details_url"].notna()][["details_url", "benchmark", "time_to_train", "GBS",
                                              "samples_to_converge", "RCP", "rcp_scaling_factor", "folder"]]
    both = mine.merge(official, on=["details_url", "benchmark"], how="outer", suffixes=("", "_official"),
                      indicator=True)

    def close(a, b, tol):
        if pd.isna(a) and pd.isna(b):
            return True
        return not (pd.isna(a) or pd.isna(b)) and abs(float(a) - float(b)) <= tol

    def same(r) -> bool:
        if r["_merge"] != "both":
            # A folder the summarizer has no row for must have no score from us either.
            return r["_merge"] == "left_only" and pd.isna(r["time_to_train"])
        rcp_a = r["RCP"] if isinstance(r["RCP"], str) else None
        rcp_b = r["RCP_official"] if isinstance(r["RCP_official"], str) else None
        return (close(r["time_to_train"], r["time_to_train_official"], tolerance_min)
                and close(r["GBS"], r["GBS_official"], 1e-9)
                and close(r["samples_to_converge"], r["samples_to_converge_official"], 1e-6)
                and close(r["rcp_scaling_factor"], r["rcp_scaling_factor_official"], 1e-12)
                and rcp_a == rcp_b)

    both["same"] = both.apply(same, axis=1) if len(both) else []
    both["abs_diff_min"] = (both["time_to_train"] - both["time_to_train_official"]).abs()
    return both
