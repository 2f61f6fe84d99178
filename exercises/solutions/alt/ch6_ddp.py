"""A second correct answer, written differently: one flat all-reduce for the naive version; buckets in
forward order, each all-reduced as one flat tensor once its last gradient arrives."""
import torch
import torch.distributed as dist


def all_reduce_gradients(model):
    grads = [p.grad for p in model.parameters()]
    flat = torch.cat([g.flatten() for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat.div_(dist.get_world_size())
    for g, piece in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(piece.view_as(g))


class BucketedDDP:
    def __init__(self, model, bucket_bytes: int):
        self.groups = [[]]
        for p in model.parameters():
            if self.groups[-1] and sum(q.numel() * q.element_size() for q in self.groups[-1]) >= bucket_bytes:
                self.groups.append([])
            self.groups[-1].append(p)
        self.waiting = {}
        self.handles = []
        for p in model.parameters():
            p.register_post_accumulate_grad_hook(self._on_grad)
        self._reset()

    def _reset(self):
        self.waiting = {i: set(map(id, g)) for i, g in enumerate(self.groups)}
        self.handles = []

    def _on_grad(self, param):
        for i, left in self.waiting.items():
            if id(param) in left:
                left.discard(id(param))
                if not left:
                    flat = torch.cat([q.grad.flatten() for q in self.groups[i]])
                    self.handles.append((self.groups[i], flat, dist.all_reduce(flat, async_op=True)))
                return

    def finish(self):
        world = dist.get_world_size()
        for params, flat, handle in self.handles:
            handle.wait()
            for q, piece in zip(params, flat.split([q.numel() for q in params])):
                q.grad.copy_(piece.view_as(q.grad) / world)
        self._reset()
