"""Wrong on purpose: skips and grows correctly, but steps with the scaled gradients."""
import torch

from exercises.solutions.ch4_loss_scaler import LossScaler as Right


class LossScaler(Right):
    def step(self, optimizer):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.found_inf = not all(torch.isfinite(g).all() for g in grads)
        if not self.found_inf:
            optimizer.step()
