"""boto3 sessions and clients for the ops commands, and AWS errors turned into one clear message each.

Credentials and region come from the standard AWS chain (environment, shared config/credentials
files, SSO, instance/container roles); `--profile`/`--region` only pick from it.

Retries are botocore's own (https://docs.aws.amazon.com/sdkref/latest/guide/feature-retry-behavior.html):
`standard` mode retries throttling, transient and 5xx errors with jittered exponential backoff. A
user's AWS_RETRY_MODE / AWS_MAX_ATTEMPTS (or `retry_mode` / `max_attempts` in their profile) wins over
our defaults.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from nvrx_eks.kitcore.configio import USER_ERROR_EXIT_CODE, UserError

if TYPE_CHECKING:
    from collections.abc import Iterator

    import boto3

# Exit codes of the ops commands (documented in `nvrx-eks --help` of each command).
EXIT_OK = 0
EXIT_USER = USER_ERROR_EXIT_CODE
"""Input or environment the user fixes: bad config, no credentials, access denied, missing stack."""
EXIT_CHECKS_FAILED = 3
"""preflight: one or more checks failed (the table names each and its fix)."""
EXIT_SERVICE = 4
"""AWS or Kubernetes unavailable or still throttling after botocore's retries; retry later."""
EXIT_JOB_FAILED = 5
"""job submit: pods failed to start (image pull, crash loop) or did not start within --timeout."""

DEFAULT_RETRY_MODE = "standard"
DEFAULT_MAX_ATTEMPTS = 8

_THROTTLING = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "RequestThrottled",
        "RequestThrottledException",
        "SlowDown",
    }
)
_ACCESS_DENIED = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess", "AuthFailure"}
)
_BAD_CREDENTIALS = frozenset(
    {
        "ExpiredToken",
        "ExpiredTokenException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "InvalidAccessKeyId",
    }
)


class ServiceError(Exception):
    """AWS or Kubernetes could not answer (after retries); not the user's input. Exit code 4."""

    exit_code = EXIT_SERVICE


class AwsSession:
    """One boto3 session plus clients configured with the kit's retry policy."""

    def __init__(
        self, *, profile: str | None = None, region: str | None = None, session: boto3.Session | None = None
    ) -> None:
        """`session`: an existing boto3 session to use instead of a new one from the standard chain."""
        import boto3  # noqa: PLC0415 - keep `nvrx-eks --help` fast

        self.session: boto3.Session = session or boto3.Session(profile_name=profile, region_name=region)
        self._clients: dict[str, Any] = {}

    @property
    def region(self) -> str:
        region: str | None = self.session.region_name
        if not region:
            raise UserError(
                "no AWS region configured: pass --region, set AWS_REGION, or add `region` to your AWS profile"
            )
        return region

    def assume(self, role_arn: str, *, session_name: str = "nvrx-eks") -> AwsSession:
        """A session acting as `role_arn` (sts:AssumeRole with this session's credentials), in the same
        region; botocore assumes it again before the credentials expire, as for a profile's role_arn."""
        import boto3  # noqa: PLC0415
        import botocore.session  # noqa: PLC0415
        from botocore.credentials import (  # noqa: PLC0415
            AssumeRoleCredentialFetcher,
            DeferredRefreshableCredentials,
        )

        source = self.session._session  # noqa: SLF001 - botocore's session holds the credential chain
        with aws_errors("sts:AssumeRole"):
            credentials = source.get_credentials()
            if credentials is None:
                raise UserError(
                    "no AWS credentials found: set AWS_PROFILE (and run `aws sso login` for SSO "
                    "profiles), or export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
                )
            fetcher = AssumeRoleCredentialFetcher(
                client_creator=source.create_client,
                source_credentials=credentials,
                role_arn=role_arn,
                extra_args={"RoleSessionName": session_name},
            )
            fetcher.fetch_credentials()  # a role the caller may not assume fails here, named
        core = botocore.session.Session()
        core._credentials = DeferredRefreshableCredentials(  # noqa: SLF001 - no public setter
            refresh_using=fetcher.fetch_credentials, method="assume-role"
        )
        return AwsSession(session=boto3.Session(botocore_session=core, region_name=self.region))

    def client(self, service: str) -> Any:  # noqa: ANN401 - boto3 clients are dynamically typed
        if service not in self._clients:
            self._clients[service] = self.session.client(
                service, region_name=self.region, config=retry_config(self.session)
            )
        return self._clients[service]


def retry_config(session: boto3.Session) -> Any:  # noqa: ANN401 - botocore.config.Config
    """botocore's retry config: the user's mode/attempts if they set any, else standard x 8."""
    from botocore.config import Config  # noqa: PLC0415

    scoped = session._session.get_scoped_config()  # noqa: SLF001 - the profile's own settings
    mode = os.environ.get("AWS_RETRY_MODE") or scoped.get("retry_mode") or DEFAULT_RETRY_MODE
    attempts = os.environ.get("AWS_MAX_ATTEMPTS") or scoped.get("max_attempts") or DEFAULT_MAX_ATTEMPTS
    return Config(retries={"mode": mode, "total_max_attempts": int(attempts)}, user_agent_extra="nvrx-eks")


def error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def describe_aws_error(  # noqa: PLR0911 - one return per error class reads best
    exc: Exception, *, action: str
) -> UserError | ServiceError | None:
    """The one message for an AWS failure while doing `action` (e.g. "ec2:DescribeInstanceTypes").

    Returns None for errors the caller handles itself (e.g. a missing stack).
    """
    from botocore import exceptions as bex  # noqa: PLC0415

    if isinstance(exc, bex.NoCredentialsError | bex.PartialCredentialsError):
        return UserError(
            "no AWS credentials found: set AWS_PROFILE (and run `aws sso login` for SSO profiles), "
            "or export AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY"
        )
    if isinstance(exc, bex.TokenRetrievalError | bex.SSOTokenLoadError | bex.UnauthorizedSSOTokenError):
        return UserError(f"AWS SSO session expired or missing ({exc}); run `aws sso login`")
    if isinstance(exc, bex.NoRegionError):
        return UserError("no AWS region configured: pass --region or set AWS_REGION")
    if isinstance(exc, bex.EndpointConnectionError | bex.ConnectTimeoutError | bex.ReadTimeoutError):
        return ServiceError(f"cannot reach AWS for {action} ({exc}); check the network/proxy and retry")
    if not isinstance(exc, bex.ClientError):
        return None
    code = error_code(exc)
    message = exc.response.get("Error", {}).get("Message", "")
    attempts = exc.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
    if code in _ACCESS_DENIED:
        return UserError(
            f"access denied for {action} ({code}: {message}); grant the identity you run as "
            f"(`aws sts get-caller-identity`) the IAM permission {action}"
        )
    if code in _BAD_CREDENTIALS:
        return UserError(f"AWS rejected the credentials ({code}: {message}); refresh them (`aws sso login`)")
    if code in _THROTTLING:
        return ServiceError(
            f"AWS throttled {action} and still did after {attempts + 1} attempt(s); wait a minute and "
            "retry, or raise AWS_MAX_ATTEMPTS / set AWS_RETRY_MODE=adaptive"
        )
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if status >= 500:  # noqa: PLR2004 - HTTP server errors
        return ServiceError(f"AWS failed {action} ({code}: {message}) after {attempts + 1} attempt(s)")
    return None


@contextmanager
def aws_errors(action: str) -> Iterator[None]:
    """Translate AWS failures inside the block into UserError / ServiceError naming `action`."""
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        translated = describe_aws_error(exc, action=action)
        if translated is None:
            raise
        raise translated from None
