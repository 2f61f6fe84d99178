"""The book's answer: flatten the parameters, keep an optimizer for this process's 1/G of the numbers,
and broadcast each process's updated piece to the others."""
import torch
import torch.distributed as dist


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.params = list(params)
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        total = sum(p.numel() for p in self.params)
        self.piece = -(-total // self.world)
        flat = torch.cat([p.detach().reshape(-1) for p in self.params])
        flat = torch.cat([flat, flat.new_zeros(self.piece * self.world - total)])
        # this process's numbers, as a leaf the inner optimizer owns (its state is this size)
        self.shard = flat[self.rank * self.piece:(self.rank + 1) * self.piece].clone().requires_grad_()
        self.optimizer = optimizer_cls([self.shard], **kwargs)

    def _flat(self, tensors):
        flat = torch.cat([t.reshape(-1) for t in tensors])
        return torch.cat([flat, flat.new_zeros(self.piece * self.world - flat.numel())])

    def step(self):
        grads = self._flat([p.grad for p in self.params])
        self.shard.grad = grads[self.rank * self.piece:(self.rank + 1) * self.piece].clone()
        self.optimizer.step()
        pieces = [torch.empty_like(self.shard) for _ in range(self.world)]
        for r in range(self.world):  # every process's updated piece, to everyone
            pieces[r].copy_(self.shard.detach()) if r == self.rank else None
            dist.broadcast(pieces[r], src=r)
        flat = torch.cat(pieces)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()

    def zero_grad(self):
        for p in self.params:
            p.grad = None
