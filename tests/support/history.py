"""A tiny in-memory executor for replay tests: history in, requests out."""
from __future__ import annotations

from engine.core.replay import LoggedStep, Replayer, Response


class History:
    """Runs a worker to completion against ``answer(request) -> Response``,
    recording the log and the responses as the live initiator would."""

    def __init__(self, worker, args, automation_id="a1", answer=None, order=None):
        self.worker, self.args, self.automation_id = worker, args, automation_id
        self.answer = answer or (lambda req: Response("ok", {"echo": req.args}))
        self.order = order or (lambda pending: pending[0])
        self.steps: dict[tuple[str, int], LoggedStep] = {}
        self.requests: list = []            # index -> Request
        self.responses: list[tuple[int, Response]] = []    # delivery order
        self.appended_after: list[int] = []  # log length after each delivery
        self.revision = 0

    def run(self) -> Replayer:
        live = Replayer(self.automation_id, self.worker, self.args)
        self._append(live)
        self.appended_after.append(len(self.requests))
        pending = [i for i in range(len(self.requests))]
        while pending and not live.finished:
            index = self.order(pending)
            pending.remove(index)
            self.revision += 1
            answer = self.answer(self.requests[index])
            response = Response(answer.status, answer.value, answer.error,
                                "h", 1000.0 + self.revision, self.revision)
            self.responses.append((index, response))
            live.deliver(index, response)
            before = len(self.requests)
            self._append(live)
            pending.extend(range(before, len(self.requests)))
            self.appended_after.append(len(self.requests))
        return live

    def _append(self, replayer: Replayer):
        while True:
            batch = replayer.take_new()
            if not batch:
                return
            for new in batch:
                index = len(self.requests)
                step = LoggedStep(index, new.worker, new.seq, new.fingerprint,
                                  f"{new.request.name}@{new.request.target}")
                self.steps[(new.worker, new.seq)] = step
                self.requests.append(new.request)
                replayer.bind(step)

    def replay(self, upto: int | None = None, worker=None) -> Replayer:
        """A fresh replayer fed the log and the first ``upto`` responses."""
        replayer = Replayer(self.automation_id, worker or self.worker, self.args,
                            logged=self.steps)
        for index, response in self.responses[:upto]:
            replayer.deliver(index, response)
        return replayer
