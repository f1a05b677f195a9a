"""The shape of check-install --format json's object (docs/check-install.md), checked
key by key: the tests of every verdict validate what they get with it."""

from __future__ import annotations

from typing import Any

from patchset.errors import Exit

KEYS = {
    "schema": str,
    "schema_version": int,
    "exit_code": int,
    "exit_name": str,
    "checker_python": str,
    "interpreter": (dict, type(None)),
    "inspected": (str, type(None)),
    "distribution": (dict, type(None)),
    "files": list,
    "verdict": (dict, type(None)),
    "races_open": (list, type(None)),
    "configuration": (dict, type(None)),
    "error": (dict, type(None)),
}
DISTRIBUTION = {"description", "name", "version", "info", "fork", "listing"}
FILE = {"path", "location", "blob_id", "sha256", "record", "record_match"}
VERDICT = {"text", "content", "basis", "shape", "release", "ours", "fixes"}
SHAPE = {"verdict", "reason", "evidence", "races_as_in"}
CONFIGURATION = {
    "source", "parser", "release", "settings", "environment", "torch_build", "effects",
}  # fmt: skip
BASES = ("blob id", "code shape", None)


def validate(obj: Any) -> None:
    """Assert obj is one check-install answer of schema version 1, consistent in itself."""
    assert isinstance(obj, dict) and set(obj) == set(KEYS), sorted(obj)
    for key, kind in KEYS.items():
        assert isinstance(obj[key], kind), (key, obj[key])
    assert obj["schema"] == "sglang-backports/check-install" and obj["schema_version"] == 1
    code = Exit(obj["exit_code"])
    assert obj["exit_name"] == code.name.lower()
    if obj["error"] is not None:
        assert set(obj["error"]) == {"problem", "next_step"} and obj["error"]["problem"]
        assert obj["verdict"] is None and obj["files"] == [] and obj["configuration"] is None
        return
    assert set(obj["distribution"]) == DISTRIBUTION
    assert len(obj["files"]) == 3
    for entry in obj["files"]:
        assert set(entry) == FILE, sorted(entry)
        assert entry["path"].startswith("python/sglang/srt/")
        assert entry["record_match"] in (True, False, None)
        if entry["blob_id"] is not None:
            assert len(entry["blob_id"]) == 40 and len(entry["sha256"]) == 64
    verdict = obj["verdict"]
    assert set(verdict) == VERDICT and verdict["text"] and verdict["basis"] in BASES
    known = bool(verdict["content"])
    assert (verdict["basis"] == "blob id") == known
    judged = verdict["shape"]
    assert (verdict["basis"] == "code shape") == (judged is not None)
    if judged is not None:
        assert set(judged) == SHAPE and judged["reason"] and not known
        assert judged["verdict"] in (
            "fixed",
            "fix A only",
            "affected",
            "not this race's design",
            "cannot tell",
        )
        assert (obj["races_open"] is None) == (judged["races_as_in"] is None) or judged[
            "verdict"
        ] in ("fixed", "not this race's design")
    if known:
        assert obj["races_open"] is not None
    if code in (Exit.OK, Exit.AFFECTED, Exit.PARTIAL_FIX):
        assert obj["races_open"] is not None and (obj["races_open"] == []) == (code == Exit.OK)
    if code == Exit.UNKNOWN_CONTENT:
        assert not known and obj["races_open"] is None
    config = obj["configuration"]
    if code in (Exit.EXPOSED, Exit.NOT_EXPOSED, Exit.EXPOSURE_UNKNOWN):
        assert config is not None
    if config is not None:
        assert set(config) == CONFIGURATION and config["source"] in ("launch-args", "server-info")
        assert isinstance(config["settings"], dict) and config["settings"]
        assert all(isinstance(line, str) for line in config["effects"]) and config["effects"]
