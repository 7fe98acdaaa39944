"""console: this terminal on a VM's serial console, through its host's
libvirt or a peer's API (the rule: engine/operations/consoles.py)."""
from __future__ import annotations

import contextlib
import os

from engine.core.validate import parse_duration
from engine.errors import UsageError
from engine.operations import consoles

from .context import say

_LEFT = {"escape": "\nLeft the console", "closed": "Console closed: the VM stopped",
         "timeout": "Left the console: --timeout reached",
         "stdin": "Left the console: the terminal closed"}


def cmd_console(ctx) -> int:
    args = ctx.args
    if ctx.api is not None:         # a workstation: the remote's API and token
        if args.via == "libvirt":
            raise UsageError("--via libvirt needs this machine to reach the hosts' libvirt: "
                             "not through a remote")
        token, route = ctx.remote.token, consoles.console_route(
            ctx, args.name, "api", ",".join(args.api.split(",") if args.api
                                            else ctx.remote.urls))
    else:
        token = _token_from(args.token_file)    # a bad file: exit 2 before anything opens
        route = consoles.console_route(ctx, args.name, args.via, args.api)
    tty = not args.no_tty and os.isatty(0)
    with _attached(ctx, route, token) as console:
        say(f"Connected to VM {console.name} on {console.host} ({console.where}). "
            + ("Escape character is ^]" if tty else
               "Plain byte stream: it ends with the console, a signal"
               + (f" or --timeout {args.timeout:g}" if args.timeout is not None else "")))
        ended = console.run(tty=tty, timeout=args.timeout)
    say(_LEFT.get(ended.reason, f"Left the console on signal {ended.signum}")
        + f" (VM {console.name} on {console.host})")
    return ended.exit_code


@contextlib.contextmanager
def _attached(ctx, route: consoles.Route, token: str | None):
    """The console ``route`` leads to, attached; for the API, a token of
    this command's own when none was given, deleted when the block ends."""
    if route.via == "libvirt":
        from engine.hypervisor.host import console
        vm = route.vm
        yield console.attach(route.uri, vm["uuid"], vm["name"], vm["host"])
        return
    from engine.web import console_client
    with contextlib.ExitStack() as stack:
        if token is None:
            token = stack.enter_context(consoles.console_token(ctx))
        cacert = ctx.remote.cacert if ctx.remote else ctx.settings.get("cacert")
        yield console_client.attach(route.apis, route.name, token, cacert or None)


def _token_from(path: str | None) -> str | None:
    from .remote_config import read_token
    return read_token(path, "--token-file") if path else None


def register(commands) -> None:
    sub = commands.add(
        "console", "an interactive serial console to a VM",
        "python peerctl.py console web1\n"
        "printf 'uname -a\\n' | python peerctl.py console web1 --no-tty --timeout 5\n"
        "python peerctl.py console web1 --api https://h1:8443 --token-file ~/.peerctl-token",
        cmd_console,
        "Attach this terminal to the serial console of one VM. It goes through its "
        "host's libvirt when that host is this machine, else through a peer's API "
        "(the websocket GET /v1/vms/NAME/console): this machine needs no libvirt "
        "access. --via says otherwise. Through the API it uses --token-file, or mints "
        "an operator token of its own with this command's etcd credentials, renewed "
        "while the session runs and deleted when it ends (a killed command's expires "
        "within a minute). "
        "The console is forced: a client holding it already is cut off. On a "
        "terminal, the terminal is raw and Ctrl-] leaves (exit 0). With --no-tty, or "
        "when stdin is not a terminal, stdin is passed to the guest byte for byte "
        "(Ctrl-] too) and its end does not leave: the session ends when the console "
        "closes, on SIGINT/SIGTERM (exit 128+signal) or after --timeout (exit 0). "
        "The guest's output is on stdout, peerctl's lines on stderr. The session "
        "ends with exit 0 when the VM stops; a VM that is not running, a host or API "
        "that does not answer (exit 3), a refused or revoked token (exit 4) or a "
        "hypervisor offering no console fail with one line.")
    sub.add_argument("name", metavar="NAME", help="the VM: VMGLOB or HOSTGLOB/VMGLOB, "
                                                  "matching exactly one VM")
    sub.add_argument("--no-tty", action="store_true",
                     help="a plain byte stream even on a terminal: no raw mode, no escape")
    sub.add_argument("--timeout", metavar="SECONDS",
                     type=lambda text: parse_duration(text, "--timeout"),
                     help="leave after this long (exit 0); for scripts that pipe a command "
                          "in and read its output")
    sub.add_argument("--via", choices=consoles.VIA, default="auto",
                     help="auto (default): the host's libvirt when the VM's host is this "
                          "machine, else a peer's API when one publishes it, else libvirt; "
                          "api: always a peer's API; libvirt: always the host's libvirt")
    sub.add_argument("--api", metavar="URL[,URL...]", default=os.environ.get("PEERCTL_API"),
                     help="the API to go through, the first that answers "
                          "[$PEERCTL_API; default: the VM's host's peer's, then any "
                          "other's, as their host records publish them]; with a token "
                          "file, no etcd is read")
    sub.add_argument("--token-file", metavar="FILE",
                     default=os.environ.get("PEERCTL_TOKEN_FILE"),
                     help="an operator token's secret for the API [$PEERCTL_TOKEN_FILE; "
                          "default: one minted for the session]")
