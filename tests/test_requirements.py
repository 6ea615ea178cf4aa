"""The install files: the GPU requirements never carry the CPU build's pins, and the run-time check
names what does not pair with the installed torch (fakes for the installed versions)."""
from __future__ import annotations

import re
from pathlib import Path

from gemref.env import FBGEMM_FOR_TORCH, paired_versions

ROOT = Path(__file__).resolve().parent.parent


def requirement_lines(name: str) -> list[str]:
    return [line.split("#")[0].strip() for line in (ROOT / name).read_text().splitlines()
            if line.split("#")[0].strip()]


def package(line: str) -> str:
    return re.split(r"[=<>!~ ;\[]", line)[0].lower()


def forbidden(lines: list[str]) -> list[str]:
    """The lines a GPU install must not hold: a Triton or torch pin, a CPU-only build."""
    return [line for line in lines if package(line) in ("triton", "torch") or package(line).endswith("-cpu")]


def test_the_gpu_requirements_pin_no_triton_and_no_cpu_build():
    lines = requirement_lines("requirements-gpu.txt")
    assert forbidden(lines) == []
    assert {"fbgemm-gpu", "torchrec", "torchao"} <= {package(line) for line in lines}


def test_the_check_refuses_the_cpu_install_and_a_planted_pin():
    assert forbidden(requirement_lines("requirements-nodeps.txt")) == ["triton==3.9.0", "fbgemm-gpu-cpu==1.8.0"]
    assert forbidden(["torchao==0.18.0", "Triton >= 3.5"]) == ["Triton >= 3.5"]


def test_the_gpu_pins_pair_fbgemm_and_torchrec_with_one_torch():
    pins = dict(line.split("==") for line in requirement_lines("requirements-gpu.txt"))
    assert pins["fbgemm-gpu"] == pins["torchrec"]
    assert ".".join(pins["fbgemm-gpu"].split(".")[:2]) in FBGEMM_FOR_TORCH.values()


def fake(**versions):
    table = {k.replace("_", "-"): v for k, v in versions.items()}
    return lambda name: table.get(name)


TORCH_211 = ['triton==3.6.0; platform_system == "Linux"', "filelock"]


def test_a_paired_gpu_stack_has_no_problems():
    installed = fake(torch="2.11.0+cu128", triton="3.6.0", fbgemm_gpu="1.6.0", torchrec="1.6.0", torchao="0.18.0")
    assert paired_versions(installed, TORCH_211, cuda=True) == []


def test_each_unpaired_package_is_named():
    installed = fake(torch="2.11.0+cu128", triton="3.9.0", fbgemm_gpu_cpu="1.8.0", torchrec="1.8.0", torchao="0.18.0")
    problems = paired_versions(installed, TORCH_211, cuda=True)
    assert any("triton 3.9.0" in p and "3.6.0" in p for p in problems)
    assert any(p.startswith("fbgemm-gpu-cpu 1.8.0 pairs with another torch") for p in problems)
    assert any(p.startswith("torchrec 1.8.0") for p in problems)
    assert any("CPU kernels only" in p for p in problems)
    old_torch = fake(torch="2.10.0", torchao="0.18.0")
    assert paired_versions(old_torch, [], cuda=False) == ["torchao 0.18.0 needs torch >= 2.11, torch is 2.10.0"]


def test_this_cpu_install_pairs():
    """The CPU install (requirements-nodeps.txt) is torch 2.13's pairing: fbgemm-gpu-cpu and torchrec 1.8."""
    assert paired_versions(cuda=False) == []
