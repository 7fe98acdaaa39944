"""The peer's heartbeat file, beaten from several threads at once (the
lease's keep-alive and a stop's last renewal did, and a systemctl stop
failed on the rename of a temporary file the other beat had taken)."""
import json
import threading

from engine.hypervisor.ha.guard import Heartbeat


def test_beats_from_several_threads_never_collide_and_never_go_back(tmp_path):
    heartbeat = Heartbeat(str(tmp_path))
    failures = []

    def beats(base):
        for i in range(150):
            try:
                heartbeat.beat(base + i)
            except Exception as exc:        # what the race raised: FileNotFoundError
                failures.append(exc)
    threads = [threading.Thread(target=beats, args=(k * 1000.0,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []

    def written():
        with open(heartbeat.path) as f:
            return json.load(f)
    assert written()["until"] == 3149.0, "a later beat was overwritten by an earlier one"
    heartbeat.beat(5.0)                                 # a renewal that answered late
    assert written()["until"] == 3149.0
    heartbeat.stopping()
    assert written()["until"] == 3149.0 and written()["stopping"] is True
