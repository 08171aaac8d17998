"""The original API's exception names, for code that catches them: each is one of the library's
own classes (:mod:`serverless_gpu.common.errors`) under a second name, or, for what has no
counterpart here, a class of its own that the library never raises.

>>> from serverless_gpu.exceptions import LocalExecutionTimeoutError
>>> try:
...     train.distributed()
... except LocalExecutionTimeoutError as exc:   # is DistributedTimeoutError
...     print(exc.running_ranks)

What a raised error is called does not change: ``type(exc).__name__`` stays
``DistributedTimeoutError``. An exception a rank raises reaches the caller as itself (a
``ValueError`` stays a ``ValueError``), not wrapped in one of these.
"""

from __future__ import annotations

from serverless_gpu.common.errors import (
    CallerError,
    ConfigurationError,
    DistributedError,
    DistributedTimeoutError,
    GPUConfigError,
    InternalError,
    LauncherError,
    RankFailedError,
    SerializationError,
)

__all__ = [
    "APIError",
    "CredentialError",
    "CurlDownloadTimeoutError",
    "EnvironmentDownloadError",
    "EnvironmentUploadError",
    "GPUTypeError",
    "GPUValidationError",
    "LocalExecutionTimeoutError",
    "MissingEnvironmentError",
    "NotebookGPULimitExceededError",
    "OutputCollectionError",
    "RayConnectionError",
    "RayInitializationError",
    "RuntimeConfigurationError",
    "SerializationError",
    "ServerlessGpuCustomerError",
    "ServerlessGpuException",
    "ServerlessGpuInternalError",
    "WorkloadCreationError",
    "WorkloadFailureException",
    "WorkloadRateLimitExceededError",
    "WorkloadTerminationError",
    "WorkspaceFileError",
]

# -- the same classes under the original names ------------------------------------------------

ServerlessGpuException = DistributedError
ServerlessGpuCustomerError = CallerError
ServerlessGpuInternalError = InternalError
RuntimeConfigurationError = ConfigurationError
# One class here for both: a GPU request that does not fit, by count or by type.
GPUValidationError = GPUConfigError
GPUTypeError = GPUConfigError
LocalExecutionTimeoutError = DistributedTimeoutError
WorkloadCreationError = LauncherError
WorkloadFailureException = RankFailedError

# -- names with no counterpart here: never raised, defined so that code catching them runs ----


class WorkloadRateLimitExceededError(CallerError):
    """A workload quota of the original service; nothing here limits submissions."""


class NotebookGPULimitExceededError(CallerError):
    """A per-notebook GPU quota of the original service; here a count above the visible GPUs
    is a :class:`~serverless_gpu.common.errors.GPUConfigError`."""


class WorkspaceFileError(CallerError):
    """A workspace file of the original service could not be read or written."""


class WorkloadTerminationError(InternalError):
    """The original service could not stop a workload; stopping ranks here cannot fail so."""


class OutputCollectionError(InternalError):
    """The original service could not collect a workload's results."""


class RayInitializationError(InternalError):
    """The original service's Ray cluster did not start."""


class RayConnectionError(InternalError):
    """The original service lost its Ray cluster; a missing connection here is a
    :class:`~serverless_gpu.common.errors.ConfigurationError` saying how to connect."""


class EnvironmentUploadError(InternalError):
    """The original service could not upload the notebook's Python environment; ranks here
    share the caller's environment."""


class EnvironmentDownloadError(InternalError):
    """A worker of the original service could not download the Python environment."""


class CurlDownloadTimeoutError(EnvironmentDownloadError):
    """The original service's environment download timed out."""


class MissingEnvironmentError(InternalError):
    """A variable the original service's runtime sets was missing."""


class CredentialError(InternalError):
    """The original service's credentials could not be read."""


class APIError(InternalError):
    """A call to the original service's API failed."""
