"""The rehearsal: the commands code/budget.py prints, run as printed on this CPU with gloo, shrunk.

    python -m bookbuild.rehearse            # the whole matrix: every printed flag set and the pairwise set
    python -m bookbuild.rehearse --subset   # what the test command runs: every flag at least once
    python -m bookbuild.rehearse --list     # the runs and their checks, without running them

What is run. budget.plan() (in this process) for each named model (budget.MODELS) on COMMON_GPUS, on 1,
8 and 64 GPUs, with and without --checkpoint-activations; each `command     torchrun ...` line it prints
is parsed by torchrun's own parser and by train_gpu.py's build_parser(), so a flag the budget prints that
either does not take fails here. The command keeps every flag; only these change:
  - the model shape (--d-model, --n-layer, --n-head, --seq-len, --vocab-size: SHAPE, or SHAPE_FP16),
    --steps (STEPS), a token file written here (--data) and a temporary --out;
  - the processes: 1 GPU stays 1, one machine of 8 becomes --nproc-per-node 4, several machines become
    2 launches of 2 on 127.0.0.1 (c10d, --rdzv-conf join_timeout so a missing node fails in a minute);
  - the global batch: micro-batch × seq-len × processes × accumulation, the accumulation 2 where the
    plan's is above 1, else 1;
  - added: --device cpu; and for the pairwise runs --compile and --precision fp16, which a GPU takes by
    default (compile on CUDA; bf16, or fp16 on GPUs without it) and a CPU does not.
Plans whose shrunk command is the same run once; the table lists the plans each run stands for.

The pairwise set. Each option value the budget can print (every scheme of budget.SHARD_FLAGS, --grad-sync
last and every), with and without --checkpoint-activations, with and without --compile, fp32 and fp16
(bf16 where /proc/cpuinfo has avx512_bf16 or amx_bf16), on 1, 2 and 4 processes and on 2 nodes, with
accumulation 1 and 2: the product is too large, so covering() picks runs greedily until every pair of
option values that some valid run holds appears in one of them (the subset: every value once).

The checks. Every run: it reaches --steps with status 0 from every worker, and the line "state held by
process 0 ..." after its first step gives, part by part and in all, the ledger's bytes (shapes.run_
state_bytes of train_gpu's own planned_run) to the 0.01 MiB it prints. Some runs (the table's checks):
  stop    a second launch gets SIGTERM (torchrun forwards it) before its first step (after it, when
          compiled): every worker exits 75, run.json says 75, no model.pt, the newest checkpoint is
          complete (.metadata, one shard per process, its step before --steps);
  resume  that checkpoint resumed with --auto-resume, on the same processes and scheme (then model.pt
          equals the uninterrupted run's bitwise) or on others (within TOL; TOL_FP16 for fp16, TOL_BF16 for bf16);
  equal   the run's model.pt against the first run of its precision in the pairwise set, within the same.
Each worker's status is recorded by a sitecustomize put on PYTHONPATH, which wraps sys.exit: torchrun
reports no worker's status when it is itself signalled. A combination that fails says why, from the
error's last line. Output: a table (run, plan, flags, checks, result, seconds), printed and written to
_build/rehearsal.json and _build/rehearsal.md (after every run, so an interrupted one leaves a table).
A launch is killed after LAUNCH_TIMEOUT_S (REHEARSE_TIMEOUT_S changes it: on a loaded machine a first
compile can outlast it); --only runs some. Each run compiles into a torch.compile cache of its own, in its
folder (INDUCTOR_DIR), which its stop and resume launches share and which a killed launch removes: a launch
killed mid-compile can leave a truncated kernel (.so) behind, and no other launch loads it.
"""
import argparse
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from .book import REPO

sys.path.insert(0, str(REPO / "code"))
import budget  # noqa: E402
from fake_run import printed_commands  # noqa: E402  (the command lines budget.plan prints)

OUTPUT = REPO / "_build" / "rehearsal.json"
INDUCTOR_DIR = "inductor"  # each run's own torch.compile cache, in its folder: a killed launch's half-written
# kernel (a truncated .so) is never loaded by another run, nor by another rehearsal running at the same time
COMMON_GPUS = ("H100", "A100", "RTX4090")
PLAN_GPU_COUNTS = (1, 8, 64)
SHAPE = {"--d-model": 64, "--n-layer": 2, "--n-head": 2, "--seq-len": 32, "--vocab-size": 250}  # 250: uneven shards
SHAPE_FP16 = {**SHAPE, "--d-model": 32}  # fp16 matmuls are ~65x slower than fp32 on an AVX2 CPU
STEPS = 14  # the stop flag is polled at the first step, then every STOP_POLL_S (10 s) of wall time: a stop sent
# during the run is heard at step 1 in these short runs (30 of 30 in the full matrix), leaving 13 to resume
PAIRWISE_SEQUENCES = 8  # the pairwise runs' global batch, in sequences: every world and accumulation divides it
TOL = 1e-5  # tests/test_train_gpu.py's TOL, measured there above the summation-order noise
# fp16 runs: fp16's narrow exponent lets a tiny gradient round to 0 under one split of the batch and not
# under another, and a weight with no gradient before then moves by a whole AdamW step, lr·sign(g), or not at
# all. Measured through execute() (6 eager FSDP2 fp16 runs: 1, 2, 4 processes, 2 nodes, ZeRO-2/3, HSDP, accumulation
# 1 and 2; 3 compiled ones: 2, 4 processes, 2 nodes): most numbers within 1.3e-6, single ones up to 1.01e-5
# apart (compiled 9.99e-6), one update of step 0 (lr 1e-5); 4x that.
TOL_FP16 = 4e-5
# bf16 runs: bf16 keeps fp32's exponent but has an 8-bit mantissa, and a bf16 matmul's result depends on its
# rows (the micro-batch): runs of one group (group_of) with the same micro-batch end within 1.9e-9, with
# another micro-batch 2.2e-5 to 2.9e-5 apart, nearly every weight moved. Measured through execute() on an
# AMD EPYC (Zen 4, avx512_bf16): 22 runs, 1, 2, 4 processes, 2 nodes, DDP, ZeRO-2/3, HSDP, accumulation 1 and
# 2, with and without --checkpoint-activations, micro-batch 1 to 8 (9 eager FSDP2, 8 eager DDP, 3 compiled
# FSDP2, 2 compiled DDP); 64 pairs in one group, at most 2.91e-5 apart (2 nodes ZeRO-2 accumulation 2 against
# 2 processes HSDP), across groups 6.4e-5; 4x the most in one group.
TOL_BF16 = 1.2e-4
LAUNCH_TIMEOUT_S = 420  # a launch that takes longer is killed (REHEARSE_TIMEOUT_S changes it, for a loaded machine)
TIMEOUT_VAR = "REHEARSE_TIMEOUT_S"
JOIN_TIMEOUT_S = 60
STATUS_VAR = "REHEARSE_STATUS_DIR"
# each worker writes the status it exits with (torchrun does not report them when it is signalled)
SITECUSTOMIZE = f"""import os, sys
if os.environ.get("{STATUS_VAR}") and "RANK" in os.environ:
    _exit = sys.exit
    def _recorded(status=None):
        path = os.path.join(os.environ["{STATUS_VAR}"], "rank" + os.environ["RANK"])
        with open(path, "w") as f:
            f.write(str(0 if status is None else status))
        _exit(status)
    sys.exit = _recorded
"""
LAUNCHES = {"1": (1, 1), "2": (1, 2), "4": (1, 4), "2 nodes": (2, 1)}  # (launches, processes each)


def cpu_has_bf16() -> bool:
    """Whether this CPU has bf16 instructions (else a bf16 matmul is a slow software fallback)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return bool(re.search(r"\b(avx512_bf16|amx_bf16)\b", flags))


# ---- covering arrays: every pair (or every value) of the options in some run ----------------------------

def _tuples(combo: dict, strength: int) -> set:
    return set(itertools.combinations(sorted(combo.items(), key=lambda kv: kv[0]), strength))


def covering(factors: dict, valid=lambda c: True, strength: int = 2) -> list:
    """Rows (dicts factor -> value), picked greedily from the valid combinations in product order, until
    every `strength`-tuple of values that some valid combination holds appears in a row."""
    combos = [c for c in (dict(zip(factors, vals)) for vals in itertools.product(*factors.values())) if valid(c)]
    needed = set().union(*(_tuples(c, strength) for c in combos))
    rows = []
    while needed:
        best = max(combos, key=lambda c: len(_tuples(c, strength) & needed))  # the first of the best
        rows.append(best)
        needed -= _tuples(best, strength)
    return rows


def uncovered(factors: dict, rows: list, valid=lambda c: True, strength: int = 2) -> set:
    """The tuples of values that a valid combination holds and no row does (empty: the rows cover)."""
    combos = [c for c in (dict(zip(factors, vals)) for vals in itertools.product(*factors.values())) if valid(c)]
    return set().union(*(_tuples(c, strength) for c in combos)) - set().union(*(_tuples(r, strength) for r in rows))


def factors() -> dict:
    return {"launch": tuple(LAUNCHES), "scheme": tuple(budget.SHARD_FLAGS), "grad_sync": (None, "last", "every"),
            "checkpoint": (False, True), "compile": (False, True),
            "precision": ("fp32", "fp16", *(("bf16",) if cpu_has_bf16() else ())), "accum": (1, 2)}


def valid(c: dict) -> bool:
    """What the budget can print: a sharded scheme on more than one process (train_gpu.py trains one
    process's model plain), --grad-sync exactly where it prints it (sharded, accumulation above 1)."""
    world = LAUNCHES[c["launch"]][0] * LAUNCHES[c["launch"]][1]
    if c["scheme"] != "ddp" and world == 1:
        return False
    return (c["grad_sync"] is None) == (c["scheme"] == "ddp" or c["accum"] == 1)


# ---- the printed command: parsed by the launcher's and the script's own parsers, edited flag by flag ----

class Refused(Exception):
    """A printed command that torchrun's or train_gpu.py's parser refuses."""


def _parse(parser, argv: list):
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(argv)
    except SystemExit:
        lines = err.getvalue().strip().splitlines() or ["(no message)"]
        raise Refused(f"{parser.prog} refuses it: {lines[-1]}") from None


def script_parser():
    import train_gpu
    return train_gpu.build_parser()


@dataclass(frozen=True)
class Command:
    launcher: tuple  # torchrun's arguments
    script: str
    args: tuple  # the script's

    def argv(self) -> list:
        return [sys.executable, "-m", "torch.distributed.run", *self.launcher, self.script, *self.args]

    def text(self) -> str:
        return shlex.join(["torchrun", *self.launcher, self.script, *self.args])


def parse_command(line: str) -> Command:
    """A `torchrun ... code/train_gpu.py ...` line, checked by both parsers (Refused if either refuses)."""
    from torch.distributed.run import get_args_parser
    tokens = shlex.split(line)
    if not tokens or tokens[0] != "torchrun":
        raise Refused(f"not a torchrun command: {line[:80]}")
    ns = _parse(get_args_parser(), tokens[1:])
    script_args = list(ns.training_script_args)
    _parse(script_parser(), script_args)
    return Command(tuple(tokens[1:len(tokens) - len(script_args) - 1]), ns.training_script, tuple(script_args))


def _where(tokens: tuple, flag: str) -> list:
    return [i for i, t in enumerate(tokens) if t == flag or t.startswith(flag + "=")]


def value(tokens: tuple, flag: str):
    """The value of `flag` (its last occurrence), or None."""
    at = _where(tokens, flag)
    if not at:
        return None
    t = tokens[at[-1]]
    return t.split("=", 1)[1] if "=" in t else tokens[at[-1] + 1]


def without(tokens: tuple, flag: str, takes_value: bool = True) -> tuple:
    out, skip = [], False
    for t in tokens:
        if skip:
            skip = False
        elif t == flag:
            skip = takes_value
        elif not t.startswith(flag + "="):
            out.append(t)
    return tuple(out)


def with_value(tokens: tuple, flag: str, v) -> tuple:
    """`flag` set to v: in place where it is printed first (in the form printed; later ones dropped), else
    appended."""
    at = _where(tokens, flag)
    if not at:
        return (*tokens, flag, str(v))
    out, i = list(tokens), at[0]
    if "=" in out[i]:
        out[i], end = f"{flag}={v}", i + 1
    else:
        out[i + 1], end = str(v), i + 2
    return (*out[:end], *without(tuple(out[end:]), flag))


def with_switch(tokens: tuple, flag: str, on: bool = True) -> tuple:
    tokens = without(tokens, flag, takes_value=False)
    return (*tokens, flag) if on else tokens


def world_of(launcher: tuple) -> tuple:
    """(launches, processes each) of a torchrun argument list."""
    nodes = value(launcher, "--nnodes")
    return int(nodes.split(":")[-1]) if nodes else 1, int(value(launcher, "--nproc-per-node") or 1)


def with_scheme(args: tuple, scheme: str, grad_sync, checkpoint: bool) -> tuple:
    """The script's arguments under another of budget.SHARD_FLAGS's schemes, --grad-sync and checkpointing."""
    for f, v in (("--shard", True), ("--reshard-after-forward", False), ("--no-reshard-after-forward", False),
                 ("--grad-sync", True), ("--checkpoint-activations", False)):
        args = without(args, f, v)
    args = (*args, *budget.SHARD_FLAGS[scheme], *(("--checkpoint-activations",) if checkpoint else ()))
    return (*args, "--grad-sync", grad_sync) if grad_sync else args


def scheme_of(args: tuple) -> str:
    """The budget.SHARD_FLAGS scheme these arguments hold."""
    ns = _parse(script_parser(), list(args))
    flags = ["--shard", ns.shard]
    if ns.shard == "fsdp" and not ns.reshard_after_forward:
        flags.append("--no-reshard-after-forward")
    return next(s for s, f in budget.SHARD_FLAGS.items() if f == flags)


# ---- shrinking a printed command -----------------------------------------------------------------------

@dataclass
class Spec:
    """One rehearsal run: the printed command, how it is shrunk, which checks it carries."""
    name: str
    plans: list  # the budget argument lists that print this command ([] for the pairwise set)
    printed: Command  # as printed (the pairwise set: a printed command with other options)
    launches: int
    per_node: int
    accum: int
    micro: int
    options: dict = field(default_factory=dict)  # the pairwise set's option values
    extra: tuple = ()  # flags the CPU needs or the option adds (--compile, --precision fp16)
    checks: tuple = ("steps", "held")
    resume_as: "Spec | None" = None  # how the stopped run resumes (its launcher and script flags)
    group: str | None = None  # runs that must end equal within tol() (same data, batch, shape, precision)

    def resumes_as_is(self) -> bool:
        """Whether the stopped run resumes on the same processes, scheme and options (then bitwise)."""
        r = self.resume_as
        return r is not None and (r.launches, r.per_node, r.micro, r.accum, r.printed, r.extra) == (
            self.launches, self.per_node, self.micro, self.accum, self.printed, self.extra)

    @property
    def world(self) -> int:
        return self.launches * self.per_node

    def shape(self) -> dict:
        return SHAPE_FP16 if value(self.extra, "--precision") == "fp16" else SHAPE

    def tol(self) -> float:
        """How far its model.pt may end from another run's of its precision: TOL, TOL_FP16 for fp16,
        TOL_BF16 for bf16."""
        return {"fp16": TOL_FP16, "bf16": TOL_BF16}.get(value(self.extra, "--precision"), TOL)

    def command(self, out: Path, data: Path, port: int, resume: bool = False) -> Command:
        """The printed command with only the shape, steps, data, out, processes and batch changed."""
        launcher = with_value(self.printed.launcher, "--nproc-per-node", self.per_node)
        if self.launches > 1:
            launcher = with_value(launcher, "--nnodes", self.launches)
            launcher = with_value(launcher, "--rdzv-endpoint", f"127.0.0.1:{port}")
            launcher = with_value(launcher, "--rdzv-id", f"rehearse-{self.name}-{port}")
            conf = value(launcher, "--rdzv-conf")
            launcher = with_value(launcher, "--rdzv-conf",
                                  f"{conf},join_timeout={JOIN_TIMEOUT_S}" if conf else f"join_timeout={JOIN_TIMEOUT_S}")
        args = self.printed.args
        for flag, v in self.shape().items():
            args = with_value(args, flag, v)
        seq = self.shape()["--seq-len"]
        args = with_value(args, "--micro-batch", self.micro)
        args = with_value(args, "--global-batch-tokens", self.micro * seq * self.world * self.accum)
        args = with_value(args, "--steps", STEPS)
        args = with_value(with_value(with_value(args, "--out", out), "--data", data), "--device", "cpu")
        for flag in ("--compile", "--checkpoint-activations"):
            if flag in self.extra:
                args = with_switch(args, flag)
        if value(self.extra, "--precision"):
            args = with_value(args, "--precision", value(self.extra, "--precision"))
        if resume:
            args = with_switch(args, "--auto-resume")
        return Command(launcher, self.printed.script, args)

    def flags(self) -> str:
        """The options that tell runs apart, for the table."""
        ns = _parse(script_parser(), list(self.printed.args))
        parts = [f"{self.world} proc" if self.launches == 1 else f"{self.launches} nodes × {self.per_node}",
                 scheme_of(self.printed.args)]
        if self.accum > 1:
            parts.append(f"accum {self.accum}")
        if ns.shard == "fsdp" and value(self.printed.args, "--grad-sync"):
            parts.append(f"grad-sync {ns.grad_sync}")
        if ns.checkpoint_activations:
            parts.append("ckpt-act")
        parts += [x.lstrip("-") for x in self.extra if x in ("--compile",)]
        if value(self.extra, "--precision"):
            parts.append(value(self.extra, "--precision"))
        return " · ".join(parts)


def _accum_of(cmd: Command) -> int:
    launches, per_node = world_of(cmd.launcher)
    ns = _parse(script_parser(), list(cmd.args))
    return max(1, ns.global_batch_tokens // (ns.micro_batch * ns.seq_len * launches * per_node))


def printed_plans(models=None, gpus=COMMON_GPUS, counts=PLAN_GPU_COUNTS):
    """(budget arguments, Command, or None where it prints no command, or the Refused of a line that a
    parser refuses, with the line) for each named model on each of `gpus`, on each of `counts` GPUs, with
    and without --checkpoint-activations: the plans the budget prints (bookbuild/full_size.py runs them too)."""
    for model, gpu, n, ck in itertools.product(models or tuple(budget.MODELS), gpus, counts, (False, True)):
        argv = ["--model", model, "--gpu", gpu, "--gpus", str(n), *(["--checkpoint-activations"] if ck else [])]
        lines = printed_commands(argv)
        if not lines:
            yield argv, None
        for line in lines:
            try:
                yield argv, parse_command(line)
            except Refused as e:
                yield argv, (e, line)


def plan_specs(models=None, gpus=COMMON_GPUS, counts=PLAN_GPU_COUNTS) -> tuple:
    """(specs, plans without a command): one spec per distinct shrunk command the budget prints."""
    specs, none, seen = [], [], {}
    for argv, cmd in printed_plans(models, gpus, counts):
        if cmd is None:
            none.append(argv)
            continue
        if isinstance(cmd, tuple):  # refused by a parser
            e, line = cmd
            specs.append(Spec(f"p{len(specs) + 1}", [argv], Command((), line, ()), 1, 1, 1, 1,
                              checks=("parse",), group=str(e)))
            continue
        launches, per_node = world_of(cmd.launcher)
        shrunk = (1, 1) if launches * per_node == 1 else (1, 4) if launches == 1 else (2, 2)
        spec = Spec(f"p{len(specs) + 1}", [argv], cmd, *shrunk, 2 if _accum_of(cmd) > 1 else 1,
                    int(value(cmd.args, "--micro-batch")))
        key = _key(spec)
        if key in seen:
            seen[key].plans.append(argv)
        else:
            specs.append(spec)
            seen[key] = spec
    return specs, none


def _key(spec: Spec) -> tuple:
    """What tells two shrunk commands apart: the same key, the same run."""
    cmd = spec.command(Path("OUT"), Path("DATA"), 0)
    return without(without(cmd.launcher, "--rdzv-id"), "--rdzv-endpoint"), cmd.args


def plan_label(argv: list) -> str:
    a = dict(zip(argv[::2], argv[1::2]))
    return f"{a['--model']} {a['--gpu']}×{a['--gpus']}" + (" ckpt" if "--checkpoint-activations" in argv else "")


def base_commands() -> dict:
    """The printed commands the pairwise runs start from: one machine of 8 and two of 8 (124M, H100)."""
    one = parse_command(printed_commands(["--model", "124M", "--gpu", "H100", "--gpus", "8"])[0])
    two = parse_command(printed_commands(["--model", "124M", "--gpu", "H100", "--gpus", "16"])[0])
    return {1: one, 2: two}


def pairwise_specs(strength: int = 2) -> list:
    """The covering set as specs; checks assigned so that each is exercised across it (assign_checks)."""
    bases, specs = base_commands(), []
    for i, row in enumerate(covering(factors(), valid, strength)):
        launches, per_node = LAUNCHES[row["launch"]]
        base = bases[launches]
        args = with_scheme(base.args, row["scheme"], row["grad_sync"], row["checkpoint"])
        extra = (*(("--compile",) if row["compile"] else ()),
                 *(("--precision", row["precision"]) if row["precision"] != "fp32" else ()))
        micro = PAIRWISE_SEQUENCES // (launches * per_node * row["accum"])
        specs.append(Spec(f"{'s' if strength == 1 else 'w'}{i + 1}", [], replace(base, args=args), launches, per_node,
                          row["accum"], micro, options=row, extra=extra, group=group_of(row)))
    return assign_checks(specs)


def group_of(row: dict) -> str:
    """Runs that end equal within their tol(): fp32 whatever the scheme, processes, compile or checkpointing;
    16-bit only under the same casts (autocast over fp32 weights for DDP and one process, FSDP2's
    param_dtype for the sharded schemes) and the same compilation (inductor computes in fp32 between kernels)."""
    if row["precision"] == "fp32":
        return "fp32"
    sharded = row["scheme"] != "ddp" and LAUNCHES[row["launch"]] != (1, 1)
    return f"{row['precision']}, {'FSDP2 param_dtype' if sharded else 'autocast'}{', compiled' * row['compile']}"


def resumed_elsewhere(spec: Spec, other: Spec) -> Spec:
    """spec's run resumed under other's processes, scheme, grad-sync, compile and checkpointing, at spec's
    precision and global batch (the micro-batch follows)."""
    o = other.options
    extra = (*(("--compile",) if o["compile"] else ()), *(x for x in spec.extra if x != "--compile"))
    micro = PAIRWISE_SEQUENCES // (other.world * spec.accum)
    grad_sync = None if o["scheme"] == "ddp" or spec.accum == 1 else (o["grad_sync"] or "last")
    args = with_scheme(other.printed.args, o["scheme"], grad_sync, o["checkpoint"])
    return replace(other, name=f"{spec.name}→{other.name}", printed=replace(other.printed, args=args),
                   accum=spec.accum, micro=micro, extra=extra, options={**o, "grad_sync": grad_sync})


def assign_checks(specs: list) -> list:
    """Every run: steps and held bytes, and equal to the first of its precision. The runs without
    --compile but the first are also stopped, alternately resumed as they are (bitwise) and as the next
    run with other processes or scheme is set up (which may compile it): compiling is the costly part."""
    out, alternate = [], itertools.cycle((True, False))
    for i, s in enumerate(specs):
        checks = ("steps", "held", *(("equal",) if any(t.group == s.group for t in specs[:i]) else ()))
        resume_as = None
        if i and "--compile" not in s.extra:
            others = [t for t in specs[i + 1:] + specs[:i] if (t.world, t.options["scheme"]) !=
                      (s.world, s.options["scheme"]) and t.world * s.accum <= PAIRWISE_SEQUENCES]
            resume_as = s if next(alternate) or not others else resumed_elsewhere(s, others[0])
            checks = (*checks, "stop", "resume")
        out.append(replace(s, checks=checks, resume_as=resume_as))
    return out


def on_fewer(spec: Spec) -> Spec | None:
    """spec on half its processes per launch (1 process: on 2), the global batch kept: the micro-batch
    or, where it cannot, the accumulation follows. None where the batch does not split so."""
    per_node = spec.per_node // 2 if spec.world > 1 else 2
    sequences, world = spec.micro * spec.world * spec.accum, spec.launches * per_node
    if sequences % (world * spec.accum) == 0:
        return replace(spec, name=f"{spec.name}→½", per_node=per_node, micro=sequences // (world * spec.accum))
    if sequences % (world * spec.micro) == 0:
        return replace(spec, name=f"{spec.name}→½", per_node=per_node, accum=sequences // (world * spec.micro))
    return None


def plan_checks(specs: list) -> list:
    """The printed flag sets: every third stopped and resumed on the same processes (bitwise), every
    third from the second one on others (on_fewer)."""
    out = []
    for i, s in enumerate(specs):
        other = on_fewer(s) if i % 3 == 2 and s.checks != ("parse",) else None
        if i % 3 == 1 and s.checks != ("parse",):
            s = replace(s, checks=(*s.checks, "stop", "resume"), resume_as=s)
        elif other is not None:
            s = replace(s, checks=(*s.checks, "stop", "resume"), resume_as=other)
        out.append(s)
    return out


# ---- running a command -------------------------------------------------------------------------------

@dataclass
class Outcome:
    stdout: str
    stderr: str
    statuses: dict  # rank -> the status its worker exited with (as the sitecustomize recorded it)
    seconds: float
    timed_out: bool
    stopped: bool  # SIGTERM was sent
    cpu_s: float = 0.0  # CPU seconds of the launchers and their workers (on a shared machine: the cost)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children_cpu() -> float:
    """CPU seconds of every finished child and of what they waited for: torchrun waits for its workers."""
    import resource
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _kill_tree(pid: int) -> None:
    import psutil
    with contextlib.suppress(psutil.NoSuchProcess):
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()


def launch(cmd: Command, launches: int, work: Path, stop_on: str | None = None,
           timeout_s: float | None = None) -> Outcome:
    """Run cmd as `launches` torchrun launches at once (the nodes, on this machine); with stop_on, SIGTERM
    every launcher when a line of the output starts with it."""
    status_dir = Path(tempfile.mkdtemp(prefix="status-", dir=work))
    hook = work / "hook"
    hook.mkdir(exist_ok=True)
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONHASHSEED": "0", STATUS_VAR: str(status_dir),
           "PYTHONPATH": os.pathsep.join([str(hook), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(work / INDUCTOR_DIR)  # the run's own (INDUCTOR_DIR), whatever the caller's
    timeout_s = timeout_s or float(os.environ.get(TIMEOUT_VAR, LAUNCH_TIMEOUT_S))
    t0, cpu0 = time.perf_counter(), _children_cpu()
    procs = [subprocess.Popen(cmd.argv(), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, start_new_session=True) for _ in range(launches)]
    out, err, stopped = [], [], threading.Event()

    def read(stream, sink, watch):
        for line in stream:
            sink.append(line)
            if watch and stop_on and line.startswith(stop_on) and not stopped.is_set():
                stopped.set()
                for p in procs:
                    with contextlib.suppress(ProcessLookupError):
                        p.send_signal(signal.SIGTERM)
    threads = [threading.Thread(target=read, args=(p.stdout, out, True), daemon=True) for p in procs]
    threads += [threading.Thread(target=read, args=(p.stderr, err, False), daemon=True) for p in procs]
    for t in threads:
        t.start()
    timed_out = False
    try:
        for p in procs:
            p.wait(timeout=max(1, timeout_s - (time.perf_counter() - t0)))
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        for p in procs:
            if p.poll() is None:
                _kill_tree(p.pid)
                p.wait()
                shutil.rmtree(env["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)  # it may hold half a kernel
    for t in threads:
        t.join(timeout=10)
    statuses = {int(f.name[4:]): int(f.read_text()) for f in status_dir.glob("rank*") if f.read_text().isdigit()}
    return Outcome("".join(out), "".join(err), statuses, time.perf_counter() - t0, timed_out, stopped.is_set(),
                   _children_cpu() - cpu0)


def why(o: Outcome) -> str:
    """The error's last line: a one-sentence refusal, else the exception a worker ended with."""
    if o.timed_out:
        return f"no end within {os.environ.get(TIMEOUT_VAR, LAUNCH_TIMEOUT_S)} s (the launch was killed)"
    lines = [x.strip() for x in (o.stderr + o.stdout).splitlines() if x.strip()]
    said = [x for x in lines if x.startswith("error: ")]
    if said:
        return said[-1][:300]
    raised = [x for x in lines if re.match(r"^([a-z_]\w*\.)*[A-Z]\w*: \S", x) and "ChildFailedError" not in x]
    return (raised[-1] if raised else lines[-1] if lines else "no output")[:300]


# ---- the checks ----------------------------------------------------------------------------------------

HELD = re.compile(r"state held by process 0, counted from its local shards: weights ([\d,.]+) MiB, grads ([\d,.]+) "
                  r"MiB, optimizer ([\d,.]+) MiB \(ledger ([\d,.]+) MiB in all\)")


def ledger_parts(cmd: Command, launches: int) -> dict:
    """The ledger's weights, grads and optimizer state for process 0 of this run, in MiB as the script
    prints them, and their sum: train_gpu's planned_run, shapes.run_state_bytes."""
    import torch

    import train_gpu
    from shapes import param_count, run_state_bytes
    args = train_gpu.build_parser().parse_args(list(cmd.args))
    per_node = world_of(cmd.launcher)[1]
    world = launches * per_node
    saved = os.environ.get("LOCAL_WORLD_SIZE")
    os.environ["LOCAL_WORLD_SIZE"] = str(per_node)  # as torchrun sets it in each launch: HSDP's shard group
    try:
        accum = train_gpu.check_args(args, world)
        precision = train_gpu.resolve_precision(args.precision, torch.device("cpu"))
        run = train_gpu.planned_run(args, world, accum, precision)
    finally:
        if saved is None:
            os.environ.pop("LOCAL_WORLD_SIZE")
        else:
            os.environ["LOCAL_WORLD_SIZE"] = saved
    state = run_state_bytes(run, param_count(args.d_model, args.n_layer, args.vocab_size))
    parts = {k: state[k] / 2**20 for k in ("weights", "grads", "optimizer")}
    return {**{k: f"{v:,.2f}" for k, v in parts.items()}, "in all": f"{sum(parts.values()):,.2f}"}


def check_held(o: Outcome, cmd: Command, launches: int) -> str | None:
    """None if the held line equals the ledger part by part; else what differs."""
    m = HELD.search(o.stdout)
    if not m:
        return "no 'state held by process 0' line"
    printed = dict(zip(("weights", "grads", "optimizer", "in all"), m.groups()))
    expect = ledger_parts(cmd, launches)
    bad = [f"{k} {printed[k]} (ledger {expect[k]})" for k in expect if printed[k] != expect[k]]
    return f"held ≠ ledger: {', '.join(bad)}" if bad else None


def check_finished(o: Outcome, world: int, out: Path) -> str | None:
    """None if every worker exited 0 after --steps and model.pt is written; else the error."""
    if o.timed_out or sorted(o.statuses.values()) != [0] * world:
        return f"{why(o)} (worker statuses {dict(sorted(o.statuses.items()))})"
    if f"done: {STEPS} steps" not in o.stdout or not (out / "model.pt").is_file():
        return f"did not reach {STEPS} steps: {why(o)}"
    return None


def check_stopped(o: Outcome, world: int, out: Path) -> tuple:
    """(problem or None, the step it stopped at)."""
    from checkpoint import complete_checkpoints
    m = re.search(r"stopped by SIGTERM after step (\d+)", o.stdout)
    step = int(m.group(1)) if m else None
    problems = []
    if sorted(o.statuses.values()) != [75] * world:
        problems.append(f"worker statuses {dict(sorted(o.statuses.items()))}, not 75 from all {world}")
    if "forcefully exiting" in o.stderr:
        problems.append("torchrun killed a worker after --shutdown-timeout")
    with contextlib.suppress(OSError, ValueError):
        rec = json.loads((out / "run.json").read_text())
        if rec.get("exit_code") != 75:
            problems.append(f"run.json exit_code {rec.get('exit_code')}")
    done = complete_checkpoints(out)
    if not done:
        problems.append("no complete checkpoint")
    else:
        shards = {f.name for f in done[-1].glob("*.distcp")}
        saved = json.loads((done[-1] / "train_state.json").read_text())["step"]
        if len(shards) != world:
            problems.append(f"{len(shards)} shards for {world} processes")
        if step is None or saved != step:
            problems.append(f"checkpoint at step {saved}, stop line says {step}")
        elif step >= STEPS:
            problems.append(f"stopped only at the last step ({step}): nothing left to resume")
    if (out / "model.pt").exists():
        problems.append("model.pt written by a stopped run")
    if not o.stopped:
        problems.append("the stop line never came")
    return ("; ".join(problems) or None), step


def weights(out: Path) -> dict:
    import torch
    return torch.load(out / "model.pt", weights_only=True)


def difference(a: Path, b: Path) -> float:
    wa, wb = weights(a), weights(b)
    if wa.keys() != wb.keys():
        return float("inf")
    return max((wa[k].double() - wb[k].double()).abs().max().item() for k in wa)


# ---- one spec, end to end ------------------------------------------------------------------------------

def tokens_file(work: Path) -> Path:
    """A uint16 token file of ids below SHAPE's vocabulary, the same on every call."""
    import numpy as np
    path = work / "tokens.bin"
    if not path.exists():
        ids = np.random.default_rng(0).integers(0, SHAPE["--vocab-size"], size=20_000, dtype=np.uint16)
        ids.tofile(path)
    return path


def execute(spec: Spec, work: Path) -> dict:
    """Run spec's checks; a row of the table (result 'ok', or what failed; its wall and CPU seconds)."""
    t0, cpu0 = time.perf_counter(), _children_cpu()
    row = {"run": spec.name, "plans": [plan_label(p) for p in spec.plans], "flags": "", "checks": list(spec.checks),
           "notes": [], "commands": []}

    def finish(problems) -> dict:
        problems = [problems] if isinstance(problems, str) else problems
        return {**row, "result": "ok" if not problems else "FAIL: " + "; ".join(problems),
                "seconds": round(time.perf_counter() - t0, 1), "cpu_s": round(_children_cpu() - cpu0, 1)}
    if spec.checks == ("parse",):
        row["flags"] = spec.printed.script
        return finish(spec.group)
    row["flags"] = spec.flags()
    here = work / spec.name.replace("→", "-")
    here.mkdir(parents=True)
    data, problems = tokens_file(work), []
    out = here / "run"
    cmd = spec.command(out, data, _free_port())
    row["commands"].append(cmd.text())
    o = launch(cmd, spec.launches, here)
    problem = check_finished(o, spec.world, out)
    if problem:
        return finish(problem)
    problems += filter(None, [check_held(o, cmd, spec.launches)])
    row["out"] = str(out)
    if "stop" not in spec.checks:
        return finish(problems)
    cut = here / "stopped"
    stop_cmd = spec.command(cut, data, _free_port())
    row["commands"].append(stop_cmd.text())
    o = launch(stop_cmd, spec.launches, here, stop_on="state held by process 0" if "--compile" in spec.extra
               else "model ")  # compiled: after the compilation, which may outlast torchrun's --shutdown-timeout
    problem, step = check_stopped(o, spec.world, cut)
    if problem:
        return finish(f"stop: {problem}")
    row["notes"].append(f"SIGTERM: 75 from {spec.world} workers at step {step}")
    r = spec.resume_as
    resume_cmd = r.command(cut, data, _free_port(), resume=True)
    row["commands"].append(resume_cmd.text())
    o = launch(resume_cmd, r.launches, here)
    problem = check_finished(o, r.world, cut) or (None if f"resumed from step_{step:08d}" in o.stdout
                                                  else "did not resume from the checkpoint")
    if problem:
        return finish(f"resume as {r.flags()}: {problem}")
    d = difference(out, cut)
    same = spec.resumes_as_is()
    if same and d != 0:
        problems.append(f"resumed on the same processes and scheme: max |Δθ| {d:.1e}, not bitwise")
    elif d >= spec.tol():
        problems.append(f"resumed as {r.flags()}: max |Δθ| {d:.1e} ≥ {spec.tol():g}")
    row["notes"].append("resumed as is: bitwise" if same and d == 0 else f"resumed as {r.flags()}: max |Δθ| {d:.1e}")
    return finish(problems)


def compare_groups(specs: list, rows: list) -> None:
    """The 'equal' check: each run's model.pt against the first of its group that finished."""
    firsts = {}
    for spec, row in zip(specs, rows):
        if spec.group is None or "out" not in row:
            continue
        if spec.group not in firsts:
            firsts[spec.group] = (spec, row)
            continue
        if "equal" in spec.checks:
            ref_spec, ref = firsts[spec.group]
            d = difference(Path(ref["out"]), Path(row["out"]))
            row["notes"].append(f"vs {ref_spec.name}: max |Δθ| {d:.1e}")
            if d >= spec.tol():
                bad = f"ends {d:.1e} from {ref_spec.name} (tolerance {spec.tol():g})"
                row["result"] = f"FAIL: {bad}" if row["result"] == "ok" else f"{row['result']}; {bad}"


# ---- the table -----------------------------------------------------------------------------------------

def table(rows: list) -> str:
    lines = ["| run | plan | flags | checks | result | s | CPU s |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        plans = ", ".join(r["plans"][:3]) + (f" (+{len(r['plans']) - 3})" if len(r["plans"]) > 3 else "")
        result = r["result"] + (f" ({'; '.join(r['notes'])})" if r.get("notes") else "")
        lines.append(f"| {r['run']} | {plans or 'pairwise'} | {r['flags']} | {' '.join(r['checks'])} | "
                     f"{result.replace('|', '/')} | {r['seconds']:.0f} | {r['cpu_s']:.0f} |")
    return "\n".join(lines)


def write_report(rows: list, extra: dict, path: Path = OUTPUT) -> None:
    from script_support import atomic_write
    report = {**extra, "runs": rows}
    with atomic_write(path) as f:
        f.write(json.dumps(report, ensure_ascii=False, indent=1).encode())
    with atomic_write(path.with_suffix(".md")) as f:
        f.write((table(rows) + "\n\n" + "\n".join(f"- {k}: {v}" for k, v in extra.items()) + "\n").encode())


def matrix(subset: bool = False) -> tuple:
    """(specs, notes): the pairwise set (subset: every value once) and the printed flag sets."""
    plans, none = plan_specs()
    plans = plan_checks(plans)
    notes = {"plans without a command": [plan_label(p) for p in none],
             "bf16": "run" if cpu_has_bf16() else "not run: this CPU has neither avx512_bf16 nor amx_bf16 "
                                                  "(a bf16 matmul is a slow software fallback)"}
    if subset:  # every value once, and the first printed flag set that shards
        sharded = next(s for s in plans if s.checks != ("parse",) and scheme_of(s.printed.args) != "ddp")
        return pairwise_specs(strength=1) + [replace(sharded, checks=("steps", "held"), resume_as=None)], notes
    return pairwise_specs() + plans + compiled_twins(plans), notes


def compiled_twins(plans: list) -> list:
    """As a GPU runs them (compile is on by default on CUDA): the first printed DDP flag set on several
    processes and the first sharded one with --checkpoint-activations, with --compile."""
    ran = [s for s in plans if s.checks != ("parse",)]
    picks = [next((s for s in ran if scheme_of(s.printed.args) == "ddp" and s.world > 1), None),
             next((s for s in ran if scheme_of(s.printed.args) != "ddp" and "--checkpoint-activations" in
                   s.printed.args), None)]
    return [replace(s, name=f"{s.name}c", extra=("--compile",), checks=("steps", "held"), resume_as=None)
            for s in picks if s is not None]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bookbuild.rehearse", description=__doc__.split("\n\n")[0])
    p.add_argument("--subset", action="store_true", help="every option value once (the test command's run)")
    p.add_argument("--list", action="store_true", help="print the runs and their checks; run nothing")
    p.add_argument("--only", nargs="*", help="run only these runs (names from --list)")
    p.add_argument("--output", type=Path, default=OUTPUT, help=f"the JSON table (default {OUTPUT.relative_to(REPO)}"
                   "; the Markdown table beside it)")
    p.add_argument("--keep", type=Path, help="keep the runs' folders here (default: a temporary folder, removed)")
    args = p.parse_args(argv)
    specs, notes = matrix(args.subset)
    if args.only:
        specs = [s for s in specs if s.name in args.only]
    if args.list:
        for s in specs:
            print(f"{s.name:5s} {s.flags() if s.checks != ('parse',) else s.printed.script:60s} "
                  f"{' '.join(s.checks):28s} {', '.join(plan_label(x) for x in s.plans[:2])}"
                  + (f" → resumed as {s.resume_as.flags()}" if s.resume_as else ""))
        return 0
    t0, rows = time.perf_counter(), []
    with contextlib.ExitStack() as stack:
        if args.keep:
            work = args.keep
            work.mkdir(parents=True, exist_ok=True)
        else:
            work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rehearse-")))
        for i, s in enumerate(specs):
            row = execute(s, work)
            rows.append(row)
            print(f"{row['run']:6s} {row['flags']:60s} {row['result'][:160]} ({row['seconds']:.0f} s, "
                  f"CPU {row['cpu_s']:.0f} s)", flush=True)
            if i + 1 < len(specs):  # a table so far (the equal checks come at the end), in case the rest never does
                write_report(rows, summary(notes, rows, t0, len(specs)), args.output)
        compare_groups(specs, rows)
    extra = summary(notes, rows, t0, len(specs))
    print(table(rows))
    print(f"\n{len(rows)} runs in {extra['total_s']:.0f} s ({extra['cpu_s']:.0f} CPU s: at least "
          f"{extra['cpu_s'] / 2:.0f} s on 2 idle cores); {len(extra['failed'])} failed: "
          f"{', '.join(extra['failed']) or 'none'}")
    write_report(rows, extra, args.output)
    return 1 if extra["failed"] else 0


def summary(notes: dict, rows: list, t0: float, planned: int) -> dict:
    return {**notes, "finished": f"{len(rows)} of {planned} runs",
            "failed": [r["run"] for r in rows if r["result"] != "ok"],
            "total_s": round(time.perf_counter() - t0, 1), "cpu_s": round(sum(r["cpu_s"] for r in rows), 1),
            "tol": TOL, "tol_fp16": TOL_FP16, "tol_bf16": TOL_BF16, "steps": STEPS, "shape": SHAPE,
            "shape_fp16": SHAPE_FP16,
            "schemes": {k: " ".join(v) for k, v in budget.SHARD_FLAGS.items()}}


if __name__ == "__main__":
    sys.exit(main())
