"""The machine line's CPU: its name, family and model from /proc/cpuinfo's first processor."""

from __future__ import annotations

import platform

from specdecode.hardware import cpu_model

TWO_PROCESSORS = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
flags\t\t: fpu avx512f

processor\t: 1
vendor_id\t: AuthenticAMD
cpu family\t: 26
model\t\t: 2
model name\t: AMD EPYC 9005
"""


def test_the_first_processors_name_family_and_model():
    assert cpu_model(TWO_PROCESSORS) == "AMD EPYC (family 25 model 17)"


def test_a_cpuinfo_without_family_gives_the_name_alone():
    arm = "processor\t: 0\nmodel name\t: ARMv8 Processor rev 1 (v8l)\nCPU implementer\t: 0x41\n"
    assert cpu_model(arm) == "ARMv8 Processor rev 1 (v8l)"
    assert cpu_model("") == (platform.processor() or "unknown model")
