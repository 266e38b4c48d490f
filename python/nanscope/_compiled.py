"""A torch.compile'd model in the guard's and the replay's diagnosis.

Op-level capture runs a compiled model eagerly (nanscope/_scopes.py): a
fused kernel shows no ops. A step that is finite run eagerly is therefore
run compiled too; non-finite there, the compiler is to blame, and the core
searches for the module to take out of the compiled program
(core/compiled_region.hpp) with Program.alone(): the model runs eagerly but
for one module, compiled with the user's own torch.compile settings."""
import torch
from torch import nn

# The search compiles one module at a time; Dynamo's default cache size
# (8 programs per code object) would quietly run the rest eagerly.
_SEARCH_CACHE_SIZE = 256


def program_of(model):
    """The compiled program of a torch.compile'd module, or None for any other."""
    inner = getattr(model, "_orig_mod", None)
    context = getattr(model, "dynamo_ctx", None)
    if context is None or not isinstance(inner, nn.Module):
        return None
    return Program(model)


class _Compiled(nn.Module):
    """One module, compiled as the user's program compiles, inside a model
    that otherwise runs eagerly (the stance is force_eager around it)."""

    def __init__(self, compiled):
        super().__init__()
        self.compiled = compiled

    def forward(self, *args, **kwargs):
        with torch.compiler.set_stance("default"):
            return self.compiled(*args, **kwargs)


class Program:
    def __init__(self, compiled):
        self._compiled = compiled

    def alone(self, path):
        """Runs the model eagerly but for the module at `path` (named as in the
        model torch.compile wrapped), compiled; returns the function that puts
        the model back as it was."""
        if not path:  # the whole model compiled: the program itself
            return lambda: None
        root = self._compiled._orig_mod
        parent_path, _, name = path.rpartition(".")
        parent = root.get_submodule(parent_path)
        module = root.get_submodule(path)
        # An OptimizedModule over that module, with the user's own compile context (backend, mode, options).
        compiled = type(self._compiled)(module, self._compiled.dynamo_ctx)
        config = torch._dynamo.config
        old_cache_size = getattr(config, "cache_size_limit", None)
        if old_cache_size is not None:
            config.cache_size_limit = max(old_cache_size, _SEARCH_CACHE_SIZE)
        stance = torch.compiler.set_stance("force_eager")
        parent._modules[name] = _Compiled(compiled)

        def restore():
            parent._modules[name] = module
            stance.__exit__(None, None, None)
            if old_cache_size is not None:
                config.cache_size_limit = old_cache_size

        return restore
