"""Chapter 12 exercise: the peak memory of one training step, as the ledger counts it.

Write peak_bytes(shape): the peak bytes on one device of one training step of the book's GPT with the
shape (code/memory.py's Shape: d_model, n_layer, n_head, seq_len, micro_batch, vocab_size), trained as
train_gpu.py does on one GPU: fp32 weights, gradients and AdamW's two moments, bf16 autocast with flash
attention, the full logits, no activation checkpointing. Work it out from chapter 12 (per layer, the
head, the logits and their temporaries, autocast's weight copies); shapes.param_count may count the
parameters. Check it: .venv/bin/python -m pytest exercises -k memory_peak
"""


def peak_bytes(shape) -> int:
    raise NotImplementedError
