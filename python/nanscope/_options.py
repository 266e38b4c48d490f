"""The guard's options in StepGuard's signature and help, made from their one
declaration in the C++ core: the list nanscope-train's flags come from too."""
import inspect
import textwrap

from ._nanscope import guard_keyword_list


def with_guard_keywords(cls):
    """Adds every guard option to cls.__init__'s signature (keyword-only, with
    its default) and to the class's help; __init__ takes them as **options."""
    options = guard_keyword_list()
    signature = inspect.signature(cls.__init__)
    own = [p for p in signature.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    guard = [inspect.Parameter(o["name"], inspect.Parameter.KEYWORD_ONLY, default=o["default"]) for o in options]
    cls.__init__.__signature__ = signature.replace(parameters=own + guard)
    lines = ["", "    The guard's options (keyword-only) and their defaults:", ""]
    for o in options:
        lines.append(f"    {o['name']}={o['default']!r}")
        lines += textwrap.wrap(o["help"], width=78, initial_indent="        ", subsequent_indent="        ")
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"
    return cls
