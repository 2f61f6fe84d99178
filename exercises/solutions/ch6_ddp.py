"""The book's answer: an all-reduce per gradient, then buckets all-reduced from hooks during backward."""
import torch
import torch.distributed as dist


def all_reduce_gradients(model):
    world = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)  # gloo: sum, then divide (no ReduceOp.AVG)
        p.grad /= world


class BucketedDDP:
    def __init__(self, model, bucket_bytes: int):
        self.world = dist.get_world_size()
        params = [p for p in model.parameters() if p.requires_grad]
        # buckets in reverse order: backward produces the last layers' gradients first
        self.buckets, current, size = [], [], 0
        for p in reversed(params):
            if current and size + p.numel() * p.element_size() > bucket_bytes:
                self.buckets.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        self.buckets.append(current)
        self.bucket_of = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.pending, self.ready = [], [0] * len(self.buckets)
        for p in params:
            p.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, p):
        i = self.bucket_of[p]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):  # the bucket is full: send it while backward goes on
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        for i, flat, work in self.pending:
            work.wait()
            flat /= self.world
            offset = 0
            for q in self.buckets[i]:
                q.grad.copy_(flat[offset:offset + q.numel()].view_as(q.grad))
                offset += q.numel()
        self.pending, self.ready = [], [0] * len(self.buckets)
