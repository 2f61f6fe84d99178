"""Wrong on purpose: the loss not divided by k, so the gradients are k times the big batch's."""


def accumulate(model, micro_batches):
    total = 0.0
    for x, y in micro_batches:
        _, loss = model(x, y)
        loss.backward()
        total += loss.item() / len(micro_batches)
    return total
