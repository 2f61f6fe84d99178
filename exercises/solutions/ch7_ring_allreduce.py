"""The book's answer: reduce-scatter around the ring, then all-gather around it; G-1 steps each."""
import torch.distributed as dist


def ring_all_reduce(tensor):
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(tensor.chunk(world))  # views: the sum lands in `tensor`
    right, left = (rank + 1) % world, (rank - 1) % world
    incoming = chunks[0].clone()
    # reduce-scatter: after step s, chunk (rank - s - 1) holds s + 2 processes' numbers; in the end
    # this process holds the whole sum of chunk (rank + 1)
    for s in range(world - 1):
        send, recv = (rank - s) % world, (rank - s - 1) % world
        request = dist.isend(chunks[send], right)
        dist.recv(incoming, left)
        request.wait()
        chunks[recv] += incoming
    # all-gather: pass the finished chunks on around the ring
    for s in range(world - 1):
        send, recv = (rank + 1 - s) % world, (rank - s) % world
        request = dist.isend(chunks[send], right)
        dist.recv(chunks[recv], left)
        request.wait()
    return tensor
