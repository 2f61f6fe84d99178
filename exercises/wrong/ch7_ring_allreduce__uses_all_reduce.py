"""Wrong on purpose: the right sum, from dist.all_reduce itself rather than a ring of sends."""
import torch.distributed as dist


def ring_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor
