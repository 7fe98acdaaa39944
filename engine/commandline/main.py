"""Dispatch: build the parser from the noun modules, run one command, and
map every failure onto an exit code and one line (the one ladder)."""
from __future__ import annotations

import gc
import importlib
import os
import signal
import sys

from engine.errors import (Detached, Failed, PeerctlError, StoreRefused, StoreUnavailable,
                           Unavailable, UsageError)

from .context import Context, me, say, warn_unreadable
from .options import RAW, Commands, Parser, global_options
from .settings import TLS_FLAGS, settings_for

__all__ = ["build_parser", "run", "main"]

# The noun modules, in the order --help lists them, and the commands each
# registers: a command loads only its own noun (as pip's commands_dict does),
# --help and an unknown command load them all.
NOUNS = {"vms": ("vmlist", "boot", "destroy", "start", "stop", "reboot", "suspend", "resume",
                 "ha"),
         "console": ("console",),
         "adoption": ("adopt", "unmanage"),
         "groups": ("group",),
         "hosts": ("hostlist", "hoststats", "ping"),
         "membership": ("host", "join"),
         "moves": ("migrate", "drain", "undrain", "evacuate"),
         "balance": ("balance",),
         "images": ("images",),
         "code": ("code", "version"),
         "upgrade": ("upgrade", "cluster"),
         "tasks": ("tasks", "task", "wait", "abort"),
         "backups": ("backup", "restore"), "snapshots": ("snapshot",), "replicas": ("replicate",), "leases": ("lease",),
         "placement": ("placement",),
         "aside": ("aside",),
         "tokens": ("token",),
         "admin": ("scrub", "tls", "etcd"), "local": ("peer", "up", "down"), "serve": ("serve",),
         "remotes": ("remote",)}
NOUN_OF = {command: noun for noun, commands in NOUNS.items() for command in commands}
# commands that run on this machine, never through a peer's API: a peer and
# the local cluster, the CA's files, a new machine joining, etcd's own file,
# and the list of remotes itself
LOCAL = frozenset(("peer", "up", "down", "serve", "tls", "join", "etcd", "remote"))
# global options that take a value, to find the command after them
_VALUED = ("--etcd", "--cluster", "--format", "--conf", "--api", "--token-file", "--remote",
           *(f"--{name}" for name in TLS_FLAGS))
# options whose value may start with '-': `--sort -memory_mb`, `--start -1h`
DASHED_VALUES = ("--sort", "--start", "--end", "--from")

EPILOG = """\
examples:
  python peerctl.py up                       # a local etcd and 3 test peers
  python peerctl.py boot web1 web2 --resources VCPU:1,MEMORY_MB:256,DISK_GB:1
  python peerctl.py vmlist 'host1/*'
  python peerctl.py --format json hostlist
  python peerctl.py stop 'host17/*sql*' --yes
  python peerctl.py migrate db1 --to host2
  python peerctl.py evacuate host1 --yes
  python peerctl.py tasks

Patterns: a VM pattern is HOSTGLOB/VMGLOB or VMGLOB (shell globs, quote them);
a host pattern is a glob on host names.
Settings: flags, then PEERCTL_ETCD / PEERCTL_CLUSTER / PEERCTL_FORMAT, then a
running `up` in ./state, then the config file (--conf, PEERCTL_CONF,
/etc/peerctl/peerctl.conf if it exists, else conf/peerctl.conf).
Exit codes: 0 ok; 1 failed or nothing matched; 2 usage error; 3 etcd
unreachable; 4 permission denied by etcd (names the role); 130 detached from
an automation by Ctrl-C (it goes on).
TLS: --cacert/--cert/--key, or PEERCTL_CACERT / PEERCTL_CERT / PEERCTL_KEY,
or cacert/cert/key in the config file (docs/security.md).
Run `python peerctl.py COMMAND --help` for a command's options and an example."""


def build_parser(only: str | None = None) -> Parser:
    """The whole parser, or with ``only`` (a noun) that noun's commands alone."""
    called = me()       # "python peerctl.py", or "peerctl" as the console script
    parser = Parser(prog="peerctl.py" if called.endswith(".py") else "peerctl",
                    description="peerctl: a masterless cluster "
                    "manager for KVM hosts. State lives in etcd; every host runs a peer.",
                    epilog=EPILOG.replace("python peerctl.py", called), formatter_class=RAW)
    parser.add_argument("--etcd", metavar="URLS",
                        help="comma-separated etcd endpoints [$PEERCTL_ETCD, "
                             "default http://127.0.0.1:2379]")
    parser.add_argument("--cluster", metavar="NAME",
                        help="cluster name, keys live under /peerctl/NAME/ "
                             "[$PEERCTL_CLUSTER, default 'default']")
    parser.add_argument("--format", choices=("table", "json"),
                        help="output format [$PEERCTL_FORMAT, default table]")
    parser.add_argument("--conf", metavar="FILE",
                        help="config file [$PEERCTL_CONF, default /etc/peerctl/peerctl.conf "
                             "if it exists, else conf/peerctl.conf]")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    for name, what in TLS_FLAGS.items():
        parser.add_argument(f"--{name}", metavar="FILE", help=f"{what} [$PEERCTL_{name.upper()}]")
    parser.add_argument("--api", dest="remote_api", metavar="URL[,URL...]",
                        help="run the command through this peer's API (the next when one "
                             "does not answer), with no etcd access [$PEERCTL_API]")
    parser.add_argument("--token-file", dest="remote_token_file", metavar="FILE",
                        help="the API token's secret, for --api; only its owner may read "
                             "it [$PEERCTL_TOKEN_FILE]")
    parser.add_argument("--remote", metavar="NAME",
                        help="run through the API of remote NAME (remote add) [$PEERCTL_REMOTE; "
                             "default: the one remote use chose, else etcd]")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    commands = Commands(subparsers, global_options(), called)
    for noun in ([only] if only else NOUNS):
        importlib.import_module(f"{__package__}.{noun}").register(commands)
    parser.command_names = list(subparsers.choices)
    return parser


def noun_of(argv: list[str]) -> str | None:
    """The noun of the command ``argv`` names; None when it names none (or
    asks for the top-level help)."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _VALUED:
            skip = True
        elif not arg.startswith("-"):
            return NOUN_OF.get(arg)
        elif arg in ("-h", "--help"):
            return None
    return None


def values_after_options(argv: list[str]) -> list[str]:
    """``--sort -memory_mb``, ``--start -1h``: a value, not an option."""
    fixed = []
    for arg in argv:
        if fixed and fixed[-1] in DASHED_VALUES and arg.startswith("-") and arg != "--":
            fixed[-1] = f"{fixed[-1]}={arg}"
        else:
            fixed.append(arg)
    return fixed


def run(argv=None, one_shot: bool = False) -> int:
    """Parse, run one command, map every failure onto an exit code and one line.

    ``one_shot``: this process ends with the command (:func:`main`)."""
    argv = values_after_options(sys.argv[1:] if argv is None else list(argv))
    debug = "--debug" in argv
    try:
        parser = build_parser(noun_of(argv))
        args = parser.parse_args(argv)
        debug = bool(getattr(args, "debug", False))
        if one_shot and args.command != "peer":
            _collect_rarely()
        if not args.command:
            say(f"usage: {me()} [--etcd URLS] [--cluster NAME] [--format table|json] "
                f"COMMAND ...\ncommands: {' '.join(parser.command_names)}\n"
                f"peerctl: no command given (see {me()} --help)")
            return UsageError.exit_code
        ctx = Context(args, settings_for(args))
        _choose_way(ctx, args)
        if args.command != "peer":
            signal.signal(signal.SIGPIPE, signal.SIG_DFL)   # `vmlist | head` is fine
            from engine.core import values      # a peer logs them instead
            values.set_reporter(warn_unreadable)
        return args.func(ctx)
    except Failed as exc:
        if exc.result is not None and "ctx" in locals() and ctx.json:
            ctx.emit(exc.result)
        say(f"peerctl: {exc}")
        return exc.exit_code
    except Unavailable as exc:
        if debug:
            import traceback
            traceback.print_exc()
        code = exc.exit_code
        if isinstance(exc, StoreRefused):
            code = exc.exit_code    # etcd answered: its own words
        elif isinstance(exc, StoreUnavailable):
            waited = f" (no answer in {exc.timed_out:g} s)" if exc.timed_out else ""
            exc = f"etcd unreachable at {ctx.settings['etcd'] if 'ctx' in locals() else '?'}{waited}"
        elif exc.where is not None:
            exc = f"{exc.service} unreachable at {exc.where}"
        say(f"peerctl: {exc}")
        return code
    except UsageError as exc:
        say(f"peerctl: {exc}")
        return exc.exit_code
    except Detached as exc:
        return exc.exit_code
    except PeerctlError as exc:
        if debug:
            import traceback
            traceback.print_exc()
        say(f"peerctl: {exc}".splitlines()[0])
        return exc.exit_code
    except KeyboardInterrupt:
        say("peerctl: interrupted")
        return Detached.exit_code
    except Exception as exc:
        if debug:
            import traceback
            traceback.print_exc()
        say(f"peerctl: {type(exc).__name__}: {exc}".splitlines()[0]
            + ("" if debug else " (--debug shows the traceback)"))
        return Failed.exit_code


def _choose_way(ctx, args) -> None:
    """Through a remote's API, or straight on etcd (remote_config.py); a
    local command given a remote explicitly is refused."""
    from .remote_config import remote_for
    local = args.command in LOCAL or (args.command == "host" and
                                      getattr(args, "what", None) == "add")
    explicit = any(getattr(args, name, None) is not None
                   for name in ("remote_api", "remote_token_file", "remote"))
    if local:
        if explicit:
            raise UsageError(f"{args.command} runs on this machine, not through an API "
                             "(--api, --token-file and --remote are for the other commands)")
        return
    remote = remote_for(args)
    if remote is not None:
        ctx.through(remote)


def _collect_rarely() -> None:
    """A command that ends with its process: the cyclic garbage collector
    would only walk, again and again, the tens of thousands of acyclic rows
    of a listing (about 10 ms of vmlist's 10,000 VMs), so it runs rarely
    and skips what the imports made.  A peer keeps the default."""
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)


def main(argv=None) -> None:
    code = run(argv, one_shot=True)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    # client library threads (watches, keepalives) must not hold the exit
    os._exit(code)

