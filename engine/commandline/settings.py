"""Settings: flag > environment > a running `up` > config file > default.

:func:`settings_for` reads them once per command and checks each: a bad
value is a ``UsageError`` (exit 2) naming where it came from, before
anything connects.

The config file is ``--conf``, else ``$PEERCTL_CONF`` (either must be
readable), else :data:`SYSTEM_CONF` when it exists (and then it must be
readable: an administrator's file is never skipped), else the tree's
``conf/peerctl.conf`` (which may be missing)."""
from __future__ import annotations

import configparser
import os
import re

from engine.core.credentials import Credentials  # cheap
from engine.core.validate import endpoint_scheme, parse_duration, parse_endpoints, parse_size
from engine.errors import UsageError

__all__ = ["DEFAULTS", "TLS_FLAGS", "ROOT", "SYSTEM_CONF", "LOG_FORMATS", "LOG_LEVELS",
           "read_conf", "settings_for", "placement_setting"]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A host's configuration, where an administrator (and the .deb) puts it.
SYSTEM_CONF = "/etc/peerctl/peerctl.conf"
LOG_FORMATS = ("console", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")

DEFAULTS = {"etcd": "http://127.0.0.1:2379", "cluster": "default", "format": "table",
            "ttl": "5", "workers": "8", "retention": "7d", "state_dir": "state",
            "libvirt": "test:///default", "hosts": "3", "network": "default",
            "networks": "default", "etcd_history": "1h", "etcd_quota": "2G",
            "ha_margin": "3s", "placement": "etcd", "backup_pool": "", "reserved": "",
            "api": "", "api_roles": "", "api_cert": "", "api_key": "",
            "session_idle": "12h", "session_max": "7d",
            # the peer's own (engine/commandline/peer_host.py): "" = derived
            "host": "", "libvirt_remote": "", "migration_address": "", "migration_ports": "",
            "migration_network": "",
            # "" = the command's own level: info for peer and serve, else warning
            "log_format": "console", "log_level": ""}

TLS_FLAGS = {"cacert": "CA certificate that signed etcd's (https:// endpoints)",
             "cert": "client certificate: who this is to etcd, and its role",
             "key": "the client certificate's private key"}

_CLUSTER = re.compile(r"[A-Za-z0-9._-]+")
WHOLE_NUMBERS = {"ttl": "seconds", "workers": "requests", "hosts": "peers"}


def read_conf(path: str) -> dict:
    parser = configparser.ConfigParser()
    try:
        parser.read(path)
    except configparser.Error as exc:
        raise UsageError(f"bad config file {path}: {exc}".splitlines()[0]) from None
    if not parser.has_section("peerctl"):
        return {}
    return {k.replace("-", "_"): v.strip() for k, v in parser.items("peerctl")}


def _conf_path(args) -> str:
    """The config file: --conf, else $PEERCTL_CONF (either must exist), else
    /etc/peerctl/peerctl.conf when it exists (then it must be readable),
    else conf/peerctl.conf (which may not exist)."""
    for path, where in ((getattr(args, "conf", None), "--conf"),
                        (os.environ.get("PEERCTL_CONF") or None, "$PEERCTL_CONF")):
        if path is not None:
            try:
                with open(path):
                    pass
            except OSError as exc:
                raise UsageError(f"cannot read config file {path!r} from {where}: "
                                 f"{exc.strerror}") from None
            return path
    if os.path.lexists(SYSTEM_CONF):       # a dangling link is there, and unreadable
        try:
            with open(SYSTEM_CONF):
                pass
        except OSError as exc:
            raise UsageError(f"cannot read config file {SYSTEM_CONF}: {exc.strerror}") from None
        return SYSTEM_CONF
    return os.path.join(ROOT, "conf", "peerctl.conf")


def placement_setting(settings: dict, where: str) -> dict:
    """The placement backend: ``etcd``, or an OpenStack Placement URL with
    the token read from ``placement_token_file``."""
    value = settings["placement"].strip()
    if value == "etcd":
        return {"backend": "etcd"}
    if not value.startswith(("http://", "https://")):
        raise UsageError(f"bad placement {value!r} {where} (want etcd, or the http(s):// URL "
                         "of an OpenStack Placement)")
    parse_endpoints(value, where)
    config = {"backend": "openstack", "url": value}
    path = settings.get("placement_token_file")
    if path:
        try:
            with open(path) as file:
                config["token"] = file.read().strip()
        except OSError as exc:
            raise UsageError(f"cannot read placement_token_file {path!r}: "
                             f"{exc.strerror}") from None
    return config


def _log_settings(settings: dict, source: dict, path: str) -> None:
    """log_format and log_level: $PEERCTL_LOG_FORMAT / $PEERCTL_LOG_LEVEL,
    else the config file, else console and the command's own level."""
    for key, allowed in (("log_format", LOG_FORMATS), ("log_level", LOG_LEVELS)):
        source[key] = f"in {path}"
        if os.environ.get("PEERCTL_" + key.upper()):
            settings[key], source[key] = os.environ["PEERCTL_" + key.upper()], \
                f"from $PEERCTL_{key.upper()}"
        settings[key] = settings[key].strip().lower()
        if settings[key] and settings[key] not in allowed:
            raise UsageError(f"bad {key} {settings[key]!r} {source[key]} "
                             f"(want {', '.join(allowed[:-1])} or {allowed[-1]})")
    settings["log_format"] = settings["log_format"] or "console"


def settings_for(args) -> dict:
    settings = dict(DEFAULTS)
    path = _conf_path(args)
    conf = read_conf(path)
    settings.update(conf)
    settings["conf_file"], settings["in_conf"] = path, frozenset(conf)
    for key, unit in WHOLE_NUMBERS.items():
        if not re.fullmatch(r"[0-9]+", settings[key]) or int(settings[key]) < 1:
            raise UsageError(f"bad {key} {settings[key]!r} in {path} "
                             f"(want a whole number of {unit}, at least 1)")
    parse_duration(settings["retention"], "retention", f"in {path}")
    for key in ("etcd_history", "etcd_quota", "ha_margin", "session_idle", "session_max"):
        where = f"in {path}"
        if os.environ.get("PEERCTL_" + key.upper()):
            settings[key], where = os.environ["PEERCTL_" + key.upper()], f"from $PEERCTL_{key.upper()}"
        (parse_size if key == "etcd_quota" else parse_duration)(settings[key], key, where)
    for name in (*TLS_FLAGS, "placement_token_file", "api_roles", "api_cert", "api_key"):
        # relative to the config file
        if settings.get(name) and not os.path.isabs(settings[name]):
            settings[name] = os.path.join(os.path.dirname(os.path.abspath(path)), settings[name])
    source = {"etcd": f"in {path}", "cluster": f"in {path}", "placement": f"in {path}",
              "reserved": f"in {path}",
              **{name: f"in {path}" for name in TLS_FLAGS}}
    from engine import supervisor       # cheap: etcd's client is not loaded
    up = supervisor.running_up(os.path.abspath(settings["state_dir"]))
    if up:     # the embedded default: a running `peerctl.py up` in ./state
        settings["etcd"], settings["cluster"] = supervisor.etcd_urls(up), up.get("cluster",
                                                                                  "default")
        where = f"in {supervisor.up_file(settings['state_dir'])}"
        source.update(etcd=where, cluster=where)
        for name, value in supervisor.client_tls(up).items():     # the operator's identity
            settings[name], source[name] = value, where
    for key in ("network", "networks", "reserved"):     # set, even empty: "" none
        if os.environ.get("PEERCTL_" + key.upper()) is not None:
            settings[key] = os.environ["PEERCTL_" + key.upper()]
            source[key] = f"from $PEERCTL_{key.upper()}"
    for key in ("placement", "placement_token_file"):
        if os.environ.get("PEERCTL_" + key.upper()):
            settings[key] = os.environ["PEERCTL_" + key.upper()]
            source[key] = f"from $PEERCTL_{key.upper()}"
    for key in ("etcd", "cluster", "format", *TLS_FLAGS):
        if os.environ.get("PEERCTL_" + key.upper()):     # set but empty: unset
            settings[key] = os.environ["PEERCTL_" + key.upper()]
            source[key] = f"from $PEERCTL_{key.upper()}"
        if getattr(args, key, None) is not None:        # given, even if empty
            settings[key] = getattr(args, key)
            source[key] = f"from --{key}"
    _log_settings(settings, source, path)
    if settings["format"] not in ("table", "json"):
        raise UsageError(f"bad format {settings['format']!r} (want table or json)")
    if not _CLUSTER.fullmatch(settings["cluster"]):
        raise UsageError(f"bad cluster name {settings['cluster']!r} {source['cluster']} "
                         "(want letters, digits, '-', '_' or '.')")
    parse_endpoints(settings["etcd"], source["etcd"])      # exit 2 before anything connects
    settings["placement_config"] = placement_setting(settings, source["placement"])
    credentials = Credentials.from_settings(settings, source)
    if credentials and endpoint_scheme(settings["etcd"]) == "https":
        credentials.read()          # exit 2 naming a missing or unreadable file
    settings["credentials"] = credentials
    settings["source"] = source
    return settings
