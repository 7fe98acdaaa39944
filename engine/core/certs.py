"""A cluster's own certificate authority, and the certificates it issues.

``up --tls`` and ``peerctl.py certs`` make, in one directory:

- ``ca.pem`` / ``ca-key.pem``: the authority (EC P-256, ten years);
- ``etcd.pem`` / ``etcd-key.pem``: etcd's certificate, for its client and peer
  ports alike (server and client use, SANs ``127.0.0.1``, ``localhost`` and
  whatever names are asked for); or, one per member, ``etcd-<member>.pem`` /
  ``etcd-<member>-key.pem``, each with a key of its own and naming its
  member's address too;
- ``libvirt-<host>.pem`` / ``libvirt-<host>-key.pem``: a host's libvirt
  certificate, for its libvirtd's TLS port and for its libvirtd as the
  client of another host's during a migration (server and client use; CN
  the host, SANs its address and name), with ``libvirt/<host>/`` holding
  the same under the names libvirt looks for (:func:`issue_libvirt`);
- ``<user>.pem`` / ``<user>-key.pem``: one client certificate per identity.
  Its common name is the etcd user (etcd takes a client certificate's CN as
  the user name); its organizational unit is the user's role (``peer``,
  ``operator``, ``viewer``, ``root``), so a command can name the role etcd
  refused without asking etcd.

Keys are written 0600.  Issuing again over an existing file keeps it: the
authority is made once, and a certificate already issued is reused; but an
etcd certificate asked for with other names than it has is issued again
(a new key, the same authority), and :attr:`Issued.status` says so.
:func:`describe` reads a certificate back (subject, role, names, expiry) for
listings.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from engine.core.files import write_whole

__all__ = ["Issued", "authority", "issue", "issue_server", "issue_libvirt", "identity",
           "describe", "certificates", "ROOT_USER", "LOOPBACK", "LIBVIRT_FILES", "QEMU_FILES"]

ROOT_USER = "root"          # etcd's administrator: the one user that enables auth
_LIFETIME = datetime.timedelta(days=3650)
LOOPBACK = ("127.0.0.1", "localhost")     # every etcd certificate names them


@dataclass(frozen=True)
class Issued:
    """A certificate and its key on disk, and the authority that signed it;
    ``status`` says what this call did (``made``, ``kept`` or ``reissued``)
    and ``was`` the names a re-issued certificate had."""
    cert: str
    key: str
    cacert: str
    status: str = "kept"
    was: tuple = ()


def _paths(directory: str, name: str) -> tuple[str, str]:
    return os.path.join(directory, f"{name}.pem"), os.path.join(directory, f"{name}-key.pem")


def _load(directory: str, name: str):
    cert_path, key_path = _paths(directory, name)
    with open(cert_path, "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    with open(key_path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    return cert, key


def _save(directory: str, name: str, cert, key) -> tuple[str, str]:
    cert_path, key_path = _paths(directory, name)
    write_whole(key_path, key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()), private=True)
    write_whole(cert_path, cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


def _builder(subject: x509.Name, issuer: x509.Name, public_key):
    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + _LIFETIME))


def authority(directory: str, cluster: str = "default") -> str:
    """The authority in ``directory`` (made the first time); its cert path."""
    os.makedirs(directory, exist_ok=True)
    cert_path, key_path = _paths(directory, "ca")
    if os.path.exists(cert_path) and os.path.exists(key_path):
        return cert_path
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "peerctl"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"peerctl {cluster} CA")])
    cert = (_builder(name, name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                         crl_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    _save(directory, "ca", cert, key)
    return cert_path


def _names(cert) -> list[str]:
    """The DNS names and addresses a certificate is valid for."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [str(entry.value) for entry in sans]


def _sign(directory: str, name: str, subject: x509.Name, usages: list,
          names: list[str] = (), renames: bool = False) -> Issued:
    """The certificate ``name`` in ``directory``, made if absent; with
    ``renames``, made again when it does not name exactly ``names``."""
    cert_path, key_path = _paths(directory, name)
    cacert = os.path.join(directory, "ca.pem")
    status, was = "made", ()
    if os.path.exists(cert_path) and os.path.exists(key_path):
        if not renames:
            return Issued(cert_path, key_path, cacert)
        current, _ = _load(directory, name)
        was = tuple(_names(current))
        if set(was) == set(names):
            return Issued(cert_path, key_path, cacert)
        status = "reissued"
    ca_cert, ca_key = _load(directory, "ca")
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (_builder(subject, ca_cert.subject, key.public_key())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    if names:
        alternatives = []
        for entry in names:
            try:
                alternatives.append(x509.IPAddress(ipaddress.ip_address(entry)))
            except ValueError:
                alternatives.append(x509.DNSName(entry))
        builder = builder.add_extension(x509.SubjectAlternativeName(alternatives), critical=False)
    _save(directory, name, builder.sign(ca_key, hashes.SHA256()), key)
    return Issued(cert_path, key_path, cacert, status, was)


def issue_server(directory: str, names: list[str] = (), member: str | None = None,
                 address: str | None = None) -> Issued:
    """etcd's certificate (client and peer ports), valid for loopback and
    ``names``: ``etcd.pem``, or with ``member``, that member's own
    ``etcd-<member>.pem``, naming its ``address`` too.  An existing one is
    kept, unless names are asked for (``names``, or a member's address) and
    it does not name exactly those: then it is issued again, with a new key."""
    wanted = [*LOOPBACK]
    for entry in ([address] if address else []) + list(names):
        if entry not in wanted:
            wanted.append(entry)
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "peerctl"),
                         x509.NameAttribute(NameOID.COMMON_NAME,
                                            f"etcd-{member}" if member else "etcd")])
    return _sign(directory, f"etcd-{member}" if member else "etcd", subject,
                 [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                 wanted, renames=bool(names or member))


# What libvirt looks for (the ``pkipath`` of a URI holds the first three
# under these names), and where it looks on a host by default.
LIBVIRT_FILES = {"cacert.pem": "/etc/pki/CA/cacert.pem",
                 "clientcert.pem": "/etc/pki/libvirt/clientcert.pem",
                 "clientkey.pem": "/etc/pki/libvirt/private/clientkey.pem",
                 "servercert.pem": "/etc/pki/libvirt/servercert.pem",
                 "serverkey.pem": "/etc/pki/libvirt/private/serverkey.pem"}
# QEMU's own names for the same certificate, for its migration and disk
# streams over TLS (qemu.conf's migrate_tls_x509_cert_dir): in ``qemu/``.
QEMU_FILES = {"ca-cert.pem": "cacert.pem", "server-cert.pem": "servercert.pem",
              "server-key.pem": "serverkey.pem", "client-cert.pem": "clientcert.pem",
              "client-key.pem": "clientkey.pem"}


def issue_libvirt(directory: str, host: str, address: str, *also: str) -> Issued:
    """Host ``host``'s libvirt certificate, naming ``address`` (what other
    hosts' ``libvirt_remote`` URIs use), ``also`` (other addresses it is
    reached at: its ``migration_address`` on a network of its own, which
    QEMU's TLS checks the certificate against) and ``host``; kept when it
    names exactly those, else issued again.  ``directory/libvirt/<host>/`` is
    (re)written with it under libvirt's own file names
    (:data:`LIBVIRT_FILES`): copied there on the host, or given as a URI's
    ``pkipath``, it is both the server's and the client's; and under QEMU's
    names (:data:`QEMU_FILES`) in ``qemu/`` beside them, for the migration
    streams (``/etc/pki/qemu`` on the host)."""
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "peerctl"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "libvirt"),
                         x509.NameAttribute(NameOID.COMMON_NAME, host)])
    names = list(dict.fromkeys([address, *also, host]))
    issued = _sign(directory, f"libvirt-{host}", subject,
                   [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
                   names, renames=True)
    layout = os.path.join(directory, "libvirt", host)
    os.makedirs(layout, mode=0o700, exist_ok=True)
    with open(issued.cacert, "rb") as f:
        ca = f.read()
    with open(issued.cert, "rb") as f:
        cert = f.read()
    with open(issued.key, "rb") as f:
        key = f.read()
    for name, data, private in (("cacert.pem", ca, False), ("clientcert.pem", cert, False),
                                ("servercert.pem", cert, False), ("clientkey.pem", key, True),
                                ("serverkey.pem", key, True)):
        write_whole(os.path.join(layout, name), data, private)
    os.makedirs(os.path.join(layout, "qemu"), mode=0o700, exist_ok=True)
    for name, same in QEMU_FILES.items():
        shutil.copyfile(os.path.join(layout, same), os.path.join(layout, "qemu", name))
        os.chmod(os.path.join(layout, "qemu", name),
                 0o600 if name.endswith("key.pem") else 0o644)
    return issued


def issue(directory: str, user: str, role: str) -> Issued:
    """The client certificate of etcd user ``user``, whose role is ``role``."""
    subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "peerctl"),
                         x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                         x509.NameAttribute(NameOID.COMMON_NAME, user)])
    return _sign(directory, user, subject, [ExtendedKeyUsageOID.CLIENT_AUTH])


def identity(cert_pem: bytes) -> tuple[str | None, str | None]:
    """``(user, role)`` a client certificate names: its CN and OU (None when
    absent or unreadable)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return None, None

    def first(oid):
        values = cert.subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else None
    return first(NameOID.COMMON_NAME), first(NameOID.ORGANIZATIONAL_UNIT_NAME)


def describe(path: str) -> dict | None:
    """``{file, subject, role, names, expires}`` of the certificate at
    ``path`` (``expires``: epoch seconds; ``role``: its OU, ``CA`` for an
    authority, ``etcd server`` for etcd's); None if it is not one."""
    try:
        with open(path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
    except (OSError, ValueError):
        return None

    def first(oid):
        values = cert.subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else None
    try:
        authority_ = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        authority_ = False
    try:
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        server = ExtendedKeyUsageOID.SERVER_AUTH in usages
    except x509.ExtensionNotFound:
        server = False
    role = "CA" if authority_ else first(NameOID.ORGANIZATIONAL_UNIT_NAME) or (
        "etcd server" if server else None)
    return {"file": path, "subject": first(NameOID.COMMON_NAME), "role": role,
            "names": _names(cert), "expires": int(_expiry(cert).timestamp())}


def _expiry(cert) -> datetime.datetime:
    if hasattr(cert, "not_valid_after_utc"):         # cryptography 42 and later
        return cert.not_valid_after_utc
    return cert.not_valid_after.replace(tzinfo=datetime.timezone.utc)


def certificates(directory: str) -> list[dict]:
    """:func:`describe` of every certificate in ``directory``, the
    authority first, then by file name."""
    try:
        files = sorted(os.listdir(directory))
    except OSError:
        return []
    found = [describe(os.path.join(directory, name)) for name in files
             if name.endswith(".pem") and not name.endswith("-key.pem")]
    found = [entry for entry in found if entry is not None]
    return sorted(found, key=lambda entry: (entry["role"] != "CA", entry["file"]))
