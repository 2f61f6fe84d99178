"""Wrong on purpose: a scaler that halves after an overflow but never grows again."""
from exercises.solutions.ch4_loss_scaler import LossScaler as Right


class LossScaler(Right):
    def update(self):
        if self.found_inf:
            self.scale_value *= 0.5
