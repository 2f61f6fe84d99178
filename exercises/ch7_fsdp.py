"""Chapter 7 exercise: FSDP by hand, exact in fp32 against one process (gloo, 2 processes).

Write HandFSDP(model). Each process keeps only its 1/G of every parameter (pad it to a multiple of G,
then cut it in G pieces); the whole weights exist only while they are used.
  shards()          this process's pieces, leaf tensors that require grad: the test's AdamW steps them;
  loss(x, y)        all-gather the current weights (dist.all_gather_into_tensor) into the model, then
                    return model(x, y)'s loss;
  after_backward()  called after loss.backward(): reduce-scatter the whole gradients
                    (dist.reduce_scatter_tensor, then divide by G) into each shard's .grad, and free the
                    whole weights;
  full_state_dict() {name: whole tensor} of the current weights, as model.named_parameters() names them.
The embedding is tied with the output layer: one parameter used twice.
Check it: .venv/bin/python -m pytest exercises -k fsdp
"""
import torch.distributed as dist  # noqa: F401  (what you will need)


class HandFSDP:
    def __init__(self, model):
        raise NotImplementedError

    def shards(self):
        raise NotImplementedError

    def loss(self, x, y):
        raise NotImplementedError

    def after_backward(self):
        raise NotImplementedError

    def full_state_dict(self) -> dict:
        raise NotImplementedError
