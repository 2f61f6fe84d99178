"""What train_gpu.py tells of its model as it trains: validation loss and bits per byte (Evaluator), each
process evaluating its share of the fixed batches, and the text generated at the end of a run (sample_text)."""
import math

import torch
import torch.distributed as dist

from data import TokenSource, get_batch, token_bytes
from model import batch_losses
from script_support import generate


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
