"""Wrong on purpose: whole parameters dealt out to the processes in turn (as the first ZeRO sketches do):
the right parameters, but the state per rank is not the ledger's 1/G of it."""
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)
        world = dist.get_world_size()
        self.owner = [i % world for i in range(len(self.params))]
        mine = [p for p, o in zip(self.params, self.owner) if o == dist.get_rank()]
        self.optimizer = optimizer_cls(mine, **kwargs)

    def step(self):
        self.optimizer.step()
        for p, o in zip(self.params, self.owner):
            dist.broadcast(p.data, src=o)

    def zero_grad(self):
        for p in self.params:
            p.grad = None
