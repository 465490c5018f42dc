"""The C extensions under AddressSanitizer and UndefinedBehaviorSanitizer.

Every extension of pyproject.toml is built with ``-fsanitize=address,undefined`` into a scratch copy of
the project (tests.support.sanitizers), and a pytest subprocess runs there, with gcc's ASan runtime
preloaded, the extensions' unit tests and the client's integration tests (with the daemon they start,
which loads the daemon's extension): any sanitizer report, from any of these processes, fails this test
and is its message.
"""

from __future__ import annotations

import re
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path

import pytest

from tests.support.sanitizers import HEADER, SanitizedTree, SanitizersUnavailable

ROOT = Path(__file__).parents[2]
# The unit tests of the C extensions: the client's fast path, and the functions it implements for
# client_stub.contract.records and client_stub.partitioner.
UNIT_TESTS = ("tests/unit/test_fastpath.py", "tests/unit/test_records.py", "tests/unit/test_varints.py",
              "tests/unit/test_partitioner.py")
# The client's integration tests, and the daemon's coalescing (rebase_records) against a broker.
INTEGRATION_TESTS = ("tests/integration/test_producer_api.py", "tests/integration/test_client_stub.py",
                     "tests/integration/test_coalescing.py")
# Tests that spend their time waiting (request timeouts, linger, max.block.ms, a slowed broker), which
# run no C code the others do not: seconds each, that the sanitizers would add to the default run.
WAITING = (
    "tests/integration/test_producer_api.py::test_on_delivery_gets_the_error_and_no_metadata",
    "tests/integration/test_producer_api.py::test_flush_with_a_silent_broker_returns_what_is_undelivered",
    "tests/integration/test_producer_api.py::test_close_with_a_timeout_fails_what_is_unconfirmed",
    "tests/integration/test_producer_api.py::test_linger_seals_without_flush",
    "tests/integration/test_producer_api.py::test_buffer_exhausted_for_a_large_record_no_earlier_than_max_block_ms",
    "tests/integration/test_producer_api.py::test_a_failed_record_future_raises_its_kafka_error",
    "tests/integration/test_client_stub.py::test_exhausted_pool_raises_after_max_block_ms_and_recovers",
    "tests/integration/test_client_stub.py::test_a_slow_broker_makes_batches_bigger_not_more_numerous",
    "tests/integration/test_client_stub.py::test_a_partition_pipelines_its_batches_while_reports_come_back_in_time",
    "tests/integration/test_client_stub.py::test_no_daemon_raises_sidecar_unavailable_naming_the_endpoint",
    # 200 000 records through the same appends as the tests kept: 40 s of a worker under the sanitizers.
    "tests/integration/test_client_stub.py::test_four_processes_send_50k_records_each",
)
# Tests that name the extensions but run none of their code: the type checks read the stubs, not the modules.
NOT_EXTENSION_TESTS = ("tests/unit/test_typing.py",)
# A run with fewer passed tests than this has lost most of what it is for.
MINIMUM_PASSED = 200
TIMEOUT = 480.0


def extension_tests(names: list[str]) -> list[str]:
    """UNIT_TESTS and INTEGRATION_TESTS that exist, and any other unit test module that names an extension module
    ``names``, their twins (tests.support.fastpath) or rebase_records: the daemon's tests, wherever they land."""
    mentions = re.compile("|".join([*map(re.escape, names), r"\btests\.support\.fastpath\b", r"\brebase_records\b"]))
    found = [path for path in (*UNIT_TESTS, *INTEGRATION_TESTS) if (ROOT / path).exists()]
    for path in sorted((ROOT / "tests/unit").glob("test_*.py")):
        relative = str(path.relative_to(ROOT))
        if relative not in found and relative not in NOT_EXTENSION_TESTS and mentions.search(path.read_text()):
            found.append(relative)
    return found


def passed_per_file(junit: Path) -> Counter[str]:
    """The number of tests that passed in each test file, from pytest's JUnit XML report."""
    passed: Counter[str] = Counter()
    for case in ElementTree.parse(junit).iter("testcase"):
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            # classname is the module's dotted path, then the class if any: tests.unit.test_records[.Class]
            module = re.match(r"tests\.(?:unit|integration)\.test_\w+", case.get("classname", ""))
            passed[module.group(0).replace(".", "/") + ".py" if module else case.get("classname", "")] += 1
    return passed


@pytest.mark.timeout(TIMEOUT + 120)
def test_c_extensions_under_address_and_undefined_behavior_sanitizers(tmp_path: Path) -> None:
    try:
        tree = SanitizedTree.build(ROOT, tmp_path)
    except SanitizersUnavailable as reason:
        pytest.skip(f"no sanitizer build here: {reason}")
    selected = extension_tests(list(tree.built))
    assert any(path.startswith("tests/unit/") for path in selected), "none of the C extensions' unit tests exist"
    junit = tmp_path / "junit.xml"
    started = time.monotonic()
    # Two pytest-xdist workers: the instrumented tests wait on brokers and daemons much of their time.
    result = tree.run_pytest(["-rfE", "-n", "2", f"--junitxml={junit}", *selected,
                              *(f"--deselect={test}" for test in WAITING)], timeout=TIMEOUT)
    output = f"{result.stdout}\n{result.stderr}"[-20_000:]
    found = tree.found()
    assert not found and result.returncode == 0, (
        f"pytest under the sanitizers exited with {result.returncode} after {time.monotonic() - started:.0f}s\n"
        f"-- the sanitizers' reports --\n{found or '(none)'}\n-- pytest's output --\n{output}")
    # The plugin refuses to start on any other build of an extension: its header says it checked them.
    for name in tree.built:
        assert f"{HEADER} {name} from " in result.stdout, f"the sanitized build of {name} was not checked"
    passed = passed_per_file(junit)
    assert not [path for path in selected if not passed[path]], f"files of which no test passed: {passed}"
    assert passed.total() >= MINIMUM_PASSED, f"only {passed.total()} tests passed: {passed}"
