import json
import math

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

import measure
from measure import (
    choose_size,
    cpu_isa,
    flops_per_token,
    matmul_peak,
    matmul_probe,
    peak_memory,
    time_it,
    time_steps,
    training_step_fn,
)
from model import GPT, GPTConfig

SMALL = dict(d_model=64, n_layer=2, n_head=2, seq_len=32)


def test_flops_per_token_of_default_model():
    cfg = GPTConfig()
    assert flops_per_token(cfg, GPT(cfg).num_params()) == 11_606_784


def test_formula_matches_pytorch_flop_counter():
    # with attention written as matmuls, the counter sees everything but the RMSNorm gains
    torch.manual_seed(0)
    cfg = GPTConfig(**SMALL)
    model = GPT(cfg)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as fc:
        model(x, x)[1].backward()
    per_token = fc.get_total_flops() // x.numel()
    norm_params = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    assert per_token == flops_per_token(cfg, model.num_params()) - 6 * norm_params


def test_time_it_and_time_steps_call_counts_and_order():
    calls = []
    stats = time_it(lambda: calls.append("f"), warmup=2, repeats=3)
    assert len(calls) == 5 and len(stats["warmup_s"]) == 2 and len(stats["times_s"]) == 3
    assert stats["min_s"] <= stats["median_s"]
    calls.clear()
    res = time_steps({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")},
                     warmup=1, repeats=2, rounds=2)
    assert calls == ["a", "b"] + ["a", "a", "b", "b"] * 2  # warm-ups first, then interleaved rounds
    assert len(res["a"]["times_s"]) == 4 and len(res["b"]["warmup_s"]) == 1


def _trained_params(accum, autocast_dtype=None):
    torch.manual_seed(0)
    cfg = GPTConfig(**SMALL)
    model = GPT(cfg)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=gen)
    y = torch.randint(0, cfg.vocab_size, (8, cfg.seq_len), generator=gen)
    loss = training_step_fn(model, opt, x, y, autocast_dtype=autocast_dtype, accum=accum)()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), loss


def test_training_step_accumulation_equals_big_batch():
    p1, _ = _trained_params(1)
    for k in (2, 4):
        pk, _ = _trained_params(k)
        assert (pk - p1).abs().max() < 1e-6
    torch.manual_seed(0)
    p_init = torch.cat([p.detach().flatten() for p in GPT(GPTConfig(**SMALL)).parameters()])
    assert (p1 - p_init).abs().max() > 1e-4  # the step really moved the parameters


def test_training_step_bf16_autocast_runs_and_keeps_fp32_weights():
    p, loss = _trained_params(1, autocast_dtype=torch.bfloat16)
    assert p.dtype == torch.float32 and torch.isfinite(loss)


def test_training_step_rejects_uneven_split():
    model = GPT(GPTConfig(**SMALL))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.zeros(6, 32, dtype=torch.long)
    with pytest.raises(ValueError, match="not divisible"):
        training_step_fn(model, opt, x, x, accum=4)


def test_peak_memory_measures_allocations():
    def fn():
        a = torch.ones(25_000_000)  # 100 MB, freed before b exists
        del a
        b = torch.ones(5_000_000)  # 20 MB
        c = torch.ones(1_000_000)  # 4 MB, alive together with b
        return b, c
    assert 100e6 <= peak_memory(fn) < 101e6

    def fn2():
        b = torch.ones(5_000_000)
        c = torch.ones(20_000_000)  # 20 MB + 80 MB alive at once
        return b.sum() + c.sum()
    assert 100e6 <= peak_memory(fn2) < 101e6


def test_memory_timeline_follows_each_allocation_and_names_the_phases():
    from torch.profiler import record_function

    from measure import memory_timeline

    def fn():
        with record_function("phase:grow"):
            a = torch.ones(10_000_000)  # 40 MB
            b = torch.ones(15_000_000)  # 60 MB: the peak, 100 MB, is here
        with record_function("phase:shrink"):
            del a, b
            c = torch.ones(5_000_000)  # 20 MB
        return c
    tl = memory_timeline(fn)
    assert len(tl["t_ms"]) == len(tl["live"]) and tl["t_ms"] == sorted(tl["t_ms"])
    assert [name for name, _, _ in tl["phases"]] == ["grow", "shrink"]
    (_, g0, g1), (_, s0, s1) = tl["phases"]
    assert g0 <= g1 <= s0 <= s1
    assert 100e6 <= tl["peak"] < 101e6 and tl["peak"] == max(tl["live"])
    assert g0 <= tl["peak_ms"] <= g1  # the peak falls in the phase that made it
    after = [b for t, b in zip(tl["t_ms"], tl["live"]) if t >= s0]
    assert any(20e6 <= b < 21e6 for b in after)  # c alone, once a and b are freed
    assert tl["live"][-1] == 0  # the profiled call drops what fn returned


def test_matmul_peak_is_plausible():
    flops = matmul_peak(torch.float32, sizes=(128, 256), repeats=3)
    assert 1e6 < flops < 1e15  # loose: a machine shared by many jobs can be 100× slower than quiet


class FakeClock:
    """A clock that only the fake work below advances: calibration is driven without waiting."""

    def __init__(self):
        self.now = 0.0
        self.calls = []  # (size, seconds) of every fake call

    def __call__(self):
        return self.now

    def work(self, seconds, size=None):
        self.now += seconds
        self.calls.append((size, seconds))


def fake_matmul(clock, flops_per_s_at_128, slowdown_per_doubling):
    """measure.matmul_fn's stand-in: an n³ matmul at a speed that falls by `slowdown_per_doubling`
    each time n doubles (like bf16 without bf16 instructions), advancing the fake clock."""
    def matmul_fn(dtype=torch.float32, n=2048):
        speed = flops_per_s_at_128 / slowdown_per_doubling ** math.log2(n / 128)
        return (lambda: clock.work(2 * n**3 / speed, n)), 2 * n**3
    return matmul_fn


@pytest.mark.parametrize("speed, slowdown, expect_n", [
    (400e9, 1.0, 2048),  # fast bf16 hardware: the largest size fits
    (60e9, 1.0, 2048),  # an AVX2 laptop's fp32: 2048³ is 0.29 s
    (2.4e9, 1.25, 512),  # bf16 without bf16 instructions (0.6-2.4 GFLOPS, measured on an AVX2 CPU)
    (0.3e9, 2.0, 256),  # a fallback far worse at scale than measured
    (1e6, 1.0, 128),  # hopelessly slow: the smallest size, once timed, still within the budget
])
def test_matmul_probe_stays_within_its_budget_whatever_the_speed(monkeypatch, speed, slowdown, expect_n):
    clock = FakeClock()
    monkeypatch.setattr(measure, "clock", clock)
    monkeypatch.setattr(measure, "matmul_fn", fake_matmul(clock, speed, slowdown))
    probe = matmul_probe(torch.bfloat16, call_budget_s=1.0, budget_s=20.0, repeats=5)
    assert probe["n"] == expect_n
    if expect_n > 128:  # a size above the smallest is chosen only if its calls fit the per-call budget
        assert max(s for _, s in clock.calls) <= 1.0
    if speed > 1e9:
        assert clock.now <= 20.0 and probe["seconds"] == pytest.approx(clock.now)
        assert probe["calls"] >= 1 and probe["flops_s"] == pytest.approx(probe["flops"] / min(
            s for n, s in clock.calls if n == probe["n"]))


def test_matmul_probe_does_not_take_a_stalled_size_for_the_peak(monkeypatch):
    # 4 threads on 2 cores (an Intel AMX CPU): fp32 1024³ at 137 GFLOPS, 2048³ at 3-5
    clock = FakeClock()
    monkeypatch.setattr(measure, "clock", clock)

    def matmul_fn(dtype=torch.float32, n=2048):
        speed = 4e9 if n == 2048 else 137e9
        return (lambda: clock.work(2 * n**3 / speed, n)), 2 * n**3
    monkeypatch.setattr(measure, "matmul_fn", matmul_fn)
    probe = matmul_probe(torch.float32, call_budget_s=1.0, budget_s=20.0, repeats=5)
    assert probe["n"] == 1024 and probe["flops_s"] == pytest.approx(137e9)


def test_time_steps_budget_cuts_rounds_then_repeats(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(measure, "clock", clock)
    fns = {"a": lambda: clock.work(0.5, "a"), "b": lambda: clock.work(1.5, "b")}
    res = time_steps(fns, warmup=1, repeats=3, rounds=10, budget_s=20.0)  # a round: 3 × 2 s = 6 s
    assert res["a"]["rounds"] == 3 and len(res["b"]["times_s"]) == 9
    timed = clock.now - 2.0  # after the warm-ups
    assert timed <= 20.0
    clock.now = 0.0
    res = time_steps(fns, warmup=1, repeats=5, rounds=3, budget_s=5.0)  # not even one round fits
    assert res["a"]["repeats"] == 2 and res["a"]["rounds"] == 1 and clock.now - 2.0 <= 5.0
    clock.now = 0.0
    res = time_steps(fns, warmup=1, repeats=5, budget_s=0.1)  # each fn still gets one timed call
    assert len(res["a"]["times_s"]) == len(res["b"]["times_s"]) == 1
    clock.now = 0.0
    res = time_steps(fns, warmup=0, repeats=1, rounds=5, budget_s=7.0)  # planned from a first round
    assert len(res["b"]["times_s"]) == 3 and clock.now <= 7.0
    res = time_steps(fns, warmup=0, repeats=2, rounds=4, budget_s=7.0, agree=lambda plan: (1, 1))
    assert len(res["a"]["times_s"]) == 2  # the calibration call and the one agreed


def test_choose_size_tries_sizes_in_order_and_stops_before_the_budget(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(measure, "clock", clock)
    pick = choose_size(lambda n: (lambda: clock.work(n * 1e-3, n)), [400, 100, 200, 800], work=lambda n: n,
                       call_budget_s=1.0)
    assert pick["size"] == 400  # 400 takes 0.4 s; 800 is predicted at 0.8 s × margin 2 > 1 s
    assert [n for n, _ in clock.calls] == [100, 100, 200, 200, 400, 400] and pick["spent_s"] == pytest.approx(1.4)


def test_cpu_isa_names_the_instruction_sets():
    assert cpu_isa({"avx2", "fma"}, "x86_64").startswith("AVX2 (")
    assert cpu_isa({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, "x86_64").startswith(
        "AVX-512 + avx512_bf16 + AMX (")
    assert cpu_isa({"asimd", "bf16"}, "aarch64").startswith("NEON + bf16 (")
    assert "torch kernels:" in cpu_isa()


def test_profiler_buckets_follow_the_callers_and_shares_sum_to_one():
    from types import SimpleNamespace as Event

    from measure import BUCKET_NAMES, OTHER_BUCKET, bucket_of, bucket_shares, profile_step
    ce = Event(name="VocabCrossEntropyBackward", cpu_parent=None)
    assert bucket_of(Event(name="aten::fill_", cpu_parent=ce)) == "softmax/CE over vocab"  # from its caller
    assert bucket_of(Event(name="aten::mm", cpu_parent=ce)) == "matmul"  # its own name before its caller's
    assert bucket_of(Event(name="aten::mul", cpu_parent=None)) == OTHER_BUCKET
    torch.manual_seed(0)
    model = GPT(GPTConfig(**SMALL))
    x = torch.randint(0, model.cfg.vocab_size, (2, 32))
    shares = bucket_shares(profile_step(training_step_fn(model, torch.optim.AdamW(model.parameters()), x, x)))
    assert set(shares) <= set(BUCKET_NAMES) and {"matmul", "optimizer"} <= set(shares)
    assert sum(shares.values()) == pytest.approx(1.0)


def test_traffic_counts_a_matmuls_flops_and_bytes_as_by_hand():
    from measure import OTHER_BUCKET, Traffic
    m, k, n = 3, 5, 7
    a, b = torch.ones(m, k), torch.ones(k, n)
    traffic = Traffic(seq_len=4)
    with traffic:
        c = a @ b  # aten::mm: reads a and b, writes c
    assert traffic.flops == {"matmul": 2 * m * k * n}
    assert traffic.bytes == {"matmul": 4 * (m * k + k * n + m * n)}  # fp32: 4 bytes an element
    with traffic:
        c.t()  # a view moves nothing
        c.add_(1.0)  # in place: reads c, writes c back
        torch.ones(m, n, dtype=torch.bfloat16) * 2  # fills one tensor, then reads it and writes a new one
    assert traffic.flops[OTHER_BUCKET] == m * n + m * n + m * n
    assert traffic.bytes[OTHER_BUCKET] == 4 * (m * n + m * n) + 2 * (m * n) + 2 * (m * n + m * n)
    traffic.in_optimizer = True
    with traffic:
        c.mul_(0.5)
    assert traffic.flops["optimizer"] == m * n and traffic.bytes["optimizer"] == 4 * 2 * m * n


def test_min_rounds_and_round_halves(monkeypatch):
    clock = FakeClock()
    monkeypatch.setattr(measure, "clock", clock)
    costs = iter([1.0, 2.0, 3.0, 4.0, 5.0] * 4)
    res = time_steps({"a": lambda: clock.work(next(costs))}, warmup=1, repeats=2, rounds=3, budget_s=3.0,
                     min_rounds=2)  # the budget fits one round of 2; kept: two rounds of 1 (the halves)
    assert res["a"]["rounds"] == 2 and res["a"]["times_s"] == [2.0, 3.0]
    assert measure.round_halves(res["a"]["times_s"], 2) == (2.0, 3.0)
    assert measure.round_halves([5, 1, 4, 3, 2, 6], 3) == (1, 3)  # rounds (5, 1), (4, 3), (2, 6)
    with pytest.raises(ValueError):
        measure.round_halves([1.0, 2.0, 3.0], 2)


def test_check_records_the_margin_and_fails_with_one_sentence(monkeypatch):
    monkeypatch.setattr(measure, "CHECKS", [])
    for args in (("ratio", 1.0, "<", 1.35), ("gain", 300.0, ">", 100.0), ("difference", -0.1, "<", 0.0)):
        assert measure.check(*args) is None  # a check as a cell's last line prints nothing
    assert [c["margin"] for c in measure.CHECKS] == pytest.approx([1.35, 3.0, 0.1])
    assert measure.margins_text(2) == "ratio ×1.35 (1 < 1.35); gain ×3.00 (300 > 100)"
    with pytest.raises(AssertionError, match=r"^tight: measured 2, which is not < 1 \(margin ×0.50\)$"):
        measure.check("tight", 2.0, "<", 1.0)
    assert measure.CHECKS[-1]["margin"] == pytest.approx(0.5)  # a failed check is recorded too
    with pytest.raises(ValueError):
        measure.check("bad", 1.0, "<=", 2.0)


def test_check_writes_numpy_values_to_the_margins_file(monkeypatch, tmp_path):
    # bookbuild.portability collects every check as a JSON line; a fit's numpy scalars must go in too
    np = pytest.importorskip("numpy")
    monkeypatch.setattr(measure, "CHECKS", [])
    monkeypatch.setenv("BOOK_MARGINS_FILE", str(tmp_path / "margins.jsonl"))
    measure.check("alpha above its standard error", np.float64(0.023), ">", np.float64(0.006))
    line = json.loads((tmp_path / "margins.jsonl").read_text())
    assert line["ratio"] is True and line["margin"] == pytest.approx(0.023 / 0.006)


def test_print_record_prints_margins_only_after_a_check(monkeypatch, capsys):
    monkeypatch.setattr(measure, "CHECKS", [])
    measure.print_record()
    assert "margins" not in capsys.readouterr().out
    measure.check("x", 2.0, ">", 1.0)
    measure.print_record()
    assert capsys.readouterr().out.splitlines()[-1] == "      margins: x ×2.00 (2 > 1)"


# ---- glue_measured: the one way a machine-dependent value reaches the prose ----

def glued_record(monkeypatch, glue_fn, *args) -> str:
    """The text/plain a chapter's glue output stores (what nbval compares), without a kernel."""
    import myst_nb.ext.glue
    shown = []
    monkeypatch.setattr(myst_nb.ext.glue, "ipy_display", lambda bundle, **kw: shown.append(bundle))
    glue_fn(*args)
    (bundle,) = shown
    return bundle[myst_nb.ext.glue.GLUE_PREFIX + "text/plain"]


def sanitized(text: str) -> str:
    """What nbval compares: the text after every rule of tests/nbval_sanitize.cfg, in order."""
    import re

    from nbval.plugin import get_sanitize_patterns

    from bookbuild import book
    for regex, replace in get_sanitize_patterns(book.SANITIZER.read_text(encoding="utf-8")):
        text = re.sub(regex, replace, text)
    return text


def test_glue_measured_is_masked_and_a_plain_glued_string_is_compared(monkeypatch):
    from myst_nb import glue
    measured = [glued_record(monkeypatch, measure.glue_measured, "k", v, ".0f") for v in (183.4, 91.0)]
    assert measured == ["('183')", "('91')"]
    assert {sanitized(m) for m in measured} == {"('<measured>')"}  # another machine's value compares equal
    quoted = glued_record(monkeypatch, measure.glue_measured, "k", "it's \"x\"")
    assert sanitized(quoted) == "('<measured>')"
    for fixed in ("9.44", "放得下", "B200 的 180 GB、H200 的 141 GB", "13%–14%"):  # fixed by formula: glue()
        record = glued_record(monkeypatch, glue, "k", fixed, False)
        assert record == repr(fixed) and sanitized(record) == record, record


def test_glue_measured_reads_as_its_text_on_the_page(monkeypatch):
    """myst-nb's {glue:text} literal-evaluates text/plain: the parentheses and quotes do not show."""
    from myst_nb.core.variables import format_plain_text
    for value, fmt in ((3.25, ".1f"), ("快了 34%", ""), ("it's \"x\"", "")):
        record = glued_record(monkeypatch, measure.glue_measured, "k", value, fmt)
        for spec in ("s", ""):  # {glue:text}`key` and {glue:text}`key:s`
            assert format_plain_text(record, spec) == format(value, fmt)


def test_about_rounds_a_duration_for_prose():
    assert measure.about(3) == "约 10 秒" and measure.about(44) == "约 40 秒" and measure.about(94) == "约 90 秒"
    assert measure.about(95) == "约 2 分钟" and measure.about(380) == "约 6 分钟"


def test_estimate_run_time_scales_the_stored_run_by_the_calibration(monkeypatch, tmp_path):
    glued = {}
    monkeypatch.setattr(measure, "glue_measured", lambda name, value, fmt="": glued.__setitem__(name, value))
    monkeypatch.setattr(measure, "calibration_step_s", lambda: 0.3)
    monkeypatch.setattr(measure, "RUN_TIMES", tmp_path / "run_times.json")
    measure.estimate_run_time("07_comm_fsdp")  # nothing stored yet: says so
    assert "还没有存下的运行" in glued["ch7_run_estimate"]
    (tmp_path / "run_times.json").write_text(json.dumps({"07_comm_fsdp": {"seconds": 100.0, "step_s": 0.15}}))
    measure.estimate_run_time("07_comm_fsdp")  # twice as slow here: 200 s
    assert glued["ch7_run_estimate"].startswith("预计约 3 分钟（") and "2.00 倍" in glued["ch7_run_estimate"]
    assert "100" not in glued["ch7_run_estimate"]  # the reference run's own time is stated once, by provenance


def test_calibration_step_is_a_positive_time():
    assert 0 < measure.calibration_step_s(repeats=1) < 60


def test_glue_values_glues_each_value_under_the_prefix(monkeypatch):
    import myst_nb
    glued = {}
    monkeypatch.setattr(myst_nb, "glue", lambda name, value, display: glued.__setitem__(name, (value, display)))
    measure.glue_values("ch7_", {"a": 1, "b": "x"}, c=2.5)
    assert glued == {"ch7_a": (1, False), "ch7_b": ("x", False), "ch7_c": (2.5, False)}


def test_compare_says_faster_only_beyond_twice_the_spread_and_with_three_samples():
    a = [1.00, 1.02, 1.10]  # spread: median 1.02 / fastest 1.00 − 1 = 2 %
    b = [0.90, 0.91, 0.95]  # spread 1.1 %; b's best is 1.00/0.90 = 1.11× a's rate
    c = measure.compare(a, b)
    assert c["noise"] == pytest.approx(0.02) and c["bound"] == pytest.approx(1.04)
    assert c["ratio"] == pytest.approx(1 / 0.9) and c["verdict"] == "faster" and c["samples"] == 3
    assert measure.compare(b, a)["verdict"] == "slower"  # the same pair the other way round
    noisy = [0.90, 1.00, 1.20]  # spread 11 %: 1.11× is inside 1 + 2·0.11
    assert measure.compare(a, noisy)["verdict"] == "unclear"
    assert measure.compare([1.0, 1.0], [0.5, 0.5])["verdict"] == "unclear"  # two calls each: no spread to judge
    assert measure.compare([1.0], [0.1])["verdict"] == "unclear" and math.isnan(measure.compare([1.0], [0.1])["noise"])
    # different work per call: b does twice the tokens in 1.5× the time, so its rate is 4/3 of a's
    w = measure.compare([1.0, 1.0, 1.0], [1.5, 1.5, 1.5], work_a=1, work_b=2)
    assert w["ratio"] == pytest.approx(4 / 3) and w["verdict"] == "faster"


def test_compare_clause_states_the_pairs_own_bound_for_every_verdict():
    # a reader checks each verdict against the numbers beside it: the bound printed is this pair's
    a = [1.00, 1.02, 1.10]  # spread 2 %
    said = {v: measure.compare_clause(measure.compare(a, b), "a") for v, b in
            (("faster", [0.90, 0.91, 0.95]), ("slower", [1.20, 1.22, 1.30]), ("unclear", [0.90, 1.00, 1.20]))}
    assert said["faster"] == "比a快了 11%，超出了这一对两倍的计时噪声（±4%）"
    assert said["slower"] == "比a慢，吞吐只有它的 83%，差别超出了这一对两倍的计时噪声（±4%）"
    assert said["unclear"] == "和a分不出快慢：差别 +11% 在这一对两倍的计时噪声（±22%）之内"
    assert measure.compare_clause(measure.compare([1.0], [0.1]), "a") == "和a分不出快慢：只量了 1 步，量不出噪声"


def test_chapter_2_interleaves_all_configurations_unless_bf16_is_a_software_fallback():
    names = ["fp32 eager", "bf16 eager", "fp32 compile", "bf16 compile", "fp32 matmul", "bf16 matmul"]
    assert measure.timing_groups(names, 300e9, 1000e9) == [names]  # AMX: bf16 faster
    assert measure.timing_groups(names, 300e9, 150e9) == [names]  # bf16 instructions without AMX: half as fast
    assert measure.timing_groups(names, 300e9, 300e9 / measure.SOFTWARE_BF16 * 1.01) == [names]
    assert measure.timing_groups(names, 300e9, 0.9e9) == [  # no bf16 instructions: under 1 GFLOPS
        ["fp32 eager", "fp32 compile", "fp32 matmul"], ["bf16 eager", "bf16 compile", "bf16 matmul"]]


def test_bf16_instructions_usable_follows_the_flags_and_onednns_cap():
    flags = {"avx512f", "avx512_bf16"}
    assert measure.bf16_instructions_usable(flags, {})
    assert measure.bf16_instructions_usable(flags, {"ONEDNN_MAX_CPU_ISA": "avx512_core_bf16"})
    assert not measure.bf16_instructions_usable(flags, {"ONEDNN_MAX_CPU_ISA": "AVX2"})  # the portability cap
    assert not measure.bf16_instructions_usable({"avx2"}, {})
