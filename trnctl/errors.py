"""Errors that end a command with one line on stderr, and the exit codes trnctl uses.

Exit codes: 0 success; 1 a check or an operation failed (a preflight check, a stack that could
not be reaped); 2 the command line is wrong (also the code for usage errors); 3 AWS refused or
could not be reached (credentials, access, throttling, endpoint); 4 the named environment or
resource does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum

from boto3.exceptions import Boto3Error
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ProfileNotFound,
    TokenRetrievalError,
    WaiterError,
)

from trn_catalog.settings import SettingError


class ExitCode(IntEnum):
    OK = 0
    FAILED = 1
    USAGE = 2
    AWS = 3
    NOT_FOUND = 4


class TrnctlError(Exception):
    """A failure to report as ``trnctl: <message>`` on stderr with ``exit_code``."""

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# How the commands name settings that are not options of their own.
_SETTING_NAMES = {"name": "pipeline name", "training": "training settings"}


def option_of(setting: str) -> str:
    """The command-line name of ``setting``: ``--eval-data`` for ``eval_data``."""
    return _SETTING_NAMES.get(setting, "--" + setting.replace("_", "-"))


@contextmanager
def settings_as_usage(name: Callable[[str], str] = option_of) -> Iterator[None]:
    """Turns a :class:`SettingError` of the shared checks (trn_catalog) into a USAGE
    :class:`TrnctlError` whose message shows each setting as ``name`` does (default: the
    command's option; ``str`` where the caller passed the option's name already)."""
    try:
        yield
    except SettingError as error:
        raise TrnctlError(error.render(name)) from None


# Error codes differ by service (EC2 says UnauthorizedOperation, JSON services say
# AccessDeniedException, S3 says AccessDenied), so each family is listed in full.
ACCESS_DENIED_CODES = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidAccessKeyId",
        # S3 answers HEAD requests without a body, so the code is the bare HTTP status.
        "403",
    }
)
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "RequestThrottledException",
        "TooManyRequestsException",
        "SlowDown",
        "ProvisionedThroughputExceededException",
    }
)


def one_line(text: str) -> str:
    """``text`` with its whitespace runs (newlines included) collapsed to single spaces."""
    return " ".join(text.split())


def from_aws(error: Exception) -> TrnctlError | None:
    """The :class:`TrnctlError` to show for a botocore exception, or None for anything else."""
    if isinstance(error, NoCredentialsError | PartialCredentialsError):
        return TrnctlError(
            "no AWS credentials found: set AWS_PROFILE (and run `aws sso login` for SSO "
            "profiles) or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY",
            ExitCode.AWS,
        )
    if isinstance(error, TokenRetrievalError):
        return TrnctlError(
            f"AWS SSO token could not be refreshed ({one_line(str(error))}): run `aws sso login`",
            ExitCode.AWS,
        )
    if isinstance(error, ProfileNotFound):
        return TrnctlError(f"{one_line(str(error))}: check AWS_PROFILE", ExitCode.AWS)
    if isinstance(error, NoRegionError):
        return TrnctlError("no AWS region: pass --region or set AWS_REGION", ExitCode.USAGE)
    if isinstance(error, EndpointConnectionError):
        return TrnctlError(f"cannot reach AWS: {one_line(str(error))}", ExitCode.AWS)
    if isinstance(error, WaiterError):
        return TrnctlError(f"AWS operation did not finish: {one_line(str(error))}", ExitCode.FAILED)
    if isinstance(error, ClientError):
        return _from_client_error(error)
    # boto3's managed transfers raise S3UploadFailedError while handling the ClientError.
    cause = error.__cause__ or error.__context__
    if isinstance(error, Boto3Error) and isinstance(cause, ClientError):
        return _from_client_error(cause)
    if isinstance(error, BotoCoreError | Boto3Error):
        return TrnctlError(f"AWS error: {one_line(str(error))}", ExitCode.AWS)
    return None


def _from_client_error(error: ClientError) -> TrnctlError:
    details = error.response.get("Error", {})
    code = str(details.get("Code", "Unknown"))
    message = one_line(str(details.get("Message", "")))
    operation = error.operation_name
    if code in ACCESS_DENIED_CODES:
        return TrnctlError(
            f"access denied calling {operation} ({code}): {message}; check the IAM permissions "
            "of the credentials in use (`aws sts get-caller-identity`)",
            ExitCode.AWS,
        )
    if code in THROTTLING_CODES:
        return TrnctlError(
            f"AWS throttled {operation} ({code}) and adaptive retries gave up: wait a minute "
            "and run the command again",
            ExitCode.AWS,
        )
    return TrnctlError(f"{operation} failed ({code}): {message}", ExitCode.AWS)
