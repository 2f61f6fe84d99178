"""A second correct answer, written differently: each step's send and receive posted together with
batch_isend_irecv, the received chunk in a fresh buffer, the sum assembled at the end."""
import torch
import torch.distributed as dist


def ring_all_reduce(tensor):
    g, me = dist.get_world_size(), dist.get_rank()
    nxt, prev = (me + 1) % g, (me + g - 1) % g
    parts = [c.clone() for c in torch.tensor_split(tensor, g)]

    def exchange(send_index, recv_index):
        buf = torch.empty_like(parts[recv_index])
        ops = [dist.P2POp(dist.isend, parts[send_index], nxt), dist.P2POp(dist.irecv, buf, prev)]
        for req in dist.batch_isend_irecv(ops):
            req.wait()
        return buf

    for step in range(g - 1):  # reduce-scatter
        idx = (me - step) % g
        parts[(idx - 1) % g] = parts[(idx - 1) % g] + exchange(idx, (idx - 1) % g)
    for step in range(g - 1):  # all-gather: the finished chunk is (me + 1) at the start
        idx = (me + 1 - step) % g
        parts[(idx - 1) % g] = exchange(idx, (idx - 1) % g)
    return torch.cat(parts)
