"""Images come only from the image sources (issue 48, security item 3).

A boot whose image is outside the cluster's ``image_sources`` (default:
``images/`` under each host's state directory, no network source), of an
unsupported scheme, or no URL at all, is refused before anything starts:
exit 2 on the command line, 400 from the API, one line naming the URL
once, nothing written.  A whole scheme (``http://``) never reaches a
loopback address or the cluster's own etcd; a prefix listed for it does.
And the host checks again right before it reads: a symlink in ``images/``
pointing out of it, or a redirect out of a listed prefix, is refused there.
"""
from __future__ import annotations

import functools
import http.server
import threading

import pytest

from engine.hypervisor.storage import image_sources
from engine.core import keys
from engine.errors import RequestError
from engine.hypervisor.storage import images
from tests.support.api_client import serving_api
from tests.support.cluster import SMALL_VM, ready_hosts
from tests.support.handlers import call, new_host
from tests.support.image_sources import allow_images

UNPARSEABLE = ["ftp://x/y", "http://", "http://[::1", "not a url", "../../etc/passwd"]


def bad_urls(cluster) -> list[str]:
    """Every image a boot must refuse on a cluster with the default sources."""
    port = cluster.etcd_url.rsplit(":", 1)[1]
    return [*UNPARSEABLE, "file:///etc/passwd", f"http://127.0.0.1:{port}/version"]


def nothing_started(store) -> bool:
    return store.range(keys.auto())[0] == [] and store.range(keys.task())[0] == []


WRITES = ("auto/", "tasks/", "member/", "inbox/", "vms/", "settings/")


def written(store) -> dict:
    """What a boot could have changed: each key and its revision (a live
    peer rewrites its own host record meanwhile)."""
    return {kv.key: kv.mod_revision for prefix in WRITES for kv in store.range(prefix)[0]}


def assert_one_line_naming(line: str, url: str) -> None:
    assert "\n" not in line.strip() and line.count(url) == 1, line


@pytest.fixture
def www(tmp_path):
    """A loopback HTTP server of the test's own: (its base URL, its root,
    the server)."""
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", root, server
    server.shutdown()
    server.server_close()


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        if self.path.startswith("/away/"):     # a redirect to another server
            self.send_response(302)
            self.send_header("Location", self.server.elsewhere + self.path[len("/away"):])
            self.end_headers()
            return
        super().do_GET()

    def log_message(self, *args):
        pass


# -- refused when the boot is planned -------------------------------------------

def test_the_command_line_refuses_each_bad_image_before_anything_starts(cluster, store):
    ready_hosts(cluster, store, ["host1"])
    before = written(store)
    for url in bad_urls(cluster):
        done = cluster.cli("boot", "vm1", "--resources", SMALL_VM, "--image", url, input="")
        assert done.returncode == 2, (url, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("peerctl: "), (url, done.stderr)
        assert_one_line_naming(lines[0], url)
        assert "Traceback" not in done.stderr
    assert written(store) == before and nothing_started(store)


def test_the_api_refuses_each_bad_image_with_a_400_and_writes_nothing(cluster, store):
    client = serving_api(cluster, store)
    before = written(store)
    for url in bad_urls(cluster):
        status, doc, _ = client.post("/v1/vms", {"names": ["vm1"], "resources": SMALL_VM,
                                                 "image": url})
        assert status == 400, (url, status, doc)
        assert list(doc) == ["error"], doc
        assert_one_line_naming(doc["error"], url)
    assert written(store) == before and nothing_started(store)


def test_a_whole_scheme_never_reaches_loopback_but_a_listed_prefix_does(cluster, store, www):
    base, root, _server = www
    (root / "guest.img").write_bytes(b"a guest\n" * 512)
    ready_hosts(cluster, store, ["host1"])
    url = f"{base}/guest.img"
    allow_images(store, "http://")
    done = cluster.cli("boot", "vm1", "--resources", SMALL_VM, "--image", url, input="")
    assert done.returncode == 2 and "127.0.0.1 is a loopback address" in done.stderr, \
        done.stderr
    etcd = cluster.etcd_url + "/version"
    done = cluster.cli("boot", "vm1", "--resources", SMALL_VM, "--image", etcd, input="")
    assert done.returncode == 2 and done.stderr.count(etcd) == 1, done.stderr
    assert nothing_started(store)

    allow_images(store, base + "/")
    booted = cluster.cli_json("boot", "vm1", "--resources", SMALL_VM, "--image", url)
    assert booted["state"] == "done", booted
    # the listed prefix is this server, not every port of its address
    done = cluster.cli("boot", "vm2", "--resources", SMALL_VM, "--image", etcd, input="")
    assert done.returncode == 2, done.stderr


def test_an_image_in_the_hosts_state_directory_boots_with_the_default(cluster, store):
    ready_hosts(cluster, store, ["host1"])
    assert cluster.cli_json("images", "sources")["sources"] == [
        {"source": "images",
         "allows": "files under this directory of each host's state directory"}]
    folder = cluster.state_dir("host1").absolute() / "images"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "guest.img").write_bytes(b"a guest\n" * 512)
    booted = cluster.cli_json("boot", "vm1", "--resources", SMALL_VM,
                              "--image", f"file://{folder / 'guest.img'}")
    assert booted["state"] == "done", booted


def test_a_whole_scheme_never_reaches_the_clusters_etcd_on_any_address():
    etcd = "https://10.1.2.3:2379"
    guarded = image_sources.addresses_of_urls(etcd)
    for url in (f"{etcd}/v3/kv/range", "http://10.1.2.3:2380/members"):
        why = image_sources.refusal(url, ["http://", "https://"], guarded=guarded)
        assert why is not None and "is the cluster's own etcd" in why and why.count(url) == 1
    assert image_sources.refusal("http://10.1.2.4/x.img", ["http://"], guarded=guarded) is None
    assert image_sources.refusal(f"{etcd}/x.img", ["https://10.1.2.3:2379/"],
                                 guarded=guarded) is None, "listed explicitly"


# -- the setting ---------------------------------------------------------------

def test_images_sources_shows_adds_removes_and_refuses_a_bad_source(cluster, store, tmp_path):
    doc = cluster.cli_json("images", "sources", "--add", str(tmp_path), "--add",
                           "https://Mirror.example/cloud/")
    assert [s["source"] for s in doc["sources"]] == [
        "images", str(tmp_path), "https://mirror.example/cloud/"]
    before = written(store)
    for bad in ("../../etc", "ftp://x/y", "http://[::1", "~/images"):
        done = cluster.cli("images", "sources", "--add", bad)
        assert done.returncode == 2 and done.stderr.count(bad) == 1, (bad, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1
    assert written(store) == before
    doc = cluster.cli_json("images", "sources", "--remove", "images")
    assert [s["source"] for s in doc["sources"]] == [
        str(tmp_path), "https://mirror.example/cloud/"]
    done = cluster.cli("images", "sources", "--set")
    assert done.returncode == 0 and "no image sources" in done.stdout


# -- checked again on the host ----------------------------------------------------

def test_the_host_refuses_a_symlink_in_images_pointing_out_of_it(store, tmp_path):
    host = new_host(tmp_path / "state", store)
    folder = tmp_path / "state" / "images"
    folder.mkdir(parents=True)
    (folder / "guest.img").write_bytes(b"a guest\n" * 512)
    (folder / "passwd.img").symlink_to("/etc/passwd")
    base = {"vcpus": 1, "memory_mb": 64, "disk_gb": 1}
    url = f"file://{folder / 'passwd.img'}"
    with pytest.raises(RequestError, match="outside the image sources") as refused:
        call(host, "build", uuid="5b0c1f3e-0f35-4c57-9a47-7e3b8f0c5a01", name="evil",
             image=url, **base)
    assert str(refused.value).count(url) == 1
    assert images._Index(host.state_dir).load()["urls"] == {}, "nothing read, nothing cached"
    built = call(host, "build", uuid="5b0c1f3e-0f35-4c57-9a47-7e3b8f0c5a02", name="good",
                 image=f"file://{folder / 'guest.img'}", **base)
    assert built["state"] == "running"
    call(host, "destroy", uuid=built["uuid"])


def test_the_host_refuses_a_redirect_out_of_a_listed_prefix(store, tmp_path, www):
    base, root, server = www
    other = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
    threading.Thread(target=other.serve_forever, daemon=True).start()
    try:
        (root / "guest.img").write_bytes(b"a guest\n" * 512)
        server.elsewhere = f"http://127.0.0.1:{other.server_address[1]}"
        allow_images(store, base + "/")
        host = new_host(tmp_path / "state", store)
        with pytest.raises(RequestError, match="outside the image sources"):
            call(host, "build", uuid="5b0c1f3e-0f35-4c57-9a47-7e3b8f0c5a03", name="away",
                 vcpus=1, memory_mb=64, disk_gb=1, image=f"{base}/away/guest.img")
        assert images._Index(host.state_dir).load()["urls"] == {}
    finally:
        other.shutdown()
        other.server_close()

