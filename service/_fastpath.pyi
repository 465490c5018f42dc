"""Types of the C extension service._fastpath (service/_fastpath.c), whose docstrings say what each does.

Its pure-Python twin, service/_fastpath_py.py, has the same names and signatures (tests/unit/test_typing.py
checks both against this stub).
"""

from _typeshed import ReadableBuffer

def rebase_records(records: ReadableBuffer, record_count: int, first_offset_delta: int, timestamp_shift: int,
                   /) -> bytes: ...
def copy_records(records: ReadableBuffer, record_count: int, /) -> bytes: ...
