"""Wrong on purpose: the buckets are right, but every all-reduce starts in finish(), after backward:
nothing overlaps."""
import torch
import torch.distributed as dist

from exercises.solutions.ch6_ddp import BucketedDDP as Right
from exercises.solutions.ch6_ddp import all_reduce_gradients  # noqa: F401


class BucketedDDP(Right):
    def _grad_ready(self, p):
        pass

    def finish(self):
        for i, bucket in enumerate(self.buckets):
            flat = torch.cat([q.grad.reshape(-1) for q in bucket])
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))
        super().finish()
