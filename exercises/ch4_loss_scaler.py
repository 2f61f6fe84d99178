"""Chapter 4 exercise: a dynamic loss scaler, decision for decision the same as torch.amp.GradScaler.

Write LossScaler(init_scale, growth_interval) with growth factor 2 and backoff factor 0.5:
  scale(loss)     the loss times the current scale;
  step(optimizer) unscale every gradient (divide by the scale); if any is inf or NaN skip
                  optimizer.step(), otherwise take it;
  update()        after a skipped step halve the scale; after growth_interval steps in a row without
                  overflow double it;
  get_scale()     the current scale, a float.
Check it: .venv/bin/python -m pytest exercises -k loss_scaler
"""


class LossScaler:
    def __init__(self, init_scale: float = 2.0 ** 16, growth_interval: int = 2000):
        raise NotImplementedError

    def scale(self, loss):
        raise NotImplementedError

    def step(self, optimizer):
        raise NotImplementedError

    def update(self):
        raise NotImplementedError

    def get_scale(self) -> float:
        raise NotImplementedError
