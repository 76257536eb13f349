"""A LoadGen Server run on a fake engine of known service time, for the capacity search's test
(tests/test_capacity.py): one request at a time, first come first served, each taking exactly
`--service-ms` and answering its first token when its service ends (an M/D/1 queue under LoadGen's
Poisson arrivals), behind the harness's own LoadGen adapter. Service starts and ends follow the
queue's schedule (start = max(arrival, the previous end)), not the time a sleep happened to wake,
so the machine's timer jitter does not accumulate into the queue.

    python tests/fake_queue_server.py --user-conf FILE --log-dir DIR --service-ms 10
"""

import argparse
import collections
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import mlperf_loadgen as lg  # noqa: E402

from harness.loadgen_sut import EngineSUT, construct_qsl  # noqa: E402
from sut import SamplingParams  # noqa: E402
from sut.outputs import RequestOutput  # noqa: E402

LOADGEN_MODEL = "fake"  # its limits are the user.conf's ttft_latency and tpot_latency


class QueueEngine:
    """The engine-client calls EngineSUT makes, over a one-server FIFO queue of fixed service time."""

    def __init__(self, service_s: float):
        self.service_s = service_s
        self.queue = collections.deque()  # (request_id, arrival, on_token)
        self.lock = threading.Lock()
        self.last_end = 0.0

    def add_request(self, prompt, params=None, request_id=None, on_token=None):
        with self.lock:
            self.queue.append((request_id, time.perf_counter(), on_token))

    def has_unfinished(self) -> bool:
        return bool(self.queue)

    def step(self) -> list[RequestOutput]:
        with self.lock:
            request_id, arrival, on_token = self.queue.popleft()
        self.last_end = max(arrival, self.last_end) + self.service_s
        time.sleep(max(0.0, self.last_end - time.perf_counter()))
        on_token(1)
        return [RequestOutput(request_id, [0], [1, 2], None, "length")]

    def fail_all(self, error: str) -> list[RequestOutput]:
        raise AssertionError(f"the fake engine does not fail: {error}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--user-conf", required=True)
    parser.add_argument("--log-dir", type=Path, required=True)
    parser.add_argument("--service-ms", type=float, required=True)
    args = parser.parse_args()
    settings = lg.TestSettings()
    if settings.FromConfig(args.user_conf, LOADGEN_MODEL, "Server"):
        sys.exit(f"error: {args.user_conf}: LoadGen refused it")
    settings.scenario, settings.mode = lg.TestScenario.Server, lg.TestMode.PerformanceOnly
    args.log_dir.mkdir(parents=True, exist_ok=True)
    log = lg.LogSettings()
    log.log_output.outdir, log.log_output.copy_summary_to_stdout = str(args.log_dir), False
    samples = 1000
    sut = EngineSUT(QueueEngine(args.service_ms / 1000), [[0]] * samples, SamplingParams(), stream_first_token=True)
    qsl = construct_qsl(samples, samples)
    sut.run_test(qsl, settings, log, str(args.log_dir / "no-audit.config"))
    lg.DestroyQSL(qsl)
    sut.close()


if __name__ == "__main__":
    main()
