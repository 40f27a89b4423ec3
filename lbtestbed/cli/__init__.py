"""``lbt``: the command line of lbtestbed.

- ``parser``: the arguments of every command, checked where they are given
- ``commands``: each command reads its spec, hands the Experiment to one function of the experiment layer
  and prints what it returns
- ``output``: exit codes (0 success, 1 the run failed, 2 bad input), one-line messages, JSON

``main`` runs one command and turns what it raises into an exit code and one line on stderr.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence

from lbtestbed.cli.output import EXIT_BAD_INPUT, EXIT_FAILED, error
from lbtestbed.cli.parser import build_parser
from lbtestbed.experiment.errors import FULL_DISK, BadInput, Failed
from lbtestbed.model.reader import SpecError

__all__ = ["build_parser", "main"]


def _interrupted(sig: int, frame: object) -> None:
    from lbtestbed.cluster.processes import Interrupted

    raise Interrupted(sig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    passthrough: list[str] = []
    if "--" in argv:  # lbt load --locust ... -- ARGS: ARGS go to locust as they are
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1 :]
    args = parser.parse_args(argv)
    args.locust_args = passthrough
    if passthrough and args.command != "load":
        return error(f"{passthrough[0]!r} after --: only lbt load --locust takes options after --")
    if threading.current_thread() is threading.main_thread():
        # SIGTERM and SIGHUP end a command as Ctrl-C does: what it started (a cluster) is stopped on the way
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupted)
    if getattr(args, "dispatchers", None) is not None:  # an override of the spec's key, after the others
        args.set = [*args.set, f"policy.dispatchers={args.dispatchers}"]
    try:
        return int(args.func(args))
    except (SpecError, BadInput) as e:
        return error(str(e), EXIT_BAD_INPUT)
    except Failed as e:
        return error(str(e), EXIT_FAILED)
    except BrokenPipeError:  # the reader went away (lbt ... | head): stop quietly, as a shell's commands do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that flushing stdout at exit does not raise again
        return 128 + signal.SIGPIPE
    except KeyboardInterrupt as e:
        sig = getattr(e, "signal", signal.SIGINT)
        print(f"lbt: interrupted ({signal.Signals(sig).name})", file=sys.stderr)
        return 128 + sig
    except Exception as e:  # a bug, not bad input: say so in one line; LBT_DEBUG=1 shows the traceback
        if isinstance(e, OSError) and e.errno in FULL_DISK:  # a write that found no room: said as such
            where = f"{e.filename}: " if e.filename else ""
            return error(f"{where}the disk is full ({e.strerror}): nothing more was written", EXIT_FAILED)
        if os.environ.get("LBT_DEBUG"):
            raise
        print(
            f"lbt: internal error: {type(e).__name__}: {e} (set LBT_DEBUG=1 for the traceback)",
            file=sys.stderr,
        )
        return EXIT_FAILED
