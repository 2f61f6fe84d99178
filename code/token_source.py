"""train_gpu.py's data: the tokens it trains on and evaluates with, the sampler that gives 1, 2 or N
processes the same global batch, and the sample text at the end.

TokenSource: the book's tokens (int64) or a uint16 memmap of --data (code/prepare_tokens.py), never
copied into memory, whose last 5% is held out for validation; every refusal (a missing, odd-sized or
short file, an id beyond --vocab-size, a tokenizer larger than the vocabulary) is one sentence and exit
status 1 before any work. Each process scans only its part of the file for the largest id; the parts
are compared with one all-reduce once the processes have joined (check_ids).
Sampler: every process draws all start positions of the step's sequences from one seeded generator
and reads only its own rows (data.get_batch's rows), so the data does not depend on the number of
processes; its state is the generator's, saved with a checkpoint.
Evaluator: validation loss and bits per byte, each process evaluating its share of the fixed batches.
"""
import math
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from arguments import refuse
from data import get_batch, load_tokenizer, load_tokens_or_exit, token_bytes, tokenizer_path_for
from script_support import generate
from train import batch_losses

HOLDOUT = 0.05  # the last 5% of a --data file is validation


class TokenSource:
    """Training and validation tokens as 1-D tensors: the book's (int64) or a uint16 memmap (no copy
    into memory) whose last 5% is held out; and the tokenizer if it is known (else None)."""

    def __init__(self, path, vocab_size: int, seq_len: int, tokenizer=None, rank: int = 0, world: int = 1):
        need = seq_len + 2  # one window of seq_len + 1 tokens, and room to draw it
        self.vocab_size, self.top, self.name = vocab_size, 0, "the book's 全宋词 tokens"
        if path is None:
            book = load_tokens_or_exit()
            self.train, self.val = book.train, book.val
            default_tok = "book"
        else:
            path = Path(path)
            if not path.is_file():
                refuse(f"--data {path} does not exist or is not a file (make one with code/prepare_tokens.py)")
            size = path.stat().st_size
            if size % 2 or size == 0:
                refuse(f"--data {path.name} is not a uint16 token file (its size is odd or zero)")
            if size // 2 < need:
                refuse(f"--data {path.name} holds {size // 2:,} tokens, fewer than one sequence "
                       f"(--seq-len {seq_len} + 2); use a longer file or a shorter --seq-len")
            # copy-on-write: a writable view for torch that never writes back to the file
            arr = np.memmap(path, dtype=np.uint16, mode="c")
            part = -(-len(arr) // world)  # each process scans its own part for the largest id (check_ids)
            mine = arr[rank * part:(rank + 1) * part]
            self.top = max([int(mine[i:i + (1 << 26)].max()) for i in range(0, len(mine), 1 << 26)] or [0])
            if world == 1 and self.top >= vocab_size:
                self._too_large(path.name)
            tokens = torch.from_numpy(arr)
            n_val = int(len(tokens) * HOLDOUT)
            if n_val < need or len(tokens) - n_val < need:
                refuse(f"--data {path.name} holds {len(tokens):,} tokens: its last 5% ({n_val:,}) held out for "
                       f"validation is shorter than one sequence (--seq-len {seq_len} + 2); use a longer file")
            self.train, self.val = tokens[:len(tokens) - n_val], tokens[len(tokens) - n_val:]
            self.name = f"{path.name} (uint16 memmap; last 5%, {n_val:,} tokens, held out)"
            default_tok = tokenizer_path_for(path) if tokenizer_path_for(path).is_file() else None
        self.path = path
        self.tokenizer, self.tokenizer_name = self._tokenizer(tokenizer or default_tok, vocab_size)

    def _too_large(self, name):
        refuse(f"--data {name} holds token id {self.top}, beyond --vocab-size {self.vocab_size}")

    def check_ids(self, device) -> None:
        """The largest id over every process's part of the file (one all-reduce), against --vocab-size."""
        if self.path is not None and dist.is_initialized():
            top = torch.tensor(self.top, device=device)
            dist.all_reduce(top, op=dist.ReduceOp.MAX)
            self.top = int(top.item())
            if self.top >= self.vocab_size:
                self._too_large(Path(self.path).name)

    @staticmethod
    def _tokenizer(source, vocab_size):
        if source is None:
            return None, "unknown (no bits per byte, no sample text)"
        if source == "book":
            sp, name = load_tokenizer(), "the book's"
        else:
            import sentencepiece as spm
            path = Path(source)
            if not path.is_file():
                refuse(f"--tokenizer {path} does not exist")
            try:
                sp, name = spm.SentencePieceProcessor(model_file=str(path)), path.name
            except (RuntimeError, OSError):
                refuse(f"--tokenizer {path.name} is not a SentencePiece model")
        if sp.get_piece_size() > vocab_size:  # ids past the embedding: IndexError on a CPU, an assert on a GPU
            refuse(f"--vocab-size {vocab_size:,} is smaller than {name} tokenizer's {sp.get_piece_size():,} ids; "
                   f"use --vocab-size {sp.get_piece_size()}")
        return sp, name

    def __len__(self):
        return len(self.train)


class Sampler:
    """The step's global batch of --global-batch-tokens: every process draws all its start positions
    from one generator (the same on every process, whatever their number) and reads only its own
    rows, cut into micro-batches. Its state is the generator's: saved and restored with a checkpoint."""

    def __init__(self, tokens, args, rank: int, world: int, device):
        self.tokens, self.seq_len, self.micro, self.device = tokens, args.seq_len, args.micro_batch, device
        self.sequences = args.global_batch_tokens // args.seq_len  # per step, over all processes
        per_rank = self.sequences // world
        self.rows = slice(rank * per_rank, (rank + 1) * per_rank)
        self.gen = torch.Generator().manual_seed(args.seed + 1)

    def step_batches(self) -> list:
        x, y = get_batch(self.tokens, self.sequences, self.seq_len, self.gen, rows=self.rows)
        x, y = x.to(torch.int64), y.to(torch.int64)
        if self.device.type == "cuda":  # pinned host memory lets the copy run asynchronously with compute
            x, y = (t.pin_memory().to(self.device, non_blocking=True) for t in (x, y))
        return list(zip(x.split(self.micro), y.split(self.micro)))



class Evaluator:
    """Validation loss and bits per byte of train_gpu.py's Trainer `t` on the same fixed batches every
    time, split across the processes (each reads only its batches) and summed with one all-reduce."""

    def __init__(self, t, data: TokenSource, autocast):
        self.t, self.batches, self.byte_counts, self.autocast = t, [], None, autocast
        if not t.args.eval_every:
            return
        n, g = t.args.eval_batches, torch.Generator().manual_seed(1234)  # data.fixed_batches' seed
        per_rank = -(-n // t.world)  # FSDP: every process runs as many forwards as the others
        mine = {t.rank + t.world * j for j in range(per_rank)}
        for i in range(max(mine) + 1):  # every draw, so the generator stays equal; only our rows are read
            x, y = get_batch(data.val, t.args.micro_batch, t.args.seq_len, g, rows=None if i in mine else slice(1))
            if i in mine:
                self.batches.append((x.to(t.device, torch.int64), y.to(t.device, torch.int64), float(i < n)))
        if data.tokenizer is not None:
            self.byte_counts = token_bytes(data.tokenizer).to(t.device)

    def report(self, log, done: int) -> None:
        with self.autocast():
            losses = batch_losses(self.t.eval_model, [(x, y) for x, y, _ in self.batches])
        sums = torch.zeros(3, dtype=torch.float64, device=self.t.device)  # nats, tokens, bytes
        for loss, (_, y, weight) in zip(losses, self.batches):
            bytes_ = self.byte_counts[y].sum() if self.byte_counts is not None else 0
            sums += weight * torch.tensor([loss * y.numel(), y.numel(), float(bytes_)], device=self.t.device)
        if dist.is_initialized():
            dist.all_reduce(sums)
        loss = (sums[0] / sums[1]).item()
        bpb = None if self.byte_counts is None else (sums[0] / math.log(2) / sums[2]).item()
        log(f"step {done:5d}/{self.t.args.steps} | val loss {loss:.4f}"
            + ("" if bpb is None else f" | val bits per byte {bpb:.4f}"))
        log.jsonl({"step": done, "val_loss": loss, "val_bpb": bpb})


def sample_text(model, sp, args, device, autocast) -> str:
    """A line with ~args.sample_tokens tokens generated from the start of a document."""
    if sp is None:
        return "sample: skipped, the tokenizer of --data is unknown (pass --tokenizer)"
    g = torch.Generator().manual_seed(args.seed)
    start = torch.tensor([[sp.eos_id()]], device=device)  # eos ends a document: what follows starts one
    with autocast():
        ids = generate(model, start, args.sample_tokens, temperature=0.8, generator=g, context=args.seq_len)
    ids = [i for i in ids[0, 1:].tolist() if i < sp.get_piece_size()]  # ids beyond the tokenizer: never trained
    docs, cur = [], []
    for i in ids:
        if i == sp.eos_id():
            docs.append(sp.decode(cur))
            cur = []
        else:
            cur.append(i)
    docs.append(sp.decode(cur))
    return f"sample ({args.sample_tokens} tokens, temperature 0.8, ⏎ = end of document): " + " ⏎ ".join(docs)
