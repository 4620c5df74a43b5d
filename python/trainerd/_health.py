"""The standard grpc.health.v1.Health/Check call, with its two one-field messages encoded by hand
(as trainctl does): the package carries no copy of health.proto and needs no grpcio-health-checking.
"""

from __future__ import annotations

from trainerd._rpc import Op, Raw
from trainerd.errors import NotFound, TrainerdError

__all__ = ["check", "serving_status_name"]

_METHOD = "/grpc.health.v1.Health/Check"
_NAMES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def serving_status_name(status: int) -> str:
    return _NAMES.get(status, f"STATUS_{status}")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def encode_request(service: str) -> bytes:
    """HealthCheckRequest {string service = 1;}; proto3 leaves an empty string off the wire."""
    if not service:
        return b""
    data = service.encode()
    return b"\x0a" + _varint(len(data)) + data


def decode_response(data: bytes) -> int:
    """HealthCheckResponse {ServingStatus status = 1;}: the status (0 when absent). Fields other
    than a varint field 1 are skipped."""
    status = 0
    i = 0

    def varint() -> int:
        nonlocal i
        shift = 0
        value = 0
        while True:
            if i >= len(data):
                raise TrainerdError("the health check reply is not a protobuf message")
            byte = data[i]
            i += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    while i < len(data):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            value = varint()
            if field == 1:
                status = value
        elif wire == 2:
            i += varint()
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            raise TrainerdError("the health check reply is not a protobuf message")
    return status


def check(service: str = "") -> Op[str]:
    """The serving status of ``service`` ("" for the whole server) as a name. The health service
    needs no token and says nothing of the version: no version check."""
    try:
        reply = yield Raw(_METHOD, encode_request(service))
    except NotFound:
        # The health protocol answers NOT_FOUND for a service it has no status for.
        return "SERVICE_UNKNOWN"
    return serving_status_name(decode_response(reply))
