"""configs/devices.yaml: the devices the roofline projects onto and each preset's workload
(read by `specdrive roofline` and by the closed loop's priced latency)."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bench.common.costs import Device, Workload
from core.config import from_dict, load_yaml

DEVICES_FILE = Path(__file__).resolve().parents[2] / "configs" / "devices.yaml"


@dataclass
class DeviceFile:
    """configs/devices.yaml: {name: Device} and {preset: Workload overrides}."""
    devices: dict = field(default_factory=dict)
    workloads: dict = field(default_factory=dict)

    def __post_init__(self):
        self.devices = {n: d if isinstance(d, Device) else from_dict(Device, d, f"devices.{n}")
                        for n, d in self.devices.items()}
        for n, w in self.workloads.items():
            from_dict(Workload, w, f"workloads.{n}")       # checked; applied as overrides


def load_devices(path: Path = DEVICES_FILE) -> DeviceFile:
    return load_yaml(DeviceFile, path)
