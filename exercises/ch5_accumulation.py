"""Chapter 5 exercise: gradient accumulation that equals the big batch.

Write accumulate(model, micro_batches): forward and backward over the micro-batches [(x, y), ...] so that
afterwards every parameter's .grad is the gradient of the mean loss over the whole batch (as if it had
been one batch), and return that mean loss. model(x, y) returns (logits, loss), the loss being the mean
over the micro-batch's tokens. The gradients start empty (None).
Check it: .venv/bin/python -m pytest exercises -k accumulation
"""


def accumulate(model, micro_batches):
    raise NotImplementedError
