"""Step functions of the polling loop (``examples/polling_loop.yaml``).

A stand-in for a reporting service that builds reports asynchronously: you submit
a job, poll its status until it is ``done``, then fetch the result. The job's
progress is a pure function of how often it was polled, so the example behaves
the same on every run: a job submitted with ``polls_needed: 3`` is ``running``
on polls 0 and 1 and ``done`` on poll 2.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, TypedDict

__all__ = ["check_job", "fetch_report", "submit_job"]


class JobStatus(TypedDict):
    job_id: str
    state: Literal["running", "done"]
    progress: float
    poll: int


def _job_id(report: str, period: str) -> str:
    digest = hashlib.sha256(f"{report}/{period}".encode()).hexdigest()[:10]
    return f"job-{digest}"


def submit_job(report: str, period: str, polls_needed: int) -> dict[str, Any]:
    """Ask the service to build a report; it answers with a job id at once."""
    return {"job_id": _job_id(report, period), "polls_needed": polls_needed}


def check_job(job_id: str, polls_needed: int, poll: int) -> JobStatus:
    """One status poll; ``poll`` is the 0-based loop iteration."""
    done = poll + 1 >= polls_needed
    progress = 1.0 if done else round((poll + 1) / polls_needed, 2)
    return {
        "job_id": job_id,
        "state": "done" if done else "running",
        "progress": progress,
        "poll": poll,
    }


def fetch_report(job_id: str, report: str, period: str) -> dict[str, Any]:
    """Download the finished report (a summary of it)."""
    return {
        "job_id": job_id,
        "report": report,
        "period": period,
        "url": f"file:///reports/{report}-{period}.csv",
        "rows": 1204,
    }
