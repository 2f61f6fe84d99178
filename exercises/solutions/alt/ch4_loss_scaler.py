"""A second correct answer, written differently: the overflow found on the scaled gradients before
unscaling, and the growth counted modulo the interval."""
import torch


class LossScaler:
    def __init__(self, init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        self._s = init_scale
        self._interval = growth_interval
        self._streak = 0
        self._overflowed = None

    def get_scale(self) -> float:
        return float(self._s)

    def scale(self, loss):
        return self._s * loss

    def step(self, optimizer):
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self._overflowed = bool((~torch.isfinite(flat)).any())
        torch._foreach_div_(grads, self._s)
        if self._overflowed:
            return None
        return optimizer.step()

    def update(self):
        if self._overflowed:
            self._s, self._streak = self._s / 2, 0
            return
        self._streak = (self._streak + 1) % self._interval
        if self._streak == 0:
            self._s = self._s * 2
