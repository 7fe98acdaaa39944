"""VM request handlers against libvirt's test driver, in this process.

test:///default keeps one in-memory hypervisor per process, shared by every
connection: each test uses its own host name (so its own storage pool) and
VM names of its own.
"""
from __future__ import annotations

import functools
import hashlib
import http.server
import os
import threading
import uuid as uuidlib
import xml.etree.ElementTree as ET

import libvirt
import pytest

from engine.errors import RequestError
from engine.hypervisor.storage import images
from engine.hypervisor.domain.domain_xml import DomainSpec, domain_xml, read_metadata
from tests.support.handlers import call, new_host
from tests.support.image_sources import allow_images


@pytest.fixture
def host(tmp_path, store):
    """A host of this test's own on the test driver, in a cluster whose
    image sources list the test's directory (its image files)."""
    allow_images(store, tmp_path)
    return new_host(tmp_path / "state", store)


def vm_args(image=None, **overrides):
    tag = uuidlib.uuid4().hex[:8]
    args = {"uuid": str(uuidlib.uuid4()), "name": f"vm-{tag}", "vcpus": 1,
            "memory_mb": 64, "disk_gb": 2, "image": image}
    args.update(overrides)
    return args


def domain(host, uuid):
    try:
        return host.conn.lookupByUUIDString(uuid)
    except libvirt.libvirtError:
        return None


def pool_volumes(host):
    return {vol.name(): vol for vol in images.ensure_pool(host).listAllVolumes(0)}


def vm_volumes(host, uuid):
    return [name for name in pool_volumes(host) if name.startswith(uuid)]


# -- build and destroy -------------------------------------------------------

def test_build_twice_gives_one_running_vm_and_destroy_twice_leaves_nothing(host):
    args = vm_args()
    first = call(host, "build", **args)
    second = call(host, "build", **args)
    assert first == second == {"uuid": args["uuid"], "name": args["name"],
                               "host": host.host, "state": "running"}
    assert vm_volumes(host, args["uuid"]) == [args["uuid"] + ".qcow2"]
    disk = pool_volumes(host)[args["uuid"] + ".qcow2"]
    assert disk.info()[1] == 2 * images.GiB
    assert read_metadata(domain(host, args["uuid"])) == {
        "host": host.host, "disk_gb": 2, "image": ""}

    first = call(host, "destroy", uuid=args["uuid"])
    second = call(host, "destroy", uuid=args["uuid"])
    assert first == {"uuid": args["uuid"], "state": "destroyed",
                     "volumes_deleted": [args["uuid"] + ".qcow2"]}
    assert second == {"uuid": args["uuid"], "state": "destroyed", "volumes_deleted": []}
    assert domain(host, args["uuid"]) is None
    assert vm_volumes(host, args["uuid"]) == []
    assert not os.path.exists(os.path.join(host.state_dir, "console", args["uuid"] + ".log"))


def test_build_restarts_a_vm_an_earlier_run_defined_but_did_not_start(host):
    args = vm_args()
    call(host, "build", **args)
    domain(host, args["uuid"]).destroy()        # as if the peer died before create()
    assert call(host, "build", **args)["state"] == "running"


def test_diskless_vm_has_no_volume(host):
    args = vm_args(disk_gb=0)
    assert call(host, "build", **args)["state"] == "running"
    assert vm_volumes(host, args["uuid"]) == []
    call(host, "destroy", uuid=args["uuid"])
    assert domain(host, args["uuid"]) is None


@pytest.mark.parametrize("request_name, state", [
    ("suspend", "paused"), ("stop", "shutoff"), ("start", "running"),
    ("reboot", "running"), ("resume", "running")])
def test_lifecycle_handler_run_twice_ends_in_the_same_state(host, request_name, state):
    args = vm_args()
    call(host, "build", **args)
    if request_name == "resume":
        call(host, "suspend", uuid=args["uuid"])
    if request_name == "start":
        call(host, "stop", uuid=args["uuid"])
    first = call(host, request_name, uuid=args["uuid"], name=args["name"])
    second = call(host, request_name, uuid=args["uuid"], name=args["name"])
    extra = {"stop": {"forced": False},                 # ACPI sufficed
             "reboot": {"rebooted": True}}.get(request_name, {})   # no token: twice
    assert first == second == {"uuid": args["uuid"], "state": state, **extra}
    assert call(host, "vm_info", uuid=args["uuid"])["state"] == state
    call(host, "destroy", uuid=args["uuid"])


def test_reboot_with_the_same_token_runs_once_per_token(host):
    """A re-sent reboot (same token) finds it done; a new token reboots again,
    and so does the same token after the VM was stopped and started."""
    args = vm_args()
    call(host, "build", **args)
    vm = {"uuid": args["uuid"], "name": args["name"]}
    running = {"uuid": args["uuid"], "state": "running"}
    assert call(host, "reboot", **vm, token="t1") == {**running, "rebooted": True}
    assert call(host, "reboot", **vm, token="t1") == {**running, "rebooted": False}
    assert call(host, "reboot", **vm, token="t2") == {**running, "rebooted": True}
    assert call(host, "reboot", **vm, token="t2") == {**running, "rebooted": False}
    call(host, "stop", **vm)        # live metadata ends with the run
    assert call(host, "reboot", **vm, token="t2") == {**running, "rebooted": True}
    call(host, "suspend", **vm)     # paused: reset and resume, then it is recorded
    assert call(host, "reboot", **vm, token="t3") == {**running, "rebooted": True}
    assert call(host, "reboot", **vm, token="t3") == {**running, "rebooted": False}
    with pytest.raises(RequestError, match="bad reboot token"):
        call(host, "reboot", **vm, token=7)
    call(host, "destroy", uuid=args["uuid"])


def test_stop_of_a_paused_vm_and_start_of_a_paused_vm(host):
    args = vm_args()
    call(host, "build", **args)
    call(host, "suspend", uuid=args["uuid"])
    assert call(host, "start", uuid=args["uuid"])["state"] == "running"
    call(host, "suspend", uuid=args["uuid"])
    assert call(host, "stop", uuid=args["uuid"], timeout=1)["state"] == "shutoff"
    with pytest.raises(RequestError, match="cannot suspend .* shutoff"):
        call(host, "suspend", uuid=args["uuid"], name=args["name"])
    with pytest.raises(RequestError, match="cannot resume .* shutoff"):
        call(host, "resume", uuid=args["uuid"])
    call(host, "destroy", uuid=args["uuid"])


@pytest.mark.parametrize("timeout", ["soon", -1, True, float("nan"), float("inf"), [5]])
def test_a_bad_stop_timeout_is_a_request_error_and_leaves_the_vm_running(host, timeout):
    args = vm_args()
    call(host, "build", **args)
    with pytest.raises(RequestError, match="timeout must be a number of seconds >= 0"):
        call(host, "stop", uuid=args["uuid"], timeout=timeout)
    assert call(host, "vm_info", uuid=args["uuid"])["state"] == "running"
    assert call(host, "stop", uuid=args["uuid"], timeout=5) == {
        "uuid": args["uuid"], "state": "shutoff", "forced": False}
    call(host, "destroy", uuid=args["uuid"])


def test_requests_for_an_unknown_vm_fail_clearly_except_destroy(host):
    unknown = str(uuidlib.uuid4())
    for request_name in ("start", "stop", "reboot", "suspend", "resume"):
        with pytest.raises(RequestError, match=f"VM 'ghost' \\({unknown}\\) is not on host"):
            call(host, request_name, uuid=unknown, name="ghost")
    assert call(host, "destroy", uuid=unknown)["state"] == "destroyed"
    assert call(host, "vm_info", uuid=unknown) == {"uuid": unknown, "host": host.host,
                                                   "state": "absent"}


def test_vm_info_is_the_vmlist_record(host):
    args = vm_args(vcpus=2, memory_mb=128, disk_gb=3)
    call(host, "build", **args)
    assert call(host, "vm_info", uuid=args["uuid"]) == {
        "host": host.host, "name": args["name"], "uuid": args["uuid"], "state": "running",
        "vcpus": 2, "memory_mb": 128, "disk_gb": 3, "ha": "none"}
    call(host, "destroy", uuid=args["uuid"])


def test_another_peers_vm_on_a_shared_hypervisor_is_not_ours(host, tmp_path):
    args = vm_args()
    call(host, "build", **args)
    neighbour = new_host(tmp_path / "b", name=host.host + "-b")
    assert call(neighbour, "vm_info", uuid=args["uuid"])["state"] == "absent"
    call(neighbour, "destroy", uuid=args["uuid"])
    assert call(host, "vm_info", uuid=args["uuid"])["state"] == "running"
    call(host, "destroy", uuid=args["uuid"])


# -- errors ------------------------------------------------------------------

def test_a_name_taken_by_another_uuid_is_an_error(host):
    args = vm_args()
    call(host, "build", **args)
    clash = vm_args(name=args["name"])
    with pytest.raises(RequestError, match=f"already has a VM named '{args['name']}' "
                                           f"\\(uuid {args['uuid']}\\)"):
        call(host, "build", **clash)
    assert domain(host, clash["uuid"]) is None
    assert vm_volumes(host, clash["uuid"]) == []
    call(host, "destroy", uuid=args["uuid"])


@pytest.mark.parametrize("override, message", [
    ({"uuid": "not-a-uuid"}, "bad uuid"),
    ({"uuid": None}, "bad uuid"),
    ({"name": ""}, "bad VM name"),
    ({"name": "a/b"}, "bad VM name"),
    ({"vcpus": 0}, "vcpus must be an integer >= 1"),
    ({"vcpus": "2"}, "vcpus must be an integer"),
    ({"memory_mb": True}, "memory_mb must be an integer"),
    ({"disk_gb": -1}, "disk_gb must be an integer >= 0"),
    ({"image": "ftp://example.org/x.img"}, "unsupported scheme"),
    ({"image": "file:///nonexistent/x.img"}, "outside the image sources"),
    ({"image": 7}, "image must be a URL"),
    ({"kernel": "vmlinuz"}, "kernel 'vmlinuz': not an absolute path"),
    ({"initrd": "/etc/hostname"}, "initrd given without kernel"),
    ({"accel": "hvf"}, "accel must be one of kvm, tcg"),
])
def test_bad_build_arguments_are_refused_and_leave_nothing(host, override, message):
    args = vm_args(**override)
    with pytest.raises(RequestError, match=message):
        call(host, "build", **args)
    if isinstance(args["uuid"], str) and len(args["uuid"]) == 36:
        assert domain(host, args["uuid"]) is None
        assert vm_volumes(host, args["uuid"]) == []


def test_a_missing_file_inside_the_image_sources_is_no_such_file(host, tmp_path):
    args = vm_args(image=f"file://{tmp_path / 'nonexistent.img'}")
    with pytest.raises(RequestError, match="no such file on this host"):
        call(host, "build", **args)
    assert domain(host, args["uuid"]) is None


def test_a_define_failure_takes_the_new_volumes_back(host, monkeypatch):
    import engine.hypervisor.host.vm as vm
    monkeypatch.setattr(vm, "domain_xml", lambda spec: "<domain type='test'/>")
    args = vm_args()
    with pytest.raises(RequestError, match="cannot define VM"):
        call(host, "build", **args)
    assert vm_volumes(host, args["uuid"]) == []


def test_domain_xml_keeps_user_input_as_text():
    hostile = "x' /><evil attr=\"1\"/><cmdline>&amp;"
    spec = DomainSpec(uuid=str(uuidlib.uuid4()), name=hostile, vcpus=1, memory_mb=64,
                      disk_gb=1, domain_type="test", kernel="/k", cmdline=hostile,
                      image=hostile, owner="h")
    root = ET.fromstring(domain_xml(spec))
    assert root.find("name").text == hostile
    assert root.find("os/cmdline").text == hostile
    assert root.find(".//evil") is None
    assert root.find("devices/graphics") is None


# -- images ------------------------------------------------------------------

def write_image(path, content=b"peerctl test image\n" * 1000):
    path.write_bytes(content)
    return hashlib.sha256(content).hexdigest()


def backing_path(vol):
    return ET.fromstring(vol.XMLDesc(0)).findtext("backingStore/path")


def test_file_images_are_cached_once_per_content_and_shared(host, tmp_path):
    sha = write_image(tmp_path / "a.raw")
    write_image(tmp_path / "b.raw")             # same bytes, other URL
    first = vm_args(image=f"file://{tmp_path / 'a.raw'}")
    second = vm_args(image=f"file://{tmp_path / 'b.raw'}")
    call(host, "build", **first)
    call(host, "build", **second)
    call(host, "build", **first)

    bases = [name for name in pool_volumes(host) if name.startswith("image-")]
    assert bases == [f"image-{sha}"]
    base_path = pool_volumes(host)[f"image-{sha}"].path()
    for args in (first, second):
        overlay = pool_volumes(host)[args["uuid"] + ".qcow2"]
        assert backing_path(overlay) == base_path
        assert overlay.info()[1] == 2 * images.GiB
        assert read_metadata(domain(host, args["uuid"]))["image"] == args["image"]

    for args in (first, second):
        call(host, "destroy", uuid=args["uuid"])
    assert sorted(pool_volumes(host)) == [f"image-{sha}"]     # the cache stays


def qcow2_header(virtual_size: int) -> bytes:
    """The start of a qcow2 file: magic, version 3, no backing file, 64 KiB
    clusters, ``virtual_size``: enough for the image probe."""
    import struct
    return (b"QFI\xfb" + struct.pack(">IQIIQ", 3, 0, 0, 16, virtual_size)).ljust(4096, b"\0")


@pytest.mark.parametrize("disk_gb, refused", [(2, True), (3, False), (0, False)])
def test_an_image_larger_than_the_disk_is_refused(host, tmp_path, disk_gb, refused):
    """A 3 GiB image on a 2 GiB disk would use more than the allocation: the
    build fails and leaves no domain and no VM volume (the base stays
    cached).  Equal fits; DISK_GB 0 takes the image's size, as before."""
    path = tmp_path / "big.qcow2"
    path.write_bytes(qcow2_header(3 * images.GiB))
    args = vm_args(image=f"file://{path}", disk_gb=disk_gb)
    if refused:
        with pytest.raises(RequestError, match=r"image is 3\.00 GiB \(virtual size\), "
                                               r"larger than the VM's disk of 2 GiB"):
            call(host, "build", **args)
        assert domain(host, args["uuid"]) is None
        assert vm_volumes(host, args["uuid"]) == []
    else:
        assert call(host, "build", **args)["state"] == "running"
        if disk_gb:
            disk = pool_volumes(host)[args["uuid"] + ".qcow2"]
            assert disk.info()[1] == disk_gb * images.GiB
        call(host, "destroy", uuid=args["uuid"])


def test_a_changed_file_is_hashed_again(host, tmp_path):
    image = tmp_path / "img.raw"
    old = write_image(image, b"old" * 100)
    call(host, "build", **vm_args(image=f"file://{image}"))
    new = write_image(image, b"new" * 200)
    os.utime(image, (1, 1))
    call(host, "build", **vm_args(image=f"file://{image}"))
    assert {f"image-{old}", f"image-{new}"} <= set(pool_volumes(host))


def test_a_base_volume_whose_upload_never_finished_is_made_again(host, tmp_path):
    sha = write_image(tmp_path / "img.raw")
    pool = images.ensure_pool(host)
    from engine.hypervisor.domain.domain_xml import volume_xml
    pool.createXML(volume_xml(f"image-{sha}", 10, "raw"), 0)     # torn, not in the index
    call(host, "build", **vm_args(image=f"file://{tmp_path / 'img.raw'}"))
    assert pool_volumes(host)[f"image-{sha}"].info()[1] == os.path.getsize(tmp_path / "img.raw")


def test_concurrent_builds_of_one_image_store_it_once(host, tmp_path):
    sha = write_image(tmp_path / "img.raw")
    url = f"file://{tmp_path / 'img.raw'}"
    results, errors = [], []

    def build():
        try:
            results.append(call(host, "build", **vm_args(image=url)))
        except Exception as exc:       # pragma: no cover - reported below
            errors.append(exc)
    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [r["state"] for r in results] == ["running"] * 4
    assert [n for n in pool_volumes(host) if n.startswith("image-")] == [f"image-{sha}"]


class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        self.server.hits.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def http_server(tmp_path, store):
    root = tmp_path / "www"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_CountingHandler, directory=str(root)))
    server.hits = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    allow_images(store, f"http://127.0.0.1:{server.server_address[1]}/")
    yield server, root, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_images_are_streamed_once_and_cached(host, http_server):
    server, root, base_url = http_server
    sha = write_image(root / "guest.img", b"\x00" * 3_000_000)
    first = vm_args(image=f"{base_url}/guest.img")
    second = vm_args(image=f"{base_url}/guest.img")
    call(host, "build", **first)
    call(host, "build", **second)
    assert server.hits == ["/guest.img"]
    assert [n for n in pool_volumes(host) if n.startswith("image-")] == [f"image-{sha}"]
    assert os.listdir(os.path.join(host.state_dir, "downloads")) == []
    for args in (first, second):
        call(host, "destroy", uuid=args["uuid"])
    assert not any(name.startswith((first["uuid"], second["uuid"]))
                   for name in pool_volumes(host))


def test_an_http_error_is_a_request_error(host, http_server):
    _server, _root, base_url = http_server
    args = vm_args(image=f"{base_url}/missing.img")
    with pytest.raises(RequestError, match="HTTP 404"):
        call(host, "build", **args)
    assert domain(host, args["uuid"]) is None


def test_an_unreachable_http_server_is_a_request_error(host, store):
    allow_images(store, "http://127.0.0.1:9/")
    with pytest.raises(RequestError, match="download failed"):
        call(host, "build", **vm_args(image="http://127.0.0.1:9/none.img"))


class _TruncatingHandler(http.server.BaseHTTPRequestHandler):
    """Announces more bytes than it sends, then closes: a server dying
    mid-download."""
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(3 * len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def truncating_server(store):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _TruncatingHandler)
    server.body = b"\x00" * 300_000
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    allow_images(store, f"http://127.0.0.1:{server.server_address[1]}/")
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def assert_nothing_cached(host, args):
    assert domain(host, args["uuid"]) is None
    assert pool_volumes(host) == {}, "no base image, no VM disk"
    assert os.listdir(os.path.join(host.state_dir, "downloads")) == []
    assert args["image"] not in images._Index(host.state_dir).load()["urls"]


@pytest.fixture(params=["urllib3 as installed", "no length enforcement"])
def urllib3_behaviour(request, monkeypatch):
    """urllib3 2 refuses a short body by itself; urllib3 1.26 (which
    requests >= 2.28 still accepts) hands it over as complete.  The second
    case checks that images.py refuses it on its own."""
    if request.param == "no length enforcement":
        import urllib3.response
        init = urllib3.response.HTTPResponse.__init__

        def lax(self, *args, **kwargs):
            kwargs["enforce_content_length"] = False
            init(self, *args, **kwargs)
        monkeypatch.setattr(urllib3.response.HTTPResponse, "__init__", lax)
    return request.param


def test_a_truncated_download_is_refused_and_caches_nothing(host, truncating_server,
                                                            urllib3_behaviour):
    args = vm_args(image=f"{truncating_server}/guest.img")
    with pytest.raises(RequestError, match="truncated download|IncompleteRead"):
        call(host, "build", **args)
    assert_nothing_cached(host, args)


def test_a_checksum_mismatch_is_refused_and_caches_nothing(host, http_server):
    server, root, base_url = http_server
    sha = write_image(root / "guest.img", b"\x01" * 200_000)
    wrong = hashlib.sha256(b"something else").hexdigest()
    args = vm_args(image=f"{base_url}/guest.img#sha256={wrong}")
    with pytest.raises(RequestError, match=f"sha256 {sha} does not match the expected {wrong}"):
        call(host, "build", **args)
    assert_nothing_cached(host, args)
    assert server.hits == ["/guest.img"]                # the fragment is not sent

    local = vm_args(image=f"file://{root / 'guest.img'}#sha256={wrong}")
    with pytest.raises(RequestError, match="does not match"):
        call(host, "build", **local)
    assert_nothing_cached(host, local)

    with pytest.raises(RequestError, match="#sha256=<64 hex digits>"):
        call(host, "build", **vm_args(image=f"{base_url}/guest.img#md5=abc"))


def test_a_matching_checksum_builds_and_names_the_cached_image(host, http_server):
    server, root, base_url = http_server
    sha = write_image(root / "guest.img", b"\x02" * 200_000)
    first = vm_args(image=f"{base_url}/guest.img#sha256={sha.upper()}")
    assert call(host, "build", **first)["state"] == "running"
    assert [n for n in pool_volumes(host) if n.startswith("image-")] == [f"image-{sha}"]
    # Another URL naming the same content: the cache answers, nothing fetched.
    second = vm_args(image=f"{base_url}/mirror/guest.img#sha256={sha}")
    assert call(host, "build", **second)["state"] == "running"
    assert server.hits == ["/guest.img"]
    for args in (first, second):
        call(host, "destroy", uuid=args["uuid"])


def _self_signed_ca_and_server_cert(directory):
    """A CA and a server certificate it signed for 127.0.0.1 (PEM files)."""
    import datetime
    import ipaddress
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(hours=1))

    def cert(subject, issuer, key, signer, ca, extensions):
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(valid[0]).not_valid_after(valid[1])
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        for extension in extensions:
            builder = builder.add_extension(extension, critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = ec.generate_private_key(ec.SECP256R1()), \
        ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peerctl test CA")])
    ca_cert = cert(ca_name, ca_name, ca_key, ca_key, True, [
        x509.KeyUsage(digital_signature=True, content_commitment=False,
                      key_encipherment=False, data_encipherment=False, key_agreement=False,
                      key_cert_sign=True, crl_sign=True, encipher_only=False,
                      decipher_only=False),
        x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())])
    server_cert = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]),
                       ca_name, server_key, ca_key, False, [
        x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
        x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
        x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())])
    pem = serialization.Encoding.PEM
    paths = {"ca": directory / "ca.pem", "cert": directory / "server.pem",
             "key": directory / "server.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(pem))
    paths["cert"].write_bytes(server_cert.public_bytes(pem))
    paths["key"].write_bytes(server_key.private_bytes(
        pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return paths


@pytest.fixture
def https_server(tmp_path, store):
    """An HTTPS server on 127.0.0.1 with a certificate from a CA of its own;
    yields (server, root, base URL, CA bundle path)."""
    import ssl
    try:
        import cryptography  # noqa: F401
    except ImportError:
        pytest.fail("the https test needs the 'cryptography' package to make its certificate")
    paths = _self_signed_ca_and_server_cert(tmp_path)
    root = tmp_path / "www-tls"
    root.mkdir()
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_CountingHandler, directory=str(root)))
    server.hits = []
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(paths["cert"], paths["key"])
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    allow_images(store, f"https://127.0.0.1:{server.server_address[1]}/")
    yield server, root, f"https://127.0.0.1:{server.server_address[1]}", str(paths["ca"])
    server.shutdown()
    server.server_close()


def test_https_images_are_verified_against_the_ca_bundle_and_cached(host, https_server,
                                                                      monkeypatch):
    server, root, base_url, ca_bundle = https_server
    sha = write_image(root / "guest.img", b"\x03" * 500_000)
    args = vm_args(image=f"{base_url}/guest.img#sha256={sha}")

    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)     # the default CAs only
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    with pytest.raises(RequestError, match="download failed.*CERTIFICATE_VERIFY_FAILED"):
        call(host, "build", **args)
    assert server.hits == [] and pool_volumes(host) == {}

    monkeypatch.setenv("REQUESTS_CA_BUNDLE", ca_bundle)
    assert call(host, "build", **args)["state"] == "running"
    assert server.hits == ["/guest.img"]
    assert [n for n in pool_volumes(host) if n.startswith("image-")] == [f"image-{sha}"]
    call(host, "destroy", uuid=args["uuid"])
