"""The graphs' ring buffers (engine/core/ring.py) and the book a peer keeps
of its host and VMs (engine/hypervisor/host/graphs.py), with the clock in
the test's hands: history in, points out, no peer, no etcd."""
from __future__ import annotations

import math

from engine.core.ring import NAN, History, Ring
from engine.hypervisor.host.graphs import SERIES, Graphs, Reading

T0 = 1_800_000_000.0        # a time on a 5-minute boundary


def test_a_ring_wraps_around_keeping_the_newest_rows_oldest_first():
    ring = Ring(10, 4, 1)
    for i in range(6):                      # six samples into four slots
        ring.put(T0 + 10 * i, [float(i)])
    start, [column] = ring.read(T0 + 50)
    assert start == T0 + 20
    assert column == [2.0, 3.0, 4.0, 5.0]
    assert len(ring.values) == 4            # never grew


def test_rows_no_sample_reached_and_values_not_measured_read_as_absent():
    ring = Ring(10, 6, 2)
    ring.put(T0, [1.0, NAN])
    ring.put(T0 + 30, [4.0, 40.0])          # two steps skipped: gaps, not zeros
    start, (first, second) = ring.read(T0 + 50)    # and two more since the last sample
    assert start == T0
    assert first == [1.0, None, None, 4.0, None, None]
    assert second == [None, None, None, 40.0, None, None]


def test_a_gap_longer_than_the_ring_clears_every_stale_row():
    ring = Ring(10, 3, 1)
    for i in range(3):
        ring.put(T0 + 10 * i, [float(i)])
    ring.put(T0 + 1000, [9.0])
    assert ring.read(T0 + 1000)[1] == [[None, None, 9.0]]
    assert ring.read(T0 + 2000)[1] == [[None, None, None]]     # older than the span


def test_a_sample_for_a_written_slot_replaces_it_and_one_too_old_is_ignored():
    ring = Ring(10, 3, 1)
    ring.put(T0 + 20, [2.0])
    ring.put(T0 + 25, [2.5])                # same slot
    ring.put(T0 + 10, [1.0])                # a slot within the span, late
    ring.put(T0 - 100, [7.0])               # older than the span
    assert ring.read(T0 + 20) == (T0, [[None, 1.0, 2.5]])


def test_the_coarse_ring_holds_the_mean_of_the_fine_samples_present():
    history = History(2, fine_step=10, fine_slots=60, coarse_step=60, coarse_slots=3)
    for i in range(6):                      # minute 0: 0..5, the second series absent once
        history.put(T0 + 10 * i, [float(i), NAN if i == 0 else 10.0 * i])
    history.put(T0 + 60, [100.0, NAN])      # minute 1, so far
    start, (first, second) = history.coarse.read(T0 + 60)
    assert start == T0 - 60
    assert first == [None, 2.5, 100.0]
    assert second == [None, 30.0, None]     # (10+20+30+40+50)/5; minute 1: none present
    history.put(T0 + 70, [200.0, 5.0])
    assert history.coarse.read(T0 + 70)[1] == [[None, 2.5, 150.0], [None, 30.0, 5.0]]


def test_a_day_of_fine_samples_wraps_both_rings_to_their_spans():
    history = History(1)                    # the hour at 10 s, the day at 5 min
    for i in range(2 * 8640):               # two days of samples, each its index
        history.put(T0 + 10 * i, [float(i)])
    now = T0 + 10 * (2 * 8640 - 1)
    start, [hour] = history.fine.read(now)
    assert len(hour) == 360 and hour[0] == 2 * 8640 - 360 and hour[-1] == 2 * 8640 - 1
    assert start == now - 3590
    start, [day] = history.coarse.read(now)
    assert len(day) == 288 and start == T0 + 86400
    assert day[0] == 8640 + 14.5            # the mean of the 30 samples of its 5 minutes
    assert day[-1] == 2 * 8640 - 30 + 14.5


def test_the_memory_of_a_history_is_fixed_when_made():
    history = History(len(SERIES))
    before = history.bytes()
    for i in range(1000):
        history.put(T0 + 10 * i, [1.0] * len(SERIES))
    assert history.bytes() == before == (360 + 288) * len(SERIES) * 4 + len(SERIES) * 12


# -- the book of a host and its VMs --------------------------------------------------------

def at(series: dict, name: str) -> list:
    """The points of ``name`` present, without the absent ones."""
    return [v for v in series["series"][name] if v is not None]


def test_rates_come_from_two_readings_and_memory_from_each():
    graphs = Graphs("host1")
    graphs.put(T0, Reading(cpu_s=100.0, cpus=2, mem_bytes=1000, disk_read=0, disk_written=0,
                           net_rx=0, net_tx=0), {})
    graphs.put(T0 + 10, Reading(cpu_s=105.0, cpus=2, mem_bytes=2000, disk_read=10_000,
                                disk_written=500, net_rx=1000, net_tx=20), {})
    hour = graphs.host_series("hour", T0 + 10)
    assert (hour["span"], hour["step_s"], hour["start"]) == ("hour", 10, T0 + 10 - 3590)
    assert set(hour["series"]) == set(SERIES)
    assert all(len(points) == 360 for points in hour["series"].values())
    assert hour["series"]["cpu_pct"][-2:] == [None, 25.0]     # 5 CPU s of 2 CPUs in 10 s
    assert hour["series"]["mem_bytes"][-2:] == [1000, 2000]
    assert at(hour, "disk_read_bytes_per_s") == [1000]
    assert at(hour, "disk_write_bytes_per_s") == [50]
    assert at(hour, "net_rx_bytes_per_s") == [100] and at(hour, "net_tx_bytes_per_s") == [2]
    day = graphs.host_series("day", T0 + 10)
    assert (day["step_s"], len(day["series"]["cpu_pct"])) == (300, 288)
    assert day["series"]["mem_bytes"][-1] == 1500 and day["series"]["cpu_pct"][-1] == 25.0


def test_a_counter_missing_or_gone_back_gives_no_rate_never_zero():
    graphs = Graphs("host1")
    graphs.put(T0, None, {"u1": Reading(cpu_s=50.0, mem_bytes=1, disk_read=900)})
    graphs.put(T0 + 10, None, {"u1": Reading(cpu_s=1.0, mem_bytes=1, disk_read=None)})
    vm = graphs.vm_series("u1", "hour", T0 + 10)
    assert vm["series"]["cpu_pct"][-1] is None             # restarted: went back
    assert vm["series"]["disk_read_bytes_per_s"][-1] is None
    assert vm["series"]["net_rx_bytes_per_s"][-1] is None  # never measured
    assert graphs.host_series("hour", T0 + 10)["series"]["mem_bytes"] == [None] * 360


def test_a_vm_never_read_answers_the_same_shape_all_absent():
    graphs = Graphs("host1")
    vm = graphs.vm_series("nobody", "day", T0)
    assert vm["step_s"] == 300 and set(vm["series"]) == set(SERIES)
    assert all(points == [None] * 288 for points in vm["series"].values())


def test_vms_that_left_are_forgotten_and_the_book_keeps_at_most_its_bound():
    graphs = Graphs("host1", forget_after=60, most_vms=3)
    graphs.put(T0, None, {"gone": Reading(mem_bytes=1), "stays": Reading(mem_bytes=2)})
    graphs.put(T0 + 50, None, {"stays": Reading(mem_bytes=2)})
    assert graphs.vms() == {"gone", "stays"}
    graphs.put(T0 + 70, None, {"stays": Reading(mem_bytes=2)})
    assert graphs.vms() == {"stays"}
    graphs.put(T0 + 80, None, {"a": Reading(), "b": Reading()})
    graphs.put(T0 + 90, None, {"c": Reading()})     # a fourth: the longest unseen goes
    assert graphs.vms() == {"a", "b", "c"}


def test_cpu_is_a_share_of_the_cpus_it_has_at_most_all_of_them():
    graphs = Graphs("host1")
    graphs.put(T0, None, {"u1": Reading(cpu_s=0.0, cpus=4)})
    graphs.put(T0 + 10, None, {"u1": Reading(cpu_s=80.0, cpus=4)})     # more than it can
    assert graphs.vm_series("u1", "hour", T0 + 10)["series"]["cpu_pct"][-1] == 100.0
    assert not math.isnan(graphs.vm_series("u1", "day", T0 + 10)["series"]["cpu_pct"][-1])
