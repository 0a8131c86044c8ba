"""Which credentials an `s3` source reaches its store with: the deployment's keys go to the
deployment's store only (no services: the addresses are literals, resolved by nobody)."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from shared.config import Settings, SourcesSettings
from shared.errors import ErrorCode, RaglineError
from shared.sources.models import S3Settings
from workers.sources.s3 import endpoint_for

DEPLOYMENT_STORE = "http://8.8.4.4:9000"


def _deployment() -> Settings:
    return Settings(
        sources=SourcesSettings(
            s3_endpoint_url=DEPLOYMENT_STORE,
            s3_access_key_id="deployment-key",
            s3_secret_access_key=SecretStr("deployment-secret"),
            s3_buckets=["src-{tenant}-*"],
        )
    )


def test_the_deployments_keys_are_never_sent_to_an_endpoint_the_source_names() -> None:
    # The bucket is one the deployment's keys serve for the tenant; the endpoint is a server of the
    # tenant's choosing (public, so the fetch policy lets it be reached): it would get requests
    # signed with the deployment's access key, its id in clear.
    elsewhere = S3Settings(bucket="src-t1-docs", endpoint_url="http://8.8.8.8:9000")
    with pytest.raises(RaglineError) as error:
        endpoint_for(elsewhere, _deployment(), "t1")
    assert error.value.code == ErrorCode.FORBIDDEN
    assert "deployment-key" not in error.value.message


def test_the_deployments_keys_serve_its_own_store_and_a_sources_keys_any_store() -> None:
    default = endpoint_for(S3Settings(bucket="src-t1-docs"), _deployment(), "t1")
    assert (default.endpoint_url, default.access_key_id) == (DEPLOYMENT_STORE, "deployment-key")
    named = S3Settings(bucket="src-t1-docs", endpoint_url=DEPLOYMENT_STORE)
    assert endpoint_for(named, _deployment(), "t1").access_key_id == "deployment-key"
    own = S3Settings.model_validate(
        {
            "bucket": "any-bucket",
            "endpoint_url": "http://8.8.8.8:9000",
            "access_key_id": "own-key",
            "secret_access_key": "own-secret",
        }
    )
    reached = endpoint_for(own, _deployment(), "t1")
    assert (reached.endpoint_url, reached.access_key_id, reached.secret_access_key) == (
        "http://8.8.8.8:9000",
        "own-key",
        "own-secret",
    )
