"""train_gpu.py's step sampler: every process draws all start positions of the step's sequences from one
seeded generator and reads only its own rows (data.get_batch's rows), so the data does not depend on the
number of processes; its state is the generator's, saved with a checkpoint."""
import torch

from data import get_batch


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
