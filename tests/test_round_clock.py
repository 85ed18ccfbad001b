"""RoundClock: rounds' device time for the share allocator, read without waiting."""

from __future__ import annotations

import pytest
import torch

from lanes.round_clock import RoundClock


def test_without_events_the_wall_time_stands_in_in_order():
    clock = RoundClock(on_cuda=False)
    assert clock.begin() is None
    clock.end(None, 16, 2, 0.5)
    clock.end(None, 0, 3, 0.25)
    assert clock.measured() == [(16, 2, 0.5), (0, 3, 0.25)]
    assert clock.measured() == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_device_time_is_measured_once_the_work_completes():
    clock = RoundClock(on_cuda=True)
    torch.cuda.synchronize()
    mark = clock.begin()
    torch.cuda._sleep(100_000_000)  # ~50 ms of device time, launched in microseconds
    clock.end(mark, 0, 1, wall_seconds=0.0)
    clock.end(None, 0, 2, wall_seconds=1.0)  # queued behind it: waits its turn
    assert clock.measured() == []  # still running: nothing measured, nothing waited for
    torch.cuda.synchronize()
    (first, second) = clock.measured()
    assert first[:2] == (0, 1) and first[2] > 0.01  # the device's time, not the host's 0.0
    assert second == (0, 2, 1.0)
