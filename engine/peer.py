"""The peer: the one process every host runs.

It holds a session (lease) in etcd and, under it: the host record (written
again only when it says something new: the lease proves the host alive), the
host's placement provider (what it keeps back for the reserved setting and
the foreign domains kept current on every stats tick), the executor taking
requests from the host's inbox, the duties (automations it is a member of)
and the cluster singletons.  When the session is lost (etcd
unreachable for a TTL, the process paused) everything bound to it stops at
once and the peer starts over with a fresh session; its durable state is all
in etcd, so it resumes where it was.  An upgrade hands the host over to a
process of another release on the same lease (``engine/releases/handover.py``):
the host record, the guard's heartbeat and the VMs carry on; if that
process does not come up, this one serves again.  SIGTERM/SIGINT stop it gracefully:
running requests finish, then the lease is revoked so the other members take
over at once instead of after a TTL (unless the host runs HA VMs: then the
lease runs out, and a peer back within it keeps them; see
``engine/hypervisor/ha/guard.py``).

This is where the rooms meet: the generic machinery (``engine.core``), the
placement service and the hypervisor room are composed here, and only here;
none of them imports this module.
"""
from __future__ import annotations

import os
import platform
import signal
import sys
import threading
import time

import structlog

from engine.planning.auto import balancer
from engine.core import keys
from engine.core import features
from engine.core import service_notify as notify
from engine.core.duties import Duties, Singleton, janitor
from engine.core.maintenance import compactor
from engine.core import removed as removal
from engine.core.executor import Executor
from engine.core.handlers import load_request_handlers
from engine.core.registry import load_automations
from engine.core.session import Session
from engine.core.store import Put, Store, StoreUnavailable, wake_blocked_streams_every
from engine.core.validate import parse_duration   # one check, shared with the command line
from engine.placement.drains import align
from engine.errors import Refused, RequestError, UsageError
from engine.hypervisor.ha.guard import (Heartbeat, ensure_guard, fenced, forget_fenced, ha_domains,
                               lead_for, needs_guard)
from engine.hypervisor.ha.recoverer import DEFAULT_MARGIN, recoverer
from engine.hypervisor.host.hostctx import HostContext, check_libvirt_uri
from engine.hypervisor.host.reachability import machine_id, remote_conflict
from engine.hypervisor.host.hostinfo import Publication, host_facts
from engine.hypervisor.data.backup_sweep import sweep_backups
from engine.hypervisor.host.reconciler import GHOST_INTERVAL, reconciler, sweep_ghosts
from engine.leases.guard import lease_guard
from engine.releases import current as releases
from engine.releases.handover import (DEFAULT_DEADLINE, adopted_lease, hand_over, handed_over,
                                note_serving)

__all__ = ["run_peer", "parse_duration"]

log = structlog.get_logger("peerctl.peer")

STATS_INTERVAL = 5.0
DRAIN_TIMEOUT = 120.0     # how long a hand-over waits for the host's running requests
RETENTION = 24 * 3600.0
ETCD_HISTORY = 3600.0     # etcd revisions kept by the cluster's compactor


def _offered(host: HostContext) -> tuple[dict, list[str]]:
    """The configured networks this hypervisor has now, and why others not."""
    if not host.offer:
        return {}, []
    try:
        from engine.hypervisor.domain.networks import offered
        return offered(host.conn, host.offer)
    except Exception as exc:        # the hypervisor is down: none for now
        return {}, [str(exc)]


def _host_record(host: HostContext, scanned: list | None = None, memo=None) -> dict:
    try:
        facts = host_facts(host.conn, host.state_dir, host.host, scanned, memo)
    except Exception as exc:    # the hypervisor is down: still be a live peer
        log.warning("host_facts_failed", error=str(exc))
        facts = {"kernel": platform.release(), "error": str(exc)}
    networks, missing = _offered(host)
    return {"host": host.host, "libvirt_uri": host.libvirt_uri,
            "libvirt_remote": host.remote_uri, **(host.migration or {}),
            "machine": machine_id(), "pid": os.getpid(),
            "state_dir": os.path.abspath(host.state_dir), "updated": time.time(), **facts, "networks": sorted(networks),
            **({"networks_missing": missing} if missing else {})}


class Peer:
    def __init__(self, store: Store, host: str, libvirt_uri: str, ttl: int = 5,
                 hooks_dir: str | None = None, workers: int = 8, state_dir: str | None = None,
                 retention: float = RETENTION, networks: str = "default",
                 etcd_history: float = 3600.0, ha_margin: float = DEFAULT_MARGIN,
                 backup_pool: str | None = None, reserved: dict | None = None,
                 pause=None, resume=None, libvirt_remote: str = "",
                 migration: dict | None = None, api_url: str = ""):
        self.store = store
        self.api_url = api_url          # the URL of the API this process serves, or ""
        self.name = host
        self.ttl = ttl
        self.retention = retention
        self.etcd_history = etcd_history
        self.ha_margin = ha_margin
        state_dir = state_dir or os.path.join("/tmp", "peerctl", store.cluster, host)
        os.makedirs(state_dir, exist_ok=True)
        from engine.hypervisor.domain.networks import parse_offer
        self.host = HostContext(host, libvirt_uri, store, state_dir,
                                offer=parse_offer(networks, "in the peer's networks setting"),
                                backup_pool=backup_pool or None,
                                reserved=dict(reserved or {}),
                                replace=self.replace, libvirt_remote=libvirt_remote,
                                migration=migration)
        self.executor = Executor(store, self.host, hooks_dir, workers)
        # A hypervisor whose VMs outlive this process gets a guard that
        # fences its HA VMs when this peer's lease may lapse.
        self.heartbeat = Heartbeat(state_dir) if needs_guard(libvirt_uri) else None
        self.stopping = threading.Event()
        self.wake = threading.Event()   # the main loop's: a stop, a lost lease, a hand-over
        self.extras = []                # per-session components started by plugins
        self.log = log.bind(host=host)
        # A hand-over: what the upgrade asked for, the lease a previous
        # process left us, and what the host record says about both.
        self.pause, self.resume = pause or (lambda: None), resume or (lambda: None)
        self.replacing: dict | None = None
        self.adopt = adopted_lease()
        self.handover: dict | None = None
        self.rolled_back: dict | None = None
        self.guarded: bool | None = None    # the guard was found or started (None: none needed)
        self.code = releases.running_code(state_dir)
        self.unreachable_since: float | None = None     # etcd, as systemd's status says
        self.said = ""                  # the last status line sent
        self.memo = None                # the VM publisher's: each domain's metadata, kept
        self.removed: dict | None = None    # this host's tombstone, once seen (host remove)

    def _status(self, text: str) -> None:
        """The line ``systemctl status`` shows (sent when it changed)."""
        if text != self.said:
            self.said = text
            notify.status(text)

    def _serving(self, record: dict) -> str:
        vms = record.get("vms")
        return (f"serving {self.name}: {vms if vms is not None else '?'} VMs, "
                f"etcd {self.store.endpoints}, {self.identity()['version']}")

    def _unreachable(self) -> None:
        if self.unreachable_since is None:
            self.unreachable_since = time.time()
        since = time.strftime("%H:%M:%S", time.localtime(self.unreachable_since))
        self._status(f"etcd unreachable since {since} ({self.store.endpoints}): "
                     f"{self.name} not serving")

    def identity(self) -> dict:
        """The host record's fields about this peer's code."""
        code = self.code
        version = code["version"] or "unknown"
        if code.get("commit"):
            version += "+" + code["commit"][:8]
        previous = code.get("previous") or None
        return {"version": version, "release": code.get("release"),
                "feature_level": features.SUPPORTED,
                "previous": ({"release": previous.get("release"),
                              "version": previous.get("version"),
                              "feature_level": previous.get("feature_level")}
                             if previous else None),
                **({"guarded": self.guarded} if self.heartbeat is not None else {}),
                **({"handover": self.handover} if self.handover else {}),
                **({"rolled_back": self.rolled_back} if self.rolled_back else {})}

    def replace(self, plan: dict) -> bool:
        """Hand the host over to ``plan['choice']`` once running requests
        are done (called by the ``upgrade_host`` request)."""
        if self.replacing is not None:
            return False
        self.replacing = plan
        self.wake.set()
        return True

    def _check_reachable(self) -> None:
        """Refused: another live host, on another machine, could not tell
        this host's libvirt from its own, or not reach it at all
        (engine/hypervisor/host/reachability.py)."""
        from engine.core.hosts import live_hosts
        why = remote_conflict(self.name, self.host.remote_uri, machine_id(),
                              list(live_hosts(self.store).values()))
        if why is not None:
            raise Refused(why)

    def run(self) -> int:
        try:
            check_libvirt_uri(self.host.libvirt_uri)     # before any lease exists
        except UsageError as exc:
            sys.stderr.write(f"peerctl: {exc}\n")
            return 2
        load_request_handlers()
        load_automations()
        self._carry_in()
        releases.write_peer_file(self.host.state_dir)
        self._status(f"starting {self.name}: etcd {self.store.endpoints}")
        while not self.stopping.is_set():
            notify.watchdog()
            try:
                features.found_cluster(self.store)
                features.check_supported(self.store)
                self._check_reachable()
            except Refused as exc:
                sys.stderr.write(f"peerctl: {exc}\n")
                return 2
            except StoreUnavailable:
                pass                    # checked again once etcd answers
            if self._found_removed():
                break
            try:
                session = Session(self.store, self.ttl, adopt=self.adopt,
                                  on_renewed=self.heartbeat.beat if self.heartbeat else None)
            except StoreUnavailable as exc:
                self.log.warning("etcd_unreachable", error=str(exc))
                self._unreachable()
                self.stopping.wait(0.5)
                continue
            self.adopt = None
            crashed = False
            try:
                self._serve(session)
            except StoreUnavailable as exc:
                self.log.warning("session_interrupted", error=str(exc))
                self._unreachable()
                session.lost.set()
            except BaseException:
                # A bug (or an interrupt): the process is about to exit, so
                # give the lease back now rather than leave the host record,
                # candidacies and claims to a TTL of a peer that is gone.
                crashed = True
                self.log.exception("peer_crashed")
                raise
            finally:
                graceful = self.stopping.is_set()
                if graceful:
                    self.executor.wait_idle(30)
                if self.replacing is not None and not crashed:
                    last_renewal = self._drain(session)
                else:
                    # A host running HA VMs lets its lease run out instead: a
                    # peer restarted within it keeps them running; otherwise
                    # the guard fences them and they restart elsewhere.  A
                    # process that came from a hand-over and crashed keeps
                    # it too: the old one may still take the host back.
                    revoke = (graceful or crashed) and not (crashed and handed_over())
                    if revoke and self._runs_ha_vms():
                        revoke = False
                        if graceful:
                            self._leave_to_guard(session)
                    session.close(revoke=revoke)
            if self.replacing is not None:
                if self._hand_over(session.lease, last_renewal):
                    return 0
        if self.removed is not None:
            self.log.warning("host_removed", by=self.removed.get("by"))
            self._status(removal.refusal(self.removed))
            sys.stderr.write(f"peerctl: {removal.refusal(self.removed)}\n")
            return 2
        self.log.info("peer_stopped")
        return 0

    def _found_removed(self) -> bool:
        """This host's tombstone is there (``host remove``): it must not serve."""
        try:
            self.removed = self.removed or removal.read(self.store, self.name)
        except StoreUnavailable:
            pass                        # the registration's own compare fences it
        return self.removed is not None

    def _fenced_by_removal(self, record: dict) -> None:
        """The tombstone was written while this peer served: stop as for
        SIGTERM (running requests finish, the lease is given back)."""
        self.removed = record
        self.stopping.set()
        self.wake.set()

    def _leave_to_guard(self, session: Session) -> None:
        """A planned stop of a host running HA VMs keeps its lease: renewed
        one last time (the longest wait before the guard fences, for a
        restart to come back within), and the guard told that the peer
        stops on purpose."""
        try:
            session.renew()
        except Exception as exc:        # etcd away: the last renewal stands
            self.log.warning("last_renewal_failed", error=str(exc))
        self.heartbeat.stopping()
        self.log.info("lease_left_to_run_out", ttl=self.ttl, why="HA VMs run here")
        self._status(f"stopped {self.name}: its lease runs out in {self.ttl} s; a peer back "
                     f"before then keeps its HA VMs running, else the guard powers them off")

    def _drain(self, session: Session) -> float:
        """Stop serving for a hand-over, keeping the lease: running requests
        finish, the test driver's domains are saved; the lease's last renewal."""
        until = time.monotonic() + DRAIN_TIMEOUT
        while not self.executor.wait_idle(min(1.0, max(until - time.monotonic(), 0))):
            notify.watchdog()           # a long drain is no hang
            if time.monotonic() >= until:
                self.log.warning("handover_not_idle", timeout=DRAIN_TIMEOUT)
                break
        self.replacing["carried"] = self._carry_out()
        try:
            last = session.renew()
        except StoreUnavailable:
            last = time.time()
        session.close(revoke=False)
        return last

    def _hand_over(self, lease: int, last_renewal: float) -> bool:
        """Start the new release on ``lease``; True once it serves, False
        (this process serves again, on the same lease) when it did not."""
        plan, self.replacing = self.replacing, None
        self.pause()
        self.log.info("handing_over", to=plan["choice"].get("release"),
                      path=plan["choice"]["path"])
        self._status(f"handing {self.name} over to release "
                     f"{plan['choice'].get('release') or plan['choice'].get('version')}")
        outcome = hand_over(self.host.state_dir, lease, last_renewal, plan["choice"],
                            {k: v for k, v in self.code.items() if k != "previous"},
                            float(plan.get("deadline") or DEFAULT_DEADLINE),
                            plan.get("carried"), plan.get("automation"),
                            renew=lambda: self._renew(lease), ttl=self.ttl,
                            tick=notify.watchdog)
        if plan.get("carried"):
            try:
                os.unlink(plan["carried"])
            except OSError:
                pass
        if outcome.ok:
            self.log.info("handed_over", pid=outcome.pid)
            if self.stopping.is_set():
                # stopped (systemctl stop) while handing over: the service
                # manager follows the new process now; it stops too
                os.kill(outcome.pid, signal.SIGTERM)
            return True
        self.log.error("handover_rolled_back", why=outcome.why)
        releases.write_peer_file(self.host.state_dir)
        self.rolled_back = {"to": plan["choice"].get("release"), "why": outcome.why,
                            "time": time.time(), "automation": plan.get("automation")}
        self.adopt = lease
        self.code = releases.running_code(self.host.state_dir)
        # the new process may have made itself the service's main one
        notify.main_pid(text=f"{self.name}: hand-over to {self.rolled_back['to']} "
                        f"rolled back: {outcome.why}"[:400])
        self.said = ""
        self.resume()
        return False

    def _renew(self, lease: int) -> float:
        """Renew ``lease`` outside a session (a hand-over waiting for the new
        process), the guard told as after any renewal; when it was."""
        sent = time.monotonic()
        remaining = self.store.keepalive(lease)
        if remaining > 0 and self.heartbeat is not None:
            self.heartbeat.beat(sent + remaining)
        return time.time()

    def _carry_out(self) -> str | None:
        """Save the test driver's domains for the next process (a real
        hypervisor keeps them by itself)."""
        path = os.path.join(releases.releases_dir(self.host.state_dir), "carry.json")
        try:
            from engine.hypervisor.host import carry
            if not carry.carries(self.host.libvirt_uri):
                return None
            carry.save(self.host.conn, path)
        except Exception as exc:
            self.log.error("carry_save_failed", error=str(exc))
            return None
        return path

    def _carry_in(self) -> None:
        came = handed_over()
        path = (came or {}).get("carried")
        if not path:
            return
        try:
            from engine.hypervisor.host import carry
            restored = carry.restore(self.host.conn, path)
            self.log.info("carried_domains", domains=restored)
        except Exception as exc:
            self.log.error("carry_restore_failed", error=str(exc))

    def _host_record(self, scanned: list | None = None) -> dict:
        return {**_host_record(self.host, scanned, self.memo), **self.identity(),
                **({"api": self.api_url} if self.api_url else {})}

    def _serve(self, session: Session):
        self.log.info("session_started", lease=f"{session.lease:x}", ttl=self.ttl,
                      adopted=session.adopted, version=self.identity()["version"])
        cfg = self.store.get(keys.host_config(self.name))
        enabled = (cfg.value or {}).get("enabled", True) if cfg else True
        record = {**self._host_record(), "enabled": enabled}
        # registered only while no tombstone says the host was removed
        joined = self.store.txn([removal.not_removed(self.name)],
                                [Put(keys.host(self.name), record, session.lease),
                                 Put(keys.host_config(self.name), record)])
        if not joined.succeeded:        # removed meanwhile: never registered
            self._fenced_by_removal(removal.read(self.store, self.name)
                                    or {"host": self.name, "state": "removing", "time": 0})
            return
        # The lease proves that this host is alive: its record is written
        # again when it says something new (engine/hypervisor/host/hostinfo.py).
        published = Publication()
        published.written(record, time.monotonic())
        registered = self._register_provider(record["networks"])
        # Before publishing: a copy of a VM the cluster placed elsewhere while
        # this host was away (its libvirtd kept the domain) never shows up.
        self._sweep_ghosts()
        swept = time.monotonic()
        publisher = self._start_publisher(session)
        self._ensure_guard()
        self.executor.attach(session)
        duties = Duties(self.store, session, self.name, self.executor.submit).start()
        singletons = [Singleton(self.store, session, self.name, "janitor",
                                janitor(self.store, self.retention)).start(),
                      Singleton(self.store, session, self.name, "reconciler",
                                reconciler(self.store, host=self.name)).start(),
                      Singleton(self.store, session, self.name, "lease-guard",
                                lease_guard(self.store)).start(),
                      Singleton(self.store, session, self.name, "recoverer",
                                recoverer(self.store, self.ha_margin)).start(),
                      Singleton(self.store, session, self.name, "balancer",
                                balancer(self.store, host=self.name)).start()]
        if self.etcd_history > 0:
            singletons.append(Singleton(self.store, session, self.name, "compactor",
                                        compactor(self.store, self.etcd_history,
                                                  self.name)).start())
        self._unfence()
        if handed_over() is not None:
            # what the upgrade checks: this process's own look at its VMs
            if publisher is not None:
                try:
                    publisher.reconcile()
                except StoreUnavailable:
                    raise
                except Exception as exc:
                    self.log.warning("first_publication_failed", error=str(exc))
            # the service manager follows this process before the old one
            # exits (its message, once it is gone, may not count)
            notify.main_pid(text=self._serving(record))
            self.handover = note_serving(self.host.state_dir, session.first_renewal)
            self._publish(session, published, {**self._host_record(), "enabled": enabled})
        else:
            notify.ready(self._serving(record))
        self.unreachable_since, self.said = None, self._serving(record)
        # A lost lease must end this session at once, not up to
        # STATS_INTERVAL later, so that the next one is made (and the host
        # record re-published) before the old lease expires: it wakes the
        # loop, as a stop and a hand-over do.
        threading.Thread(target=lambda: (session.lost.wait(), self.wake.set()), daemon=True,
                         name="session-lost").start()
        # from the registration on: a tombstone written since is seen
        watch = removal.RemovalWatch(self.store, self.name, joined.revision,
                                     self._fenced_by_removal).start()
        try:
            while not self.stopping.is_set() and not session.lost.is_set() \
                    and self.replacing is None:
                next_stats = time.monotonic() + STATS_INTERVAL
                while not (self.stopping.is_set() or session.lost.is_set()
                           or self.replacing is not None):
                    left = next_stats - time.monotonic()
                    if left <= 0:
                        break
                    notify.watchdog()   # this loop turning is what "not stuck" means
                    ping_every = notify.watchdog_interval()
                    self.wake.wait(min(left, ping_every / 2) if ping_every else left)
                    self.wake.clear()
                if self.stopping.is_set() or session.lost.is_set() or self.replacing is not None:
                    break
                # one look at every domain's metadata, for the accounting and the record
                scanned = self._account() if registered else None
                record = {**self._host_record(scanned), "enabled": enabled}
                if published.due(record, time.monotonic()):
                    self._publish(session, published, record)
                self._status(self._serving(record))
                self.executor.rescan()
                if not registered:
                    registered = self._register_provider(record["networks"])
                if publisher is None:
                    publisher = self._start_publisher(session)
                self._ensure_guard()
                if self._unfence() or time.monotonic() - swept >= GHOST_INTERVAL:
                    self._sweep_ghosts()
                    swept = time.monotonic()
        finally:
            watch.stop()
            duties.stop()
            for singleton in singletons:
                singleton.stop()
            self.executor.detach()
            if publisher is not None:
                publisher.stop()

    def _publish(self, session: Session, published: Publication, record: dict) -> None:
        self.store.put(keys.host(self.name), record, session.lease)
        published.written(record, time.monotonic())

    def _register_provider(self, networks: list[str]) -> bool:
        """The host as a placement provider: same provider across restarts,
        with one trait per network it offers, keeping back what the reserved
        setting and the foreign domains hold (``engine/hypervisor/host/accounting.py``).
        The hypervisor being unreachable is not fatal (a live peer still, as
        for its host facts): False, and the stats tick tries again."""
        from engine.hypervisor.host import accounting
        from engine.hypervisor.domain.networks import NETWORK_TRAIT_PREFIX, network_trait
        from engine.placement import open_placement
        from engine.placement.host import own_traits
        placement = open_placement(None, self.store)
        try:
            accounting.refresh(self.host, placement)
            own_traits(placement, self.name, NETWORK_TRAIT_PREFIX,
                       [network_trait(name) for name in networks])
            align(self.store, placement, self.name)     # drained exactly when drained/ says
            return True
        except StoreUnavailable:
            raise
        except Exception as exc:
            self.log.warning("provider_registration_failed", error=str(exc))
            return False
        finally:
            placement.close()

    def _account(self) -> list | None:
        """Keep the provider's reserved current as foreign domains come, go,
        start and stop (written only when it changed); the domains as
        scanned for it, under the accounting lock (an adoption is seen
        whole), or None.  Never fatal: the next tick tries again."""
        from engine.hypervisor.host import accounting, foreign
        from engine.placement import open_placement
        placement = open_placement(None, self.store)
        try:
            with accounting.lock(self.name):
                scanned = foreign.scan(self.host.conn, self.memo)
                accounting.refresh(self.host, placement, scanned=scanned)
            return scanned
        except StoreUnavailable:
            raise
        except Exception as exc:
            self.log.warning("reserved_refresh_failed", error=str(exc))
            return None
        finally:
            placement.close()

    def _ensure_guard(self) -> None:
        """Start this host's guard if none runs (never fatal: the next tick
        tries again; meanwhile HA VMs here are not guarded, and it says so)."""
        if self.heartbeat is None:
            return
        try:
            ensure_guard(self.host.state_dir, self.name, self.host.libvirt_uri,
                         lead_for(self.ttl))
            self.guarded = True
        except Exception as exc:
            self.guarded = False
            self.log.error("guard_unavailable", error=str(exc))

    def _runs_ha_vms(self) -> bool:
        if self.heartbeat is None:
            return False
        try:
            return bool(ha_domains(self.host.conn, self.name))
        except Exception:
            # Cannot tell.  Keeping the lease would only delay what its
            # expiry brings anyway (the guard cannot reach libvirt either).
            return False

    def _unfence(self) -> bool:
        """Start again the HA VMs the guard powered off, those the cluster
        still says are this host's: listed here, not disowned here, held by
        no automation (a recovery that took one before this host came back
        keeps it).  True when one turned out not to be ours any more (the
        ghost sweep then keeps its disks aside)."""
        if self.heartbeat is None:
            return False
        uuids = fenced(self.host.state_dir)
        if not uuids:
            return False
        from engine.core import locks
        from engine.hypervisor.host import vm as lifecycle
        settled, lost = [], False
        for uuid in uuids:
            try:
                if self.store.get(keys.disowned(self.name, uuid)) is not None \
                        or self.store.get(keys.vm(self.name, uuid)) is None:
                    settled.append(uuid)
                    lost = True
                    self.log.warning("fenced_vm_not_ours", uuid=uuid)
                    continue
                if locks.holder(self.store, f"vm/{uuid}") is not None:
                    continue            # being recovered or acted on: later
                lifecycle.start(self.host, {"uuid": uuid})
                settled.append(uuid)
                self.log.warning("fenced_vm_restarted", uuid=uuid)
            except StoreUnavailable:
                raise
            except RequestError as exc:     # no such VM here any more, or it cannot start
                settled.append(uuid)
                self.log.error("unfence_failed", uuid=uuid, error=str(exc))
            except Exception as exc:    # libvirt is away: try again later
                self.log.warning("unfence_postponed", uuid=uuid, error=str(exc))
        forget_fenced(self.host.state_dir, settled)
        return lost

    def _sweep_ghosts(self):
        """Destroy this host's copies of VMs placed elsewhere (see
        ``engine/hypervisor/host/reconciler.py``), and what backups that did not
        complete left here (``engine/hypervisor/data/backup_sweep.py``).  Never
        fatal: the next sweep tries again."""
        try:
            sweep_ghosts(self.store, self.host)
        except StoreUnavailable:
            raise
        except Exception as exc:
            self.log.warning("ghost_sweep_failed", error=str(exc))
        try:
            sweep_backups(self.store, self.host)
        except StoreUnavailable:
            raise
        except Exception as exc:
            self.log.warning("backup_sweep_failed", error=str(exc))

    def _start_publisher(self, session: Session):
        """Keep ``vms/<host>/`` in line with the hypervisor, while this
        session's lease holds the host record."""
        try:
            from engine.hypervisor.host.vmpublish import VmPublisher
        except ImportError:
            return None
        try:
            conn = self.host.conn
        except Exception as exc:    # the hypervisor is down: the stats tick tries again
            self.log.warning("vm_publisher_waits", error=str(exc))
            return None
        publisher = VmPublisher(self.store, self.name, conn, lease=session.lease,
                                offer=self.host.offer)
        publisher.start()
        self.memo = publisher.memo
        return publisher


def run_peer(store: Store, host: str, libvirt_uri: str, ttl: int = 5,
             hooks_dir: str | None = None, workers: int = 8,
             state_dir: str | None = None, retention=RETENTION,
             networks: str = "default", etcd_history=ETCD_HISTORY,
             ha_margin=DEFAULT_MARGIN, backup_pool: str | None = None,
             reserved: dict | None = None, pause=None, resume=None,
             libvirt_remote: str = "", migration: dict | None = None,
             api_url: str = "") -> int:
    """Run a peer in the foreground until SIGTERM or SIGINT.  Finished
    automations are kept for ``retention`` (seconds or ``7d``-style);
    ``networks`` is what the host offers (``default, lan=br0``: see
    :mod:`engine.hypervisor.domain.networks`); etcd keeps ``etcd_history`` of
    revisions (0: the cluster never compacts it); a dead host's HA VMs are
    restarted elsewhere ``ha_margin`` after its lease expired; backups of
    other hosts' VMs land in libvirt pool ``backup_pool`` (None: a dir pool
    under the state directory); placement keeps ``reserved`` ``{RC: amount}``
    back on this host, on top of what its foreign domains hold.  ``pause``
    and ``resume`` stop and start what else the process serves (its API)
    around a hand-over to another release; ``api_url`` is the URL of that
    API, published in the host record (``api``) for consoles.  ``migration``
    (``{migration_address, migration_ports}``) is published in the host
    record for ``cluster verify``."""
    peer = Peer(store, host, libvirt_uri, ttl, hooks_dir, workers, state_dir,
                parse_duration(retention if retention is not None else RETENTION), networks,
                parse_duration(etcd_history if etcd_history is not None else ETCD_HISTORY),
                parse_duration(ha_margin if ha_margin is not None else DEFAULT_MARGIN),
                backup_pool, reserved, pause, resume, libvirt_remote, migration, api_url)

    def stop(signum, frame):
        peer.log.info("peer_stopping", signal=signum)
        notify.stopping(f"stopping {host}: letting running requests finish")
        peer.stopping.set()
        peer.wake.set()
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    wake_blocked_streams_every(1.0)     # its main thread never waits on a stream
    return peer.run()
