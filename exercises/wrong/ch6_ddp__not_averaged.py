"""Wrong on purpose: sums the gradients over the processes and forgets to divide by their number."""
import torch.distributed as dist

from exercises.solutions.ch6_ddp import BucketedDDP  # noqa: F401


def all_reduce_gradients(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
