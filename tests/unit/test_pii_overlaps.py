"""Overlapping PII findings: redaction must cover every flagged character."""

from __future__ import annotations

from workers.stages.pii import Finding, merge_overlaps


def test_a_stronger_finding_inside_a_longer_one_does_not_leave_the_rest_exposed() -> None:
    # What the NER and the IP recognizer report for "2001:db8:85a3::8a2e:370:7334".
    ip = Finding(0, 28, "IP_ADDRESS", 0.6)
    person = Finding(5, 28, "PERSON", 0.85)
    assert merge_overlaps([person, ip]) == [Finding(0, 28, "PERSON", 0.85)]


def test_chains_of_overlaps_merge_and_separate_findings_stay_apart() -> None:
    findings = [
        Finding(30, 40, "PHONE_NUMBER", 0.4),
        Finding(0, 10, "PERSON", 0.9),
        Finding(8, 14, "EMAIL_ADDRESS", 1.0),
        Finding(13, 20, "URL", 0.5),
    ]
    assert merge_overlaps(findings) == [
        Finding(0, 20, "EMAIL_ADDRESS", 1.0),
        Finding(30, 40, "PHONE_NUMBER", 0.4),
    ]


def test_touching_findings_are_not_merged() -> None:
    findings = [Finding(0, 5, "PERSON", 0.9), Finding(5, 9, "PERSON", 0.8)]
    assert merge_overlaps(findings) == findings
