"""Why our patched functions differ from upstream's fixed release, as data.

scripts/review finds the differences itself (difflib over the function
sources, ast over the signatures) and then looks here for the reason. A
difference that no note covers is shown as unexplained, and a note that
covers nothing is shown as stale, so this file has to follow the code.

How a note covers a difference:
- params: parameter names whose presence or type differs in the signature;
- lines: regexes; every changed line that matches is covered;
- blocks: regexes; a matching changed line and the deeper-indented changed
  lines that follow it (its body) are covered;
- comments: regexes; a matching changed comment line and the comment lines
  next to it (the whole comment) are covered.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Note:
    title: str
    why: str
    params: tuple[str, ...] = ()
    lines: tuple[str, ...] = ()
    blocks: tuple[str, ...] = ()
    comments: tuple[str, ...] = ()


@dataclass(frozen=True)
class FunctionNotes:
    path: str
    notes: tuple[Note, ...]


OVERLAP_UTILS = "python/sglang/srt/managers/overlap_utils.py"
DECODE = "python/sglang/srt/disaggregation/decode.py"
EAGLE_DISAGG = "python/sglang/srt/speculative/eagle_disaggregation.py"

FUNCTION_NOTES: dict[str, FunctionNotes] = {
    "FutureMap.publish": FunctionNotes(
        OVERLAP_UTILS,
        (
            Note(
                "confidence relay is a later upstream feature",
                "0.5.19 can also relay a per-row confidence tensor (for its ragged "
                "verify mode): the extra confidence parameter, the scatter into "
                "confidence_relay and the ring copy after the record. 0.5.15.post1 "
                "has no confidence relay, and the race fix does not need one.",
                params=("confidence",),
                lines=(r"\bconfidence\b",),
                blocks=(r"^\s*if publish_confidence:",),
            ),
            Note(
                "_publish_fresh is later upstream bookkeeping",
                "0.5.19 sets _publish_fresh after each record so that a debug "
                "assertion in its consumer can check that every wait follows a "
                "fresh publish. 0.5.15.post1 has no such flag; it is not part of "
                "either fix.",
                lines=(r"\b_publish_fresh\b",),
            ),
        ),
    ),
    "SchedulerDisaggregationDecodeMixin.get_new_prebuilt_batch": FunctionNotes(
        DECODE,
        (
            Note(
                "0.5.15.post1 signature: no running_batch argument",
                "In 0.5.15.post1 get_new_prebuilt_batch(self) reads "
                "self.running_batch; 0.5.19 has the caller pass running_batch in. "
                "Our patch keeps the pinned base's signature, so its callers stay "
                "as they are.",
                params=("running_batch",),
                lines=(r"\brunning_batch\b",),
            ),
            Note(
                "0.5.15.post1 call: process_prebuilt(server_args, future_map)",
                "ScheduleBatch.process_prebuilt takes (server_args, future_map) in "
                "0.5.15.post1 and only (future_map) in 0.5.19, which reads the "
                "speculative settings through get_spec(). Fix B puts its wait "
                "before this call in both.",
                lines=(r"\bprocess_prebuilt\(",),
            ),
            Note(
                "server-args access refactored upstream",
                "0.5.19 reads disaggregation settings through get_disagg() instead "
                "of self.server_args. Same flag, unrelated to the race.",
                lines=(r"disaggregation_decode_enable_radix_cache",),
            ),
            Note(
                "KV fields moved under req.kv upstream",
                "0.5.19 moved kv_committed_len to req.kv.kv_committed_len (and ruff "
                "wrapped the longer call). Unrelated to the race.",
                lines=(r"\bkv_committed_len\b", r"\bset_extend_range\("),
            ),
            Note(
                "same wait, comment in our words",
                "The code of fix B is identical on both sides: when overlap is on, "
                "the schedule stream waits for the forward stream after "
                "prepare_for_prebuilt() and before process_prebuilt(). Only the "
                "comment above the wait is worded differently.",
                comments=(r"forward in flight",),
            ),
        ),
    ),
    "build_eagle_disagg_draft_input": FunctionNotes(
        EAGLE_DISAGG,
        (
            Note(
                "0.5.15.post1 signature: server_args parameter",
                "In 0.5.15.post1 build_eagle_disagg_draft_input(batch, server_args, "
                "last_tokens_tensor, future_map) reads the EAGLE top-k and step "
                "count from server_args; 0.5.19 dropped the parameter and reads "
                "them from get_spec(). Our patch keeps the base's signature.",
                params=("server_args",),
                lines=(r"\bserver_args\b", r"\bget_spec\(\)", r"\bspec\.\w+"),
                comments=(r"Adaptive spec",),
            ),
            Note(
                "DSA top-k remap is a later upstream feature",
                "0.5.19 remaps the DSA top-k seed sent by the prefill side to "
                "decode-local KV slots. It arrived after 0.5.15.post1 and has "
                "nothing to do with the race.",
                blocks=(r"should_remap_pd_dsa_seed_to_local_slots",),
            ),
            Note(
                "comment corrected: 0.5.19's is stale",
                "0.5.19 still says publish's chained record keeps the in-flight "
                "forward's fence intact. That was fix A; fix B removed the chain "
                "again, so the comment is wrong there. Ours says what really "
                "orders the writes: get_new_prebuilt_batch() made the schedule "
                "stream wait for the forward stream before this seeding.",
                comments=(r"Seed the relay",),
            ),
        ),
    ),
}
