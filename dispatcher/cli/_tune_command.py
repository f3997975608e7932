"""`dispatcher tune`: its options, and running the sweep from them."""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import anyio

from dispatcher._core._errors import ConfigurationError, DispatcherError

from ..tuning._recommend import TOLERANCE
from ..tuning._sweep import DEFAULT_REPEATS, DEFAULT_SETTINGS, tune
from ..tuning._workloads import load_workload
from ._machine import machine_info
from ._present import ProgressBar, print_lines, tune_lines
from ._targets import UsageError, add_target_options, parse_overrides, target_from_args

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from dispatcher._core._calls import ToolCall

    from ..tuning._report import TuneReport

__all__ = ["add_parser", "doubling", "parse_range"]


def _seconds(text: str) -> float:
    """A positive number of seconds, for the time options: leaving an option out is how to say "no limit"."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"takes a number of seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"takes a positive number of seconds, got {text!r}; leave it out for no limit")
    return value


def _count(minimum: int, leave_out: str) -> Callable[[str], int]:
    """An integer option of at least `minimum`; the error says what leaving the option out gives."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"takes an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"takes an integer >= {minimum}, got {text!r}; leave it out for {leave_out}"
            )
        return value

    return parse


def doubling(start: int, stop: int) -> list[int]:
    """The settings start, 2*start, 4*start, ... up to stop (stop included even off the sequence).

    Raises:
        ConfigurationError: start < 1 or stop < start.
    """
    if start < 1 or stop < start:
        raise ConfigurationError(f"--from must be >= 1 and --to >= --from, got {start} and {stop}")
    limits = []
    value = start
    while value < stop:
        limits.append(value)
        value *= 2
    limits.append(stop)
    return limits


def parse_range(text: str) -> list[int]:
    """The settings of `--range`: integers separated by commas, each once, in any order (`tune` checks they are >= 1).

    An empty item (``1,,2``, a comma at either end) and a setting listed twice are usage errors rather than
    dropped: both are likelier a typo (``1,2,2,4`` for ``1,2,3,4``) than a wish, and a sweep of hours should
    not run on a guess at what was meant. The order is free: settings are measured in increasing order.

    Raises:
        UsageError: The list is not that.
    """
    example = "e.g. --range 1,2,4,8"
    parts = [part.strip() for part in text.split(",")]
    if any(not part for part in parts):
        raise UsageError(f"--range has an empty item in {text!r} (two commas together, or one at an end); {example}")
    try:
        limits = [int(part) for part in parts]
    except ValueError:
        raise UsageError(f"--range takes integers separated by commas, got {text!r}; {example}") from None
    twice = sorted({limit for limit in limits if limits.count(limit) > 1})
    if twice:
        listed = " and ".join(map(str, twice))
        raise UsageError(f"--range lists {listed} more than once in {text!r}: give each setting once; {example}")
    return limits


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the `tune` subcommand."""
    parser = subparsers.add_parser(
        "tune",
        help="sweep max_concurrency against an MCP server and recommend a setting",
        description=(
            "Run a workload against an MCP server under each setting of max_concurrency (or of the per-server "
            "limit), each several times, measure throughput and p50/p95 latency, and recommend the knee: the "
            f"smallest setting within {TOLERANCE:.0%} of the best throughput per unit of run time."
        ),
    )
    add_target_options(parser)
    load = parser.add_mutually_exclusive_group(required=True)
    load.add_argument(
        "--workload", type=Path, metavar="FILE", help='JSONL: one {"name": ..., "arguments": {...}} a line'
    )
    load.add_argument(
        "--synthetic",
        choices=("reads", "mixed"),
        help="calls of the server's own read-only (and additive) tools, with generated arguments",
    )
    sweep = parser.add_argument_group("the sweep")
    sweep.add_argument("--range", metavar="A,B,...", help="the settings to try (default: 1,2,4,8,16,32,64)")
    sweep.add_argument("--from", dest="start", type=int, metavar="N", help="double from N ...")
    sweep.add_argument("--to", dest="stop", type=int, metavar="M", help="... up to M")
    sweep.add_argument(
        "--per-server", action="store_true", help="sweep the per-server limit instead of the dispatcher-wide one"
    )
    sweep.add_argument(
        "--fleet",
        metavar="REDIS_URL",
        help="sweep the fleet-wide limit (FleetServer.limit) shared through this Redis by --processes processes, "
        "each a dispatcher of its own (needs --url and the fleet extra)",
    )
    sweep.add_argument("--processes", type=int, default=2, metavar="N", help="processes of a --fleet sweep (default 2)")
    sweep.add_argument(
        "--calls", type=_count(1, "100"), default=None, metavar="N", help="measured calls per measurement (default 100)"
    )
    sweep.add_argument(
        "--repeats",
        type=int,
        default=DEFAULT_REPEATS,
        metavar="N",
        help=f"measurements per setting, in rounds over the settings; the table shows their median and spread "
        f"(default {DEFAULT_REPEATS})",
    )
    sweep.add_argument(
        "--max-time",
        type=_seconds,
        metavar="S",
        help="stop after S seconds in all and report the settings measured so far (exit status 124; 130 after "
        "Ctrl-C, 1 when the server stops answering mid-sweep)",
    )
    sweep.add_argument("--duration", type=_seconds, metavar="S", help="measure each setting for at most S seconds")
    sweep.add_argument(
        "--warmup",
        type=_count(0, "two calls per slot"),
        metavar="N",
        help="calls before measuring (default: twice the setting)",
    )
    sweep.add_argument(
        "--clients",
        type=_count(1, "as many as the largest setting"),
        metavar="N",
        help="callers offering calls (default: the largest setting)",
    )
    sweep.add_argument("--call-timeout", type=_seconds, default=60.0, metavar="S", help="per call (default 60)")
    sweep.add_argument("--seed", type=int, default=0, help="seed of the synthetic mixed workload")
    sweep.add_argument(
        "--online",
        action="store_true",
        help="then run the online limit (max_concurrency='auto', up to the largest setting) on the same workload "
        "and report where it settles beside the recommendation",
    )
    out = parser.add_argument_group("output")
    out.add_argument("--json", type=Path, metavar="PATH", help="write the report as JSON")
    out.add_argument("--plot", type=Path, metavar="PATH", help="draw a PNG plot (needs matplotlib)")
    out.add_argument("--quiet", action="store_true", help="no progress")
    parser.set_defaults(handler=_run)


def _settings(args: argparse.Namespace) -> list[int]:
    if args.range is not None and (args.start is not None or args.stop is not None):
        raise UsageError("give either --range or --from/--to, not both")
    if args.range is not None:
        return parse_range(args.range)
    if args.start is not None or args.stop is not None:
        start = 1 if args.start is None else args.start
        return doubling(start, DEFAULT_SETTINGS[-1] if args.stop is None else args.stop)
    return list(DEFAULT_SETTINGS)


def _workload(args: argparse.Namespace) -> list[ToolCall] | Literal["reads", "mixed"]:
    if args.workload is None:
        synthetic: Literal["reads", "mixed"] = args.synthetic
        return synthetic
    try:
        text = args.workload.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the workload: {exc}") from None
    return load_workload(text.splitlines(), source=str(args.workload))


def _options(args: argparse.Namespace) -> dict[str, Any]:
    """The command's options for the JSON file; of --env only the names, as values may be secrets."""
    options = {key: str(value) if isinstance(value, Path) else value for key, value in vars(args).items()}
    del options["handler"]
    options["env"] = [item.partition("=")[0] for item in args.env]
    return options


def _run(args: argparse.Namespace) -> int:
    target = target_from_args(args)
    if args.fleet is not None and args.url is None:
        raise UsageError("--fleet needs --url: every process of the fleet connects to the one server")
    if args.fleet is not None and args.per_server:
        raise UsageError("--fleet sweeps the fleet-wide limit: leave out --per-server")
    if args.fleet is None and args.processes != 2:
        raise UsageError("--processes applies to a --fleet sweep only")
    settings = _settings(args)
    workload = _workload(args)
    overrides = parse_overrides(args.override)
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print(
                "dispatcher tune: --plot needs matplotlib (pip install 'mcp-dispatcher[plot]'); "
                "the sweep runs, but no plot will be drawn",
                file=sys.stderr,
            )
            args.plot = None
    with target.connect(mode=args.mode) as (connect_to, where_to_look):
        bar = ProgressBar(sys.stderr, enabled=not args.quiet)
        run = functools.partial(
            tune,
            connect_to,
            workload,
            settings,
            trusted=args.trusted,
            per_server=args.per_server,
            calls=args.calls if args.calls is not None or args.duration is not None else 100,
            duration=args.duration,
            warmup=args.warmup,
            clients=args.clients,
            call_timeout=args.call_timeout if args.call_timeout > 0 else None,
            server=args.name,
            mode=args.mode,
            connect_timeout=args.timeout if args.timeout > 0 else None,
            seed=args.seed,
            progress=bar,
            fleet=args.fleet,
            processes=args.processes,
            repeats=args.repeats,
            max_time=args.max_time,
            overrides=overrides,
            online=args.online,
        )
        try:
            finished = anyio.run(_until_interrupted, run, bar)
            if finished is None:
                raise KeyboardInterrupt  # a second Ctrl-C: quit now, with one line
            report = finished
        except ConfigurationError:
            raise
        except DispatcherError as exc:
            bar.close()  # before the message, so that the bar does not draw over it
            print(f"dispatcher tune: {exc}", file=sys.stderr)
            hint = where_to_look()
            if hint:
                print(hint, file=sys.stderr)
            return 1
        finally:
            bar.close()
    unwritten: list[str] = []
    if args.json is not None:
        document = {
            "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "options": _options(args),
            **report.to_json(),
            "machine": machine_info(),
        }
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:  # the sweep's table is still printed: the measurements are not lost
            unwritten.append(f"dispatcher tune: cannot write the JSON report to {args.json}: {exc}")
    if args.plot is not None:
        from ._plot import save_plot

        try:
            save_plot(report, args.plot)
        except OSError as exc:
            unwritten.append(f"dispatcher tune: cannot write the plot to {args.plot}: {exc}")
    print_lines(tune_lines(report), sys.stdout)
    for line in unwritten:
        print(line, file=sys.stderr)
    if unwritten:
        return 1
    if report.cut_short == "interrupted":
        return 130
    if report.cut_short == "max_time":
        return 124
    if report.cut_short == "server_lost":
        return 1
    return 0


async def _until_interrupted(run: Callable[..., Awaitable[TuneReport]], bar: ProgressBar) -> TuneReport | None:
    """Run the sweep; the first Ctrl-C ends it with the settings measured so far, a second one at once (None).

    A KeyboardInterrupt raised inside the event loop would end its tasks in disorder; the second Ctrl-C
    cancels the sweep instead, and the caller raises it outside the loop.
    """
    stop = anyio.Event()
    quit_now = False
    report: TuneReport | None = None
    failure: Exception | None = None

    async def watch(scope: anyio.CancelScope) -> None:
        nonlocal quit_now
        try:
            receiver = anyio.open_signal_receiver(signal.SIGINT)
        except (NotImplementedError, ValueError, RuntimeError):  # no signals here (Windows, not the main thread)
            return
        with receiver as signals:
            async for _ in signals:
                if stop.is_set():
                    quit_now = True
                    scope.cancel()
                    return
                stop.set()
                bar.close()
                print(
                    "dispatcher tune: interrupted; reporting the settings measured so far (Ctrl-C again to quit now)",
                    file=sys.stderr,
                )

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch, tg.cancel_scope)
        try:
            report = await run(stop=stop)
        except KeyboardInterrupt:  # before the watcher took over SIGINT: quit now
            quit_now = True
        except Exception as exc:  # raised below, out of the task group that would wrap it
            failure = exc
        tg.cancel_scope.cancel()
    if quit_now:
        return None
    if failure is not None:
        raise failure
    return report
