"""Wrong on purpose: every process keeps the whole optimizer (right parameters, no memory saved)."""


class ShardedOptimizer:
    def __init__(self, params, optimizer_cls, **kwargs):
        self.optimizer = optimizer_cls(list(params), **kwargs)

    def step(self):
        self.optimizer.step()

    def zero_grad(self):
        self.optimizer.zero_grad(set_to_none=True)
