"""Chapter 7 exercise: a ring all-reduce from send and recv, on gloo with 3 processes.

Write ring_all_reduce(tensor): sum the 1-D tensor over all processes, in place (or return the sum),
using only dist.send/dist.recv (or dist.isend/dist.irecv): split it into G chunks; G-1 steps of
reduce-scatter (send one chunk to the next rank, add the one from the previous), then G-1 steps of
all-gather. The result must equal dist.all_reduce's, and each process must send 2·(G−1)/G of the
tensor's bytes, as chapter 7 counts. Its length is a multiple of G.
Check it: .venv/bin/python -m pytest exercises -k ring
"""
import torch.distributed as dist  # noqa: F401  (what you will need)


def ring_all_reduce(tensor):
    raise NotImplementedError
