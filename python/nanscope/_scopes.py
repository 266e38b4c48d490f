"""Module paths for births in an eager model: while the core's op-level capture
(or an fp32 region, or the first step's scope check) is on, forward hooks on
every module, the root included, open a scope named by the module's
named_modules() path, so an op belongs to the innermost module running it and a
functional call to the module that called it (a loss in the root's own forward
is the root's, ''), as is a module of no parameters made outside the model (a
CrossEntropyLoss a forward builds as it runs). A module of another model is
named '<not in the model> CLASS.PATH'. Off, nothing is hooked: a clean step pays one flag read."""
import contextlib
import warnings

import torch

from . import _nanscope
from . import _sharded


def uncompiled(model):
    """The module torch.compile wrapped (its _orig_mod), else the model itself."""
    inner = getattr(model, "_orig_mod", None)
    return inner if isinstance(inner, torch.nn.Module) else model


def module_paths(model):
    """id(module) -> its dotted path, without a sharding or checkpointing
    wrapper's own parts (the path a plain model gives it); the root is ''."""
    return {id(module): _sharded.clean_name(name) for name, module in model.named_modules()}


OUTSIDE = "<not in the model> "  # the start of a module name outside the guarded model
_COMPILED_WRAPPER_WARNING = r"Using `torch\.compile\(module\)` when there are global hooks"


def other_model_label(module, others):
    """The name another model goes by in births and snapshots: its class,
    CLASS#2 for a second one of that class. `others`: label -> module so far."""
    for label, known in others.items():
        if known is module:
            return label
    label, k = type(module).__name__, 1
    while label in others:
        k += 1
        label = f"{type(module).__name__}#{k}"
    others[label] = module
    return label


def keep_buffers(module, kept):
    """`kept` (id -> (buffer, its value)) gains the module's buffers as they
    are now, where it has no older value of them."""
    for b in module.buffers():
        if id(b) not in kept:
            kept[id(b)] = (b, b.detach().clone())


def put_back(kept):
    """The buffers `kept` holds, back as they were; `kept` is emptied."""
    if not kept:  # every clean step: no re-run kept any
        return
    with torch.no_grad():
        for buffer, before in kept.values():
            buffer.copy_(before)
    kept.clear()


def _always_call():
    """Forward hooks that run when a forward raises too (torch 2.1 on): a
    module whose forward was stopped (non-reentrant checkpointing stops its
    recomputation once it has the tensors it needs) closes its scope. Without
    it, a later module's hook closes the scopes left open inside it."""
    import inspect
    try:
        return {"always_call": True} if "always_call" in inspect.signature(
            torch.nn.modules.module.register_module_forward_hook).parameters else {}
    except (TypeError, ValueError):
        return {}


_ALWAYS = _always_call()


@contextlib.contextmanager
def _hooked(paths, others=None, kept=None):
    open_modules = []  # ids of the modules whose scope is open, innermost last
    # Modules of other models the loss calls (a GAN's critic in the generator's
    # loss): named as outside, by their class and their path in it, never by a
    # path of this model or of another guard's; `others` collects them.
    outside = {}
    wrappers = set()  # ids of modules around the model (torch.compile's, DistributedDataParallel): no scope
    helpers = set()  # ids of modules of no parameters made outside the model (a loss module): no scope
    closed_late = set()  # ids of modules with forward hooks of their own: closed after those
    late_hooks = []  # their closing hooks (one call each; a forward that raised leaves its own)
    others = {} if others is None else others

    def enter(module, inputs):
        if not _nanscope.scopes_active():  # kept for a backward that never came (_closes_after_backward)
            return None
        path = paths.get(id(module))
        if path is None:
            path = outside.get(id(module))
        if path is None and (id(module) in wrappers or id(module) in helpers):
            return None
        if path is None:
            inside = module.named_modules()
            if any(id(m) in paths for _, m in inside):  # a wrapper of the guarded model, not another model
                wrappers.add(id(module))
                return None
            if next(module.parameters(), None) is None:
                # No parameters: a loss or helper made outside the model (a
                # CrossEntropyLoss a forward builds as it runs, the loop's
                # criterion) is no other model. Like a functional call, its
                # ops are the module's that runs it (the root's in a loss).
                helpers.add(id(module))
                if kept is not None:
                    keep_buffers(module, kept)
                return None
            # The outermost module of another model: a re-run is no step of its,
            # so its buffers (BatchNorm's statistics, in train mode) go back
            # after the step (after its backward, which may need them).
            root = OUTSIDE + other_model_label(module, others)
            outside.update({id(m): root + ("." + name if name else "") for name, m in module.named_modules()})
            path = outside[id(module)]
            if kept is not None:
                keep_buffers(module, kept)
        fp32 = _nanscope.push_scope_path(path)
        open_modules.append(id(module))
        if module._forward_hooks:
            # Global forward hooks run before the module's own: its scope closes
            # after them instead, so an op in its forward hook (a clamp, a
            # NaN guard) is its own, not its parent's.
            closed_late.add(id(module))
            handle = module.register_forward_hook(lambda m, i, o: (handle.remove(), close(m))[1], **_ALWAYS)
            late_hooks.append(handle)
        if fp32:  # a module run in fp32 takes its inputs in fp32: module(x.float())
            return tuple(x.float() if torch.is_tensor(x) and x.is_floating_point() else x for x in inputs)
        return None

    def close(module):
        if id(module) not in open_modules:
            return
        # A child that raised inside a forward that caught it left its scope open: close it too.
        while open_modules:
            _nanscope.pop_scope()
            if open_modules.pop() == id(module):
                break

    def leave(module, _inputs, _output):
        if id(module) in closed_late:
            closed_late.discard(id(module))  # its own last forward hook closes it
            return
        close(module)

    pre = torch.nn.modules.module.register_module_forward_pre_hook(enter)
    post = torch.nn.modules.module.register_module_forward_hook(leave, **_ALWAYS)
    try:
        with warnings.catch_warnings():
            # A torch.compile'd model warns, at each call, that global hooks
            # fire for its wrapper too: these open no scope for a wrapper (above).
            warnings.filterwarnings("ignore", message=_COMPILED_WRAPPER_WARNING, category=UserWarning)
            yield
    finally:
        pre.remove()
        post.remove()
        for handle in late_hooks:
            handle.remove()
        while open_modules:  # a forward that raised left its scopes open
            _nanscope.pop_scope()
            open_modules.pop()


def _eager():
    """While nanscope listens (the forensic re-run, an fp32 region, the first
    step's scope check), code compiled with torch.compile runs eagerly: op-level
    capture sees every op there, not a fused kernel, and Dynamo never traces
    nanscope's hooks (a graph break, and a compiled frame it may then give up
    on for good). A torch without compiler stances (1.x) has nothing to undo."""
    set_stance = getattr(getattr(torch, "compiler", None), "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


@contextlib.contextmanager
def listening(paths):
    """Module scopes (eagerly) for as long as the core listens: the watched
    form's forward, which the loop runs, while modules are in fp32."""
    with _eager(), _hooked(paths):
        yield


_rerunning = [0]  # re-runs (forensics, remedies, replay) under way: no loop's model call


def rerunning():
    """A guard is re-running a step: another guard's hooks must not take its
    model calls for the loop's (a GAN's critic run by the generator's re-run)."""
    return _rerunning[0] > 0


_lingering = []  # the last re-run's hooks, kept open until its backward ends


def close_lingering():
    """Closes a re-run's hooks still open (a step or replay has ended; a
    closure's backward ran before its hooks were kept)."""
    while _lingering:
        _lingering.pop().close()


def _closes_after_backward(loss):
    """Activation checkpointing runs modules' forwards again inside the
    backward (torch.utils.checkpoint): a re-run's module hooks stay open until
    the backward of `loss` ends, so those recomputed ops are named too. True
    when `loss` has a backward to wait for; the next re-run closes hooks whose
    backward never came, and a hook finding the core no longer listening does
    nothing."""
    node = getattr(loss, "grad_fn", None) if torch.is_tensor(loss) else None
    if node is None:
        return False
    engine = torch.autograd.Variable._execution_engine
    node.register_hook(lambda *_: engine.queue_callback(close_lingering))
    return True


def call(function, paths, *args, others=None, kept=None, rerun=True):
    """function(*args) as a re-run calls it: with module scopes when the core
    listens for them; `others` (a dict) collects the other models it ran, and
    `kept` their buffers before the first re-run (put_back after the step).
    rerun=False: a closure the core also runs for the live step (a re-run
    only while it captures)."""
    capturing = _nanscope.scopes_active()
    if not (rerun or capturing):
        return function(*args)
    if kept is not None:
        for module in (others or {}).values():
            keep_buffers(module, kept)
    _rerunning[0] += 1
    try:
        if not capturing:
            return function(*args)
        close_lingering()
        with _eager(), contextlib.ExitStack() as hooks:
            hooks.enter_context(_hooked(paths, others, kept))
            out = function(*args)
            if _closes_after_backward(out):
                _lingering.append(hooks.pop_all())
            return out
    finally:
        _rerunning[0] -= 1
