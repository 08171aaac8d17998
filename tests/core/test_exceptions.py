"""``serverless_gpu.exceptions``: the original API's exception names catch the library's own
errors, which keep their names; a rank's own exception still reaches the caller as itself."""

from __future__ import annotations

import threading
import time

import pytest

from serverless_gpu import distributed, exceptions, runtime
from serverless_gpu.common import errors
from serverless_gpu.compute import AcceleratorType
from serverless_gpu.exceptions import (
    GPUTypeError,
    GPUValidationError,
    LocalExecutionTimeoutError,
    RuntimeConfigurationError,
    SerializationError,
    ServerlessGpuCustomerError,
    ServerlessGpuException,
    ServerlessGpuInternalError,
)

# The original API's names and where each sits in its hierarchy.
CUSTOMER = [
    "WorkloadRateLimitExceededError",
    "NotebookGPULimitExceededError",
    "GPUValidationError",
    "GPUTypeError",
    "SerializationError",
    "RuntimeConfigurationError",
    "WorkspaceFileError",
    "LocalExecutionTimeoutError",
]
INTERNAL = [
    "WorkloadCreationError",
    "WorkloadTerminationError",
    "OutputCollectionError",
    "RayInitializationError",
    "RayConnectionError",
    "EnvironmentUploadError",
    "EnvironmentDownloadError",
    "CurlDownloadTimeoutError",
    "MissingEnvironmentError",
    "CredentialError",
    "APIError",
]


def test_every_original_name_is_there_in_its_place() -> None:
    for name in CUSTOMER:
        assert issubclass(getattr(exceptions, name), ServerlessGpuCustomerError), name
    for name in INTERNAL:
        assert issubclass(getattr(exceptions, name), ServerlessGpuInternalError), name
    assert issubclass(exceptions.CurlDownloadTimeoutError, exceptions.EnvironmentDownloadError)
    # A crashed rank is a failed workload, which this library does not call internal.
    assert exceptions.WorkloadFailureException is errors.RankFailedError
    assert issubclass(exceptions.WorkloadFailureException, ServerlessGpuException)
    expected = {*CUSTOMER, *INTERNAL, "WorkloadFailureException"}
    expected |= {"ServerlessGpuException", "ServerlessGpuCustomerError"}
    assert set(exceptions.__all__) == expected | {"ServerlessGpuInternalError"}


def test_the_original_names_are_the_librarys_own_classes() -> None:
    assert ServerlessGpuException is errors.DistributedError
    assert LocalExecutionTimeoutError is errors.DistributedTimeoutError
    assert SerializationError is errors.SerializationError
    assert RuntimeConfigurationError is errors.ConfigurationError
    assert GPUValidationError is GPUTypeError is errors.GPUConfigError
    assert issubclass(errors.LauncherError, ServerlessGpuInternalError)


def test_configuration_errors_are_caught_by_the_original_names() -> None:
    with pytest.raises(RuntimeConfigurationError, match="timeout must be a positive number"):
        distributed(timeout=-1)
    with pytest.raises(GPUValidationError, match="gpus must be a positive integer"):
        distributed(num_accelerators=0)
    with pytest.raises(GPUTypeError, match="unknown accelerator type") as info:
        AcceleratorType("GPU_3xH100")
    assert type(info.value).__name__ == "GPUConfigError"  # our name is kept


def test_calling_the_function_directly_is_a_customer_error() -> None:
    fn = distributed(gpus=2, standby=False)(time.time)
    with pytest.raises(ServerlessGpuCustomerError) as info:
        fn()
    assert type(info.value) is errors.UsageError


def test_unpicklable_argument_is_caught_as_serialization_error() -> None:
    fn = distributed(gpus=2, standby=False)(lambda lock: None)
    with pytest.raises(SerializationError) as info:
        fn.distributed(threading.Lock())
    assert isinstance(info.value, errors.SerializationError)


def test_timeout_is_caught_as_local_execution_timeout_error() -> None:
    @distributed(num_accelerators=2, timeout=2)
    def hang() -> None:
        if runtime.get_global_rank() == 1:
            time.sleep(60)

    with pytest.raises(LocalExecutionTimeoutError) as info:
        hang.distributed()
    assert type(info.value).__name__ == "DistributedTimeoutError"
    assert info.value.running_ranks == (1,)
    assert isinstance(info.value, ServerlessGpuCustomerError)


def test_a_ranks_own_exception_is_not_wrapped() -> None:
    @distributed(num_accelerators=2)
    def fail() -> None:
        raise KeyError(f"rank {runtime.get_global_rank()}")

    with pytest.raises(KeyError) as info:
        fail.distributed()
    assert type(info.value) is KeyError
    assert not isinstance(info.value, ServerlessGpuException)
