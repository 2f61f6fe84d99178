"""The checkers: each holds one implementation of an exercise to the book's own functions and returns
None when it agrees, or one sentence saying what differs (which parameter, by how much, at which step,
or which byte count).

verdict(name, path) checks the file at `path`; exercises/test_yours.py calls it on the reader's
files, tests/test_exercises.py on the book's solutions (exercises/solutions/), the second correct
answers written differently (exercises/solutions/alt/) and the wrong answers (exercises/wrong/).
Exercises that need several processes run in _worker.py under torch.distributed.run (gloo), started
by script_support.run_script, the book's launcher; their checks live in _worker.py.
"""
import importlib.util
import json
import os
import random
import re
import subprocess
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# exercise -> processes it runs on (0: in the test's own process). The ring needs 3: with 2, sending
# the whole tensor to the other process costs the same bytes as a ring, so the count would prove nothing.
EXERCISES = {"ch2_flops": 0, "ch4_loss_scaler": 0, "ch5_accumulation": 0, "ch6_ddp": 2,
             "ch7_ring_allreduce": 3, "ch7_zero1": 2, "ch7_fsdp": 2, "ch12_memory_peak": 0}
ANSWERS_ENV = "EXERCISES_ANSWERS"  # a folder under exercises/ to check instead of the reader's files


def reader_file(name: str) -> Path:
    """The file `pytest exercises` checks: exercises/NAME.py, or exercises/$EXERCISES_ANSWERS/NAME.py."""
    folder = os.environ.get(ANSWERS_ENV)
    return (HERE / folder if folder else HERE) / f"{name}.py"


def not_written(path: Path) -> str:
    path = Path(path).resolve()
    return f"not written yet: edit {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"


def load(path: Path):
    """Import the file at `path` as a fresh module (each answer file is its own module)."""
    path = Path(path).resolve()
    parts = path.relative_to(HERE).with_suffix("").parts if path.is_relative_to(HERE) else (path.stem,)
    module_name = "answer_" + "_".join(parts)
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def raised(e: BaseException) -> str:
    return f"your code raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")


def verdict(name: str, path: Path, timeout_s: float = 90) -> str | None:
    """None if the answer at `path` is right, else one sentence."""
    if name not in EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; choose one of {', '.join(EXERCISES)}")
    return verdicts(name, [path], timeout_s)[0]


def verdicts(name: str, paths: list, timeout_s: float = 90) -> list:
    """verdict() for several answers to one exercise; a multi-process exercise starts its processes once.
    A launch that hangs or dies gives every answer the same sentence (the processes check them in turn,
    so the first one that hangs takes the others with it; the reader checks one file)."""
    nproc = EXERCISES[name]
    if nproc:
        from script_support import run_script
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "verdicts.json"
            try:
                run_script(HERE / "_worker.py", [name, out, *map(str, paths)], nproc=nproc, timeout_s=timeout_s)
            except subprocess.TimeoutExpired:
                return [f"the {nproc} processes did not finish in {timeout_s:.0f} s: does every recv or collective "
                        "have a matching send or call on the other processes?"] * len(paths)
            except RuntimeError as e:  # a process died: the first error a rank printed says why
                found = re.search(r"^\[rank\d+\]: (\w+(?:Error|Exception)\b.*)$", str(e), re.M)
                why = found.group(1).strip() if found else "see the processes' output"
                return [f"a process exited with an error ({why}): does every recv or collective have a "
                        "matching send or call on the other processes?"] * len(paths)
            return json.loads(out.read_text(encoding="utf-8"))
    out = []
    for path in paths:
        try:
            out.append(CHECKS[name](load(path)))
        except NotImplementedError:
            out.append(not_written(path))
        except Exception as e:  # the reader's bug: say what it raised, in one line
            out.append(raised(e))
    return out


# ---- what the checks share: a tiny GPT of the book and batches of its corpus ----

def tiny_config(vocab_size: int = 8192):
    from model import GPTConfig
    return GPTConfig(vocab_size=vocab_size, d_model=32, n_layer=2, n_head=2, seq_len=16)


def tiny_model(seed: int = 0):
    from model import GPT
    torch.manual_seed(seed)
    return GPT(tiny_config())


def batches(n: int, batch_size: int, seed: int = 30):
    """n batches (x, y) of the book's corpus, the same every time (data.fixed_batches)."""
    from data import fixed_batches, load_tokens
    return fixed_batches(load_tokens().train, n, batch_size, tiny_config().seq_len, seed=seed)


def grad_difference(model, ref, what: str, rel: float = 1e-4) -> str | None:
    """The first parameter whose gradient differs from ref's beyond rel × its largest |value|."""
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        if p.grad is None:
            return f"the gradient of {name} is None (no backward reached it)"
        d = (p.grad - q.grad).abs().max().item()
        if not d <= rel * q.grad.abs().max().item() + 1e-12:
            ratio = p.grad.norm().item() / q.grad.norm().item()
            return (f"the gradient of {name} differs from {what} by up to {d:.3g}; "
                    f"yours is {ratio:.3g}× its size")
    return None


def param_difference(model, ref, what: str, atol: float = 1e-6) -> str | None:
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        d = (p.detach() - q.detach()).abs().max().item()
        if not d <= atol:
            return f"parameter {name} differs from {what} by up to {d:.3g}"
    return None


# ---- chapter 2: FLOPs per token ----

FLOP_SHAPES = [dict(vocab_size=512, d_model=64, n_layer=3, n_head=4, seq_len=32),
               dict(vocab_size=8192, d_model=128, n_layer=4, n_head=4, seq_len=128),
               dict(vocab_size=1000, d_model=96, n_layer=5, n_head=6, seq_len=64)]


def check_ch2_flops(answer) -> str | None:
    from measure import flops_per_token
    from model import GPT, GPTConfig
    from shapes import matrix_param_count
    for shape in FLOP_SHAPES:
        cfg = GPTConfig(**shape)
        n = GPT(cfg).num_params()
        book, yours = flops_per_token(cfg, n), answer.flops_per_token(cfg)
        if yours != book:
            # the counter's own parts: what no parameter counts, and the FLOPs of one parameter
            attention, per_param = flops_per_token(cfg, 0), flops_per_token(cfg, 1) - flops_per_token(cfg, 0)
            gains = n - matrix_param_count(cfg.d_model, cfg.n_layer, cfg.vocab_size)
            why = {attention: "; attention's QKᵀ and PV, which no parameter counts, are missing",
                   book * 2 // 3: "; only the forward pass is counted (backward costs twice as much)",
                   -per_param * cfg.vocab_size * cfg.d_model: "; the tied embedding is counted twice",
                   per_param * gains: "; the RMSNorm gains are missing"}.get(book - yours, "")
            return (f"for {shape}: yours is {yours:,} FLOPs per token, measure.flops_per_token's is {book:,} "
                    f"({yours - book:+,.0f}{why})")
    return None


# ---- chapter 4: a loss scaler ----

def check_ch4_loss_scaler(answer, steps: int = 12) -> str | None:
    (x, y), = batches(1, 4)
    model, ref = tiny_model(), tiny_model()
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    # 2^124 times the loss overflows fp32's 3.4e38 in backward: real overflows, then halving and growth
    init, interval = 2.0 ** 124, 2
    scaler = answer.LossScaler(init_scale=init, growth_interval=interval)
    ref_scaler = torch.amp.GradScaler("cpu", init_scale=init, growth_interval=interval)
    skipped = grown = 0
    for step in range(steps):
        took = []
        for m, o, s in ((ref, ref_opt, ref_scaler), (model, opt, scaler)):
            o.zero_grad(set_to_none=True)
            _, loss = m(x, y)
            s.scale(loss).backward()
            before = [p.detach().clone() for p in m.parameters()]
            s.step(o)
            took.append(any(not torch.equal(b, p) for b, p in zip(before, m.parameters())))
            old = s.get_scale()
            s.update()
            if s is ref_scaler:
                skipped += not took[0]
                grown += s.get_scale() > old
        if took[0] != took[1]:
            return (f"step {step}: torch.amp.GradScaler {'took' if took[0] else 'skipped'} the optimizer step "
                    f"and yours {'took' if took[1] else 'skipped'} it"
                    + ("" if took[0] else " (a gradient overflowed)"))
        if scaler.get_scale() != ref_scaler.get_scale():
            return (f"step {step}: after update() your scale is {scaler.get_scale():g}, "
                    f"torch.amp.GradScaler's is {ref_scaler.get_scale():g}")
        diff = param_difference(model, ref, f"torch.amp.GradScaler's run at step {step}")
        if diff:
            return diff
    assert skipped >= 2 and grown >= 1, f"the check's run must overflow and grow (skipped {skipped}, grew {grown})"
    return None


# ---- chapter 5: gradient accumulation ----

def check_ch4_accumulation(answer, k: int = 4) -> str | None:
    from script_support import accumulate_gradients
    (x, y), = batches(1, 8)
    model, ref = tiny_model(), tiny_model()
    micro = list(zip(x.chunk(k), y.chunk(k)))
    loss = answer.accumulate(model, micro)
    ref_loss = accumulate_gradients(ref, [(x, y)])  # the whole batch at once
    diff = grad_difference(model, ref, f"the whole batch's (k={k} micro-batches)")
    if diff:
        return diff
    if loss is None:
        return f"accumulate returned None; return the whole batch's mean loss ({ref_loss.item():.6g})"
    if abs(float(loss) - ref_loss.item()) > 1e-5:
        return f"your returned loss is {float(loss):.6g}; the whole batch's mean loss is {ref_loss.item():.6g}"
    return None


# ---- chapter 12: the memory ledger's peak ----

def memory_shapes(seed: int = 30, n: int = 3):
    """Shapes the test picks: the same draw every time, none a chapter's round numbers."""
    from memory import Shape
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        n_head = rng.choice([4, 8, 12, 16])
        out.append(Shape(d_model=n_head * rng.choice([32, 64, 128]), n_layer=rng.randint(2, 40), n_head=n_head,
                         seq_len=rng.choice([256, 1024, 2048, 4096]), micro_batch=rng.randint(1, 16),
                         vocab_size=rng.choice([8192, 32000, 50257])))
    return out


def check_ch11_memory_peak(answer) -> str | None:
    from memory import step_bytes
    from shapes import param_count
    for shape in memory_shapes():
        parts = step_bytes(shape, param_count(shape.d_model, shape.n_layer, shape.vocab_size))
        book, yours = parts.pop("total"), answer.peak_bytes(shape)
        if yours != book:
            why = next((f"; {'missing' if yours < book else 'counted twice'}: the ledger's '{part}'"
                        for part, b in parts.items() if b and abs(yours - book) == b), "")
            return (f"for {shape}: your peak is {yours:,} bytes, memory.step_bytes's is {book:,.0f} "
                    f"({yours - book:+,.0f}{why})")
    return None


CHECKS = {"ch2_flops": check_ch2_flops, "ch4_loss_scaler": check_ch4_loss_scaler,
          "ch5_accumulation": check_ch4_accumulation, "ch12_memory_peak": check_ch11_memory_peak}
