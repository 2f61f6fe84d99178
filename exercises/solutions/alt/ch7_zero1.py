"""A second correct answer, written differently: this process's range of the flat parameter vector kept
as one leaf per parameter it touches (a range may cut a parameter in two), the updated range shared
with one all_gather_into_tensor."""
import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)
        world, rank = dist.get_world_size(), dist.get_rank()
        total = sum(p.numel() for p in self.params)
        self.size = (total + world - 1) // world
        lo, hi = rank * self.size, (rank + 1) * self.size
        self.segments = []  # (parameter, start within it, leaf holding its numbers lo..hi)
        start = 0
        for p in self.params:
            a, b = max(lo, start), min(hi, start + p.numel())
            if a < b:
                leaf = p.detach().reshape(-1)[a - start:b - start].clone().requires_grad_()
                self.segments.append((p, a - start, leaf))
            start += p.numel()
        self.inner = optimizer_cls([leaf for _, _, leaf in self.segments], **kwargs)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for p, offset, leaf in self.segments:
            leaf.grad = p.grad.reshape(-1)[offset:offset + leaf.numel()].clone()
        self.inner.step()
        mine = torch.zeros(self.size)
        if self.segments:
            mine[:sum(leaf.numel() for _, _, leaf in self.segments)] = torch.cat([x for _, _, x in self.segments])
        everything = torch.empty(self.size * dist.get_world_size())
        dist.all_gather_into_tensor(everything, mine)
        torch.nn.utils.vector_to_parameters(everything[:sum(p.numel() for p in self.params)], self.params)
