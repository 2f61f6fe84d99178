"""Wrong on purpose: the gradients are right, but the loss returned is the last micro-batch's."""


def accumulate(model, micro_batches):
    k = len(micro_batches)
    for x, y in micro_batches:
        _, loss = model(x, y)
        (loss / k).backward()
    return loss.item()
