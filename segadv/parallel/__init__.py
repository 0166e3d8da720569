"""Where networks run: the device map and placement (wrapping arrives here too)."""

from segadv.parallel.device_map import DeviceMap, parse_device_map
from segadv.parallel.placement import activate, devices_of, place_networks, to_device, unwrap

__all__ = ["DeviceMap", "activate", "devices_of", "parse_device_map", "place_networks", "to_device", "unwrap"]
