"""A stand-in for nvidia-ml-py's ``pynvml`` module: GPUs (some with MIG instances) and the
compute processes on them, as NVML gives them. Install it with
``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...).module())``."""

from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any

NO_INSTANCE = 0xFFFFFFFF


class NVMLError(Exception):
    pass


@dataclass
class FakeProcess:
    pid: int
    used: int | None  # bytes; None: NVML cannot tell (WDDM)
    gpu_instance: int = NO_INSTANCE
    compute_instance: int = NO_INSTANCE


@dataclass
class FakeMig:
    uuid: str
    gpu_instance: int
    compute_instance: int = 0
    name: str = "NVIDIA H200 1g.18gb"
    memory: int = 18 << 30


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H200"
    memory: int = 141 << 30
    used: int = 10 << 30
    util: int = 90
    power_mw: int | None = 250_500  # None: not supported
    temp: int = 60
    processes: list[FakeProcess] = field(default_factory=list)
    mig: list[FakeMig | None] | None = None  # None: no MIG mode (not supported); slots


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    driver: bool = True
    shutdowns: int = 0

    def module(self) -> types.ModuleType:
        nv = types.ModuleType("pynvml")
        gpus = self.gpus

        def obj(**kw: Any) -> types.SimpleNamespace:
            return types.SimpleNamespace(**kw)

        def init() -> None:
            if not self.driver:
                raise NVMLError("Driver Not Loaded")

        def shutdown() -> None:
            self.shutdowns += 1

        def handle(i: int) -> tuple[str, int, int]:
            if not 0 <= i < len(gpus):
                raise NVMLError("Invalid Argument")
            return ("gpu", i, -1)

        def device(h: tuple[str, int, int]) -> Any:
            gpu = gpus[h[1]]
            return gpu if h[0] == "gpu" else gpu.mig[h[2]]  # type: ignore[index]

        def memory(h: tuple[str, int, int]) -> Any:
            d = device(h)
            used = d.used if isinstance(d, FakeGpu) else 0
            return obj(total=d.memory, used=used, free=d.memory - used)

        def util(h: tuple[str, int, int]) -> Any:
            if h[0] != "gpu" or (gpus[h[1]].mig is not None and any(gpus[h[1]].mig or [])):
                raise NVMLError("Not Supported")  # MIG: no device-wide utilization
            return obj(gpu=gpus[h[1]].util, memory=10)

        def power(h: tuple[str, int, int]) -> int:
            mw = gpus[h[1]].power_mw
            if mw is None:
                raise NVMLError("Not Supported")
            return mw

        def mig_mode(h: tuple[str, int, int]) -> list[int]:
            if gpus[h[1]].mig is None:
                raise NVMLError("Not Supported")
            return [1, 1]

        def mig_count(h: tuple[str, int, int]) -> int:
            return len(gpus[h[1]].mig or [])

        def mig_handle(h: tuple[str, int, int], slot: int) -> tuple[str, int, int]:
            slots = gpus[h[1]].mig or []
            if slot >= len(slots) or slots[slot] is None:
                raise NVMLError("Not Found")
            return ("mig", h[1], slot)

        def processes(h: tuple[str, int, int]) -> list[Any]:
            return [
                obj(
                    pid=p.pid,
                    usedGpuMemory=p.used,
                    gpuInstanceId=p.gpu_instance,
                    computeInstanceId=p.compute_instance,
                )
                for p in gpus[h[1]].processes
            ]

        def mig_attr(attr: str) -> Any:
            return lambda h: getattr(device(h), attr)

        nv.NVMLError = NVMLError  # type: ignore[attr-defined]
        nv.NVML_TEMPERATURE_GPU = 0  # type: ignore[attr-defined]
        nv.NVML_DEVICE_MIG_ENABLE = 1  # type: ignore[attr-defined]
        for name, function in {
            "nvmlInit": init,
            "nvmlShutdown": shutdown,
            "nvmlDeviceGetCount": lambda: len(gpus),
            "nvmlDeviceGetHandleByIndex": handle,
            "nvmlDeviceGetName": lambda h: device(h).name,
            "nvmlDeviceGetUUID": lambda h: device(h).uuid,
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetUtilizationRates": util,
            "nvmlDeviceGetPowerUsage": power,
            "nvmlDeviceGetTemperature": lambda h, sensor: gpus[h[1]].temp,
            "nvmlDeviceGetComputeRunningProcesses": processes,
            "nvmlDeviceGetMigMode": mig_mode,
            "nvmlDeviceGetMaxMigDeviceCount": mig_count,
            "nvmlDeviceGetMigDeviceHandleByIndex": mig_handle,
            "nvmlDeviceGetGpuInstanceId": mig_attr("gpu_instance"),
            "nvmlDeviceGetComputeInstanceId": mig_attr("compute_instance"),
        }.items():
            setattr(nv, name, function)
        return nv
