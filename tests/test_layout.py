"""The project's shape: `requests/` holds request handlers and must never
shadow the `requests` HTTP library, in any process of the project."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def python(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_import_requests_from_the_project_root_is_the_http_library():
    where = python("import requests; print(requests.__file__)")
    assert not where.startswith(os.path.join(ROOT, "requests")), where
    assert python("import requests; print(callable(requests.get))") == "True"


def test_handlers_load_without_shadowing_requests():
    out = python("from engine.core.handlers import load_request_handlers\n"
                 "names = sorted(load_request_handlers())\n"
                 "import requests\n"
                 "print(requests.__file__); print(' '.join(names))")
    where, names = out.splitlines()
    assert not where.startswith(os.path.join(ROOT, "requests")), where
    for name in ("ping", "build", "destroy", "start", "stop", "reboot", "suspend", "resume",
                 "claim", "release"):
        assert name in names.split()


def test_peer_process_imports_see_the_http_library():
    out = python("import sys; sys.argv = ['peerctl.py']\n"
                 "import peerctl, engine.peer, engine.hypervisor.vmpublish, engine.placement.rest\n"
                 "import requests; print(requests.__file__)")
    assert not out.startswith(os.path.join(ROOT, "requests")), out


def test_requests_folder_is_not_a_package():
    assert not os.path.exists(os.path.join(ROOT, "requests", "__init__.py"))
