"""A sharded model (FSDP2's fully_shard, or FSDP1's FullyShardedDataParallel
with use_orig_params=True) as the C++ guard sees it: each parameter is this
rank's shard of it, a plain tensor, and its gradient this rank's shard of the
reduced gradient. The guard's arithmetic (unscale, finiteness, norms, clip,
skip) then runs on local tensors with no collective hidden in it; the one
collective per step that makes norms whole and verdicts common is the
guard's own (nanscope/_distributed.py).

Names are the model's as the user wrote it: the wrappers' own path parts
(_fsdp_wrapped_module, _checkpoint_wrapped_module, _orig_mod) are left out of
parameter, buffer and module names, so births and snapshots name the modules
a single-process run of the same model names, and replay loads a snapshot
into the plain model."""
import sys
import weakref

import torch

WRAPPER_PARTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


def clean_name(name):
    """A dotted name without the wrappers' parts: 'layers.0._fsdp_wrapped_module.attn' -> 'layers.0.attn'."""
    if "_" not in name:
        return name
    return ".".join(part for part in name.split(".") if part not in WRAPPER_PARTS)


# A model is sharded only by a torch.distributed module the program imported
# already: nothing is imported here (bookworm's torch 1.13 cannot even import
# its FSDP under Python 3.11).
def _dtensor_type():
    for name in ("torch.distributed.tensor", "torch.distributed._tensor"):
        module = sys.modules.get(name)
        if module is not None and hasattr(module, "DTensor"):
            return module.DTensor
    return None


def _fsdp1_type():
    module = sys.modules.get("torch.distributed.fsdp")
    return getattr(module, "FullyShardedDataParallel", None) if module is not None else None


def kind(model):
    """'fsdp2' (parameters are DTensors), 'fsdp1' (a FullyShardedDataParallel
    inside), or None for a model that is not sharded (or no module: the guard says so)."""
    if not isinstance(model, torch.nn.Module):
        return None
    dtensor = _dtensor_type()
    if dtensor is not None and any(isinstance(p, dtensor) for p in model.parameters()):
        return "fsdp2"
    fsdp1 = _fsdp1_type()
    if fsdp1 is not None and any(isinstance(m, fsdp1) for m in model.modules()):
        for m in model.modules():
            if isinstance(m, fsdp1) and not getattr(m, "_use_orig_params", True):
                raise ValueError("nanscope.StepGuard: a FullyShardedDataParallel model needs use_orig_params=True "
                                 "(the guard checks, clips and names each parameter of yours, not FSDP's flat one)")
        return "fsdp1"
    return None


class _GradLinks:
    """FSDP2 gives each sharded parameter (a DTensor) a new gradient DTensor
    after its reduce-scatter; the guard holds the parameter's local tensor,
    whose .grad is made the gradient's local tensor each time (FSDP2 calls
    post-accumulate-grad hooks after it). Whatever cleared one side's gradient
    (the guard before a re-run, the loop's zero_grad) clears the other's when
    the model's next forward begins, so FSDP2 accumulates into nothing stale."""

    def __init__(self, model, pairs):
        self.pairs = pairs  # (DTensor parameter, its local tensor)
        self.handles = [p.register_post_accumulate_grad_hook(self._linked(local)) for p, local in pairs
                        if p.requires_grad]
        self.handles.append(model.register_forward_pre_hook(self._forward_begins))

    @staticmethod
    def _linked(local):
        def hook(p):
            local.grad = None if p.grad is None else p.grad._local_tensor
        return hook

    def _forward_begins(self, _module, _inputs):
        for p, local in self.pairs:
            if p.grad is None or local.grad is None:
                p.grad = None
                local.grad = None


_links = weakref.WeakKeyDictionary()  # a FSDP2 model -> its _GradLinks


def named_parameters(model, trainable=False):
    """(name, tensor) for each parameter the guard steers (those that require
    a gradient when `trainable`): this rank's shard of it for a sharded model,
    under the name the unwrapped model gives it."""
    items = [(clean_name(name), p) for name, p in model.named_parameters() if p.requires_grad or not trainable]
    dtensor = _dtensor_type()
    if dtensor is None or not any(isinstance(p, dtensor) for _, p in items):
        return items
    if model not in _links:
        _links[model] = _GradLinks(model, [(p, p._local_tensor) for p in model.parameters() if isinstance(p, dtensor)])
    return [(name, p._local_tensor if isinstance(p, dtensor) else p) for name, p in items]


def buffer_tree(model):
    """Where model.named_buffers() comes from: each module's own buffer dict
    (which the module writes into), the module held weakly, and its clean name
    prefix. The guard reads it once per model and lists the buffers from these
    dicts at every step (its transaction takes them then; walking
    named_modules() each time cost a small model's step a quarter of a
    millisecond). A module added to the model after its first step is not
    looked at for buffers; one that writes a buffer it did not have then is
    said as written but not saved."""
    # The module held weakly: the guard's model must not keep a module the
    # loop dropped alive. Its name prefix is clean already; a buffer's own
    # name has no dots, so the two joined are clean too.
    return [(module._buffers, weakref.ref(module), _dotted(clean_name(prefix)))
            for prefix, module in model.named_modules()]


def _dotted(prefix):
    return prefix + "." if prefix else ""


def module_names(model):
    return [clean_name(name) for name, _ in model.named_modules()]


def gathered_parameters(model):
    """The whole parameters of a sharded model, gathered from every rank (a
    collective: every rank calls it), as plain tensors under their plain
    names; they take the model's size once more in memory."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    whole = {clean_name(name): value for name, value in whole.items()}
    out = []
    for name, _ in named_parameters(model):
        if name not in whole:
            raise RuntimeError(f"nanscope: the gathered state of the sharded model holds no parameter {name!r}")
        out.append((name, whole[name].detach()))
    return out


def is_sharded(model):
    return kind(model) is not None

