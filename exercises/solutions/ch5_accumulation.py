"""The book's answer: divide each micro-batch's loss by their number, so backward's sum is the mean's gradient."""


def accumulate(model, micro_batches):
    k = len(micro_batches)
    total = 0.0
    for x, y in micro_batches:
        _, loss = model(x, y)
        (loss / k).backward()  # gradients add up in .grad
        total += loss.item() / k
    return total
