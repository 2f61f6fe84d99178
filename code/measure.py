"""Measuring: this machine's matmul peak, the timing loop, where a step's time goes (profiler
buckets) and its FLOPs and bytes by the same buckets (Traffic), and the record of what produced a
chapter's numbers (printed here, gathered by record.py without torch). The FLOP formula lives in
shapes.py and is importable from here, beside the clock it is divided by."""
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from record import EMULATION_VARS, cpu_flags, cpu_isa, cpu_name, experiment_record, git_commit, git_state  # noqa: F401,E501  (re-exported: the chapters import them from here)
from script_support import accumulate_gradients
from shapes import flops_per_token  # noqa: F401  (one formula; chapters and scripts import it from here)

CALL_BUDGET_S = 1.0  # the most one timed call of a probe that can choose its size should take
PROBE_BUDGET_S = 20.0  # the most the timed calls of one probe (calibration included) should take

clock = time.perf_counter  # every timing here reads this clock (a test replaces it with a fake one)


def _timed(fn) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def time_steps(fns: dict, warmup: int = 2, repeats: int = 5, rounds: int = 1, budget_s: float | None = None,
               agree=None, min_rounds: int = 1) -> dict:
    """Time several no-argument functions fairly on a shared machine: the one timing loop of the book.

    Each fn is first called `warmup` times (compilation, allocator, caches; reported as warmup_s,
    never budgeted). Then up to `rounds` rounds each call every fn `repeats` times in turn, so a
    burst of load from elsewhere hits all of them alike.

    budget_s: the most the timed calls may take together. The plan is made before the first timed
    call from each fn's last warm-up (without warm-ups, from a first round of one call each): as many
    whole rounds as fit, or, if one round does not fit, one round with fewer repeats. Every fn gets
    at least one timed call, so a single call longer than budget_s is the one way to exceed it.
    min_rounds: whole rounds kept even beyond the budget (2 to compare halves: round_halves).
    agree: a function applied to the planned (repeats, rounds) before timing, e.g. the minimum over
    the ranks of a process group, so that every rank makes the same calls (collectives).

    Returns {name: {"warmup_s", "times_s", "median_s", "min_s", "repeats", "rounds"}}; min_s is the
    best call.
    """
    out = {name: {"warmup_s": [_timed(fn) for _ in range(warmup)], "times_s": []} for name, fn in fns.items()}
    if budget_s is not None:
        spent = 0.0
        if not warmup:  # nothing to plan from yet: a first round of one call each, kept as timed calls
            for name, fn in fns.items():
                out[name]["times_s"].append(_timed(fn))
                spent += out[name]["times_s"][-1]
        per_call = sum((r["warmup_s"] or r["times_s"])[-1] for r in out.values())  # one call of every fn
        fit = fit_calls(budget_s - spent, per_call, most=repeats * rounds - bool(spent), least=0 if spent else 1)
        if fit >= repeats:
            rounds = min(rounds, fit // repeats)
        else:
            repeats, rounds = fit, 1
        if rounds < min_rounds:
            repeats, rounds = max(1, min(repeats, fit // min_rounds)), min_rounds
    if agree is not None:
        repeats, rounds = agree((repeats, rounds))
    for _ in range(rounds):
        for name, fn in fns.items():
            out[name]["times_s"] += [_timed(fn) for _ in range(repeats)]
    for r in out.values():
        r["median_s"] = statistics.median(r["times_s"])
        r["min_s"] = min(r["times_s"])
        r["repeats"], r["rounds"] = repeats, rounds
    return out


def round_halves(times_s: list, rounds: int) -> tuple:
    """(fastest call of the even rounds, fastest of the odd rounds) of one fn's timed calls, made in
    `rounds` rounds of equal length: two runs taken in turns, whose ratio (≥ 1) is the noise of the
    fastest call under this machine's load. Needs at least 2 rounds."""
    if rounds < 2 or len(times_s) % rounds:
        raise ValueError(f"{len(times_s)} calls do not make {rounds} ≥ 2 rounds of equal length")
    k = len(times_s) // rounds
    return tuple(min(t for r in range(first, rounds, 2) for t in times_s[r * k:(r + 1) * k]) for first in (0, 1))


LEAST_SAMPLES = 3  # fewer timed calls than this on either side, and compare() has no spread to judge by


def spread(times_s: list) -> float:
    """How far a typical call is from the best one: median / fastest − 1 (0.05: the median call is 5 %
    slower). The noise of a set of timed calls of one fn on this machine, under its load now."""
    return statistics.median(times_s) / min(times_s) - 1


def worst_spread(stats: dict) -> float:
    """The largest spread of any fn's timed calls in a time_steps result: that measurement's noise."""
    return max(spread(r["times_s"]) for r in stats.values())


def compare(a_s: list, b_s: list, work_a: float = 1.0, work_b: float = 1.0, least: int = LEAST_SAMPLES) -> dict:
    """The book's one rule for a timing verdict: is b faster than a, beyond the noise?

    a_s, b_s: the timed calls (seconds) of two fns, best taken in turns in one time_steps; work_a, work_b:
    the work of one call of each (tokens, FLOPs, bytes) where it differs. ratio: b's rate over a's, from
    each side's fastest call. noise: the larger of the two sides' spread(). The verdict is "faster" only if
    ratio > 1 + 2·noise, "slower" only if ratio·(1 + 2·noise) < 1, and otherwise "unclear"; with fewer
    than `least` calls on either side there is no spread to measure, and it is "unclear" whatever the
    ratio ("samples", the smaller count, says why).
    Returns {"ratio", "noise", "bound" (1 + 2·noise), "samples", "verdict"}."""
    samples = min(len(a_s), len(b_s))
    ratio = (work_b / min(b_s)) / (work_a / min(a_s))
    noise = max(spread(a_s), spread(b_s)) if samples >= 2 else float("nan")
    bound = 1 + 2 * noise
    verdict = "unclear"
    if samples >= least:
        verdict = "faster" if ratio > bound else "slower" if ratio * bound < 1 else "unclear"
    return {"ratio": ratio, "noise": noise, "bound": bound, "samples": samples, "verdict": verdict}


def bound_clause(c: dict) -> str:
    """Where compare()'s difference stands against this pair's own bound, in Chinese: '超出了这一对两倍的
    计时噪声（±12%）', '在这一对两倍的计时噪声（±12%）之内', or why there is no bound."""
    bound = f"这一对两倍的计时噪声（±{200 * c['noise']:.0f}%）"
    if c["verdict"] != "unclear":
        return f"超出了{bound}"
    return f"只量了 {c['samples']} 步，量不出噪声" if c["samples"] < LEAST_SAMPLES else f"在{bound}之内"


def compare_clause(c: dict, than: str) -> str:
    """compare()'s verdict as one clause of a Chinese sentence: faster, slower, or cannot tell (and why),
    always with the pair's own bound (bound_clause), so the verdict can be checked against the numbers beside it."""
    if c["verdict"] == "faster":
        return f"比{than}快了 {100 * (c['ratio'] - 1):.0f}%，{bound_clause(c)}"
    if c["verdict"] == "slower":
        return f"比{than}慢，吞吐只有它的 {100 * c['ratio']:.0f}%，差别{bound_clause(c)}"
    if c["samples"] < LEAST_SAMPLES:
        return f"和{than}分不出快慢：{bound_clause(c)}"
    return f"和{than}分不出快慢：差别 {100 * (c['ratio'] - 1):+.0f}% {bound_clause(c)}"


def fit_calls(budget_s: float, call_s: float, most: int, least: int = 1) -> int:
    """How many calls of call_s seconds fit in budget_s: between `least` and `most`."""
    fit = int(budget_s // call_s) if call_s > 0 else most
    return max(least, min(most, fit))


def time_it(fn, warmup: int = 2, repeats: int = 5, budget_s: float | None = None) -> dict:
    """time_steps for one fn: its warm-up seconds, and the median and min of its timed calls."""
    return time_steps({"fn": fn}, warmup=warmup, repeats=repeats, budget_s=budget_s)["fn"]


def choose_size(make, sizes, work, call_budget_s: float = CALL_BUDGET_S, margin: float = 2.0) -> dict:
    """Calibrate: the largest of `sizes` (ascending) whose one call fits in call_budget_s.

    make(size) returns a no-argument fn; work(size) its amount of work (e.g. FLOPs). Starting from
    the smallest, each size is called twice (a warm-up, then a timed call); the next size is tried only
    if this call × the ratio of work × `margin` fits in call_budget_s. The margin covers kernels that
    get slower per unit of work as the size grows (a bf16 matmul without bf16 instructions does).
    Returns {"size", "fn", "call_s" (the chosen size's timed call), "spent_s" (all calibration calls),
    "calls_s" ({size: its timed call} for every size tried)}.
    """
    sizes = sorted(sizes)
    spent, calls = 0.0, {}
    for i, size in enumerate(sizes):
        fn = make(size)
        warm = _timed(fn)
        calls[size] = call = _timed(fn)
        spent += warm + call
        nxt = sizes[i + 1] if i + 1 < len(sizes) else None
        if nxt is None or call * work(nxt) / work(size) * margin > call_budget_s:
            return {"size": size, "fn": fn, "call_s": call, "spent_s": spent, "calls_s": calls}


def matmul_fn(dtype=torch.float32, n: int = 2048):
    """(fn, flops): a no-argument n×n×n matmul in `dtype` and the FLOPs one call does. Time it
    together with training steps (time_steps) so that both see the same load on a shared machine."""
    a = torch.randn(n, n).to(dtype)
    b = torch.randn(n, n).to(dtype)
    return (lambda: torch.mm(a, b)), 2 * n**3


MATMUL_SIZES = (128, 256, 512, 1024, 2048)
# A size whose calibration call ran this many times slower per FLOP than the fastest size tried is a stall,
# not a peak: with 4 threads on 2 cores an fp32 2048³ matmul ran at 3-5 GFLOPS where 1024³ ran at 137 (an
# Intel AMX CPU), and chapter 2's MFU against that "peak" came out at 15. A bf16 software fallback slows by
# at most 2× per doubling of n (tests/test_measure.py), so it keeps its largest size.
STALL_FACTOR = 4


def matmul_probe(dtype=torch.float32, sizes=MATMUL_SIZES, call_budget_s: float = CALL_BUDGET_S,
                 budget_s: float = PROBE_BUDGET_S, repeats: int = 5) -> dict:
    """This CPU's matmul speed in `dtype` within a time budget: the size is calibrated (choose_size,
    at most 2048³), then up to `repeats` calls are timed within what is left of budget_s. The size timed
    is the largest tried that did not stall (STALL_FACTOR): on a quiet machine, the calibrated one.

    Returns {"n", "fn", "flops" (of one call), "flops_s" (of the fastest call), "calls", "seconds"}.
    Without instructions for `dtype` (bf16 on an AVX2 CPU) the chosen n is small, and the result is
    the speed of a software fallback, not a ceiling of the hardware."""
    made = {}

    def make(n):
        made[n] = matmul_fn(dtype, n)
        return made[n][0]
    pick = choose_size(make, sizes, lambda n: n**3, call_budget_s)
    rate = {size: size**3 / call for size, call in pick["calls_s"].items()}
    n = max(size for size in rate if rate[size] * STALL_FACTOR >= max(rate.values()))
    fn, flops = made[n]
    stats = time_it(fn, warmup=0, repeats=repeats, budget_s=max(0.0, budget_s - pick["spent_s"]))
    best = min(stats["min_s"], pick["calls_s"][n])
    return {"n": n, "fn": fn, "flops": flops, "flops_s": flops / best, "calls": len(stats["times_s"]),
            "seconds": pick["spent_s"] + sum(stats["times_s"])}


L3_SIZE = Path("/sys/devices/system/cpu/cpu0/cache/index3/size")  # Linux: e.g. "32768K"


def l3_bytes() -> int:
    """This CPU's L3 cache in bytes as Linux reports it; 0 where it is not reported."""
    return int(L3_SIZE.read_text().strip().rstrip("K")) * 1024 if L3_SIZE.is_file() else 0


def triad_fn(n: int):
    """STREAM's triad c = a + 3·b over n fp32 elements: per element it reads 8 bytes and writes 4."""
    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    return lambda: torch.add(a, b, alpha=3.0, out=c)


def bandwidth_probe(budget_s: float = PROBE_BUDGET_S) -> dict:
    """Memory bandwidth by the triad: arrays of at least 64 MiB, and 4 × L3 where it is reported (at most
    256 MiB), so that they do not fit in the cache; the fastest of up to 10 calls within the budget.
    Returns {"n" (fp32 elements per array), "bytes_s" (12 bytes per element), "times_s"}."""
    n = max(2**24, min(l3_bytes(), 2**26))
    stats = time_it(triad_fn(n), warmup=2, repeats=10, budget_s=budget_s)  # the arrays are freed with the fn
    return {"n": n, "bytes_s": 12 * n / stats["min_s"], "times_s": stats["times_s"]}


def matmul_peak(dtype=torch.float32, **kw) -> float:
    """FLOP/s of the largest n×n×n matmul in `dtype` that fits the budget: the practical peak to
    measure MFU against (matmul_probe's flops_s)."""
    return matmul_probe(dtype, **kw)["flops_s"]


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86's AVX-512 BF16 and AMX, Arm's BF16 extension


# A bf16 matmul this many times slower than fp32's is a software fallback. On this book's Xeon (512², on a busy
# machine) oneDNN capped at AVX2, with no bf16 instructions to use, did bf16 at under 1 GFLOPS, 18× or more below
# fp32; capped at AVX512_CORE_BF16 (bf16 instructions, no AMX) it was within 2× of fp32.
SOFTWARE_BF16 = 5


def timing_groups(names, fp32_flops_s: float, bf16_flops_s: float) -> list:
    """The groups in which chapter 2 times its configurations: all of them interleaved in one time_steps, unless
    bf16 is a software fallback (its matmul SOFTWARE_BF16 times slower than fp32's or more). Then the fp32 ones
    go first and the bf16 ones get the budget left, or two bf16 steps of seconds would take the whole budget."""
    if bf16_flops_s * SOFTWARE_BF16 > fp32_flops_s:
        return [list(names)]
    return [[n for n in names if "fp32" in n], [n for n in names if "bf16" in n]]


def has_bf16_instructions(flags: set | None = None) -> bool:
    """Whether the CPU has bf16 matrix instructions at all: without them a bf16 matmul is a slow
    software fallback (10-25x fp32 on an AVX2 CPU), whatever one timing says."""
    return bool(set(BF16_FLAGS) & (cpu_flags() if flags is None else flags))


# oneDNN's instruction-set caps (ONEDNN_MAX_CPU_ISA) at or above which it may use bf16 dot-product instructions
ONEDNN_BF16_ISAS = ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16",
                    "AVX10_1_512", "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "ALL", "DEFAULT")


def bf16_instructions_usable(flags: set | None = None, env: dict | None = None) -> bool:
    """Whether a bf16 matmul here can run on bf16 instructions: the CPU has them and no ONEDNN_MAX_CPU_ISA cap
    (bookbuild.portability's emulation of an AVX2 CPU) keeps oneDNN below them. False means a software
    fallback; True does not mean faster than fp32 (an Intel Xeon with avx512_bf16 but no AMX measured bf16
    at half of fp32's speed: oneDNN's bf16 kernel against MKL's fp32 one)."""
    cap = (os.environ if env is None else env).get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return has_bf16_instructions(flags) and cap in ONEDNN_BF16_ISAS


CHECKS = []  # every check() of this process, in order: what print_record reports as margins


def margin(value: float, op: str, bound: float) -> float:
    """How far a measured value is inside its bound, as a ratio (>1 holds, <1 fails): bound/value for
    '<', value/bound for '>'. Where a side is not positive the ratio says nothing; then the difference
    (positive holds) is reported instead, and this returns it."""
    if op not in ("<", ">"):
        raise ValueError(f"op must be '<' or '>', not {op!r}")
    small, large = (value, bound) if op == "<" else (bound, value)
    return large / small if small > 0 and large > 0 else large - small


def check(name: str, value: float, op: str, bound: float) -> None:
    """Assert that a measured value is on the right side of its bound ('<' or '>'), and record the
    margin (CHECKS), so that the chapter's record (print_record) shows how close each claim came on
    this machine. A failure says the value, the bound and the margin in one sentence. Returns nothing,
    so that a check as a cell's last line prints nothing."""
    value, bound = float(value), float(bound)  # numpy scalars (a fit's result) would not go into the JSON line
    m = margin(value, op, bound)
    holds = value < bound if op == "<" else value > bound
    ratio = value > 0 and bound > 0
    CHECKS.append({"name": name, "value": value, "op": op, "bound": bound, "margin": m, "ratio": ratio})
    if os.environ.get("BOOK_MARGINS_FILE"):  # python -m bookbuild.portability collects them here
        with open(os.environ["BOOK_MARGINS_FILE"], "a", encoding="utf-8") as f:
            f.write(json.dumps(CHECKS[-1]) + "\n")
    assert holds, f"{name}: measured {value:.4g}, which is not {op} {bound:.4g} (margin {_margin_text(m, ratio)})"


def _margin_text(m: float, ratio: bool) -> str:
    return f"×{m:.2f}" if ratio else f"{m:+.3g}"


def margins_text(most: int = 3) -> str:
    """The tightest recorded margins, tightest first: 'name ×1.26 (1.07 < 1.35); ...'. Ratios are
    ranked by how far above 1 they are; differences come after them."""
    ranked = sorted(CHECKS, key=lambda c: (not c["ratio"], c["margin"]))[:most]
    return "; ".join(f"{c['name']} {_margin_text(c['margin'], c['ratio'])} "
                     f"({c['value']:.3g} {c['op']} {c['bound']:.3g})" for c in ranked)


def print_record() -> None:
    for k, v in experiment_record().items():
        print(f"{k:>13}: {v}")
    if CHECKS:  # the chapter's asserts on measured values, the tightest first
        print(f"{'margins':>13}: {margins_text()}")


class MeasuredText:
    """What glue_measured glues: a string whose stored record (text/plain) is its repr in parentheses,
    `('3.2 ms')`. myst-nb's {glue:text} reads text/plain with ast.literal_eval, so the page shows 3.2 ms
    as for any glued string, while tests/nbval_sanitize.cfg's first rule can mask this form alone: a
    string glued with plain glue() is stored as `'9.44'` and compared digit for digit."""

    def __init__(self, text: str):
        self.text = text

    def __repr__(self) -> str:
        return f"({self.text!r})"


def glue_measured(name: str, value, fmt: str = "") -> None:
    """Glue a machine-dependent value, formatted with `fmt`, as text that nbval does not compare
    (MeasuredText). A value fixed by formula, on every machine the same, is glued with myst_nb.glue
    (a number, or a string) and compared exactly."""
    from myst_nb import glue
    glue(name, MeasuredText(format(value, fmt)), display=False)


def glue_values(prefix: str, values: dict | None = None, **named) -> None:
    """Glue values fixed by formula, the same on every machine, each under prefix + its name (a dict's keys,
    or keyword names): nbval compares them exactly. A measured value goes through glue_measured instead."""
    from myst_nb import glue
    for name, value in {**(values or {}), **named}.items():
        glue(f"{prefix}{name}", value, display=False)


def show_table(header: list, rows: list, align: str) -> None:
    """Display a Markdown table in a notebook; align: one letter per column, l or r."""
    from IPython.display import Markdown, display
    rule = [":---" if a == "l" else "---:" for a in align]
    display(Markdown("\n".join("| " + " | ".join(map(str, r)) + " |" for r in [header, rule, *rows])))


# ---- timing a training step ----


SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def sci(x: float, digits: int = 1) -> str:
    """7.45e-08 -> '7.5 × 10⁻⁸': scientific notation for Chinese prose, where Python's e-notation reads as code."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa} × 10" + str(int(exponent)).translate(SUPERSCRIPT)


def training_step_fn(model, opt, x, y, autocast_dtype=None, accum: int = 1):
    """A no-argument function that runs one optimizer step of `model` on the batch (x, y).

    autocast_dtype: None for plain fp32, or torch.bfloat16 for mixed precision (the weights, the
    gradients and the optimizer stay fp32). accum: split the batch into `accum` micro-batches,
    divide each loss by `accum` and let backward() sum the gradients (gradient accumulation).
    `model` may be a torch.compile'd module. Returns the mean loss of the micro-batches (a tensor).
    """
    if x.size(0) % accum:
        raise ValueError(f"batch {x.size(0)} is not divisible by accum={accum}")
    micro_batches = list(zip(x.chunk(accum), y.chunk(accum)))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = accumulate_gradients(model, micro_batches, autocast_dtype=autocast_dtype)
        opt.step()
        return loss
    return step


class _quiet_fd2:
    """Silence C++-level writes to stderr (the profiler's start/stop lines) for a block."""

    def __enter__(self):
        import sys
        sys.stderr.flush()
        self._saved = os.dup(2)
        self._null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(self._null, 2)

    def __exit__(self, *exc):
        os.dup2(self._saved, 2)
        os.close(self._saved)
        os.close(self._null)


def profile_step(fn, steps: int = 1, profile_memory: bool = False):
    """Run fn() `steps` times under torch.profiler (CPU) and return the profiler object."""
    from torch.profiler import ProfilerActivity, profile
    with _quiet_fd2():
        with profile(activities=[ProfilerActivity.CPU], profile_memory=profile_memory) as prof:
            for _ in range(steps):
                fn()
    return prof


# A profiled op goes to the first bucket one of whose substrings occurs in its name, or else in the
# name of the nearest op that called it; an op no bucket claims is elementwise & other.
BUCKETS = (
    ("optimizer", ("Optimizer.", "adamw", "zero_grad")),
    ("softmax/CE over vocab", ("log_softmax", "LogSoftmax", "nll_loss", "NllLoss", "cross_entropy",
                               "VocabCrossEntropy")),
    ("attention", ("scaled_dot_product", "Sdpa", "ScaledDotProduct")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "MmBackward", "BmmBackward", "aten::linear")),
)
OTHER_BUCKET = "elementwise & other"
BUCKET_NAMES = tuple(name for name, _ in BUCKETS) + (OTHER_BUCKET,)


def bucket_of(evt) -> str:
    """The bucket of a profiler event: its own name or its callers' (e.g. the fill_ that zeroes
    a gradient inside cross-entropy's backward counts as cross-entropy)."""
    while evt is not None:
        for bucket, keys in BUCKETS:
            if any(k in evt.name for k in keys):
                return bucket
        evt = evt.cpu_parent
    return OTHER_BUCKET


def bucket_shares(prof) -> dict:
    """{bucket: its share of the profiled CPU time} for a torch.profiler run (e.g. profile_step's),
    from each op's self time; the shares sum to 1. Buckets no op fell into are left out."""
    self_us = {}
    for evt in prof.events():
        bucket = bucket_of(evt)
        self_us[bucket] = self_us.get(bucket, 0.0) + evt.self_cpu_time_total
    total = sum(self_us.values())
    return {k: v / total for k, v in self_us.items()}


class Traffic(TorchDispatchMode):
    """FLOPs and bytes of every aten op run under it, summed by profiler bucket (chapter 3).

    Bytes = the tensors an op reads plus those it writes (new outputs and in-place arguments); a view
    moves nothing and counts nothing. A matmul's FLOPs are the FLOP counter's formula, any other op
    counts 1 FLOP per element written. The buckets follow the profiler's: matmul; whatever runs inside
    model._VocabCrossEntropy; a forward op on a (B, H, T, T) tensor is attention (its backward falls
    into elementwise, as in the profile); everything while `in_optimizer` is set is the optimizer."""

    def __init__(self, seq_len: int):
        import model
        super().__init__()
        self.seq_len, self.in_optimizer, self.flops, self.bytes = seq_len, False, {}, {}
        self.vocab_code = {model._VocabCrossEntropy.forward.__code__, model._VocabCrossEntropy.backward.__code__}

    def bucket(self, func, tensors) -> str:
        if self.in_optimizer:
            return "optimizer"
        if func._overloadpacket in flop_registry:
            return "matmul"
        frame = sys._getframe(2)  # the caller of __torch_dispatch__
        while frame is not None:  # called from _VocabCrossEntropy's Python code?
            if frame.f_code in self.vocab_code:
                return "softmax/CE over vocab"
            frame = frame.f_back
        in_backward = torch._C._current_autograd_node() is not None
        if not in_backward and any(t.dim() == 4 and t.shape[-2:] == (self.seq_len,) * 2 for t in tensors):
            return "attention"
        return OTHER_BUCKET

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        returns = func._schema.returns
        if returns and all(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            return out  # a view
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        written = [t for a, s in zip(args, func._schema.arguments)  # in-place arguments: written back
                   if s.alias_info is not None and s.alias_info.is_write
                   for t in tree_flatten(a)[0] if isinstance(t, torch.Tensor)]
        new_outs = [t for t in outs if not any(t is i for i in ins)]
        k = self.bucket(func, ins + outs)
        if k == "matmul":
            flops = flop_registry[func._overloadpacket](*args, **kwargs, out_val=out)
        else:
            flops = sum(t.numel() for t in new_outs + written)
        self.flops[k] = self.flops.get(k, 0) + flops
        self.bytes[k] = self.bytes.get(k, 0) + sum(t.nbytes for t in ins + new_outs + written)
        return out


# ---- how long a chapter runs ----


RUN_TIMES = Path(__file__).resolve().parent.parent / "chapters" / "run_times.json"  # bookbuild.refresh writes it


def calibration_step_s(repeats: int = 5) -> float:
    """The median of `repeats` fp32 training steps of the default model on 16 × 128 random tokens, after
    one warm-up: this machine's speed now, the yardstick by which a chapter's stored run time is scaled.
    The median, not the fastest: a chapter that runs beside other work is slowed as this is."""
    from model import GPT, GPTConfig
    from train import configure_optimizer

    torch.manual_seed(0)
    cfg = GPTConfig()
    model = GPT(cfg)
    x = torch.randint(cfg.vocab_size, (16, cfg.seq_len))
    step = training_step_fn(model, configure_optimizer(model, lr=1e-3, fused=True), x, torch.roll(x, -1, 1))
    return time_steps({"step": step}, warmup=1, repeats=repeats)["step"]["median_s"]


def about(seconds: float) -> str:
    """A rough duration in Chinese: '约 40 秒', '约 3 分钟'."""
    if seconds < 95:
        return f"约 {max(10, round(seconds, -1)):.0f} 秒"
    return f"约 {seconds / 60:.0f} 分钟"


def estimate_run_time(chapter: str) -> None:
    """Glue `chN_run_estimate` (N: the chapter's number) with how long the chapter should run here: the
    reference run (RUN_TIMES, the refresh that stored the .ipynb's outputs) scaled by how much slower or
    faster a training step is on this machine now (calibration_step_s, about a second). A rough estimate:
    the probes that stop at a time budget do not scale with the machine."""
    stored = json.loads(RUN_TIMES.read_text(encoding="utf-8")).get(chapter) if RUN_TIMES.is_file() else None
    here = calibration_step_s()
    number = int(chapter.split("_")[0])
    if stored is None:
        glue_measured(f"ch{number}_run_estimate",
                      "还没有存下的运行可以参照（运行 python -m bookbuild.refresh 之后才有）")
        print(f"calibration: one training step takes {here * 1e3:.0f} ms here; no stored run of {chapter} to scale")
        return
    ratio = here / stored["step_s"]
    estimate = stored["seconds"] * ratio
    # a forecast only: the time of the run whose outputs a page shows is stated once, by that run's own
    # record (bookbuild/provenance.py's sentence at the top of the built page), not here as well
    glue_measured(f"ch{number}_run_estimate",
                  f"预计{about(estimate)}（这台机器此刻训练一步的时间是仓库里参考运行那台机器的 {ratio:.2f} 倍，"
                  f"参考运行的用时按这个比例换算）")
    print(f"calibration: one training step takes {here * 1e3:.0f} ms here, {stored['step_s'] * 1e3:.0f} ms on "
          f"the machine of the reference run; estimated run time here: {estimate:.0f} s")


PHASE = "phase:"  # record_function("phase:forward") etc. marks a phase memory_timeline reports


def memory_timeline(fn) -> dict:
    """The live bytes fn() holds beyond what existed before it, after every allocation and free, in
    time order; and the phases fn marked with torch.profiler.record_function("phase:NAME").

    torch.profiler with profile_memory=True records every allocation and free of torch's CPU
    allocator with its size and time; their running sum is the live bytes at every instant. It counts
    tensors (activations, gradients, optimizer state, temporaries), not the Python interpreter or the
    torch library itself. Returns t_ms and live (equal lengths), phases [(name, start_ms, end_ms)],
    peak (bytes) and peak_ms, all times from the first event.
    """
    prof = profile_step(fn, profile_memory=True)
    events = list(prof.profiler.kineto_results.events())
    mem = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    marks = [e for e in events if e.name().startswith(PHASE)]
    t0 = min([e.start_ns() for e in mem + marks], default=0)
    t_ms, live, total, peak, peak_ms = [], [], 0, 0, 0.0
    for e in mem:
        total += e.nbytes()
        t_ms.append((e.start_ns() - t0) / 1e6)
        live.append(total)
        if total > peak:
            peak, peak_ms = total, t_ms[-1]
    phases = sorted((e.name().removeprefix(PHASE), (e.start_ns() - t0) / 1e6,
                     (e.start_ns() + e.duration_ns() - t0) / 1e6) for e in marks)
    return dict(t_ms=t_ms, live=live, phases=sorted(phases, key=lambda p: p[1]), peak=peak, peak_ms=peak_ms)


def peak_memory(fn) -> int:
    """Bytes: the most memory fn() holds at once beyond what existed before it, measured (the maximum of
    memory_timeline's live bytes)."""
    return memory_timeline(fn)["peak"]
