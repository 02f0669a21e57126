"""Every kind of benchmark (mlrepro.kinds.KINDS) is a BenchmarkKind: it has each function of the
interface, with the interface's parameters in its order and kind, of the same types; and what else
it exports is listed here, each with why it is public."""

from __future__ import annotations

import ast
import inspect
import typing
from pathlib import Path

import pytest

from mlrepro import kinds

KINDS_DIR = Path(kinds.__file__).parent
PROTOCOL = [name for name, value in vars(kinds.BenchmarkKind).items()
            if inspect.isfunction(value) and not name.startswith("_")]

# Public names a kind has beyond the interface, and who needs them from outside the module.
# A kind's name not listed here and not in the interface is a failure: make it private (`_name`)
# if only the module uses it, or list it with its reason.
EXTRAS = {
    "mlperf": {
        "implementation_config": "the config_<SYS>.sh the benchmark uses here (stages.report, the planner's tests)",
        "implementation_known": "whether a git implementation is fetched yet (kinds.systems, common.smk's DAG)",
        "config_in_use": "the config file and whether the planner wrote it (stages.score, stages.report)",
        "check_target": "the benchmark's target against the implementation's own (kinds.systems)",
    },
    "megatron": {
        "ensure_megatron": "Megatron-LM at the pinned commit in resources/ (baseline.megatron runs it too)",
        "learn": "a finished seed's measured step kept for the next plan of the system (stages.train)",
        "install_given": "a carried Megatron source (.tar.gz or folder) put in place whole (the DeepSpeed kind's too)",
        "chained_log": "a chained seed's jobs' logs as one run (finish_seed; the DeepSpeed kind's too)",
        "checkpointing": "a chained seed's job limit, --save interval and measured costs (the DeepSpeed kind's too)",
    },
    "megatron-deepspeed": {
        "source_dir": "where the patched Megatron-DeepSpeed is put (resources/<benchmark>/megatron-deepspeed)",
        "ensure_source": "the patched source at the pinned commit in resources/ (prepare; a carried .tar.gz too)",
        "model_flops_per_iter": "the Megatron-LM kind's FLOP count for a global batch (score_seed's MFU)",
    },
}
# Modules of mlrepro/kinds that are not kinds.
NOT_KINDS = {"__init__", "systems", "plan_trial"}


def test_every_module_of_kinds_is_a_listed_kind():
    modules = {p.stem for p in KINDS_DIR.glob("*.py")} - NOT_KINDS
    assert modules == {k.rsplit(".", 1)[1] for k in kinds.KINDS.values()}
    assert set(EXTRAS) <= set(kinds.KINDS)


def test_the_interface_is_the_nine_functions():
    assert PROTOCOL == ["plan_seed", "dag_plan", "dag_plans", "prepare", "implementation_folder", "corpus_folder",
                        "finish_seed", "score_seed", "unmet"]


@pytest.fixture(params=sorted(kinds.KINDS))
def kind(request):
    return request.param, kinds.named(request.param)


def test_a_kind_is_a_benchmark_kind(kind):
    assert isinstance(kind[1], kinds.BenchmarkKind)


def _returns(hint) -> set:
    """The types a return annotation allows (the members of a union)."""
    return set(typing.get_args(hint)) if typing.get_origin(hint) in (typing.Union, type(int | None)) else {hint}


@pytest.mark.parametrize("function", PROTOCOL)
def test_a_kinds_function_takes_what_the_interface_says(kind, function):
    name, module = kind
    fn = getattr(module, function)
    wanted = list(inspect.signature(getattr(kinds.BenchmarkKind, function)).parameters.values())[1:]  # not self
    given = list(inspect.signature(fn).parameters.values())
    where = f"{module.__name__}.{function}"
    assert [(p.name, p.kind) for p in given[:len(wanted)]] == [(p.name, p.kind) for p in wanted], where
    # Anything more a kind's function takes (megatron's plan_seed(prepared=)) has a default.
    assert all(p.default is not p.empty for p in given[len(wanted):]), where
    assert all(g.default is not g.empty for g, w in zip(given, wanted) if w.default is not w.empty), where
    wanted_hints = typing.get_type_hints(getattr(kinds.BenchmarkKind, function))
    given_hints = typing.get_type_hints(fn)
    for p in wanted:
        assert given_hints.get(p.name) == wanted_hints[p.name], f"{where}({p.name})"
    assert _returns(given_hints["return"]) <= _returns(wanted_hints["return"]), f"{where} returns"


def _public_names(module) -> set[str]:
    """Public names the module's own source binds at its top (not the names it imports), loggers aside."""
    names = set()
    for node in ast.parse(Path(module.__file__).read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            value = node.value
            if (isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute)
                    and value.func.attr == "getLogger"):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return {n for n in names if not n.startswith("_")}


def test_what_else_a_kind_exports_is_listed(kind):
    name, module = kind
    assert _public_names(module) - set(PROTOCOL) == set(EXTRAS.get(name, {}))


def test_of_gives_the_benchmarks_kind():
    class Bench:
        is_pretrain = False

    assert kinds.of(Bench()) is kinds.named("mlperf")
    Bench.is_pretrain = True
    Bench.pretrain = {"launcher": "megatron"}
    assert kinds.of(Bench()) is kinds.named("megatron")
    Bench.pretrain = {"launcher": "megatron-deepspeed"}
    assert kinds.of(Bench()) is kinds.named("megatron-deepspeed")
