"""Chapter 2 exercise: the training FLOPs per token of the book's GPT.

Write flops_per_token(cfg): the FLOPs one token costs in one training step (forward and backward) of
GPT(cfg), for any cfg (code/model.py's GPTConfig: vocab_size, d_model, n_layer, n_head, seq_len). Count
the parameters yourself (the embedding is tied with the output layer) and remember the work no parameter
counts. Check it: .venv/bin/python -m pytest exercises -k flops
"""


def flops_per_token(cfg) -> int:
    raise NotImplementedError
