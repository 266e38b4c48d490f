"""nanscope's lines in Python: records of the logging module's logger
"nanscope", one per line, instead of writes to file descriptor 2 that Jupyter,
contextlib.redirect_stderr and logging handlers never see.

Each record's message is the line as the C++ guard words it ("step 40: first
birth: nan at aten::log ..."), with the fields step (None for a line about no
step), rank and model (None for none). A skip, a birth, a fallback or an early
warning is logged at WARNING, the run's routine lines (where it writes, the
loss scaler's backoff) at INFO.

Until the application configures logging, the records go to sys.stderr as it
is at each record (Jupyter's, or a redirect_stderr's), as the lines always
did; once the root logger has a handler, they reach it by propagation and
only there. logging.getLogger("nanscope").setLevel(logging.WARNING) keeps the
routine lines out; StepGuard(log=False) turns a guard's lines off."""
import logging
import sys

from . import _nanscope

logger = logging.getLogger("nanscope")


class _StderrUntilConfigured(logging.Handler):
    """sys.stderr at each record, while nobody configured logging."""

    def emit(self, record):
        if logging.getLogger().handlers:
            return  # the application's handlers have it (propagation)
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def _emit(text, step, rank, model, warning):
    if logger.isEnabledFor(logging.WARNING if warning else logging.INFO):
        logger.log(logging.WARNING if warning else logging.INFO, "%s", text,
                   extra={"step": step if step >= 0 else None, "rank": rank, "model": model or None})


def install():
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not any(isinstance(h, _StderrUntilConfigured) for h in logger.handlers):
        logger.addHandler(_StderrUntilConfigured())
    _nanscope.route_lines_to(_emit)
