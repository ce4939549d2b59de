"""What a boto3 S3 client writes, in order, and a stop at its Nth write: the completion-marker
tests record uploads against moto with it and leave a bucket as a kill between two uploads would.

botocore's own event hooks on the client, nothing replaced: ``before-parameter-build`` of
PutObject and CompleteMultipartUpload (the calls that make an object appear) and DeleteObject
sees the request's parameters before it is sent, so a write that raises :class:`Stopped` there
never reaches S3. The other calls (a multipart upload's parts, HEAD, list) go on unrecorded.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

PUT, DELETE = "put", "delete"
_OPERATIONS = {"PutObject": PUT, "CompleteMultipartUpload": PUT, "DeleteObject": DELETE}
_ids = itertools.count()


class Stopped(Exception):
    """The process stopped before this write reached S3."""


@dataclass
class S3Writes:
    """Records each object write and delete of ``client`` as ``(PUT or DELETE, key)``, in the
    order the client makes them; with ``stop_at`` (1-based) the ``stop_at``-th write (PUT) raises
    :class:`Stopped` instead of being sent, and so does every write or delete after it."""

    client: Any
    stop_at: int | None = None
    log: list[tuple[str, str]] = field(default_factory=list)
    stopped: bool = False

    def __post_init__(self) -> None:
        self._unique = f"s3-writes-{next(_ids)}"
        for operation in _OPERATIONS:
            self.client.meta.events.register(
                f"before-parameter-build.s3.{operation}",
                self._seen,
                unique_id=f"{self._unique}-{operation}",
            )

    def _seen(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        kind = _OPERATIONS[model.name]
        if kind == PUT and self.stop_at is not None and len(self.puts) + 1 == self.stop_at:
            self.stopped = True
        if self.stopped:
            raise Stopped(f"stopped before the {kind} of {params['Key']}")
        self.log.append((kind, params["Key"]))

    @property
    def puts(self) -> list[str]:
        """The keys written, in order."""
        return [key for kind, key in self.log if kind == PUT]

    def close(self) -> None:
        for operation in _OPERATIONS:
            self.client.meta.events.unregister(
                f"before-parameter-build.s3.{operation}", unique_id=f"{self._unique}-{operation}"
            )
