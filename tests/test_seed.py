"""The NoCloud seed: files in, an ISO that pycdlib reads back with the same
names and bytes; every bad input refused in one line naming it."""
import base64
import hashlib
import importlib.util
import io
import json
import shutil
import subprocess

import pytest

pytest.importorskip("cryptography", reason="cryptography is not installed")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ed25519, rsa  # noqa: E402

from engine.errors import RequestError, UsageError  # noqa: E402
from engine.hypervisor.domain import seed  # noqa: E402

# build_iso imports pycdlib on use; until the project's requirements list it,
# a machine without it skips the ISO tests instead of failing them.
needs_pycdlib = pytest.mark.skipif(importlib.util.find_spec("pycdlib") is None,
                                   reason="pycdlib is not installed")

UUID = "6f1c3c59-4a53-4d8f-9d1e-2b7d3e0c9a11"
MACS = ["52:54:00:12:34:01", "52:54:00:12:34:02"]


def ed25519_line(comment: str = "") -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    line = key.public_bytes(serialization.Encoding.OpenSSH,
                            serialization.PublicFormat.OpenSSH).decode("ascii")
    return f"{line} {comment}" if comment else line


def read_iso(image: bytes):
    import pycdlib
    iso = pycdlib.PyCdlib()
    iso.open_fp(io.BytesIO(image))
    return iso


def content(iso, **where) -> bytes:
    out = io.BytesIO()
    iso.get_file_from_iso_fp(out, **where)
    return out.getvalue()


def names(iso) -> set[str]:
    return {child.rock_ridge.name().decode() for child in iso.list_children(iso_path="/")
            if not child.is_dot() and not child.is_dotdot()}


def write(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


# -- the ISO -------------------------------------------------------------------

@needs_pycdlib
def test_the_iso_holds_meta_data_and_user_data_under_their_real_names():
    key = ed25519_line("alice@laptop")
    user_data = b"#cloud-config\nruncmd:\n - [touch, /tmp/seeded]\n"
    files = seed.seed_files(UUID, "web-1.example", user_data, [key])
    iso = read_iso(seed.build_iso(files))
    try:
        assert iso.pvd.volume_identifier.rstrip(b" \x00") == b"cidata"
        assert names(iso) == {"meta-data", "user-data"}
        for name in ("meta-data", "user-data"):
            assert content(iso, rr_path=f"/{name}") == files[name]
            assert content(iso, joliet_path=f"/{name}") == files[name]
        assert content(iso, iso_path="/METADATA.;1") == files["meta-data"]
        assert content(iso, iso_path="/USERDATA.;1") == user_data
        meta = json.loads(content(iso, rr_path="/meta-data"))
    finally:
        iso.close()
    assert meta == {"instance-id": UUID, "local-hostname": "web-1.example",
                    "public-keys": [key]}


def test_meta_data_is_indented_json_without_keys_when_none_are_given():
    files = seed.seed_files(UUID, "vm", None, [])
    assert json.loads(files["meta-data"]) == {"instance-id": UUID, "local-hostname": "vm"}
    assert files["meta-data"].startswith(b'{\n "instance-id"')


def test_without_user_data_the_seed_carries_an_empty_cloud_config():
    files = seed.seed_files(UUID, "vm", None, [])
    assert files["user-data"] == seed.DEFAULT_USER_DATA
    assert files["user-data"].startswith(b"#cloud-config\n")


@needs_pycdlib
def test_network_config_only_with_two_nics():
    assert "network-config" not in seed.seed_files(UUID, "vm", None, [])
    assert "network-config" not in seed.seed_files(UUID, "vm", None, [], MACS[:1])
    files = seed.seed_files(UUID, "vm", None, [], [mac.upper() for mac in MACS])
    iso = read_iso(seed.build_iso(files))
    try:
        assert names(iso) == {"meta-data", "user-data", "network-config"}
        network = json.loads(content(iso, rr_path="/network-config"))
        assert content(iso, joliet_path="/network-config") == files["network-config"]
    finally:
        iso.close()
    assert network == {"version": 2, "ethernets": {
        "nic0": {"match": {"macaddress": MACS[0]}, "set-name": "nic0", "dhcp4": True},
        "nic1": {"match": {"macaddress": MACS[1]}, "set-name": "nic1", "dhcp4": True}}}


def test_a_bad_mac_is_a_callers_bug():
    with pytest.raises(ValueError, match="MAC"):
        seed.seed_files(UUID, "vm", None, [], ["52:54:00:12:34", MACS[0]])


@needs_pycdlib
def test_maximal_inputs_stay_under_max_seed_bytes():
    key = ed25519_line()
    # '"' doubles in JSON: the worst a comment can do to meta-data.
    comment = '"' * (seed.MAX_SSH_KEY_FILE // seed.MAX_SSH_KEYS - len(key) - 2)
    args = seed.check_seed_args({
        "hostname": ".".join(["a" * 63] * 3 + ["b" * 61]),
        "user_data": b"x" * seed.MAX_USER_DATA,
        "ssh_keys": [f"{key} {comment}"] * seed.MAX_SSH_KEYS})
    assert sum(len(line) + 1 for line in args["ssh_keys"]) == seed.MAX_SSH_KEY_FILE
    macs = [f"52:54:00:00:00:{index:02x}" for index in range(seed.MAX_MACS)]
    files = seed.seed_files(UUID, args["hostname"], args["user_data"], args["ssh_keys"], macs)
    image = seed.build_iso(files)
    assert len(image) <= seed.MAX_SEED_BYTES
    iso = read_iso(image)
    try:
        assert content(iso, rr_path="/user-data") == args["user_data"]
    finally:
        iso.close()


# -- fingerprints --------------------------------------------------------------

def test_fingerprint_is_openssh_sha256_of_the_blob(tmp_path):
    line = ed25519_line("bob@host")
    blob = base64.b64decode(line.split()[1])
    digest = hashlib.sha256(blob).digest()
    expected = "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
    assert seed.fingerprint(line) == expected
    assert seed.fingerprint_hex(line) == digest.hex()
    if shutil.which("ssh-keygen"):
        path = write(tmp_path, "id.pub", line + "\n")
        done = subprocess.run(["ssh-keygen", "-lf", path], capture_output=True, text=True,
                              timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[1] == seed.fingerprint(line)


# -- --user-data ---------------------------------------------------------------

def test_user_data_is_read_as_it_is(tmp_path):
    data = b"#!/bin/sh\necho hi\n\x00\xff"
    assert seed.read_user_data(write(tmp_path, "ud", data)) == data
    assert seed.read_user_data(write(tmp_path, "max", b"y" * seed.MAX_USER_DATA)) \
        == b"y" * seed.MAX_USER_DATA


def test_user_data_missing_file_says_why(tmp_path):
    path = str(tmp_path / "nope")
    with pytest.raises(UsageError) as caught:
        seed.read_user_data(path)
    assert str(caught.value) == f"--user-data {path}: cannot read it (No such file or directory)"


def test_user_data_directory_is_refused(tmp_path):
    with pytest.raises(UsageError, match="is a directory") as caught:
        seed.read_user_data(str(tmp_path))
    assert "\n" not in str(caught.value)


def test_user_data_too_large_is_refused(tmp_path):
    path = write(tmp_path, "big", b"z" * (seed.MAX_USER_DATA + 1))
    with pytest.raises(UsageError) as caught:
        seed.read_user_data(path)
    assert str(caught.value) == f"--user-data {path} is 65537 bytes; at most 65536"


def test_user_data_from_a_device_is_refused_not_read():
    with pytest.raises(UsageError, match="not a regular file"):
        seed.read_user_data("/dev/zero")


# -- --ssh-key -----------------------------------------------------------------

def test_ssh_keys_skip_blanks_and_comments_and_keep_the_key_comment(tmp_path):
    first, second = ed25519_line("alice@laptop  work"), ed25519_line()
    rsa_line = rsa.generate_private_key(public_exponent=65537, key_size=1024).public_key() \
        .public_bytes(serialization.Encoding.OpenSSH,
                      serialization.PublicFormat.OpenSSH).decode()
    path = write(tmp_path, "keys.pub",
                 f"# team keys\n\n  {first}  \n{second}\n\t\n{rsa_line} ci\n")
    assert seed.read_ssh_keys(path) == [first, second, f"{rsa_line} ci"]


def test_ssh_key_missing_directory_empty_and_large_files_are_refused(tmp_path):
    missing = str(tmp_path / "nope.pub")
    with pytest.raises(UsageError, match=r"cannot read it \(No such file or directory\)"):
        seed.read_ssh_keys(missing)
    with pytest.raises(UsageError, match="is a directory"):
        seed.read_ssh_keys(str(tmp_path))
    with pytest.raises(UsageError, match="no public key in it"):
        seed.read_ssh_keys(write(tmp_path, "empty.pub", "# nothing\n\n"))
    with pytest.raises(UsageError, match="no public key in it"):
        seed.read_ssh_keys(write(tmp_path, "zero.pub", b""))
    big = write(tmp_path, "big.pub", b"#" * (seed.MAX_SSH_KEY_FILE + 1))
    with pytest.raises(UsageError) as caught:
        seed.read_ssh_keys(big)
    assert str(caught.value) == f"--ssh-key {big} is 65537 bytes; at most 65536"


def test_an_invalid_key_line_is_refused_by_its_number(tmp_path):
    good = ed25519_line()
    kind, blob = good.split()
    broken = f"{kind} {blob[:-8]}AAAAAAA="        # base64, not a key
    for bad in (broken, "ssh-ed25519 not*base64", "just-one-field",
                f'no-pty,command="x" {good}', f"ssh-rsa {blob}"):
        path = write(tmp_path, "bad.pub", f"# mine\n{good}\n{bad}\n")
        with pytest.raises(UsageError) as caught:
            seed.read_ssh_keys(path)
        message = str(caught.value)
        assert message.startswith(f"--ssh-key {path} line 3: not an OpenSSH public key ("), \
            message
        assert "\n" not in message


def test_more_than_max_ssh_keys_are_refused(tmp_path):
    key = ed25519_line()
    path = write(tmp_path, "many.pub", (key + "\n") * (seed.MAX_SSH_KEYS + 1))
    with pytest.raises(UsageError, match="at most 32"):
        seed.read_ssh_keys(path)


def test_ssh_keys_not_utf8_are_refused(tmp_path):
    with pytest.raises(UsageError, match="not UTF-8"):
        seed.read_ssh_keys(write(tmp_path, "latin.pub", ed25519_line().encode() + b" caf\xe9"))


# -- hostnames -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["vm", "web-1", "a.b.c", "X9", "a" * 63,
                                  ".".join(["a" * 63] * 3 + ["b" * 61])])
def test_good_hostnames_pass(name):
    assert seed.check_hostname(name) == name


@pytest.mark.parametrize("name", ["", "-vm", "vm-", "v_m", "vm.", ".vm", "a..b", "a" * 64,
                                  ".".join(["a" * 63] * 4), "vm 1", "vé"])
def test_bad_hostnames_are_refused_in_one_line(name):
    with pytest.raises(UsageError) as caught:
        seed.check_hostname(name)
    assert "not a valid hostname" in str(caught.value) and "\n" not in str(caught.value)


# -- what the request handler receives ------------------------------------------

def test_check_seed_args_normalises():
    key = ed25519_line("me")
    assert seed.check_seed_args(None) is None
    assert seed.check_seed_args({"hostname": "vm", "user_data": "#cloud-config\né: 1\n",
                                 "ssh_keys": [f"  {key}\n"]}) == {
        "hostname": "vm", "user_data": "#cloud-config\né: 1\n".encode(), "ssh_keys": [key]}
    assert seed.check_seed_args({"hostname": "vm"}) == {
        "hostname": "vm", "user_data": None, "ssh_keys": []}
    assert seed.check_seed_args({"hostname": "vm", "user_data": b"\x00",
                                 "ssh_keys": []})["user_data"] == b"\x00"


@pytest.mark.parametrize("value, words", [
    ("vm", "expected a mapping"),
    ([], "expected a mapping"),
    ({}, "no hostname"),
    ({"hostname": 5}, "expected a string"),
    ({"hostname": "bad_name"}, "bad_name"),
    ({"hostname": "vm", "extra": 1}, "unknown field"),
    ({"hostname": "vm", "user_data": 7}, "user_data"),
    ({"hostname": "vm", "user_data": b"x" * (seed.MAX_USER_DATA + 1)}, "at most 65536"),
    ({"hostname": "vm", "user_data": "x" * (seed.MAX_USER_DATA + 1)}, "at most 65536"),
    ({"hostname": "vm", "user_data": "\udc80"}, "not valid Unicode"),
    ({"hostname": "vm", "ssh_keys": "ssh-ed25519 AAAA"}, "expected a list"),
    ({"hostname": "vm", "ssh_keys": [5]}, "ssh_keys[0]"),
    ({"hostname": "vm", "ssh_keys": ["ssh-ed25519 AAAA"]}, "ssh_keys[0]: not an OpenSSH"),
    ({"hostname": "vm", "ssh_keys": ["ssh-ed25519 AAAA\nssh-rsa x"]}, "ssh_keys[0]"),
])
def test_check_seed_args_refuses_malformed(value, words):
    with pytest.raises(RequestError) as caught:
        seed.check_seed_args(value)
    assert words in str(caught.value) and "\n" not in str(caught.value)


def test_check_seed_args_refuses_too_many_or_too_large_keys():
    key = ed25519_line()
    with pytest.raises(RequestError, match="at most 32"):
        seed.check_seed_args({"hostname": "vm", "ssh_keys": [key] * (seed.MAX_SSH_KEYS + 1)})
    huge = f"{key} {'c' * seed.MAX_SSH_KEY_FILE}"
    with pytest.raises(RequestError, match="more than 65536 bytes"):
        seed.check_seed_args({"hostname": "vm", "ssh_keys": [huge]})


@needs_pycdlib
def test_a_seed_from_checked_args_round_trips():
    args = seed.check_seed_args({"hostname": "db", "user_data": "#cloud-config\n{}\n",
                                 "ssh_keys": [ed25519_line("x")]})
    files = seed.seed_files(UUID, args["hostname"], args["user_data"], args["ssh_keys"], MACS)
    iso = read_iso(seed.build_iso(files))
    try:
        for name, data in files.items():
            assert content(iso, rr_path=f"/{name}") == data
    finally:
        iso.close()
