"""Build the CUDA C++ sources under ``kernels/`` into cached shared objects (``nvcc``), and —
for sources written to run on the CPU too — into a g++ build over ``kernels/cuda_cpu_emu.h``.

A library is built on first use into ``~/.cache/kdtree/cuda/<hash of source, headers, flags,
compiler version>/`` (``KDTREE_CUDA_CACHE`` overrides the root) and loaded with :mod:`ctypes`
by its user (``kdtree.kernels.cuda_mla``, ``kdtree.spec.gpu.tree_build_cuda``).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "KERNELS_DIR",
    "BuildResult",
    "CudaSource",
    "build_probe",
    "find_cxx",
    "find_nvcc",
    "parse_ptxas",
]

KERNELS_DIR = Path(__file__).resolve().parents[2] / "kernels"
SM90_FLAGS = (
    # -gencode form of -arch=sm_90a (sm_90a machine code only; HOPPER.md: the shorthand also
    # runs a plain sm_90 pass)
    "-gencode=arch=compute_90a,code=sm_90a",
    "-O3",
    "-std=c++17",
)
SHARED_FLAGS = ("-Xcompiler", "-fPIC", "-shared", "--ptxas-options=-v")
CPU_EMU_FLAGS = (
    "-std=c++20",
    "-O2",
    "-pthread",
    "-fPIC",
    "-shared",
    "-DKDTREE_CPU_EMU",
    "-x",
    "c++",
)


@dataclass(frozen=True)
class BuildResult:
    """A built shared object and the compiler's output (``--ptxas-options=-v`` report)."""

    path: Path
    log: str
    cached: bool


def find_nvcc() -> str | None:
    """``nvcc`` from ``CUDA_HOME``/``CUDA_PATH``, then ``PATH``, then ``/usr/local/cuda``."""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and os.access(os.path.join(root, "bin", "nvcc"), os.X_OK):
            return os.path.join(root, "bin", "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = "/usr/local/cuda/bin/nvcc"
    return default if os.access(default, os.X_OK) else None


def build_probe(src: str | os.PathLike, out_dir: str | os.PathLike | None = None) -> Path:
    """A standalone sm_90a probe (a device tool's ``.cu``, e.g. ``tools/gpu/read_floor.cu``; not
    one of kdtree's kernels) built into a shared library with the kernels' nvcc and flags, in
    ``out_dir`` (a new temporary directory if None); its path. Raises ``RuntimeError`` without
    nvcc, ``subprocess.CalledProcessError`` when it does not build."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise RuntimeError("build_probe: no nvcc (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda)")
    src = Path(src)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp())
    out.mkdir(parents=True, exist_ok=True)
    lib = out / f"lib{src.stem}.so"
    flags = [f for f in SHARED_FLAGS if f != "--ptxas-options=-v"]
    subprocess.run([nvcc, *SM90_FLAGS, *flags, "-o", str(lib), str(src)], check=True)
    return lib


def find_cxx() -> str | None:
    """A C++20 compiler for the CPU builds: ``$CXX``, then ``g++``, then ``c++``."""
    cxx = os.environ.get("CXX")
    if cxx and shutil.which(cxx):
        return shutil.which(cxx)
    return shutil.which("g++") or shutil.which("c++")


_PTXAS_FUNC = re.compile(r"Compiling entry function '([^']+)' for '([^']+)'")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_PTXAS_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas(log: str) -> dict[str, dict[str, int]]:
    """Per kernel (mangled name, ``@arch``): ``registers``, ``stack``, ``spill_stores``,
    ``spill_loads`` from an ``nvcc --ptxas-options=-v`` report."""
    kernels: dict[str, dict[str, int]] = {}
    current = None
    for line in log.splitlines():
        m = _PTXAS_FUNC.search(line)
        if m:
            current = f"{m.group(1)}@{m.group(2)}"
            kernels[current] = {}
            continue
        if current is None:
            continue
        m = _PTXAS_FRAME.search(line)
        if m:
            kernels[current].update(
                stack=int(m.group(1)), spill_stores=int(m.group(2)), spill_loads=int(m.group(3))
            )
        m = _PTXAS_REGS.search(line)
        if m:
            kernels[current]["registers"] = int(m.group(1))
    return kernels


def measurement_defines() -> tuple[str, ...]:
    """The macros of ``KDTREE_CUDA_DEFINES`` (comma-separated ``NAME`` or ``NAME=VALUE``, the
    value letters, digits and ``_``), checked."""
    raw = os.environ.get("KDTREE_CUDA_DEFINES", "")
    names = tuple(n.strip() for n in raw.split(",") if n.strip())
    for n in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(=[A-Za-z0-9_]+)?", n):
            raise ValueError(f"KDTREE_CUDA_DEFINES: {n!r} is not NAME or NAME=VALUE")
    return names


def _cache_root() -> Path:
    root = os.environ.get("KDTREE_CUDA_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "kdtree" / "cuda"


@dataclass(frozen=True)
class CudaSource:
    """One ``.cu`` file under ``kernels/`` built into ``lib_name`` with ``flags``.

    ``headers`` (names under ``kernels/``) enter the cache key; ``what`` names the library in
    error messages.
    """

    name: str
    lib_name: str
    what: str
    flags: tuple[str, ...] = SM90_FLAGS + ("--use_fast_math",) + SHARED_FLAGS
    headers: tuple[str, ...] = field(default_factory=tuple)

    @property
    def path(self) -> Path:
        return KERNELS_DIR / self.name

    def source_bytes(self) -> bytes:
        if not self.path.is_file():
            raise RuntimeError(f"{self.what} kernel source not found at {self.path}")
        data = self.path.read_bytes()
        for h in self.headers:
            data += (KERNELS_DIR / h).read_bytes()
        return data

    # --------------------------------------------------------------------- nvcc (device)
    def _require_nvcc(self) -> str:
        nvcc = find_nvcc()
        if nvcc is None:
            raise RuntimeError(
                "nvcc not found (looked in $CUDA_HOME/bin, $CUDA_PATH/bin, PATH and "
                f"/usr/local/cuda/bin): the {self.what} is built from source on first use"
            )
        return nvcc

    def _compile(self, cmd_head: list[str], out_dir: Path, lib_name: str) -> tuple[Path, str]:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".build-", suffix=".so", dir=out_dir)
        os.close(fd)
        cmd = [*cmd_head, "-o", tmp, str(self.path)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            os.unlink(tmp)
            raise RuntimeError(f"compile failed ({proc.returncode}): {' '.join(cmd)}\n{log}")
        target = out_dir / lib_name
        os.replace(tmp, target)  # atomic: concurrent builders never see a half-written library
        (out_dir / f"{lib_name}.log").write_text(log)
        return target, log

    def _key(self, compiler: str, flags: tuple[str, ...]) -> str:
        version = subprocess.run(
            [compiler, "--version"], capture_output=True, text=True, check=False
        )
        h = hashlib.sha256()
        h.update(self.source_bytes())
        h.update("\0".join(flags).encode())
        h.update(version.stdout.encode())
        return h.hexdigest()[:20]

    def _cached(self, compiler: str, flags: tuple[str, ...], lib_name: str, extra: list[str]):
        out_dir = _cache_root() / self._key(compiler, flags)
        lib = out_dir / lib_name
        if lib.is_file():
            log_file = out_dir / f"{lib_name}.log"
            if not log_file.is_file():  # a cache folder written before the log was renamed
                log_file = out_dir / "ptxas.log"
            return BuildResult(lib, log_file.read_text() if log_file.is_file() else "", True)
        path, log = self._compile([compiler, *flags, *extra], out_dir, lib_name)
        return BuildResult(path, log, False)

    def build(self) -> BuildResult:
        """The cached device library, built on first use (keyed by source, flags, nvcc).
        ``KDTREE_CUDA_LINEINFO=1`` adds ``-lineinfo`` (source lines in compute-sanitizer and
        Nsight reports); ``KDTREE_CUDA_DEFINES=NAME[=VALUE][,...]`` defines macros
        (measurement builds, such as ``KDTREE_GQA_TALL_CLOCKS``: :func:`measurement_defines`)."""
        flags = self.flags
        if os.environ.get("KDTREE_CUDA_LINEINFO") == "1":
            flags = (*flags, "-lineinfo")
        flags = (*flags, *(f"-D{name}" for name in measurement_defines()))
        return self._cached(self._require_nvcc(), flags, self.lib_name, [])

    def compile_only(self, out_dir, defines: tuple[str, ...] = ()) -> BuildResult:
        """Build the device library into ``out_dir`` with the local nvcc (no GPU needed, no
        cache); ``log`` holds the ``--ptxas-options=-v`` report (see :func:`parse_ptxas`).
        ``defines``: macros of a measurement build (``NAME`` or ``NAME=VALUE``)."""
        flags = (*self.flags, *(f"-D{name}" for name in defines))
        path, log = self._compile([self._require_nvcc(), *flags], Path(out_dir), self.lib_name)
        return BuildResult(path, log, False)

    def ptx(self, out_dir, defines: tuple[str, ...] = ()) -> str:
        """The source's PTX from the local nvcc (``-ptx``: no ptxas, no GPU), written into
        ``out_dir``: what the kernels issue, instruction by instruction (the TMA copies' cache
        policy, for one). ``defines``: macros of a measurement build."""
        nvcc = self._require_nvcc()
        flags = [f for f in self.flags if f not in SHARED_FLAGS]
        out = Path(out_dir) / self.name.replace(".cu", ".ptx")
        out.parent.mkdir(parents=True, exist_ok=True)
        cmd = [nvcc, *flags, *(f"-D{name}" for name in defines), "-ptx", "-o", str(out)]
        proc = subprocess.run([*cmd, str(self.path)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"ptx failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr}")
        return out.read_text()

    # --------------------------------------------------------------------- g++ (CPU stand-in)
    def build_cpu_emu(self) -> BuildResult:
        """The same source built for the CPU over ``kernels/cuda_cpu_emu.h`` (one thread per
        CUDA thread): for tests of sources that support ``KDTREE_CPU_EMU``."""
        cxx = find_cxx()
        if cxx is None:
            raise RuntimeError(f"no C++ compiler found ($CXX, g++, c++) for the {self.what}")
        lib = self.lib_name.replace(".so", "_cpu_emu.so")
        return self._cached(cxx, CPU_EMU_FLAGS, lib, [f"-I{KERNELS_DIR}"])
