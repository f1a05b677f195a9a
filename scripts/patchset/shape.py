"""sglang's prebuilt FutureMap race judged by code shape (ast) for files no release has: fixed
only when every path with overlap on fully orders the schedule stream after the forward stream
between prepare_for_prebuilt() and process_prebuilt() (fix B). Python 3.10-safe, stdlib only."""

import ast
from dataclasses import dataclass
from pathlib import Path

from . import shapeflow as sf

FIXED = "fixed"
FIX_A_ONLY = "fix A only"
AFFECTED = "affected"
OTHER_DESIGN = "not this race's design"
CANNOT_TELL = "cannot tell"

DECODE = sf.PREFIX + "srt/disaggregation/decode.py"
OVERLAP = sf.PREFIX + "srt/managers/overlap_utils.py"
EAGLE = sf.PREFIX + "srt/speculative/eagle_disaggregation.py"
MIXIN = sf.PREFIX + "srt/disaggregation/decode_schedule_batch_mixin.py"
SCHEDULER = sf.PREFIX + "srt/managers/scheduler.py"
ENTRY = "get_new_prebuilt_batch"
# The overlap worker's map of fresh future token ids, before FutureMap (0.4.x).
OLDER_OVERLAP = "self.future_token_ids_map = "
# each doubtful path's kind (Flow.call) and what it says, in the order they are told
_DOUBTS = {
    "unsure": "after a wait between streams this judgement does not know",
    "early": f"with the ordering before {sf.PREPARE}(), not after it",
    "unprepared": f"on a path without {sf.PREPARE}()",
}


@dataclass(frozen=True)
class Judgement:
    verdict: str  # FIXED, FIX_A_ONLY, AFFECTED, OTHER_DESIGN or CANNOT_TELL
    reason: str
    evidence: tuple[sf.Evidence, ...] = ()

    @property
    def fixed(self) -> bool:
        return self.verdict == FIXED

    def lines(self) -> list[str]:
        return [f"{self.verdict}: {self.reason}", *(f"  {e}" for e in self.evidence)]


def _future_map(sources: sf.Sources) -> dict[str, sf.Fn]:
    """FutureMap's methods: in overlap_utils.py, else wherever the tree defines the class."""
    for path in [OVERLAP, *(p for p in sources.defining("FutureMap", "class") if p != OVERLAP)]:
        module = sources.module(path)
        if found := {f.node.name: f for f in sf.functions(module, path) if f.owner == "FutureMap"}:
            return found
    return {}


def _design(sources: sf.Sources) -> tuple[bool, list[sf.Evidence]]:
    """Whether FutureMap relays request-pool rows (this race's design), with the evidence."""
    methods = _future_map(sources)
    fresh = ("alloc_future_indices", "store_to_map_for_new_batch")
    slots = [methods[m] for m in fresh if m in methods]
    if "publish" in methods and "stash" in methods:
        relay, fn, what = True, methods["publish"], "relays request-pool rows (publish, stash)"
    elif slots:
        relay, fn, what = False, slots[0], "fresh future slots, no publish/stash relay"
    elif not sources.mentioning("FutureMap") and (older := sources.mentioning(OLDER_OVERLAP)):
        what = "no FutureMap anywhere; the overlap worker's future_token_ids_map (fresh slots)"
        return False, [sf.Evidence(older[0], 0, "", what)]
    else:
        where = (
            "overlap_utils.py" if sources.module(OVERLAP) else "the tree (overlap_utils.py missing)"
        )
        raise sf.CannotTell(
            f"{where} has no FutureMap with publish and stash, nor with fresh future slots "
            "(moved or renamed)"
        )
    evidence = [sf.Evidence(fn.file, fn.node.lineno, fn.name, what)]
    seeders = {"publish", "stash", *fresh, "build_disagg_draft_input"}
    for path, name in ((EAGLE, "build_eagle_disagg_draft_input"), (MIXIN, sf.PROCESS)):
        if sources.module(path) is None:
            evidence.append(sf.Evidence(path, 0, "", "not found"))
        for fn in sf.named(sources, path, name):
            seeds = sorted({sf.tail(c.func) for c in sf.body_calls(fn)} & seeders)
            what = "calls " + (", ".join(seeds) or "nothing that seeds FutureMap")
            evidence.append(sf.Evidence(path, fn.node.lineno, fn.name, what))
    return relay, evidence


def _fix_a(sources: sf.Sources) -> sf.Evidence | None:
    """FutureMap.publish's wait on publish_ready before it records the event again."""
    publish = _future_map(sources).get("publish")
    if publish is None:
        return None
    calls = [c for c in sf.body_calls(publish) if isinstance(c.func, ast.Attribute)]
    ready = [c for c in calls if any("publish_ready" in sf.text(a) for a in c.args)]
    waits = [c for c in ready if sf.tail(c.func) == "wait_event"]
    records = [c.lineno for c in calls if _ready(c, "record")]
    if waits and records and waits[0].lineno < max(records):
        what = f"fix A: {sf.text(waits[0])} before publish_ready.record()"
        return sf.Evidence(publish.file, waits[0].lineno, publish.name, what)
    return None


def _consumer_side(sources: sf.Sources) -> sf.Evidence | None:
    """How FutureMap's consumer side differs from every release's, where it does: publish
    records publish_ready after it writes new_seq_lens_buf, whether or not the event existed,
    and each method that reads new_seq_lens_buf waits on the event first (S2 needs both)."""
    methods = _future_map(sources)
    fn = methods["publish"]
    nodes = list(ast.walk(fn.node))
    stored = [n for n in nodes if isinstance(getattr(n, "ctx", None), ast.Store)]
    writes = [n.lineno for n in stored if "new_seq_lens_buf" in sf.text(n)]
    records = [n for n in nodes if isinstance(n, ast.Call) and _ready(n, "record")]
    guards = [n for n in nodes if isinstance(n, ast.If) and "publish_ready" in sf.text(n.test)]
    what = ""
    if not writes or not records or min(r.lineno for r in records) < max(writes):
        what = "does not record publish_ready after it writes new_seq_lens_buf"
    elif all(any(r in ast.walk(g) for g in guards) for r in records):
        what = "records publish_ready only as the event's existence decides"
    for fn in [] if what else [m for n, m in methods.items() if n not in ("publish", "__init__")]:
        args = fn.node.args  # its flags: parameters that default to True or False
        defaults = zip(args.args[::-1], args.defaults[::-1], strict=False)
        flags = {a.arg for a, d in defaults if isinstance(getattr(d, "value", None), bool)}
        reads = [i for i, stmt in enumerate(fn.node.body) if _reads_seq_lens(stmt)]
        if reads and not any(_waits(stmt, flags) for stmt in fn.node.body[: reads[0]]):
            what = "reads new_seq_lens_buf where it has not waited on publish_ready"
            break
    return sf.Evidence(fn.file, fn.node.lineno, fn.name, what) if what else None


def _ready(call: ast.Call, *names: str) -> bool:
    """A call of publish_ready's method names (or a wait_event on it, for "wait")."""
    named = any(sf.text(call.func).endswith(f"publish_ready.{name}") for name in names)
    waited = sf.tail(call.func) == "wait_event" and "publish_ready" in sf.text(call)
    return named or ("wait" in names and waited)


def _reads_seq_lens(stmt: ast.stmt) -> bool:
    attributes = [n for n in ast.walk(stmt) if isinstance(n, ast.Attribute)]
    return any(n.attr == "new_seq_lens_buf" and isinstance(n.ctx, ast.Load) for n in attributes)


def _waits(stmt: ast.stmt, flags: set[str]) -> bool:
    """Whether every way through stmt waits on publish_ready: in each branch of an if, the
    one where the event is None left out (nothing was published), and the one where a flag
    the caller passes says the stream is ordered already (0.5.23's stream_ordered)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        return _ready(stmt.value, "wait", "synchronize")
    if not isinstance(stmt, ast.If):
        return False
    test = stmt.test
    values = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else []
    promised = any(isinstance(v, ast.Name) and v.id in flags for v in values)
    body = promised or any(_waits(s, flags) for s in stmt.body)
    none_else = not stmt.orelse and "publish_ready is not None" in sf.text(test)
    return body and (none_else or any(_waits(s, flags) for s in stmt.orelse))


def _war_barrier(sources: sf.Sources) -> list[sf.Evidence]:
    """The decode loop's ordering before batch selection: reported, never taken for fix B."""
    found = []
    for fn in sf.functions(sources.module(DECODE), DECODE):
        if "event_loop_overlap" in fn.name:
            for call in sf.body_calls(fn):
                if sf.tail(call.func) == "_apply_war_barrier" or sf.ordering(call):
                    what = f"WAR barrier {sf.text(call)} before batch selection (not fix B)"
                    found.append(sf.Evidence(DECODE, call.lineno, fn.name, what))
    if sources.module(SCHEDULER) is None:
        return [*found, sf.Evidence(SCHEDULER, 0, "", "not found: the WAR barrier is not reported")]
    for fn in sf.named(sources, SCHEDULER, "_apply_war_barrier"):
        kinds = ("wait_event", "wait_stream")
        waits = [sf.text(c) for c in sf.body_calls(fn) if sf.tail(c.func) in kinds]
        what = "waits with " + (", ".join(waits) or "nothing")
        found.append(sf.Evidence(SCHEDULER, fn.node.lineno, fn.name, what))
    for node in ast.walk(sources.module(SCHEDULER)):  # type: ignore[arg-type]
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(sf.tail(t) == "_war_barrier_enabled" for t in targets):
            what = f"WAR barrier on when {sf.text(node.value)}"
            found.append(sf.Evidence(SCHEDULER, node.lineno, "", what))
    return found


def judge(sources: sf.Sources) -> Judgement:
    try:
        relay, design = _design(sources)
        design += _war_barrier(sources)
        if not relay:
            reason = "the prebuilt path seeds fresh future slots, not request-pool rows"
            return Judgement(OTHER_DESIGN, reason, tuple(design))
        if sources.module(DECODE) is None:
            raise sf.CannotTell(f"{DECODE} is missing", sf.Evidence(DECODE, 0, "", "not found"))
        if not (entries := sf.defined(sources, ENTRY, DECODE)):
            raise sf.CannotTell(f"{ENTRY} is in no file of the tree (moved out of it, or renamed)")
        flow = sf.Flow(sources)
        for fn in entries:
            flow.note(fn, fn.node.lineno, "the prebuilt path starts here")
            flow.run(fn, {sf.Trace()})
        fix_a = _fix_a(sources)
    except sf.CannotTell as err:
        return Judgement(CANNOT_TELL, err.reason, err.evidence)
    except RecursionError:
        return Judgement(CANNOT_TELL, f"the code around {ENTRY} nests too deeply to be followed")
    evidence = (*flow.found, *([fix_a] if fix_a else []), *design)
    first = {kind: at for kind, at in reversed(flow.outcomes)}
    full = any(e.what.startswith(sf.FULL) for e in flow.found)
    if not first:
        return Judgement(CANNOT_TELL, f"{ENTRY} never reaches {sf.PROCESS}()", evidence)
    if "unordered" in first or ("unprepared" in first and not full):
        at = first.get("unordered") or first["unprepared"]
        reason = f"{_at(at)} on a path with no full ordering after {sf.PREPARE}()"
        return Judgement(FIX_A_ONLY if fix_a else AFFECTED, reason, evidence)
    for kind, why in _DOUBTS.items():
        if kind in first:
            return Judgement(CANNOT_TELL, f"{_at(first[kind])} {why}", evidence)
    reason = (
        f"every path with overlap on orders the schedule stream after the forward stream "
        f"between {sf.PREPARE}() and {sf.PROCESS}()"
    )
    reached = {(e.file, e.line) for _kind, e in flow.outcomes}
    for path in sources.mentioning(f"{sf.PROCESS}("):  # a seeding the walk did not reach
        for call in ast.walk(sources.module(path)):  # type: ignore[arg-type]
            if (
                isinstance(call, ast.Call)
                and sf.tail(call.func) == sf.PROCESS
                and ((path, call.lineno) not in reached)
            ):
                where = f"{path.removeprefix(sf.PREFIX)}:{call.lineno}"
                why = f"{reason}, but {sf.PROCESS}() is also called at {where}, off that path"
                return Judgement(CANNOT_TELL, why, evidence)
    if (consumer := _consumer_side(sources)) is not None:
        broken = f"{consumer.function} {consumer.what}"
        why = f"{reason}, but {broken}: a consumer may read rows before their write (S2)"
        return Judgement(CANNOT_TELL, why, (consumer, *evidence))
    return Judgement(FIXED, reason, evidence)


def _at(process: sf.Evidence) -> str:
    where = f"{process.file.removeprefix(sf.PREFIX)}:{process.line}"
    return f"{process.function} reaches {sf.PROCESS}() at {where}"


def judge_tree(tree: Path) -> Judgement:
    """A folder holding python/sglang."""
    return judge(sf.Sources(tree / "python" / "sglang"))
