"""What the Python tests share: another thread that shows whether a call holds the GIL, and Ctrl-C during a call."""
import contextlib
import os
import signal
import threading
import time

import pytest


@contextlib.contextmanager
def _ticking():
    """Another Python thread appends to the yielded list every millisecond while the block runs: a call that
    releases the GIL lets it tick, one that holds it does not."""
    ticks, stop = [], threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    t = threading.Thread(target=tick)
    t.start()
    try:
        yield ticks
    finally:
        stop.set()
        t.join()


@contextlib.contextmanager
def _ctrl_c(within=None):
    """Ctrl-C (SIGINT to this process, as a terminal sends it) 0.3 s into the block: the block must raise
    KeyboardInterrupt — within `within` seconds when given — and leave Python's own SIGINT handler in place."""
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    start = time.monotonic()
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        yield
    if within is not None:
        assert time.monotonic() - start < within
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.fixture
def ticking():
    """with ticking() as ticks: ... — the ticks another thread made while the block ran (_ticking)."""
    return _ticking


@pytest.fixture
def ctrl_c():
    """with ctrl_c(within=20): ... — the block interrupted by Ctrl-C (_ctrl_c)."""
    return _ctrl_c
