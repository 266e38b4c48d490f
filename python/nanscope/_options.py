"""The guard's options as Python holds them, made from their one declaration
in the C++ core (the list nanscope-train's flags come from too): run_dir and
amp, which every loop sets, are StepGuard's own keywords; the rest live in
nanscope.GuardConfig, one object, as a Trainer's live in TrainingArguments."""
import dataclasses
import inspect
import textwrap

from ._nanscope import check_guard_keywords
from ._nanscope import guard_keyword_list

LOOP_OPTIONS = ("run_dir", "amp")
DEFAULT_RUN_DIR = "nanscope-run"  # where a guard given no run_dir writes

# GradScaler's keywords, each with what the guard takes instead.
_GRADSCALER_WORDS = {
    "init_scale": "the guard keeps fp16's loss scale itself (GuardConfig(fallback_min_scale=...) is its floor)",
    "growth_factor": "the guard keeps fp16's loss scale itself",
    "backoff_factor": "the guard keeps fp16's loss scale itself",
    "growth_interval": "the guard keeps fp16's loss scale itself",
    "enabled": "amp='off' runs without mixed precision",
    "device": "the guard follows the model's device",
    "scheduler": ("it never touches your scheduler (call scheduler.step() in your loop as before; the "
                  "guard's LR cuts leave the groups' LR alone)"),
}


def _config_class():
    options = [o for o in guard_keyword_list() if o["name"] not in LOOP_OPTIONS]
    fields = [(o["name"], object, dataclasses.field(default=o["default"])) for o in options]
    lines = ["The guard's options beyond StepGuard's own keywords, as TrainingArguments",
             "holds a Trainer's: StepGuard(model, optimizer, run_dir=..., amp='bf16',",
             "config=nanscope.GuardConfig(fallback='off', clip=1.0)). Frozen; change one",
             "with dataclasses.replace(config, clip=0.5). Each is nanscope-train's flag of",
             "the same name (rollback_every here is --rollback-every there).", ""]
    for o in options:
        lines.append(f"{o['name']}={o['default']!r}")
        lines += textwrap.wrap(o["help"], width=78, initial_indent="    ", subsequent_indent="    ")
    cls = dataclasses.make_dataclass("GuardConfig", fields, frozen=True, kw_only=True,
                                     namespace={"__post_init__": _check, "given": _given})
    cls.__module__ = "nanscope"
    cls.__doc__ = "\n".join(lines) + "\n"
    return cls


def _check(config):
    check_guard_keywords(_given(config), "nanscope.GuardConfig")


def _given(config):
    """The options set to other than their defaults: what reaches the guard."""
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if getattr(config, f.name) != f.default}


GuardConfig = _config_class()
CONFIG_OPTIONS = frozenset(f.name for f in dataclasses.fields(GuardConfig))


def guard_options(config, run_dir, amp, who="nanscope.StepGuard"):
    """The options given, for the C++ guard: the config's and the loop's own."""
    if config is None:
        config = GuardConfig()
    elif not isinstance(config, GuardConfig):
        raise TypeError(f"{who}: config must be a nanscope.GuardConfig, got {config!r}")
    options = config.given()
    options["run_dir"] = run_dir
    if amp is not None:
        options["amp"] = amp
    return options


def keywords_of(function):
    """The keyword-only parameters of `function` (what a TypeError lists as taken)."""
    return [p.name for p in inspect.signature(function).parameters.values() if p.kind is p.KEYWORD_ONLY]


def refuse_misplaced(keywords, who="nanscope.StepGuard", own=()):
    """A TypeError naming what to use instead of each keyword the guard does not take."""
    if not keywords:
        return
    name = next(iter(keywords))
    value = keywords[name]
    if name in CONFIG_OPTIONS:
        raise TypeError(f"{who}: {name}= is an option of nanscope.GuardConfig: "
                        f"{who}(..., config=nanscope.GuardConfig({name}={value!r}))")
    if name in _GRADSCALER_WORDS:
        raise TypeError(f"{who}: {name}= is no keyword of the guard: {_GRADSCALER_WORDS[name]}")
    raise TypeError(f"{who}() got an unexpected keyword argument '{name}'; its keywords are "
                    f"{', '.join(own)}, and nanscope.GuardConfig holds the guard's options "
                    f"({', '.join(sorted(CONFIG_OPTIONS))})")
