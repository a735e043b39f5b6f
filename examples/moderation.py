"""Step functions of the content moderation workflow (``examples/content_moderation.yaml``).

Three independent checks score a post between 0 (fine) and 1 (certainly bad),
each with the reasons behind its score. The scoring is a deliberately small,
deterministic word-and-pattern model so that the example runs anywhere; a real
deployment would call classifiers here.

`publish` and `reject` append to `DECISIONS`, the stand-in for the content store.
"""

from __future__ import annotations

import re
from typing import Any, TypedDict

__all__ = [
    "DECISIONS",
    "publish",
    "record_decision",
    "reject",
    "scan_images",
    "score_spam",
    "score_toxicity",
]


class CheckResult(TypedDict):
    score: float
    reasons: list[str]


DECISIONS: list[dict[str, Any]] = []
"""Every publish / reject, in call order."""

_TOXIC_TERMS: dict[str, float] = {
    "idiot": 0.5,
    "stupid": 0.35,
    "hate": 0.45,
    "moron": 0.55,
    "kill": 0.9,
}
_SPAM_PHRASES: dict[str, float] = {
    "buy now": 0.35,
    "free money": 0.5,
    "limited offer": 0.3,
    "click here": 0.3,
}
_LINK = re.compile(r"https?://\S+")
_FLAGGED_IMAGE_WORDS: dict[str, float] = {"nsfw": 0.95, "gore": 0.95, "weapon": 0.5}
_WORD = re.compile(r"[a-z']+")


def _capped(total: float) -> float:
    return float(round(min(total, 1.0), 2))


def score_toxicity(text: str) -> CheckResult:
    """Insults and threats."""
    words = _WORD.findall(text.lower())
    hits = sorted({w for w in words if w in _TOXIC_TERMS})
    return {
        "score": _capped(sum(_TOXIC_TERMS[w] for w in hits)),
        "reasons": [f"toxic term '{w}'" for w in hits],
    }


def score_spam(text: str) -> CheckResult:
    """Sales phrases, many links, shouting."""
    lowered = text.lower()
    phrases = [p for p in _SPAM_PHRASES if p in lowered]
    links = len(_LINK.findall(text))
    letters = [c for c in text if c.isalpha()]
    shouting = len(letters) >= 20 and sum(c.isupper() for c in letters) / len(letters) > 0.7
    score = sum(_SPAM_PHRASES[p] for p in phrases) + 0.2 * max(links - 1, 0)
    reasons = [f"spam phrase '{p}'" for p in phrases]
    if links > 1:
        reasons.append(f"{links} links")
    if shouting:
        score += 0.2
        reasons.append("mostly upper case")
    return {"score": _capped(score), "reasons": reasons}


def scan_images(images: list[str]) -> CheckResult:
    """Flag images by the labels in their names (a stand-in for an image classifier)."""
    score = 0.0
    reasons: list[str] = []
    for name in images:
        for word, weight in _FLAGGED_IMAGE_WORDS.items():
            if word in name.lower():
                score = max(score, weight)
                reasons.append(f"image {name!r} looks like '{word}'")
    return {"score": _capped(score), "reasons": reasons}


def publish(content_id: str, score: float, reviewer: str | None = None) -> dict[str, Any]:
    """Make the post visible."""
    decision = {"content_id": content_id, "action": "published", "score": score, "by": reviewer}
    DECISIONS.append(decision)
    return {"url": f"https://forum.example/posts/{content_id}", "reviewed_by": reviewer}


def reject(
    content_id: str, score: float, reasons: list[str], reviewer: str | None = None
) -> dict[str, Any]:
    """Keep the post hidden and tell the author why."""
    decision = {"content_id": content_id, "action": "rejected", "score": score, "by": reviewer}
    DECISIONS.append(decision)
    why = "; ".join(reasons) if reasons else "a moderator declined it"
    return {"notice": f"Your post {content_id} was not published: {why}.", "reviewed_by": reviewer}


def record_decision(
    content_id: str,
    published: bool,
    score: float,
    reviewer: str | None,
    url: str | None,
) -> dict[str, Any]:
    """The audit record, written whichever branch ran."""
    return {
        "content_id": content_id,
        "decision": "published" if published else "rejected",
        "score": score,
        "reviewed_by": reviewer,
        "url": url,
    }
