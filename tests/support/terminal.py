"""A command running on a pty that is its controlling terminal, as in a
terminal window: what it draws, what is typed on it, how it ends."""
from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

from tests.support import ROOT, wait_for

__all__ = ["Terminal"]


class Terminal:
    """A command running on a pty of its own, as in a terminal window."""

    def __init__(self, argv, env, columns=120, lines=40):
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))

        def controlling_terminal():
            os.setsid()
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        env = {**env, "TERM": "xterm"}
        env.pop("COLUMNS", None)
        env.pop("LINES", None)
        self.process = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                        env=env, cwd=ROOT, preexec_fn=controlling_terminal)
        os.close(slave)
        self.master = master
        self.output = b""

    def read(self, timeout=0.1) -> None:
        while select.select([self.master], [], [], timeout)[0]:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:         # EIO: the other side is closed
                return
            if not chunk:
                return
            self.output += chunk
            timeout = 0

    def text(self) -> str:
        return self.output.decode(errors="replace")

    def wait_for_text(self, pattern, timeout=60):
        def seen():
            self.read()
            return re.search(pattern, self.text())
        try:
            return wait_for(seen, timeout=timeout, interval=0,
                            what=f"{pattern!r} on the terminal")
        except AssertionError as exc:     # what it showed instead, and whether it ended
            raise AssertionError(f"{exc}; exit {self.process.poll()}, it showed: "
                                 f"{self.text()[-800:]!r}") from None

    def frames(self) -> list[str]:
        """The progress view's frames so far.  Each redraw moves the cursor up
        over exactly the previous frame and clears to the end of the screen;
        an AssertionError says where that was not so."""
        parts = re.split(r"\x1b\[(\d+)F\x1b\[J", self.text().replace("\r\n", "\n"))
        frames = [parts[0]]
        for up, frame in zip(parts[1::2], parts[2::2]):
            assert int(up) == frames[-1].count("\n"), \
                f"moved up {up} lines over a frame of {frames[-1].count(chr(10))}"
            frames.append(frame)
        return frames

    def type(self, data: bytes) -> None:
        os.write(self.master, data)

    def finish(self, timeout=30) -> int:
        deadline = time.monotonic() + timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            self.read()
        self.read()
        code = self.process.wait(max(deadline - time.monotonic(), 1))
        os.close(self.master)
        return code
