"""check-install's answer as text or one JSON object (docs/check-install.md), both from one
Outcome. Within a SCHEMA_VERSION a key is only added, never renamed or redefined."""

import json
import sys
from typing import Any, NamedTuple

from patchset.errors import BackportError, Exit

from .install import JUDGED, InstallReport
from .launchargs import FIELDS, Settings

SCHEMA_VERSION = 1
DIST_KEYS = ("name", "version", "info", "fork", "listing")
FILE_KEYS = ("path", "location", "blob_id", "sha256", "record", "record_match")
NOT_EFFECTS = ("verdict: ", "configuration parsed by ")  # a configuration's other lines


class Configuration(NamedTuple):
    source: str  # "launch-args" or "server-info"
    settings: Settings  # as read, the server's environment (--env) with them
    lines: list[str]  # one per setting, then the verdict's
    release: str | None  # whose table and races were used (None: none assumed)


class Outcome(NamedTuple):
    install: InstallReport
    code: Exit
    verdict: str  # the verdict line, without "verdict: "
    configuration: Configuration | None = None


def text(outcome: Outcome) -> str:
    report, config = outcome.install, outcome.configuration
    lines = [report.where, f"distribution: {report.distribution}"]
    for state in report.files:
        found = f"blob {state.blob_id}  sha256 {state.sha256}  {state.record}"
        lines.append(f"  {state.path}  {found if state.blob_id else 'missing'}")
    if report.shape:
        lines += [f"{JUDGED}:", *(f"  {line}" for line in report.shape.lines())]
    lines += config.lines if config else [f"verdict: {outcome.verdict}"]
    return "\n".join(lines) + "\n"


def _envelope(code: int) -> dict[str, Any]:
    return {
        "schema": "sglang-backports/check-install",
        "schema_version": SCHEMA_VERSION,
        "exit_code": int(code),
        "exit_name": Exit(code).name.lower(),
        "checker_python": sys.version.split()[0],
    }


def as_json(outcome: Outcome) -> dict[str, Any]:
    report, config, dist = outcome.install, outcome.configuration, outcome.install.dist
    first, judged = report.content, report.shape
    return {
        **_envelope(outcome.code),
        "interpreter": report.python and {"path": report.python, "version": report.python_version},
        "inspected": report.where,
        "distribution": {
            "description": report.distribution,
            **{key: getattr(dist, key) if dist else None for key in DIST_KEYS},
        },
        "files": [{key: getattr(state, key) for key in FILE_KEYS} for state in report.files],
        "verdict": {
            "text": outcome.verdict,
            "content": [m.name for m in report.matches],
            "basis": "blob id" if report.matches else "code shape",
            "shape": None
            if judged is None
            else {
                "verdict": judged.verdict,
                "reason": judged.reason,
                "evidence": [str(e) for e in judged.evidence],
                "races_as_in": report.judged_as.name if report.judged_as else None,
            },
            "release": first.release if first else None,
            "ours": first.ours if first else None,
            "fixes": sorted(first.fixes) if first else [],
        },
        "races_open": report.open,
        "configuration": None
        if config is None
        else {
            "source": config.source,
            "parser": config.settings.parser,
            "release": config.release,
            "settings": {name: config.settings.get(name) for name in FIELDS},
            "environment": dict(config.settings.env),
            "torch_build": config.settings.torch_build,
            "effects": [line for line in config.lines if not line.startswith(NOT_EFFECTS)],
        },
        "error": None,
    }


def error_json(err: BackportError) -> dict[str, Any]:
    """A refusal as the same object, verdict keys null: a fleet job reads exit_code and error."""
    return {
        **_envelope(err.code),
        **dict.fromkeys(("interpreter", "inspected", "distribution")),
        "files": [],
        **dict.fromkeys(("verdict", "races_open", "configuration")),
        "error": {"problem": err.problem, "next_step": err.next_step or None},
    }


def dump(obj: dict[str, Any]) -> str:
    # sglang's ServerArgs values, a file's location (a Path): anything not JSON is said as text
    return json.dumps(obj, indent=2, sort_keys=False, default=str) + "\n"
