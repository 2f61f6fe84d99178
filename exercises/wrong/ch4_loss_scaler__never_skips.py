"""Wrong on purpose: unscales, but takes the optimizer step even when a gradient overflowed."""
from exercises.solutions.ch4_loss_scaler import LossScaler as Right


class LossScaler(Right):
    def step(self, optimizer):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.grad.mul_(1.0 / self.scale_value)
        self.found_inf = False  # never looks
        optimizer.step()
