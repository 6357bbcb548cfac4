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
    """Behaves like ``cupti.pm_sampling.Collector``; timestamps on ``clock() + skew``."""

    def __init__(self, device, *, refuse=frozenset(), skew=0, clock=time.time_ns, perm=False):
        self.device, self.refuse, self.skew, self.clock, self.perm = (
            device,
            refuse,
            skew,
            clock,
            perm,
        )
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

    def decode(self, max_samples):
        out, self.buffer = self.buffer[:max_samples], self.buffer[max_samples:]
        return _Data(out)

    def disable(self):
        self.disabled = True
