"""Chapter 7 exercise: ZeRO-1, the optimizer state sharded over the processes (gloo, 2 processes).

Write ShardedOptimizer(params, optimizer_cls, **kwargs) with step() and zero_grad(). The test averages
the gradients over the processes first (as DDP does); step() must then update every parameter exactly
as optimizer_cls(params, **kwargs) would in one process, while each process keeps optimizer state for
only its 1/G of the parameters' numbers (flatten them and cut the vector in G equal pieces; the test
counts the state tensors of the torch optimizers your object is or holds), and after its update sends
its piece to the others (e.g. dist.broadcast or dist.all_gather_into_tensor).
Check it: .venv/bin/python -m pytest exercises -k zero1
"""
import torch.distributed as dist  # noqa: F401  (what you will need)


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        raise NotImplementedError

    def step(self):
        raise NotImplementedError

    def zero_grad(self):
        raise NotImplementedError
