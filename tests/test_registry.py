"""The registry of automation kinds loads once, whoever asks first."""
from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT

ASK_AT_ONCE = """
import threading
from engine.core import registry

at_once = threading.Barrier(8)
found, failed = [], []

def ask():
    at_once.wait()
    try:
        found.append(registry.latest("ping")[0])
    except Exception as exc:
        failed.append(str(exc))

threads = [threading.Thread(target=ask) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(len(found), failed)
"""


def test_threads_that_ask_at_once_in_a_fresh_process_all_find_the_kind():
    for _ in range(3):
        ran = subprocess.run([sys.executable, "-c", ASK_AT_ONCE], cwd=ROOT, text=True,
                             capture_output=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip() == "8 []"
