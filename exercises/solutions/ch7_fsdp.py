"""The book's answer: every parameter cut in G padded pieces; all-gathered into the model before the
forward pass, the whole gradients reduce-scattered into the pieces after backward, then freed."""
import torch
import torch.distributed as dist


class HandFSDP:
    def __init__(self, model):
        self.model = model
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.names, self.pieces, self.shapes, self.uses = [], [], [], []
        # (module, attribute) of every use of each parameter: the tied embedding has two
        uses = {}
        for module in model.modules():
            for attr, p in module._parameters.items():
                if p is not None:
                    uses.setdefault(p, []).append((module, attr))
        for name, p in model.named_parameters():
            piece = -(-p.numel() // self.world)
            flat = torch.cat([p.detach().reshape(-1), p.new_zeros(piece * self.world - p.numel())])
            self.names.append(name)
            self.shapes.append(p.shape)
            self.pieces.append(flat[self.rank * piece:(self.rank + 1) * piece].clone().requires_grad_())
            self.uses.append(uses[p])
        self.whole = []
        self._free()

    def _set(self, i, tensor):
        for module, attr in self.uses[i]:
            module._parameters[attr] = tensor

    def _gather(self, i):
        piece = self.pieces[i].detach()
        flat = piece.new_empty(piece.numel() * self.world)
        dist.all_gather_into_tensor(flat, piece)
        return flat[:self.shapes[i].numel()].view(self.shapes[i])

    def _free(self):
        for i in range(len(self.pieces)):
            self._set(i, torch.nn.Parameter(torch.empty(0), requires_grad=False))
        self.whole = []

    def shards(self):
        return self.pieces

    def loss(self, x, y):
        self.whole = [torch.nn.Parameter(self._gather(i)) for i in range(len(self.pieces))]
        for i, w in enumerate(self.whole):
            self._set(i, w)
        _, loss = self.model(x, y)
        return loss

    def after_backward(self):
        for piece, w in zip(self.pieces, self.whole):
            flat = torch.cat([w.grad.reshape(-1), w.grad.new_zeros(piece.numel() * self.world - w.numel())])
            grad = torch.empty_like(piece)
            dist.reduce_scatter_tensor(grad, flat)  # sum over processes of this process's piece
            piece.grad = grad / self.world
        self._free()

    def full_state_dict(self) -> dict:
        return {name: self._gather(i).clone() for i, name in enumerate(self.names)}
