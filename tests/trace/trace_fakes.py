"""A fake ``cupti.pm_sampling.Collector`` for CPU tests of the sampler."""

from __future__ import annotations

import time


class _Sample:
    def __init__(self, s, e, vals):
        self.start_timestamp, self.end_timestamp, self.metric_values = s, e, vals


class _Data(list):
    @property
    def num_completed_samples(self):
        return len(self)


class FakeCollector:
    """Behaves like ``cupti.pm_sampling.Collector``; timestamps on ``clock() + skew``.

    ``zero_first``: the first sample's start timestamp is 0 (as seen on the H200);
    ``unit_ns``: timestamps are reported in units of this many ns (1000: microseconds);
    ``empty``: no sample at all.
    """

    def __init__(self, device, *, refuse=frozenset(), skew=0, clock=time.time_ns, perm=False,
                 zero_first=False, unit_ns=1, empty=False):  # fmt: skip
        self.device, self.refuse, self.skew, self.clock, self.perm = (
            device,
            refuse,
            skew,
            clock,
            perm,
        )
        self.zero_first, self.unit_ns, self.empty = zero_first, unit_ns, empty
        self.metrics = None
        self.disabled = False
        self.buffer: list[_Sample] = []

    def enable(self):
        if self.perm:
            raise PermissionError("Insufficient privileges for PM sampling")

    def configure(self, *, metrics, hardware_buffer_size, sampling_interval):
        assert hardware_buffer_size > 0
        if self.refuse <= set(metrics) and self.refuse:
            raise ValueError("Requested PM sampling configuration is not supported")
        self.metrics, self.interval = list(metrics), sampling_interval

    def start(self):
        self.t_start = self.clock() + self.skew

    def stop(self):
        t_stop = self.clock() + self.skew
        t = self.t_start
        k = 0
        while t + self.interval <= t_stop:
            vals = [float(10 * (j + 1) + (k % 3)) for j in range(len(self.metrics))]
            self.buffer.append(_Sample(t, t + self.interval, vals))
            t += self.interval
            k += 1
        if self.empty:
            self.buffer.clear()
        if self.unit_ns != 1:
            for smp in self.buffer:
                smp.start_timestamp //= self.unit_ns
                smp.end_timestamp //= self.unit_ns
        if self.zero_first and self.buffer:
            self.buffer[0].start_timestamp = 0

    def decode(self, max_samples):
        out, self.buffer = self.buffer[:max_samples], self.buffer[max_samples:]
        return _Data(out)

    def disable(self):
        self.disabled = True
