"""What the unit tests' gRPC fakes of Triton answer, built once (the fakes play Triton 2.51 and newer versions)."""
from __future__ import annotations

from tritonclient.grpc import service_pb2


def grpc_status_response(regions):
    """Triton's SystemSharedMemoryStatusResponse for region dicts (name, key, offset, byte_size): the gRPC fakes' answer."""
    resp = service_pb2.SystemSharedMemoryStatusResponse()
    for r in regions:
        resp.regions[r['name']].name = r['name']
        resp.regions[r['name']].key = r['key']
        resp.regions[r['name']].offset = r['offset']
        resp.regions[r['name']].byte_size = r['byte_size']
    return resp
