"""Run chapters under nbval in every kernel configuration this CPU can stand in for, and report which
pass and how close each came to its asserts.

    python -m bookbuild.portability                          # every chapter, every configuration
    python -m bookbuild.portability 06_ddp.md --configs native avx2
    python -m bookbuild.portability --kernels-only           # only what each configuration changes

A configuration is a set of environment variables for the chapter's kernel (the list is CONFIGS):
  native            nothing capped;
  no-amx            ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16: oneDNN without AMX, like a Zen 4's bf16;
  avx2              ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 ONEDNN_MAX_CPU_ISA=AVX2: no
                    AVX-512 and no bf16 instructions, as on an AVX2-only CPU;
  threads-1         OMP_NUM_THREADS=1;
  threads-4         4 threads (torch caps OMP_NUM_THREADS at the core count, so the kernel sets it
                    itself, from an IPython startup file): on 2 cores, oversubscribed.
First the command checks what each configuration really changes: the kernels torch picked, the
implementation oneDNN names for a bf16 matmul (ONEDNN_VERBOSE), the thread count and fp32/bf16 matmul
speed. A configuration that changes nothing here (no-amx on a CPU without AMX, avx2 on an AVX2 CPU) is
reported as such and its chapters are not run again.

What an emulation cannot reproduce: MKL's and oneDNN's fp32 kernels on an Intel CPU round differently
from an AMD CPU's under every cap (the caps choose instruction sets, not vendors' code paths); AMX
cannot be switched on where the CPU lacks it; and capped kernels on a fast CPU are not a slow CPU's
timings, only its choices of instructions.

Each chapter's asserts on measured values go through measure.check, which writes its margins to the
file BOOK_MARGINS_FILE names; the report gives the tightest per chapter and configuration. A run under
a configuration is never handed to the book's execution cache (bookbuild/nbval_hooks.py).
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .book import REPO, chapters, script_arguments

AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CONFIGS = {
    "native": {},
    "no-amx": {"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"},
    "avx2": AVX2,
    "threads-1": {"OMP_NUM_THREADS": "1"},
    "threads-4": {"OMP_NUM_THREADS": "4", "BOOK_TORCH_THREADS": "4"},
}
THREADS_VAR = "BOOK_TORCH_THREADS"  # torch caps OMP_NUM_THREADS at the cores; this sets the count itself
# IPython runs this in every kernel it starts (nbval's too) before the chapter's first cell
KERNEL_STARTUP = f"""import os
if os.environ.get("{THREADS_VAR}"):
    import torch
    torch.set_num_threads(int(os.environ["{THREADS_VAR}"]))
"""
# torch.compile's on-disk cache does not key its kernels on ATEN_CPU_CAPABILITY: a native run that loads
# kernels an AVX2-capped run compiled corrupts the heap (seen on an Intel AMX CPU with torch 2.13: "malloc():
# unaligned tcache chunk", the kernel dead in chapter 2). Every configuration but native compiles into its own.
INDUCTOR_CACHE_VAR = "TORCHINDUCTOR_CACHE_DIR"
MARGINS_VAR = "BOOK_MARGINS_FILE"  # code/measure.py's check appends one JSON line per assert here
NO_HANDOFF_VAR = "BOOK_NO_CACHE_HANDOFF"  # bookbuild/nbval_hooks.py hands nothing to the cache when set

KERNEL_PROBE = KERNEL_STARTUP + """
import json, time, torch
def gflops(dtype, n=512):
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    a @ b
    t0, reps = time.perf_counter(), 0
    while reps < 3 or time.perf_counter() - t0 < 0.3:
        a @ b
        reps += 1
    return round(2 * n ** 3 * reps / (time.perf_counter() - t0) / 1e9, 1)
print(json.dumps({"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
                  "fp32_gflops": gflops(torch.float32), "bf16_gflops": gflops(torch.bfloat16)}))
"""
BF16_MATMUL = "import torch; torch.randn(64, 64).bfloat16() @ torch.randn(64, 64).bfloat16()"


def kernels(env_vars: dict) -> dict:
    """What the configuration gives a fresh Python: torch's kernel capability, its thread count,
    fp32/bf16 matmul GFLOPS at 512³, and the implementation oneDNN reports for a bf16 matmul."""
    env = {**os.environ, **env_vars}
    out = subprocess.run([sys.executable, "-c", KERNEL_PROBE], env=env, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    probe = json.loads(out.stdout.strip().splitlines()[-1])
    verbose = subprocess.run([sys.executable, "-c", BF16_MATMUL], env={**env, "ONEDNN_VERBOSE": "1"},
                             capture_output=True, text=True, timeout=300).stdout
    # onednn_verbose,[timestamp,]primitive,exec,cpu,matmul,<implementation>,...
    impls = [f[f.index("matmul") + 1] for f in (line.split(",") for line in verbose.splitlines())
             if "exec" in f and "matmul" in f[:-1]]
    probe["onednn_bf16_matmul"] = impls[-1] if impls else "(not oneDNN)"
    return probe


def changes_nothing(probe: dict, native: dict) -> bool:
    """A cap that leaves torch's kernels, oneDNN's bf16 implementation and the threads as they were."""
    keys = ("capability", "onednn_bf16_matmul", "threads")
    return all(probe.get(k) == native.get(k) for k in keys)


def config_env(name: str, work: Path) -> dict:
    """The environment variables of configuration `name`: its caps or threads, and for every configuration
    but native a torch.compile cache of its own under `work` (INDUCTOR_CACHE_VAR)."""
    return dict(CONFIGS[name], **({} if name == "native" else {INDUCTOR_CACHE_VAR: str(work / f"inductor-{name}")}))


def run_chapter(md: Path, env_vars: dict, margins_file: Path) -> dict:
    """nbval over one chapter under the configuration: pass or fail, seconds, the margins of its checks."""
    margins_file.unlink(missing_ok=True)
    startup = margins_file.parent / "ipython" / "profile_default" / "startup" / "00-threads.py"
    startup.parent.mkdir(parents=True, exist_ok=True)
    startup.write_text(KERNEL_STARTUP)
    env = {**os.environ, **env_vars, MARGINS_VAR: str(margins_file), NO_HANDOFF_VAR: "1",
           "IPYTHONDIR": str(startup.parents[2])}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", str(md.with_suffix(".ipynb"))], cwd=REPO,
                          env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    checks = [json.loads(line) for line in margins_file.read_text().splitlines()] if margins_file.is_file() else []
    summary = (proc.stdout.strip().splitlines() or [""])[-1]
    if proc.returncode != 0:  # what failed, where the reader (or CI's log) sees it: the first failure, then the end
        lines = proc.stdout.splitlines()
        first = next((i for i, line in enumerate(lines) if "Cell execution caused an exception" in line), None)
        if first is not None and first < len(lines) - 60:
            print("\n".join(lines[first:first + 60]), "\n[...]", flush=True)
        print("\n".join(lines[-60:]), flush=True)
    return {"passed": proc.returncode == 0, "seconds": round(seconds), "summary": summary, "checks": checks}


def tightest(checks: list) -> str:
    """The tightest margin of a chapter's checks, as 'name ×1.26', or '—' without any."""
    ratios = [c for c in checks if c["ratio"]]
    if not ratios:
        return "—" if not checks else min(checks, key=lambda c: c["margin"])["name"] + " (a difference)"
    c = min(ratios, key=lambda c: c["margin"])
    return f"{c['name']} ×{c['margin']:.2f}"


def main(argv=None) -> int:
    arguments = script_arguments()
    ap = arguments.Parser(prog="python -m bookbuild.portability", description=__doc__.splitlines()[0])
    ap.add_argument("chapters", nargs="*", metavar="NN_name.md", help="chapters to run (default: every chapter)")
    ap.add_argument("--configs", nargs="+", choices=list(CONFIGS), default=list(CONFIGS),
                    help="configurations to run (default: all)")
    ap.add_argument("--kernels-only", action="store_true", help="only check what each configuration changes")
    ap.add_argument("--out", default="_build/portability.json", help="where to write the report as JSON")
    args = ap.parse_args(argv)
    book = chapters()
    mds = [Path(n) if Path(n).exists() else book[0].parent / n for n in args.chapters] or book
    for md in mds:
        if not md.with_suffix(".ipynb").is_file():
            ap.error(f"there is no chapter notebook {md.with_suffix('.ipynb').name} in chapters/")

    native = kernels({})
    probes = {name: native if name == "native" else kernels(CONFIGS[name]) for name in args.configs}
    print("configuration │ torch kernels │ threads │ oneDNN bf16 matmul        │ fp32 / bf16 GFLOPS (512³)")
    for name, p in probes.items():
        same = name != "native" and changes_nothing(p, native)
        print(f"{name:<13} │ {p.get('capability', '?'):<13} │ {p.get('threads', '?'):>7} │ "
              f"{p.get('onednn_bf16_matmul', p.get('error', '?')):<25} │ "
              f"{p.get('fp32_gflops', '?')} / {p.get('bf16_gflops', '?')}"
              + ("   (changes nothing here)" if same else ""))
    report = {"cpu_kernels": probes, "chapters": {}}
    if not args.kernels_only:
        runnable = [n for n in args.configs if n == "native" or not changes_nothing(probes[n], native)]
        tmp = REPO / "_build" / "portability"
        tmp.mkdir(parents=True, exist_ok=True)
        for md in mds:
            report["chapters"][md.name] = {}
            for name in runnable:
                result = run_chapter(md, config_env(name, tmp), tmp / f"{md.stem}.{name}.jsonl")
                report["chapters"][md.name][name] = result
                print(f"{md.name:<22} {name:<10} {'pass' if result['passed'] else 'FAIL'} {result['seconds']:>5} s  "
                      f"tightest: {tightest(result['checks'])}  ({result['summary']})", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False))
    failed = [(c, n) for c, runs in report["chapters"].items() for n, r in runs.items() if not r["passed"]]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
