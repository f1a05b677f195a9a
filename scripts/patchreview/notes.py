"""Why our patched functions differ from upstream's fixed release, as data. A note is about
the bases from `since` to before `before` (upstream's change); elsewhere it explains nothing and
cannot be stale, so a new release needs no change here. It covers params (signature parameters),
lines (changed lines a regex matches), blocks (such a line and the deeper-indented changed lines
after it), comments (a matching changed comment line and its whole comment)."""

from __future__ import annotations

from dataclasses import dataclass

from patchset.errors import BackportError, Exit
from patchset.manifest import Releases, release_key


@dataclass(frozen=True)
class Note:
    title: str
    why: str
    params: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()
    before: str = ""  # the release where upstream made this change ("" = no bound)
    since: str = ""  # the oldest base this note is about ("" = no bound)

    def applies_to(self, release: str) -> bool:
        key = release_key(release)
        after_since = not self.since or release_key(self.since) <= key
        return after_since and (not self.before or key < release_key(self.before))

    @property
    def bases(self) -> str:
        since = f"{self.since} and later" if self.since else ""
        before = f"older than {self.before}" if self.before else ""
        return ", ".join(filter(None, [since, before])) or "every base"


@dataclass(frozen=True)
class FunctionNotes:
    path: str
    notes: tuple[Note, ...]


FUNCTION_NOTES: dict[str, FunctionNotes] = {
    "FutureMap.publish": FunctionNotes(
        "python/sglang/srt/managers/overlap_utils.py",
        (
            Note(
                "confidence relay arrived upstream in 0.5.16",
                "0.5.19 can also relay a per-row confidence tensor for its ragged verify mode: the "
                "confidence parameter, the scatter into confidence_relay before the record and the "
                "ring copy after it. Upstream added it in 0.5.16; these bases have no confidence "
                "relay, and neither fix needs one.",
                params=("confidence",),
                lines=(r"\bconfidence\b",),
                blocks=(r"^\s*if publish_confidence:",),
                before="0.5.16",
            ),
            Note(
                "_publish_fresh arrived upstream in 0.5.16",
                "0.5.19 sets _publish_fresh after each record, so that an assertion in resolve can "
                "check that every wait follows a fresh publish. Upstream added the flag in 0.5.16; "
                "it is not part of either fix.",
                lines=(r"\b_publish_fresh\b",),
                before="0.5.16",
            ),
        ),
    ),
    "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch": FunctionNotes(
        "python/sglang/srt/disaggregation/decode.py",
        (
            Note(
                "base signature: no running_batch argument before 0.5.16",
                "Up to 0.5.15.post1, get_new_prebuilt_batch(self) reads self.running_batch; from "
                "0.5.16 on the caller passes running_batch in. Our patch keeps the base's "
                "signature, so its callers stay as they are.",
                params=("running_batch",),
                lines=(r"\brunning_batch\b",),
                before="0.5.16",
            ),
            Note(
                "server-args access: get_disagg() arrived in 0.5.17",
                "From 0.5.17 on, upstream reads the disaggregation settings through get_disagg() "
                "instead of self.server_args. Same flag, unrelated to the race.",
                lines=(r"disaggregation_decode_enable_radix_cache",),
                before="0.5.17",
            ),
            Note(
                "KV fields moved under req.kv in 0.5.19",
                "0.5.19 moved kv_committed_len to req.kv.kv_committed_len (and ruff wrapped the "
                "longer set_extend_range call). Every base we serve still has "
                "req.kv_committed_len. Unrelated to the race.",
                lines=(r"\bkv_committed_len\b", r"\bset_extend_range\("),
            ),
            Note(
                "extend range: set_extend_range() arrived in 0.5.15",
                "0.5.13 and 0.5.14 set req.fill_len and then call "
                "req.set_extend_input_len(fill_len - prefix length); from 0.5.15 on, upstream "
                "calls req.set_extend_range(prefix length, kv_committed_len) instead. The same "
                "range of tokens is extended; unrelated to the race.",
                lines=(r"\bfill_len\b", r"\bset_extend_input_len\("),
                before="0.5.15",
            ),
            Note(
                "same wait, comment in our words",
                "The code of fix B is identical on both sides: when overlap is on, the schedule "
                "stream waits for the forward stream after prepare_for_prebuilt() and before "
                "process_prebuilt(). Only the comment above the wait is worded differently.",
                comments=(r"forward in flight",),
            ),
            Note(
                "base call: process_prebuilt(server_args, future_map) before 0.5.18",
                "Up to 0.5.17, ScheduleBatch.process_prebuilt takes (server_args, future_map) and "
                "hands server_args on to the draft-input builder; from 0.5.18 it takes only "
                "future_map and the builder reads the speculative settings through get_spec(). Fix "
                "B puts its wait right before this call either way.",
                lines=(r"\bprocess_prebuilt\(",),
                before="0.5.18",
            ),
        ),
    ),
    "build_eagle_disagg_draft_input": FunctionNotes(
        "python/sglang/srt/speculative/eagle_disaggregation.py",
        (
            Note(
                "base signature: server_args parameter before 0.5.18",
                "Up to 0.5.17, build_eagle_disagg_draft_input(batch, server_args, "
                "last_tokens_tensor, future_map) reads the EAGLE top-k and step count from "
                "server_args; 0.5.18 dropped the parameter and reads them through get_spec(), with "
                "a comment about adaptive spec. Our patch keeps the base's signature.",
                params=("server_args",),
                lines=(r"\bserver_args\b", r"\bget_spec\(\)", r"\bspec\.\w+"),
                comments=(r"Adaptive spec",),
                before="0.5.18",
            ),
            Note(
                "DSA top-k seed arrived upstream in 0.5.15.post1",
                "0.5.19 stacks the DSA top-k indices the prefill side sent with each request and "
                "hands them to the draft input (dsa_topk_indices, "
                "future_dsa_topk_indices_available). Upstream added this in 0.5.15.post1; these "
                "bases have no DSA seed here. Unrelated to the race.",
                lines=(r"\bdsa_topk_indices\b", r"\bdsa_indices_list\b"),
                before="0.5.15.post1",
            ),
            Note(
                "DSA top-k remap arrived upstream in 0.5.18",
                "0.5.19 remaps the DSA top-k seed sent by the prefill side from request-relative "
                "positions to decode-local KV slots. Upstream added the remap in 0.5.18; it has "
                "nothing to do with the race.",
                blocks=(r"should_remap_pd_dsa_seed_to_local_slots",),
                before="0.5.18",
            ),
            Note(
                "stash payload: RelayPayload arrived in 0.5.15",
                "In 0.5.13 and 0.5.14 FutureMap.stash accepts the EagleDraftInput itself; 0.5.15 "
                "introduced RelayPayload, so upstream wraps the draft input with "
                "RelayPayload.from_draft_input(). The same rows are stashed; unrelated to the "
                "race.",
                lines=(r"\bstash\(", r"\bRelayPayload\b"),
                before="0.5.15",
            ),
            Note(
                "comment corrected: 0.5.19's is stale",
                "0.5.19 still says publish's chained record keeps the in-flight forward's fence "
                "intact. That was fix A; fix B removed the chain again, so the comment is wrong "
                "there. Ours says what really orders the writes: get_new_prebuilt_batch() made the "
                "schedule stream wait for the forward stream before this seeding.",
                comments=(r"Seed the relay",),
            ),
        ),
    ),
}


def check_bounds(notes: dict[str, FunctionNotes], registry: Releases) -> None:
    """Refuse a note whose bound is not a release of patches/releases.toml."""
    for qualname, function_notes in notes.items():
        for note in function_notes.notes:
            if unknown := [b for b in (note.since, note.before) if b and b not in registry.known]:
                raise BackportError(
                    Exit.PATCHSET_INVALID,
                    f"scripts/patchreview/notes.py: the note {note.title!r} of {qualname} "
                    f"is bounded by sglang {unknown[0]}, which {registry.path} does not know",
                    "name the release in which upstream made the change, as releases.toml "
                    "spells it",
                )
