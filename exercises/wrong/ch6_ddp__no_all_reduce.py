"""Wrong on purpose: the naive version forgets the all-reduce (each process keeps its own gradients)."""
from exercises.solutions.ch6_ddp import BucketedDDP  # noqa: F401


def all_reduce_gradients(model):
    pass
