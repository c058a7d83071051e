"""Whether onnxruntime's u8×s8 kernels saturate on a CPU: what QDQ508 guards against, told from the CPU's flags.

x86 CPUs without VNNI multiply u8×s8 with `pmaddubsw`, which adds each pair of products in
saturating 16-bit arithmetic. VNNI (AVX512-VNNI, AVX-VNNI, and AMX next to them) sums in 32 bits,
and onnxruntime's ARM kernels widen before adding, with the dot-product instructions (`asimddp`)
or without. QDQ508's `cpu` parameter names one of these kinds, or "auto" for the CPU qdq runs
on; the environment variable QDQ_CPU gives "auto" another kind, for a run on a machine that is not
the one the model will run on (a CI runner).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

from qdq.support.errors import RuleSetError

# Each kind, and whether its u8×s8 kernels add pairs of products in saturating 16 bits.
SATURATES = {"x86-avx2": True, "x86-vnni": False, "arm": False}
AUTO = "auto"
ENVIRONMENT = "QDQ_CPU"
# x86 flags (/proc/cpuinfo) of the instructions that sum u8×s8 products in 32 bits.
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
_ARM = ("aarch64", "arm64")


@dataclass(frozen=True)
class Cpu:
    kind: str  # a key of SATURATES
    why: str  # how qdq came to assume it, for the report

    @property
    def saturates(self) -> bool:
        return SATURATES[self.kind]


def resolve(setting: str) -> Cpu:
    """The CPU a rule set's `cpu` parameter names: a kind as given, or "auto" for this machine (or QDQ_CPU)."""
    if setting == AUTO:
        chosen = os.environ.get(ENVIRONMENT, "")
        if chosen:
            _known(chosen, f"{ENVIRONMENT}={chosen}")
            return Cpu(chosen, f"{ENVIRONMENT}={chosen}")
        return this_cpu()
    _known(setting, f"cpu = {setting!r}")
    return Cpu(setting, f"cpu = {setting!r} in the rule set")


def this_cpu(cpuinfo: Path = Path("/proc/cpuinfo"), machine: str | None = None) -> Cpu:
    """The kind of the CPU qdq runs on, from its architecture and (on Linux) its flags."""
    machine = (machine or platform.machine()).lower()
    try:
        flags: set[str] | None = set(cpuinfo.read_text().split())
    except OSError:
        flags = None
    if machine in _ARM:
        dot = " with the dot-product instructions (asimddp)" if flags and "asimddp" in flags else ""
        return Cpu("arm", f"this machine is {machine}{dot}")
    if machine not in _X86:
        return Cpu("x86-avx2", f"this machine is {machine}, which qdq cannot judge: assumed to saturate, the safe side")
    if flags is None:
        return Cpu("x86-avx2", f"no {cpuinfo} to read this x86 CPU's flags from: assumed without VNNI, the safe side")
    vnni = [flag for flag in _VNNI_FLAGS if flag in flags]
    if vnni:
        return Cpu("x86-vnni", f"this machine's CPU has {', '.join(vnni)} ({cpuinfo})")
    return Cpu("x86-avx2", f"this machine's CPU has no VNNI flag in {cpuinfo}")


def _known(kind: str, where: str) -> None:
    if kind not in SATURATES:
        raise RuleSetError(f"{where}: unknown CPU kind, expected {AUTO!r} or one of {', '.join(SATURATES)}")
