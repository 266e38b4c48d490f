"""The guard in a PyTorch-Ignite Engine: guard.attach(trainer), as Ignite's own
handlers attach.

The update function keeps its shape (the one create_supervised_trainer
builds) with the guard's watched calls in it: guard.backward(loss, batch) and
guard.step(optimizer). Attaching runs each update under guard.autocast() and
tells the engine what the guard did with it: engine.state.step_result, and on
a skipped iteration GuardEvents.STEP_SKIPPED. The handlers that read the
update's output as a training loss, Ignite's metrics (RunningAverage, ...) and
TerminateOnNan, leave a skipped iteration out: its NaN was named and dropped,
and ending the run is the guard's call (the step that stops it terminates the
engine). Every other handler runs as before and can read step_result.

Ignite has no public way to wrap an engine's update or the handlers attached
to it, so this reads two of its attributes (_process_function and
_event_handlers, the same from 0.4 to 0.5) and says so if they are gone."""
import functools
import weakref

from . import _logging

_guard_events = None


def guard_events():
    """nanscope.GuardEvents: made on first use, so that only a loop that uses
    Ignite imports it."""
    global _guard_events
    if _guard_events is None:
        from ignite.engine import EventEnum

        class GuardEvents(EventEnum):
            """Events of an Engine the guard is attached to. STEP_SKIPPED: the
            iteration's update was skipped (engine.state.step_result says where
            the NaN/Inf was born)."""
            STEP_SKIPPED = "step_skipped"

        _guard_events = GuardEvents
    return _guard_events


def attach(guard, engine):
    from ignite.engine import Events

    if not callable(getattr(engine, "_process_function", None)) or not isinstance(
            getattr(engine, "_event_handlers", None), dict):
        raise TypeError(f"nanscope: attach() needs an ignite.engine.Engine (0.4 or 0.5), got {engine!r}")
    if isinstance(engine._process_function, _GuardedUpdate):
        raise ValueError("nanscope: a guard is attached to this engine already (one guard per engine)")
    events = guard_events()
    if events.STEP_SKIPPED not in engine._allowed_events:
        engine.register_events(*events)
    update = _GuardedUpdate(guard, engine._process_function)
    engine._process_function = update
    engine.add_event_handler(Events.ITERATION_COMPLETED, update.after_iteration)
    # Handlers attached after this call are found when the run starts.
    engine.add_event_handler(Events.STARTED, _mute_readers, update)
    _mute_readers(engine, update)


class _GuardedUpdate:
    """The engine's update function, run under the guard's autocast; it notes
    what the guard did with the iteration."""

    def __init__(self, guard, update):
        functools.update_wrapper(self, update)
        self._guard = weakref.ref(guard)  # the engine does not keep the guard (and its run.h5) alive
        self._update = update
        self.skipped = False

    def __call__(self, engine, batch):
        guard = self._guard()
        if guard is None:
            raise ValueError("nanscope: the guard attached to this engine was collected; keep a reference to it")
        view = guard._integration()
        before = view.last_result
        self.skipped = False
        engine.state.step_result = None
        with guard.autocast():
            output = self._update(engine, batch)
        result = view.last_result
        if result is not before:  # this iteration ended a step: accumulation ends it on some only
            engine.state.step_result = result
            self.skipped = bool(result.skipped)
        return output

    def after_iteration(self, engine):
        result = engine.state.step_result
        if result is None:
            return
        if self.skipped:
            engine.fire_event(guard_events().STEP_SKIPPED)
        if result.stop:
            _logging.logger.warning("nanscope: the guard stopped the run at iteration %d: %s; terminating the engine",
                                    engine.state.iteration, result.stop_reason)
            engine.terminate()


class _UnlessSkipped:
    """A handler that reads the update's output as a training loss, not called
    on a skipped iteration. Keeps Ignite's _parent link, so the engine's
    has_event_handler and remove_event_handler still find the handler."""

    def __init__(self, handler, root, update):
        self._handler = handler
        self._root = root  # a bound method lives as long as this wrapper does
        self._parent = weakref.ref(root)
        self._update = update

    def __call__(self, *args, **kwargs):
        if not self._update.skipped:
            return self._handler(*args, **kwargs)
        return None


def _mute_readers(engine, update):
    from ignite.engine import Events
    from ignite.handlers import TerminateOnNan
    from ignite.metrics import Metric

    handlers = engine._event_handlers[Events.ITERATION_COMPLETED]
    for i, (handler, args, kwargs) in enumerate(handlers):
        if isinstance(handler, _UnlessSkipped):
            continue
        root = handler._parent() if hasattr(handler, "_parent") else handler
        if isinstance(getattr(root, "__self__", root), (TerminateOnNan, Metric)):
            handlers[i] = (_UnlessSkipped(handler, root, update), args, kwargs)
