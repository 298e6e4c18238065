"""trainstep: submit, follow and inspect training jobs on a trainstep coordinator.

    import trainstep
    with trainstep.Client() as client:           # $TRAINSTEP_COORDINATOR, else 127.0.0.1:7070
        job_id = client.submit("job.json")       # or a dict
        for record in client.watch(job_id):      # one dict per ended window
            print(record["optimizer_update_id"], record["loss"])

Needs the stubs `make build` generates into trainstep/v1/, python3-grpcio and
python3-protobuf. See README.md ("Python client").
"""

from trainstep.errors import (InvalidArgument, InvalidSpec, JobCancelled, JobFailed, NoProgress,
                              NotFound, PermissionDenied, RequestIdConflict, TrainstepError,
                              Unauthenticated, Unavailable)
from trainstep.client import DEFAULT_ADDRESS, Client

__all__ = [
    "Client", "DEFAULT_ADDRESS", "TrainstepError", "InvalidArgument", "InvalidSpec",
    "RequestIdConflict", "Unavailable", "NotFound", "JobFailed", "JobCancelled", "NoProgress",
    "Unauthenticated", "PermissionDenied",
]
