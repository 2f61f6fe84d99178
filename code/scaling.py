"""Chapter 9's experiment, which its pages share: four sizes of the GPT trained with one recipe, the
smallest retrained with another seed (the retrain noise), and the probe that picks this machine's thread
count and precision for them. The first of the chapter's pages to run it (run()) keeps the record
under data/cache/, keyed by this code, torch, the CPU and any cap on its kernels; the other pages read
that record, or, opened on their own, run the experiment first. Each page analyses the record in its own
cells."""
import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path

import torch

from data import CACHE_DIR, CORPUS_PATH, fixed_batches, load_tokenizer, load_tokens, token_bytes
from measure import (
    CALL_BUDGET_S,
    LEAST_SAMPLES,
    PROBE_BUDGET_S,
    choose_size,
    compare,
    flops_per_token,
    has_bf16_instructions,
    time_steps,
    training_step_fn,
)
from model import GPT, GPTConfig
from record import EMULATION_VARS, cpu_name
from script_support import generate
from train import History, TrainConfig, batch_losses, bits_per_byte, configure_optimizer, evaluate, train

SIZES = [(64, 2, 2), (96, 3, 3), (128, 4, 4), (192, 4, 6)]  # (d_model, n_layer, n_head)
# 320 steps, 8 evaluations: every claim of the chapter kept a margin of at least x1.5 at this length on each of
# four seeds (the book's rule for a cheaper recipe; at 400 steps the chapter took a fifth longer)
STEPS, WARMUP, EVAL_EVERY = 320, 50, 40
N_EVAL = 8  # fixed evaluation batches of 16 × 128 tokens: two halves of 4 for the eval noise
RETRAIN_SEED = 1
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}
THREADS = sorted({1, os.cpu_count() or 1})
RECORD_PREFIX = "scaling-"
# the code the record depends on
SOURCES = ("scaling.py", "model.py", "train.py", "data.py", "shapes.py", "script_support.py")


def config(size) -> GPTConfig:
    return GPTConfig(d_model=size[0], n_layer=size[1], n_head=size[2])


def fresh(size, seed: int = 0) -> GPT:
    """Every model of the chapter starts from torch.manual_seed(seed)."""
    torch.manual_seed(seed)
    return GPT(config(size))


def n_params() -> list:
    return [GPT(config(s)).num_params() for s in SIZES]


def n_non_embedding() -> list:
    """Each size's parameters without the embedding, vocab × d (tied to the output layer, so counted once)."""
    return [n - GPTConfig().vocab_size * s[0] for n, s in zip(n_params(), SIZES)]


def names() -> list:
    """Each size by its parameter count, as the chapter's tables and figures label it: '0.62M', ..."""
    return [f"{n / 1e6:.2f}M" for n in n_params()]


def eval_batches(tokens) -> tuple:
    """(val, train): the same N_EVAL batches of 16 × 128 tokens at every evaluation, for every model."""
    return tuple(fixed_batches(t, N_EVAL, 16, 128, seed=1234) for t in (tokens.val, tokens.train))


def recipe(precision: str) -> TrainConfig:
    """The book's recipe (TrainConfig) at the chapter's length; only the precision is this machine's."""
    return TrainConfig(steps=STEPS, warmup=WARMUP, eval_every=EVAL_EVERY, autocast=PRECISIONS[precision])


def probe(train_batches) -> dict:
    """Threads × precision for this machine: one AdamW step of each combination per round, on the largest
    shape (model size, sequences per step) whose round fits CALL_BUDGET_S, then rounds alternated within
    PROBE_BUDGET_S; a choice only where measure.compare calls one side faster beyond twice its spread."""
    n = dict(zip(SIZES, n_params()))
    flops = {s: flops_per_token(config(s), n[s]) for s in SIZES}
    shapes = [(SIZES[0], b) for b in (1, 2, 4, 8)] + [(SIZES[-1], b) for b in (2, 4, 8, 16)]  # in order of work
    made = {}

    def step(size, batch, threads, dtype):
        m, (x, y) = fresh(size), train_batches[0]
        fn = training_step_fn(m, configure_optimizer(m, 3e-3), x[:batch], y[:batch], autocast_dtype=dtype)
        return lambda: (torch.set_num_threads(threads), fn())

    def one_round(i):  # one step of every combination at shape i
        size, batch = shapes[i]
        made[i] = {(t, p): step(size, batch, t, dtype) for t in THREADS for p, dtype in PRECISIONS.items()}
        return lambda: [fn() for fn in made[i].values()]
    t0 = time.perf_counter()
    # margin 1: a step's time grows no faster than its FLOPs here
    pick = choose_size(one_round, range(len(shapes)), lambda i: flops[shapes[i][0]] * shapes[i][1],
                       call_budget_s=CALL_BUDGET_S, margin=1.0)
    (size, batch), fns = shapes[pick["size"]], made[pick["size"]]
    res = time_steps(fns, warmup=0, repeats=1, rounds=5, min_rounds=LEAST_SAMPLES,
                     budget_s=PROBE_BUDGET_S - pick["spent_s"])
    best = {t: min(PRECISIONS, key=lambda p: res[t, p]["min_s"]) for t in THREADS}  # each thread count's faster one
    lo, hi = min(THREADS), max(THREADS)
    one_thread = compare(res[hi, best[hi]]["times_s"], res[lo, best[lo]]["times_s"])
    threads = min(THREADS) if one_thread["verdict"] == "faster" else max(THREADS)
    bf16 = compare(res[threads, "fp32"]["times_s"], res[threads, "bf16"]["times_s"])
    precision = "bf16" if has_bf16_instructions() and bf16["verdict"] == "faster" else "fp32"
    out = {"threads": threads, "precision": precision, "probe_s": time.perf_counter() - t0, "d_model": size[0],
           "batch": batch, "timed": len(res[threads, "fp32"]["times_s"]),
           "best_ms": {f"{t} {p}": res[t, p]["min_s"] * 1000 for t in THREADS for p in PRECISIONS},
           "bf16_vs_fp32": {k: bf16[k] for k in ("ratio", "verdict", "noise")}}
    print(f"probe shape: d_model {size[0]}, {batch} × 128 tokens per step, {out['timed']} timed steps each; "
          f"whole probe {out['probe_s']:.1f} s")
    print("probe times: " + "; ".join(f"{t} thread(s) fp32 {out['best_ms'][f'{t} fp32']:.1f} ms, "
                                      f"bf16 {out['best_ms'][f'{t} bf16']:.1f} ms" for t in THREADS))
    print(f"probe choice: {threads} thread(s), {precision} (fp32 step / bf16 step = {bf16['ratio']:.2f}, "
          f"{bf16['verdict']} beyond twice the spread {bf16['noise']:.2f})")
    return out


def calibrate(cfg: TrainConfig, val_batches, train_batches) -> dict:
    """Seconds each size's run should take here: one timed training step and one evaluation batch each."""
    fns = {}
    for size in SIZES:
        d, m = size[0], fresh(size)
        opt = configure_optimizer(m, cfg.lr)
        fns[d, "step"] = training_step_fn(m, opt, *train_batches[0], autocast_dtype=cfg.autocast)
        fns[d, "eval"] = lambda m=m: batch_losses(m, val_batches[:1])
    cal = time_steps(fns, warmup=1, repeats=1)
    n_evals = cfg.steps // cfg.eval_every + 1  # the evaluations during training, and one on the training batches
    expected = {d: cfg.steps * cal[d, "step"]["min_s"] + n_evals * N_EVAL * cal[d, "eval"]["min_s"]
                for d, _, _ in SIZES}
    for d, _, _ in SIZES:
        print(f"calibrated d_model {d:3d}: step {cal[d, 'step']['min_s'] * 1000:.0f} ms, "
              f"eval batch {cal[d, 'eval']['min_s'] * 1000:.0f} ms, so about {expected[d]:.0f} s per run")
    print(f"expected: four sizes about {sum(expected.values()):.0f} s, "
          f"then the retrain about {expected[SIZES[0][0]]:.0f} s")
    return expected


def _progress(d: int, steps: int, expected_s: float):
    def show(h):  # every 100 steps, so a long cell shows how far it is
        if h.val_steps[-1] % 100 == 0:
            print(f"  d_model {d:3d}: step {h.val_steps[-1]}/{steps} after {h.val_seconds[-1]:.0f} s "
                  f"(expected {expected_s * h.val_steps[-1] / steps:.0f} s)", flush=True)
    return show


SAMPLE_PROMPT = "浣溪沙｜"  # a 词牌 and the separator: how the corpus's lines begin (词牌｜作者｜正文)
SAMPLE_TOKENS = 64
N_SAMPLES = 8  # per size: one is shown, all are counted (9's 它们写出了什么)


def samples(model, sp, n: int = N_SAMPLES) -> list:
    """What a model writes after SAMPLE_PROMPT at the start of a document, n times: up to SAMPLE_TOKENS tokens
    or the end of the document, at temperature 0.8 with generators seeded 0 .. n-1 (the same for every size)."""
    prompt = torch.tensor([[sp.eos_id(), *sp.encode(SAMPLE_PROMPT)]])
    texts = []
    for seed in range(n):
        ids = generate(model, prompt, SAMPLE_TOKENS, temperature=0.8, generator=torch.Generator().manual_seed(seed),
                       context=model.cfg.seq_len, kv_cache=True)[0, 1:].tolist()
        texts.append(sp.decode(ids[:ids.index(sp.eos_id())] if sp.eos_id() in ids else ids))
    return texts


def _train_one(size, seed, tokens, cfg, val_batches, train_batches, byte_counts, expected_s, sp) -> dict:
    model = fresh(size, seed)
    hist = train(model, tokens.train, dataclasses.replace(cfg, seed=seed), val_batches=val_batches,
                 on_eval=_progress(size[0], cfg.steps, expected_s))
    bpb = bits_per_byte(model, val_batches, byte_counts, losses=hist.val_batch_losses[-1])[1]  # the last evaluation
    print(f"d_model {size[0]:3d}" + (f", seed {seed}" if seed else "") + f": {hist.seconds:.0f} s, "
          f"{hist.seconds / cfg.steps * 1000:.0f} ms/step", flush=True)
    return {"d": size[0], "hist": hist, "train_fixed": evaluate(model, train_batches), "bpb": bpb,
            "samples": samples(model, sp)}


def _key() -> str:
    """What the record depends on: this code, the corpus, torch, the CPU, the thread count, and any cap on
    the kernels."""
    h = hashlib.sha256()
    for path in (*(Path(__file__).parent / name for name in SOURCES), CORPUS_PATH):
        h.update(path.read_bytes())
    h.update(repr((torch.__version__, cpu_name(), os.cpu_count(), torch.get_num_threads(),
                   [os.environ.get(v) for v in (*EMULATION_VARS, "OMP_NUM_THREADS")])).encode())
    return h.hexdigest()[:16]


def _path() -> Path:
    return CACHE_DIR / f"{RECORD_PREFIX}{_key()}.json"


def _save(record: dict, path: Path) -> None:
    """Written whole to a temporary file, then renamed: a killed run leaves no half record."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    data = {**record, "runs": [{**r, "hist": dataclasses.asdict(r["hist"])} for r in record["runs"]],
            "retrain": {**record["retrain"], "hist": dataclasses.asdict(record["retrain"]["hist"])}}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)


def _load(path: Path) -> dict:
    data = json.loads(path.read_text(encoding="utf-8"))
    for r in (*data["runs"], data["retrain"]):
        r["hist"] = History(**r["hist"])
    return data


def run() -> dict:
    """The chapter's experiment: probe, calibration, the four sizes, the retrain; or, if a page of the chapter
    has run it already for this code, corpus and machine, its record (delete the file to run it anew).

    Returns {"probe", "precision", "threads", "steps", "expected_s", "train_s", "runs": [one per size: d,
    hist, train_fixed, bpb, samples (scaling.samples)], "retrain": the smallest with RETRAIN_SEED,
    "made": when it ran}."""
    path = _path()
    if path.is_file():
        record = _load(path)
        torch.set_num_threads(record["threads"])
        print(f"the record of this chapter's experiment, made {record['made']} on this machine with this code "
              f"(chapter 9's first page makes it)")
        return record
    tokens, sp = load_tokens(), load_tokenizer()
    val_batches, train_batches = eval_batches(tokens)
    chosen = probe(train_batches)
    torch.set_num_threads(chosen["threads"])
    cfg = recipe(chosen["precision"])
    print(cfg)
    expected = calibrate(cfg, val_batches, train_batches)
    byte_counts = token_bytes(sp)
    t0 = time.perf_counter()
    runs = [_train_one(s, 0, tokens, cfg, val_batches, train_batches, byte_counts, expected[s[0]], sp) for s in SIZES]
    train_s = time.perf_counter() - t0
    print(f"all four sizes: {train_s:.0f} s (expected {sum(expected.values()):.0f} s)")
    retrain = _train_one(SIZES[0], RETRAIN_SEED, tokens, cfg, val_batches, train_batches, byte_counts,
                         expected[SIZES[0][0]], sp)
    record = {"probe": chosen, "precision": chosen["precision"], "threads": chosen["threads"], "steps": cfg.steps,
              "expected_s": sum(expected.values()), "train_s": train_s, "runs": runs, "retrain": retrain,
              "made": time.strftime("%Y-%m-%d %H:%M")}
    _save(record, path)  # under the key taken before the probe set the threads
    return record


# ---- the two noises (chapter 9.1), which the chapter's later pages also judge by ----

def half_means(run: dict, i: int) -> tuple:
    """A run's loss on the two halves A and B of the validation batches at evaluation point i."""
    b, half = run["hist"].val_batch_losses[i], N_EVAL // 2
    return sum(b[:half]) / half, sum(b[half:]) / half


def eval_noise(runs: list) -> tuple:
    """(eval noise, level difference). Eval noise: over every evaluation point and every pair of adjacent
    sizes, the largest |gap between the two on half A − gap on half B|, which is how much the comparison
    of two models moves with the text; the level difference: the most one model's loss moves between halves."""
    noise = level = 0.0
    for i in range(len(runs[0]["hist"].val_steps)):
        A, B = zip(*(half_means(r, i) for r in runs))
        level = max(level, max(abs(a - b) for a, b in zip(A, B)))
        noise = max(noise, max(abs((a1 - a2) - (b1 - b2)) for a1, a2, b1, b2 in zip(A, A[1:], B, B[1:])))
    return noise, level


def retrain_noise(record: dict) -> list:
    """At each evaluation point: |val loss of the smallest size − that of its retrain with RETRAIN_SEED|."""
    return [abs(a - b) for a, b in zip(record["runs"][0]["hist"].val_loss, record["retrain"]["hist"].val_loss)]
