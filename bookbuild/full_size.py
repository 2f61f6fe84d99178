"""Every plan code/budget.py prints, run at its full size in this one process: rank 0 of its real world size
on torch's fake process group, its real shapes as fake tensors, its peak memory per GPU by torch's own tracker
(code/fake_run.py, which chapter 12 also runs), set beside the memory ledger's.

    python -m bookbuild.full_size                       # every printed plan (the rehearsal's enumeration), a table
    python -m bookbuild.full_size --models 124M         # some of them
    python -m bookbuild.full_size --representatives     # one plan of each kind (tests/test_full_size.py's)

What runs. For each `command  torchrun ... code/train_gpu.py ...` line that budget.plan() prints (the
rehearsal's printed_plans: each named model on the common GPUs, on 1, 8, 16 and 64 GPUs, with and without
--checkpoint-activations), fake_run.simulate: train_gpu.py's own setup, train_step and optimizer_step as
process 0 of the command's world, unshrunk. Its docstring says what that measures, what it shims (SHIMS,
which the table prints) and what it cannot see.

representatives() keeps one plan of each kind: each distinct (scheme, world size, recomputation), the
cheapest to simulate standing for the others, and beside them the cheapest plan of each of the ledger's
other distinctions not yet among them (precision, accumulation or none, gradients reduced at every
micro-batch or at the last). tests/test_full_size.py runs those; this command runs them with
--representatives, and every plan without it.
"""
import argparse
import json
import sys
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from .book import REPO
from .rehearse import COMMON_GPUS, Command, printed_plans, value, world_of

sys.path.insert(0, str(REPO / "code"))
from fake_run import (  # noqa: E402
    MICRO_BATCHES,
    SHIMS,
    TOLERANCE,
    param_count_of,
    planned,
    precision_of,
    scheme_of,
    simulate,
)

FULL_SIZE_COUNTS = (1, 8, 16, 64)  # the plans: one GPU, one machine, two machines, eight
OUTPUT = REPO / "_build" / "full_size.json"


@dataclass
class Plan:
    """One printed command: the budget's arguments that print it and what it runs."""
    argv: list  # budget.plan's arguments
    command: Command

    @property
    def world(self) -> int:
        launches, per_node = world_of(self.command.launcher)
        return launches * per_node

    @property
    def per_node(self) -> int:
        return world_of(self.command.launcher)[1]

    def label(self) -> dict:
        a = dict(zip(self.argv[::2], self.argv[1::2]))
        return {"model": a["--model"], "gpu": a["--gpu"], "gpus": int(a["--gpus"]),
                "recompute": "--checkpoint-activations" in self.argv}

    @cached_property
    def planned(self) -> tuple:
        """(train_gpu.py's arguments, accumulation, precision, shapes.Run): fake_run.planned."""
        return planned(self.command.args, self.world, self.per_node, self.label()["gpu"])

    def kind(self) -> tuple:
        """Scheme, world size and recomputation: what tells the ledger's plans apart first."""
        run = self.planned[3]
        return scheme_of(run), run.gpus, run.checkpoint

    def terms(self) -> tuple:
        """What else the ledger counts differently: (sharded, precision, accumulation or not, the gradients
        reduced at every micro-batch or at the last)."""
        _, accum, precision, run = self.planned
        return run.sharded, precision, accum > 1, run.sync_every

    def cost(self) -> tuple:
        """What a simulation's time grows with: its operations (layers × the micro-batches it runs), then
        its parameters."""
        args, accum = self.planned[:2]
        return args.n_layer * min(accum, MICRO_BATCHES), param_count_of(args)


def plans(models=None, gpus=COMMON_GPUS, counts=FULL_SIZE_COUNTS) -> list:
    """Every printed command of the rehearsal's enumeration, once per distinct (command, world, precision)."""
    out, seen = [], set()
    for argv, cmd in printed_plans(models, gpus, counts):
        if cmd is None or isinstance(cmd, tuple):  # no command, or one a parser refuses (the rehearsal's)
            continue
        key = (cmd.args, world_of(cmd.launcher), precision_of(dict(zip(argv[::2], argv[1::2]))["--gpu"]))
        if key not in seen:
            seen.add(key)
            out.append(Plan(argv, cmd))
    return out


def representatives(selected: list) -> list:
    """One plan of each kind (Plan.kind: scheme, world size, recomputation), the cheapest to simulate
    (Plan.cost); then, for each of the ledger's other distinctions (Plan.terms) that occurs among `selected`
    but not yet among those chosen, the cheapest plan that has it. In the order of `selected`."""
    cheapest = {}
    for plan in sorted(selected, key=Plan.cost):
        cheapest.setdefault(plan.kind(), plan)
    chosen = list(cheapest.values())
    for plan in sorted(selected, key=Plan.cost):
        if plan.terms() not in {p.terms() for p in chosen}:
            chosen.append(plan)
    return [p for p in selected if any(p is c for c in chosen)]


# ---- the table -----------------------------------------------------------------------------------------

def table_rows(selected: list, log=print, rows=None) -> list:
    """One row per plan (simulate), each handed to log as a line of the table as soon as it is measured."""
    rows = [] if rows is None else rows
    for plan in selected:
        t0 = time.perf_counter()
        label = plan.label()
        r = simulate(plan.command.args, plan.world, plan.per_node, label["gpu"])
        row = {**label, "world": plan.world, **{k: r[k] for k in ("scheme", "micro_batch", "accum", "mesh",
                                                                  "ledger", "tracker", "ratio", "parts")},
               "seconds": round(time.perf_counter() - t0, 2)}
        rows.append(row)
        log(line(row))
    return rows


HEADER = ("| model | GPU | GPUs | scheme | recompute | micro-batch | accum | mesh | ledger MiB | tracker MiB | ratio "
          "| s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def line(r: dict) -> str:
    return (f"| {r['model']} | {r['gpu']} | {r['gpus']} | {r['scheme']} | {'on' if r['recompute'] else 'off'} | "
            f"{r['micro_batch']} | {r['accum']} | {r['mesh']} | {r['ledger']:,.1f} | {r['tracker']:,.1f} | "
            f"{r['ratio']:.3f} | {r['seconds']:.1f} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bookbuild.full_size", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="*", help="named models (default: every one of budget.MODELS)")
    p.add_argument("--gpus", nargs="*", default=list(COMMON_GPUS), help="GPU names (default: %(default)s)")
    p.add_argument("--counts", nargs="*", type=int, default=list(FULL_SIZE_COUNTS))
    p.add_argument("--output", type=Path, default=OUTPUT, help="the JSON table (the Markdown table beside it)")
    p.add_argument("--representatives", action="store_true",
                   help="one plan of each kind the ledger tells apart, the smallest (representatives())")
    p.add_argument("--sharded-first", action="store_true",
                   help="the FSDP and HSDP plans first (seconds each; DDP's and one GPU's, under MemTracker, longer)")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    selected = plans(args.models, tuple(args.gpus), tuple(args.counts))
    if args.representatives:
        selected = representatives(selected)
    if args.sharded_first:
        selected.sort(key=lambda plan: plan.world == 1 or value(plan.command.args, "--shard") in (None, "ddp"))
    print("shims: " + "; ".join(f"{k}: {v}" for k, v in SHIMS.items()) + "\n")
    print(HEADER, flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    rows = []

    def log(text):
        print(text, flush=True)
        args.output.write_text(json.dumps({"rows": rows, "seconds": round(time.perf_counter() - t0, 1),
                                           "shims": SHIMS}, ensure_ascii=False, indent=1))
    rows = table_rows(selected, log, rows)
    total = time.perf_counter() - t0
    bad = [r for r in rows if abs(r["ratio"] - 1) > TOLERANCE]
    print(f"\n{len(rows)} plans in {total:.0f} s; {len(bad)} outside ±{TOLERANCE:.0%} of the ledger")
    args.output.write_text(json.dumps({"rows": rows, "seconds": round(total, 1), "shims": SHIMS},
                                      ensure_ascii=False, indent=1))
    args.output.with_suffix(".md").write_text("\n".join([
        HEADER, *map(line, rows), "", f"{len(rows)} plans in {total:.0f} s; {len(bad)} outside ±{TOLERANCE:.0%}",
        "", *(f"- shim {k}: {v}" for k, v in SHIMS.items())]) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
