"""The pure parts of OAuth access tokens: what a role claim grants, what looks like a JWT, where
the metadata lives, and which settings are refused."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from services.core.access_tokens import is_tenant, looks_like_jwt, role_of
from services.core.auth import Role
from services.core.identity import metadata_path
from shared.config import McpSettings, OAuthSettings


@pytest.mark.parametrize(
    ("claim", "role"),
    [
        ("admin", Role.ADMIN),
        ("read", Role.READ),
        ("ragline:write", Role.WRITE),
        ("openid profile ragline:read ragline:write", Role.WRITE),
        (["ragline:read", "ragline:admin"], Role.ADMIN),
        (["Read"], Role.READ),
        ("openid profile", None),
        ("superuser", None),
        ("ragline:owner", None),
        (["admin-ish", 3], None),
        (3, None),
        ({"role": "admin"}, None),
        (None, None),
    ],
)
def test_the_highest_role_a_claim_grants(claim: object, role: Role | None) -> None:
    assert role_of(claim) == role


@pytest.mark.parametrize(
    ("claim", "valid"),
    [
        ("acme", True),
        ("a" * 63, True),
        ("acme-2_b", True),
        ("acme\n", False),  # re.match's `$` matches before a trailing newline
        ("acme\r", False),
        ("a" * 64, False),
        ("Acme", False),
        ("../acme", False),
        ("", False),
        (["acme"], False),
        (5, False),
    ],
)
def test_a_tenant_claim_is_a_whole_tenant_id(claim: object, valid: bool) -> None:
    assert is_tenant(claim) is valid


def test_a_jwt_is_told_from_an_api_key() -> None:
    assert looks_like_jwt("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln")
    assert not looks_like_jwt("rl_dev_60d7529a6dcd898f3a1d89788d81f557bb986b52c1f56e7b")
    assert not looks_like_jwt("eyJ.only-two")


@pytest.mark.parametrize(
    ("resource", "path"),
    [
        ("https://ragline.example.com/mcp", "/.well-known/oauth-protected-resource/mcp"),
        ("https://ragline.example.com/agents/mcp/", "/.well-known/oauth-protected-resource/agents/mcp"),
        ("https://ragline.example.com", "/.well-known/oauth-protected-resource"),
    ],
)
def test_the_metadata_path_inserts_the_well_known_prefix(resource: str, path: str) -> None:
    assert metadata_path(resource) == path


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"issuer": "https://issuer.example"}, "RESOURCE is required"),
        ({"algorithms": ["HS256"]}, "unsupported algorithms"),
        ({"algorithms": []}, "unsupported algorithms"),
        ({"issuer": "issuer.example", "resource": "https://r.example/mcp"}, "not an http"),
        ({"issuer": "https://i.example", "resource": 'https://r.example/m"cp'}, "not an http"),
        ({"issuer": "https://i.example", "resource": "https://r.example/{id}"}, "not an http"),
        ({"issuer": "https://i.example", "resource": "https://r.example/mcp#x"}, "not an http"),
        ({"issuer": "https://i.example", "resource": "https://r.example/m cp"}, "not an http"),
    ],
)
def test_settings_that_would_weaken_the_check_are_refused(settings: dict[str, object], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        OAuthSettings.model_validate(settings)


def test_the_audience_defaults_to_the_resource() -> None:
    settings = OAuthSettings(issuer="https://issuer.example", resource="https://r.example/mcp")
    assert settings.audiences == ["https://r.example/mcp"]
    assert OAuthSettings(
        audience=["a"], issuer="https://i.example", resource="https://r.example"
    ).audiences == ["a"]


@pytest.mark.parametrize(
    "path", ["/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json", "/v1/mcp"]
)
def test_the_mcp_path_may_not_take_a_path_the_api_serves(path: str) -> None:
    with pytest.raises(ValidationError, match=r"may not be or lie under|should match pattern"):
        McpSettings(path=path)
    assert McpSettings(path="/agents/mcp").path == "/agents/mcp"
