"""What a perf-test worker has loaded when compare.py takes its memory baseline: its own client library only.

Spawned workers import compare.py again (as ``__mp_main__``), perf_test (their target) and the
adapter's module. Anything else they load before the baseline skews the memory a producer adds:
pyzmq and msgpack in a confluent-kafka worker left freed memory that librdkafka then reused, and its
W3 figure was 19-27 MB instead of 34.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARIES = {"client_stub", "zmq", "msgpack", "confluent_kafka", "kafka"}


@pytest.mark.parametrize(("client", "own"), [
    ("confluent-kafka", {"confluent_kafka"}),
    ("kafka-python", {"kafka"}),
    ("kafka-sidecar", {"client_stub", "zmq", "msgpack"}),
])
def test_a_worker_loads_the_library_of_its_client_and_no_other(client: str, own: set[str]) -> None:
    probe = (
        "import json, sys\n"
        "import tests.perf.compare\n"
        "from tests.perf.clients import ADAPTERS\n"
        "from service.tools.perf_test import _load\n"
        f"_load(ADAPTERS[{client!r}]).prepare()\n"
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) & LIBRARIES == own


FORKED_PROBE = """\
import json, sys
sys.path.insert(0, {root!r})
import tests.perf.compare  # noqa: F401  (compare.py's workers' server imports it, as their main module)
from service.tools import perf_test
from tests.perf.clients import ADAPTERS, LIBRARIES


def loaded(queue):
    queue.put(sorted({{name.split('.')[0] for name in sys.modules}}))


if __name__ == "__main__":
    context = perf_test._context(ADAPTERS[{client!r}], [LIBRARIES[{client!r}]])
    queue = context.SimpleQueue()
    worker = context.Process(target=loaded, args=(queue,))
    worker.start()
    print(json.dumps(queue.get()))
    worker.join(30)
    perf_test._stop_forkserver()
"""


@pytest.mark.parametrize(("client", "own"), [
    ("confluent-kafka", {"confluent_kafka"}),
    ("kafka-python", {"kafka"}),
    ("kafka-sidecar", {"client_stub", "zmq", "msgpack"}),
])
def test_a_forked_worker_has_the_library_of_its_client_preloaded_and_no_other(client: str, own: set[str],
                                                                              tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(FORKED_PROBE.format(root=str(ROOT), client=client))
    done = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert set(json.loads(done.stdout)) & LIBRARIES == own
