"""PyTorch's test_node_post_hook_registered_during_unpack_hook: a node post-hook registered while the
node's saved tensor is unpacked (during backward) receives grad_inputs that must all be None.
Under the lens the hook sees non-None grad_inputs (or the halved result differs)."""
import torch
import autograd_lens

seen = []


class RegisterPostNodeHook(torch.autograd.graph.saved_tensors_hooks):
    def __init__(self):
        def pack(t):
            return t

        def unpack(t):
            node = torch._C._current_autograd_node()

            def hook(outputs, inputs):
                seen.append(all(i is None for i in inputs))
                return tuple(o / 2.0 if o is not None else None for o in outputs)

            node.register_hook(hook)
            return t

        super().__init__(pack, unpack)


def run():
    seen.clear()
    a = torch.rand(3, 3, requires_grad=True, generator=torch.Generator().manual_seed(0))
    var, mean = torch.var_mean(a, dim=0)
    (var + mean).sum().backward()
    ref = a.grad.clone()
    with RegisterPostNodeHook():
        var, mean = torch.var_mean(a, dim=0)
        (var + mean).sum().backward()
    return list(seen), torch.equal(a.grad, ref / 2.0 + ref)


plain = run()
with autograd_lens.Lens():
    lens = run()
print("plain: inputs all None per call", plain[0], "grad as expected", plain[1])
print("lens:  inputs all None per call", lens[0], "grad as expected", lens[1])
print("MISMATCH" if plain != lens else "same")
