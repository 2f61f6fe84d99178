"""bookbuild.portability: what each configuration changes, and how a chapter's margins are reported."""
import os

import pytest
import torch

from bookbuild import nbval_hooks, portability


@pytest.mark.slow  # two fresh Pythons that import torch and time matmuls
def test_native_probe_reports_this_process_kernels():
    probe = portability.kernels({})
    assert probe["capability"] == torch.backends.cpu.get_cpu_capability()
    assert probe["threads"] == torch.get_num_threads()
    assert probe["fp32_gflops"] > 0 and probe["bf16_gflops"] > 0


@pytest.mark.slow
def test_the_thread_configuration_really_sets_the_threads():
    # torch caps OMP_NUM_THREADS at the core count, so the 4-thread configuration sets the count itself
    assert portability.kernels(portability.CONFIGS["threads-4"])["threads"] == 4


def test_a_cap_that_changes_nothing_is_recognised():
    native = {"capability": "AVX512", "threads": 2, "onednn_bf16_matmul": "brg_matmul:avx512_core_bf16"}
    assert portability.changes_nothing(dict(native, fp32_gflops=1.0), native)
    assert not portability.changes_nothing(dict(native, capability="AVX2"), native)
    assert not portability.changes_nothing(dict(native, onednn_bf16_matmul="brg_matmul:avx512_core_amx"), native)


def test_tightest_names_the_smallest_ratio():
    checks = [{"name": "a", "margin": 3.0, "ratio": True}, {"name": "b", "margin": 1.2, "ratio": True},
              {"name": "c", "margin": 0.1, "ratio": False}]
    assert portability.tightest(checks) == "b ×1.20"
    assert portability.tightest([]) == "—"


def test_capped_or_portability_runs_are_not_handed_to_the_build(monkeypatch):
    for var in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "BOOK_NO_CACHE_HANDOFF"):
        monkeypatch.delenv(var, raising=False)
    assert nbval_hooks.is_the_books_run()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert not nbval_hooks.is_the_books_run()
    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA")
    monkeypatch.setenv("BOOK_NO_CACHE_HANDOFF", "1")
    assert not nbval_hooks.is_the_books_run()


def test_check_writes_its_margin_where_the_portability_run_reads_it(tmp_path, monkeypatch):
    import json

    import measure
    monkeypatch.setattr(measure, "CHECKS", [])
    monkeypatch.setenv(portability.MARGINS_VAR, str(tmp_path / "m.jsonl"))
    measure.check("gain", 300.0, ">", 100.0)
    [line] = (tmp_path / "m.jsonl").read_text().splitlines()
    assert json.loads(line)["margin"] == 3.0 and os.environ[portability.MARGINS_VAR]


def test_each_capped_configuration_compiles_into_a_cache_of_its_own(tmp_path):
    # torch.compile's shared cache hands kernels compiled under ATEN_CPU_CAPABILITY=avx2 to a native run,
    # which then corrupts its heap (chapter 2 on an Intel AMX CPU): no two configurations may share one
    envs = {name: portability.config_env(name, tmp_path) for name in portability.CONFIGS}
    assert portability.INDUCTOR_CACHE_VAR not in envs["native"]
    dirs = [env[portability.INDUCTOR_CACHE_VAR] for name, env in envs.items() if name != "native"]
    assert len(set(dirs)) == len(dirs) == len(portability.CONFIGS) - 1
    assert all(envs[name].items() >= portability.CONFIGS[name].items() for name in envs)
