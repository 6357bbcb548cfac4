"""Test setup: Triton runs in its CPU interpreter when there is no GPU.

``TRITON_INTERPRET`` must be set before Triton (and so anything from ``kdtree.kernels``) is
imported, which is why it happens here, at the top of the root conftest.
"""

from __future__ import annotations

import os
import shutil
import subprocess


def _has_cuda() -> bool:
    if os.environ.get("CUDA_VISIBLE_DEVICES") == "":
        return False
    return (
        shutil.which("nvidia-smi") is not None
        and subprocess.run(["nvidia-smi", "-L"], capture_output=True, check=False).returncode == 0
    )


if not _has_cuda():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

# The test models are tiny: one intra-op thread is faster than two on a 2-core machine and keeps
# parallel test processes from oversubscribing it.
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip_gpu)


@pytest.fixture
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@pytest.fixture
def gen() -> torch.Generator:
    """A private, seeded CPU generator (tests never touch the global RNG)."""
    g = torch.Generator()
    g.manual_seed(1234)
    return g
