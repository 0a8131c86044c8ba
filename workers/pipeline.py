"""The pipeline order: which module runs each stage. Adding a stage touches this and its module."""

from __future__ import annotations

from shared.models import Stage
from workers.runner import StageFn
from workers.stages import chunk, embed, enrich, parse, pii, store

STAGE_FUNCTIONS: dict[Stage, StageFn] = {
    Stage.PARSE: parse.run,
    Stage.CHUNK: chunk.run,
    Stage.ENRICH: enrich.run,
    Stage.PII: pii.run,
    Stage.EMBED: embed.run,
    Stage.STORE: store.run,
}
