"""Analytical device models: datasheet GPUs, the measured host CPU, and their links."""

from vtrain.collective_cost import Link
from vtrain.devices.catalog import DATASHEET_DEVICES, KNOWN_DEVICES, device_for_config, device_model
from vtrain.devices.model import DeviceModel

__all__ = ["DATASHEET_DEVICES", "KNOWN_DEVICES", "DeviceModel", "Link", "device_for_config", "device_model"]
