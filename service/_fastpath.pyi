"""Types of the C extension service._fastpath (service/_fastpath.c), whose docstrings say what each does.

Its pure-Python twin, service/_fastpath_py.py, has the same names and signatures (tests/unit/test_typing.py
checks both against this stub).
"""

from _typeshed import ReadableBuffer, WriteableBuffer

from client_stub.contract.batch_slots import ControlArea

def rebase_records(records: ReadableBuffer, record_count: int, first_offset_delta: int, timestamp_shift: int,
                   /) -> bytes: ...
def copy_records(records: ReadableBuffer, record_count: int, /) -> bytes: ...
def claim_ready(control: ControlArea, state: ReadableBuffer, owned: int, first_seen: WriteableBuffer, now_ms: int,
                claim_all: bool, early_ms: int, /) -> tuple[list[tuple[int, ...]], int | None, bool, bool, bool]: ...
def seal_claimed(state: WriteableBuffer, owned: int, sealed: int, block_size: int, claimed: tuple[int, ...],
                 /) -> bool: ...
