"""Wrong on purpose: each process updates its own piece and never sends it to the others."""
import torch

from exercises.solutions.ch7_zero1 import ShardedOptimizer as Right


class ShardedOptimizer(Right):
    def step(self):
        grads = self._flat([p.grad for p in self.params])
        self.shard.grad = grads[self.rank * self.piece:(self.rank + 1) * self.piece].clone()
        self.optimizer.step()
        flat = self._flat([p.detach() for p in self.params])
        flat[self.rank * self.piece:(self.rank + 1) * self.piece] = self.shard.detach()
        offset = 0
        with torch.no_grad():
            for p in self.params:
                p.copy_(flat[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
