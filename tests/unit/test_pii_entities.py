"""The PII entity names a knowledge base may set: exactly those the worker's analyzer can report."""

from __future__ import annotations

import pytest

from shared.errors import ErrorCode, RaglineError
from shared.models import (
    DEFAULT_PII_ENTITIES,
    SUPPORTED_PII_ENTITIES,
    PiiPolicy,
    check_pii_entities,
    check_pii_settings,
)
from workers.stages.pii import analyzer


def _reportable() -> set[str]:
    """What the analyzer as configured can find: its pattern recognizers' entities, and the
    entities the spaCy model's own NER labels map to."""
    from presidio_analyzer.predefined_recognizers import SpacyRecognizer

    engine = analyzer()
    recognizers = engine.registry.get_recognizers(language="en", all_fields=True)
    patterns = {e for r in recognizers if not isinstance(r, SpacyRecognizer) for e in r.supported_entities}
    labels = engine.nlp_engine.nlp["en"].get_pipe("ner").labels
    mapping = engine.nlp_engine.ner_model_configuration.model_to_presidio_entity_mapping
    return patterns | {mapping[label] for label in labels if label in mapping}


def test_the_static_list_is_what_the_real_analyzer_can_report() -> None:
    assert set(SUPPORTED_PII_ENTITIES) == _reportable()
    assert set(SUPPORTED_PII_ENTITIES) <= set(analyzer().get_supported_entities("en"))
    assert set(DEFAULT_PII_ENTITIES) <= set(SUPPORTED_PII_ENTITIES)


def test_names_presidio_lists_but_this_model_never_reports_are_refused() -> None:
    # Presidio lists EMAIL (an NER label of other models); en_core_web_sm never emits it.
    assert "EMAIL" in analyzer().get_supported_entities("en")
    assert analyzer().analyze(text="Write to dana@example.com", language="en", entities=["EMAIL"]) == []
    with pytest.raises(RaglineError) as raised:
        check_pii_entities(["EMAIL_ADDRESS", "EMAIL", "CREDITCARD"])
    error = raised.value
    assert error.code == ErrorCode.INVALID_ARGUMENT
    assert error.details["unknown"] == ["CREDITCARD", "EMAIL"]
    assert error.details["supported"] == list(SUPPORTED_PII_ENTITIES)
    assert "CREDITCARD" in error.message
    assert "EMAIL_ADDRESS" in error.message


def test_known_names_and_the_defaults_pass() -> None:
    check_pii_entities(list(SUPPORTED_PII_ENTITIES))
    check_pii_entities(list(DEFAULT_PII_ENTITIES))
    check_pii_entities([])


@pytest.mark.parametrize("policy", [p for p in PiiPolicy if p != PiiPolicy.OFF])
def test_no_entities_under_a_policy_that_acts_is_refused(policy: PiiPolicy) -> None:
    # An empty list detects nothing: "redact" (or "block") would silently keep every PII value.
    with pytest.raises(RaglineError) as raised:
        check_pii_settings(policy, [])
    assert raised.value.code == ErrorCode.INVALID_ARGUMENT
    assert raised.value.details == {"field": "pii_entities"}


def test_no_entities_with_pii_off_and_named_entities_pass() -> None:
    check_pii_settings(PiiPolicy.OFF, [])
    check_pii_settings(PiiPolicy.REDACT, ["EMAIL_ADDRESS"])
    with pytest.raises(RaglineError):
        check_pii_settings(PiiPolicy.OFF, ["EMAIL"])  # unknown names are refused under every policy
