"""The book's answer: GradScaler's three decisions (skip, halve, grow) written out."""
import torch


class LossScaler:
    def __init__(self, init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self.scale_value = float(init_scale)
        self.growth_interval = growth_interval
        self.good_steps = 0  # steps in a row without overflow
        self.found_inf = False

    def scale(self, loss):
        return loss * self.scale_value

    def step(self, optimizer):
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        for g in grads:
            g.mul_(1.0 / self.scale_value)  # a power of two: exact
        self.found_inf = not all(torch.isfinite(g).all() for g in grads)
        if not self.found_inf:
            optimizer.step()

    def update(self):
        if self.found_inf:
            self.scale_value *= 0.5
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= 2.0
                self.good_steps = 0

    def get_scale(self) -> float:
        return self.scale_value
