"""benchmarks/stage_variants.py: variants are the library's kernels with exact text substitutions."""

import os

import pytest

from fastkda.kernels import chunk_prepare

from conftest import benchmark_script

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    return benchmark_script("stage_variants")


def test_a_variant_is_the_kernel_source_with_its_substitutions(tmp_path):
    tool = _tool()
    subs = [("for lvl in tl.static_range(1, LOG2_BT):", "for lvl in tl.static_range(1, 1):")]
    mod = tool.variant_module(chunk_prepare, "no_doubling", subs, str(tmp_path))
    src = open(mod.__file__).read()
    assert "tl.static_range(1, 1)" in src and "tl.static_range(1, LOG2_BT)" not in src
    assert "from ." not in src                              # imports point at the package
    assert mod._chunk_prepare_kernel is not chunk_prepare._chunk_prepare_kernel
    assert hasattr(mod._chunk_prepare_kernel, "run")        # a Triton kernel, ready to launch


def test_a_substitution_that_matches_nothing_stops_the_run(tmp_path):
    tool = _tool()
    with pytest.raises(ValueError, match="typo.*not found"):
        tool.variant_module(chunk_prepare, "typo", [("no such line in the kernel", "x")], str(tmp_path))


def test_variants_file_defines_the_three_tables(tmp_path):
    tool = _tool()
    path = tmp_path / "v.py"
    path.write_text('STAGE1 = {"base": []}\nLAUNCH = {"base": {"STAGE1_MAXNREG": 128}}\n')
    s1, s2, launch = tool.load_variants(str(path))
    assert s1 == {"base": []} and s2 == {} and launch == {"base": {"STAGE1_MAXNREG": 128}}


def test_run_times_each_variant_and_flags_the_ones_that_change_results():
    # A tiny packed problem, with a stand-in timer: through the interpreter without CUDA, compiled with it.
    import torch

    from fastkda.bench.tasks import Task
    tool = _tool()
    tiny = Task("tiny", 1, (40, 7), D=64)
    calls = []
    res = tool.run({"base": [], "no_doubling": [("for lvl in tl.static_range(1, LOG2_BT):",
                                                 "for lvl in tl.static_range(1, 1):")]},
                   {"base": []}, {}, [tiny], torch.device("cuda" if torch.cuda.is_available() else "cpu"),
                   timer=lambda fn: (fn(), calls.append(1), 0.0)[-1], log=lambda line: None)
    row = res["tiny"]
    assert set(row) == {"stage1 base", "stage1 no_doubling", "stage2 base"} and len(calls) == 3
    assert row["stage1 base"]["max_diff_vs_first"] == 0.0
    assert row["stage1 no_doubling"]["max_diff_vs_first"] > 1e-4     # T without its doubling levels is wrong


@pytest.mark.parametrize("name", sorted(f for f in os.listdir(os.path.join(ROOT, "benchmarks", "variants"))
                                        if f.endswith(".py")))
def test_stored_variants_still_apply_to_the_kernels(name, tmp_path):
    # A variants file whose text no longer matches the kernels would stop its device run before timing.
    from fastkda.kernels import chunk_recurrence
    tool = _tool()
    s1, s2, _ = tool.load_variants(os.path.join(ROOT, "benchmarks", "variants", name))
    for variant, subs in s1.items():
        tool.variant_module(chunk_prepare, variant, subs, str(tmp_path))
    for variant, subs in s2.items():
        tool.variant_module(chunk_recurrence, variant, subs, str(tmp_path))
