"""Wrong on purpose: reduce-scatters the gradients but forgets to divide by the number of processes."""
import torch
import torch.distributed as dist

from exercises.solutions.ch7_fsdp import HandFSDP as Right


class HandFSDP(Right):
    def after_backward(self):
        for piece, w in zip(self.pieces, self.whole):
            flat = torch.cat([w.grad.reshape(-1), w.grad.new_zeros(piece.numel() * self.world - w.numel())])
            piece.grad = torch.empty_like(piece)
            dist.reduce_scatter_tensor(piece.grad, flat)
        self._free()
