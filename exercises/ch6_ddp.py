"""Chapter 6 exercise: DDP by hand, on gloo with 2 processes.

Each process has the same model and runs forward and backward on its own half of the batch. Afterwards
every process's gradients must equal one process's on the whole batch: their mean over the processes.

1. all_reduce_gradients(model): called after loss.backward(); all-reduce each gradient.
2. BucketedDDP(model, bucket_bytes): register hooks (e.g. Tensor.register_post_accumulate_grad_hook) that
   put gradients into buckets of about bucket_bytes as backward produces them, and start each full
   bucket's all-reduce right away (dist.all_reduce(..., async_op=True)), overlapping with the rest of
   backward. finish(), called after loss.backward(), waits for them and leaves the mean in every .grad.
   The same object is used for every step.
gloo has no ReduceOp.AVG: sum, then divide. Check it: .venv/bin/python -m pytest exercises -k ddp
"""
import torch.distributed as dist  # noqa: F401  (what you will need)


def all_reduce_gradients(model):
    raise NotImplementedError


class BucketedDDP:
    def __init__(self, model, bucket_bytes: int):
        raise NotImplementedError

    def finish(self):
        raise NotImplementedError
