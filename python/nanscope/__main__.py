"""python3 -m nanscope replay SNAPSHOT --model pkg.mod:factory --loss pkg.mod:fn [--json] [--no-write]
python3 -m nanscope inspect SNAPSHOT [--json]

replay: replays a snapshot written from Python: imports the factory that
builds the model and the loss function fn(model, batch), then runs
nanscope-replay's engine (the same report, JSON and exit codes: 0 a verdict,
1 the replay failed, 2 bad input). A batch's objects that are neither tensors
nor JSON values are unpickled, which runs code the file chose: replay only
snapshots from a source you trust.

inspect: shows what a snapshot holds and what replaying it would run (its
model's kind and origin, a TorchScript program's files and size, the weights'
and the batch's names and shapes, pickled objects), without running or
loading any of it (nanscope-replay --inspect; exit codes 0, or 2 bad input)."""
import argparse
import importlib
import sys

from . import _nanscope, inspect_snapshot, replay


def _load(spec, what):
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise SystemExit(f"nanscope replay: --{what} must be MODULE:NAME, not '{spec}'")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        print(f"nanscope replay: cannot load --{what} {spec}: {e}", file=sys.stderr)
        raise SystemExit(2)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m nanscope", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    r = commands.add_parser("replay", help="replay a snapshot of an eager model")
    r.add_argument("snapshot")
    r.add_argument("--model", required=True, help="MODULE:FACTORY, a function that builds the model")
    r.add_argument("--loss", required=True, help="MODULE:FN, fn(model, batch) returns the loss")
    r.add_argument("--json", action="store_true")
    r.add_argument("--no-write", action="store_true", help="do not append the result to the snapshot")
    r.add_argument("--no-bisect", action="store_true")
    r.add_argument("--repeats", type=int, default=3)
    i = commands.add_parser("inspect", help="show what a snapshot holds and would run, without running it")
    i.add_argument("snapshot")
    i.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "inspect":
        try:
            inspection = inspect_snapshot(args.snapshot)
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        print(inspection.to_json() if args.json else inspection, end="\n" if args.json else "")
        return 0
    sys.path.insert(0, "")
    _nanscope.keep_blas_single_threaded()  # as nanscope-replay: OpenBLAS's pool beside ATen's stalls both
    model, loss = _load(args.model, "model"), _load(args.loss, "loss")
    try:
        report = replay(args.snapshot, model, loss, write=not args.no_write, repeats=args.repeats,
                        bisect=not args.no_bisect)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    print(report.to_json() if args.json else report, end="\n" if args.json else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
