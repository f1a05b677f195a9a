"""shape.py's walk of every path from get_new_prebuilt_batch through its helpers: did prepare
run, then a full stream ordering? Overlap on, any other condition either way; stdlib, 3.10-safe."""

import ast
import functools
import os
import re
import stat
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

PREFIX = "python/sglang/"
PREPARE, PROCESS = "prepare_for_prebuilt", "process_prebuilt"
# ServerArgs/Scheduler flags and their value when overlap scheduling is on
OVERLAP_ON = dict(enable_overlap=True, enable_overlap_schedule=True, disable_overlap_schedule=False)
# A file that can hold a piece of the prebuilt path or of its ordering names one of these.
_CANDIDATE = ("forward_stream", "prebuilt", "FutureMap", "future_token_ids_map")
_DEVICE_MODULES = {"torch.cuda", "torch.npu", "torch.xpu", "torch.musa", "device_module"}
# The streams of sglang's overlap scheduler, by the names its scheduler gives them.
_STREAMS = {"schedule_stream", "forward_stream", "copy_stream", "default_stream"}
_MAX_DEPTH = 6
# How the evidence of an ordering begins; only FULL counts for fix B.
FULL = "a full ordering: "
_SAID = {"full": FULL, "partial": "not fix B: ", "unknown": "unknown: "}


@dataclass(frozen=True)
class Evidence:
    file: str  # as in the repository: python/sglang/...
    line: int
    function: str
    what: str

    def __str__(self) -> str:
        where = self.file.removeprefix(PREFIX) + (f":{self.line}" if self.line else "")
        return f"{where} {self.function}: {self.what}" if self.function else f"{where}: {self.what}"


# A source file larger than this is not read (taken as absent: never "fixed" for it).
MAX_SOURCE_BYTES = 16 << 20


def _regular_file(path: Path) -> bytes | None:
    """A regular file's bytes, else None: a fifo would block the read, a device never end."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOURCE_BYTES:
            return None
        return handle.read(MAX_SOURCE_BYTES + 1)


@dataclass(eq=False)
class Sources:
    """One sglang tree's files by repository path: a package folder's, or the texts given."""

    package: Path | None
    _given: Mapping[str, str | bytes | None] = field(default_factory=dict)
    _texts: dict[str, str | None] = field(default_factory=dict, init=False)
    _modules: dict[str, ast.Module] = field(default_factory=dict, init=False)

    @classmethod
    def from_texts(cls, texts: Mapping[str, str | bytes | None]) -> "Sources":
        return cls(None, texts)

    def text(self, path: str) -> str | None:
        if path in self._texts:
            return self._texts[path]
        if self.package is None:
            data = self._given.get(path)
        else:
            data = _regular_file(self.package / path.removeprefix(PREFIX))
        return data.decode("utf-8", "replace") if isinstance(data, bytes) else data

    def module(self, path: str) -> ast.Module | None:
        """The parsed file; None when it is absent; CannotTell when it does not parse."""
        if path not in self._modules:
            text = self._texts[path] = self.text(path)
            if text is None:
                return None
            try:
                self._modules[path] = ast.parse(text, filename=path)
            except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
                where = Evidence(path, getattr(err, "lineno", 0) or 0, "", "parse error")
                raise CannotTell(f"{path} does not parse: {err}", where) from err
        return self._modules[path]

    @functools.cached_property
    def _candidates(self) -> dict[str, str]:
        """The files that name a piece of the prebuilt path or of FutureMap: read once, kept."""
        if self.package is None:
            paths = sorted(self._given)
        else:
            found = (p.relative_to(self.package).as_posix() for p in self.package.rglob("*.py"))
            paths = sorted(PREFIX + name for name in found)
        texts = ((path, self.text(path)) for path in paths)
        kept = {p: t for p, t in texts if t is not None and any(w in t for w in _CANDIDATE)}
        self._texts.update(kept)
        return kept

    def mentioning(self, word: str) -> list[str]:
        """The candidate files that name word."""
        return [path for path, text in self._candidates.items() if word in text]

    def defining(self, name: str, keyword: str = "def") -> list[str]:
        """The files that may hold the prebuilt path and define a function (or class) name."""
        pattern = re.compile(rf"^[ \t]*(?:async[ \t]+)?{keyword}[ \t]+{re.escape(name)}\b", re.M)
        found = self.mentioning(f"{keyword} {name}")
        return [p for p in found if pattern.search(self._candidates[p])]


class CannotTell(Exception):
    def __init__(self, reason: str, *evidence: Evidence) -> None:
        super().__init__(reason)
        self.reason, self.evidence = reason, evidence


@dataclass(frozen=True)
class Fn:
    file: str
    name: str  # Class.method or function
    node: ast.FunctionDef | ast.AsyncFunctionDef
    owner: str  # the class, "" for a module function


def functions(module: ast.Module | None, file: str) -> Iterator[Fn]:
    for node in module.body if module else []:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield Fn(file, node.name, node, "")
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    yield Fn(file, f"{node.name}.{item.name}", item, node.name)


def body_calls(fn: Fn) -> Iterator[ast.Call]:
    return (call for stmt in fn.node.body for call, _ in calls(stmt))


text = ast.unparse


def tail(node: ast.AST) -> str:
    """The last name of an expression: self.forward_stream -> forward_stream."""
    if isinstance(node, ast.Attribute):
        return node.attr
    return node.id if isinstance(node, ast.Name) else ""


def ordering(
    call: ast.Call, current_stream: str = "schedule_stream", recorded: frozenset[str] = frozenset()
) -> tuple[str, str] | None:
    """('full' | 'partial' | 'unknown', what) for a stream-ordering call, else None (unknown: a
    wait between streams of names sglang does not use); current_stream: the one a `with ...
    stream(X)` around it makes current; recorded: events it recorded on the forward stream."""
    func = call.func
    if not isinstance(func, ast.Attribute):
        return None
    owner, owner_name = text(func.value), tail(func.value)
    current = owner.endswith("current_stream()")
    if func.attr == "wait_stream" and call.args:
        waited = tail(call.args[0])
        if current and current_stream != "schedule_stream":
            kind = "partial" if current_stream in _STREAMS else "unknown"
            return kind, f"{text(call)}: the current stream there is {current_stream or 'unnamed'}"
        if waited == "forward_stream" and (owner_name == "schedule_stream" or current):
            return "full", f"{owner}.wait_stream({text(call.args[0])})"
        if waited not in _STREAMS and (current or owner_name not in _STREAMS):
            return "unknown", f"{text(call)}: streams of names sglang does not use"
        return "partial", f"{text(call)}: not the schedule stream waiting for the forward stream"
    if func.attr == "synchronize":
        device = owner_name in ("forward_stream", "device_module") or owner in _DEVICE_MODULES
        got = isinstance(func.value, ast.Call) and tail(func.value.func) == "get_device_module"
        if device or got:
            return "full", f"{text(call)}: the host waits for the forward stream"
        return "partial", f"{text(call)}: not the forward stream or the device"
    if func.attr == "wait_event":
        mine = owner_name == "schedule_stream" or (current and current_stream == "schedule_stream")
        if mine and call.args and text(call.args[0]) in recorded:
            return "full", f"{text(call)}: its event was recorded on the forward stream before"
        return "partial", f"{text(call)}: an event covers what came before its record only"
    return None


@dataclass(frozen=True)
class Trace:
    prepared: bool = False
    waited: bool = False  # a full ordering since prepare_for_prebuilt()
    early: bool = False  # a full ordering before it
    unsure: bool = False  # since prepare_for_prebuilt(), a wait between unknown streams
    nones: frozenset[str] = frozenset()  # names known to hold None on this path
    recorded: frozenset[tuple[str, str]] = frozenset()  # (function, event) on the forward stream


@dataclass
class Out:
    normal: set[Trace] = field(default_factory=set)
    returns: set[tuple[Trace, bool]] = field(default_factory=set)  # (path, returned None)
    breaks: set[Trace] = field(default_factory=set)
    continues: set[Trace] = field(default_factory=set)

    def add(self, done: "Out", *kinds: str) -> None:
        """done's paths of each kind (all of them by default) join this one's."""
        for kind in kinds or ("normal", "returns", "breaks", "continues"):
            getattr(self, kind).update(getattr(done, kind))


def truth(test: ast.expr, path: Trace) -> bool | None:
    """The condition's value on this path with overlap on; None: either."""
    if isinstance(test, ast.Constant):
        return bool(test.value)
    if isinstance(test, ast.Attribute) and test.attr in OVERLAP_ON:  # a local may mean more
        return OVERLAP_ON[test.attr]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = truth(test.operand, path)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [truth(v, path) for v in test.values]
        decisive = isinstance(test.op, ast.Or)
        if decisive in values:
            return decisive
        return None if None in values else not decisive
    if isinstance(test, ast.Name) and test.id in path.nones:
        return False
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.left, ast.Name):
        right = test.comparators[0]
        if test.left.id in path.nones and isinstance(right, ast.Constant) and right.value is None:
            return isinstance(test.ops[0], ast.Is)
    return None


def calls(node: ast.AST, certain: bool = True) -> Iterator[tuple[ast.Call, bool]]:
    """Calls in node, inner ones first; certain: not under a branch of an expression."""
    if isinstance(node, ast.Lambda | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return
    for name, value in ast.iter_fields(node):
        children = value if isinstance(value, list) else [value]
        for index, child in enumerate(children):
            if not isinstance(child, ast.AST):
                continue
            sure = certain and not (
                (isinstance(node, ast.IfExp) and name in ("body", "orelse"))
                or (isinstance(node, ast.BoolOp) and index > 0)
                or isinstance(node, ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp)
            )
            yield from calls(child, sure)
    if isinstance(node, ast.Call):
        yield node, certain


@dataclass(eq=False)
class Flow:
    """Walks the prebuilt path: every path's state at each process_prebuilt() call."""

    sources: Sources
    found: dict[Evidence, None] = field(default_factory=dict)  # evidence, in the order met
    outcomes: dict[tuple[str, Evidence], None] = field(default_factory=dict)
    conditions: list[str] = field(default_factory=list)  # unknown ones around the statement walked
    current: list[str] = field(default_factory=list)  # streams the `with`s around it make current
    stack: list[Fn] = field(default_factory=list)
    _relevant: dict[tuple[str, str], bool] = field(default_factory=dict)

    def note(self, fn: Fn, line: int, what: str) -> Evidence:
        evidence = Evidence(fn.file, line, fn.name, what)
        self.found.setdefault(evidence, None)
        return evidence

    def run(self, fn: Fn, paths: set[Trace]) -> Out:
        self.stack.append(fn)  # an exception ends the whole walk (shape.judge): no unwinding
        out = self.block(fn.node.body, paths, fn)
        self.stack.pop()
        return out

    def block(self, stmts: list[ast.stmt], paths: set[Trace], fn: Fn) -> Out:
        out = Out()
        for stmt in stmts:
            if not paths:
                break
            done = self.stmt(stmt, paths, fn)
            out.add(done, "returns", "breaks", "continues")
            paths = done.normal
        out.normal = paths
        return out

    def stmt(self, stmt: ast.stmt, paths: set[Trace], fn: Fn) -> Out:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return Out(paths)
        if any(p.recorded for p in paths):  # a name stored to in stmt: maybe another event now
            stores = [n for n in ast.walk(stmt) if isinstance(getattr(n, "ctx", None), ast.Store)]
            stored = {(fn.name, text(n)) for n in stores}
            paths = {replace(p, recorded=p.recorded - stored) for p in paths}
        if isinstance(stmt, ast.Return):  # a bare return, or return None, returns None
            value = stmt.value
            none = value is None or (isinstance(value, ast.Constant) and value.value is None)
            results = self.expr(stmt, paths, fn)
            return Out(returns={(p, bool(returned) or none) for p, returned in results})
        if isinstance(stmt, ast.Raise):
            self.expr(stmt, paths, fn)
            return Out()
        if isinstance(stmt, ast.Break):
            return Out(breaks=paths)
        if isinstance(stmt, ast.Continue):
            return Out(continues=paths)
        if isinstance(stmt, ast.If):
            return self.branches(stmt.test, [stmt.body, stmt.orelse], paths, fn)
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            return self.loop(stmt, paths, fn)
        if isinstance(stmt, ast.With | ast.AsyncWith):
            entered = len(self.current)
            for item in stmt.items:
                paths = {p for p, _ in self.expr(item.context_expr, paths, fn)}
                made = item.context_expr
                if isinstance(made, ast.Call) and tail(made.func) in ("stream", "StreamContext"):
                    self.current += [tail(a) for a in made.args if text(a) != "None"][:1]
            out = self.block(stmt.body, paths, fn)
            del self.current[entered:]
            return out
        if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
            return self.try_(stmt, paths, fn)
        if isinstance(stmt, ast.Match):
            paths = {p for p, _ in self.expr(stmt.subject, paths, fn)}
            return self.branches(None, [*(case.body for case in stmt.cases), []], paths, fn)
        results = self.expr(stmt, paths, fn)
        targets = stmt.targets if isinstance(stmt, ast.Assign) else []
        if len(targets) != 1 or not isinstance(targets[0], ast.Name):
            return Out({p for p, _ in results})
        name = {targets[0].id}  # it holds None on a path where the value is None
        return Out(
            {replace(p, nones=p.nones | name if none else p.nones - name) for p, none in results}
        )

    def branches(
        self, test: ast.expr | None, bodies: list[list[ast.stmt]], paths: set[Trace], fn: Fn
    ) -> Out:
        if test is not None:
            paths = {p for p, _ in self.expr(test, paths, fn)}
        truths = {p: (None if test is None else truth(test, p)) for p in paths}
        said = text(test) if test is not None else "a case matches"
        out = Out()
        for index, body in enumerate(bodies):
            wanted = index == 0 if test is not None else None
            taken = {p for p, t in truths.items() if t is None or t == wanted}
            unknown = any(truths[p] is None for p in taken)
            if unknown:
                self.conditions.append(said if index == 0 else f"not ({said})")
            done = self.block(body, taken, fn)
            if unknown:
                self.conditions.pop()
            out.add(done)
        return out

    def loop(self, stmt: ast.For | ast.AsyncFor | ast.While, paths: set[Trace], fn: Fn) -> Out:
        head = stmt.iter if not isinstance(stmt, ast.While) else stmt.test
        paths = {p for p, _ in self.expr(head, paths, fn)}
        endless = isinstance(stmt, ast.While) and truth(stmt.test, Trace()) is True
        out, seen, frontier = Out(), set(paths), set(paths)
        self.conditions.append(f"the loop at line {stmt.lineno} runs")
        while frontier:  # a finite lattice: ends when no new state appears
            done = self.block(stmt.body, frontier, fn)
            out.add(done, "returns", "breaks")
            frontier = (done.normal | done.continues) - seen
            seen |= frontier
        self.conditions.pop()
        after: set[Trace] = set() if endless else self.block(stmt.orelse, seen, fn).normal
        return Out(out.breaks | after, out.returns)

    def try_(self, stmt: ast.stmt, paths: set[Trace], fn: Fn) -> Out:
        body = self.block(stmt.body, paths, fn)  # type: ignore[attr-defined]
        out = Out(set(), set(body.returns), set(body.breaks), set(body.continues))
        for handler in stmt.handlers:  # type: ignore[attr-defined]
            out.add(self.block(handler.body, paths | body.normal, fn), "normal", "returns")
        out.normal |= self.block(stmt.orelse, body.normal, fn).normal  # type: ignore[attr-defined]
        final = stmt.finalbody  # type: ignore[attr-defined]
        out.normal = self.block(final, out.normal, fn).normal  # no finally: the paths unchanged
        return out

    def expr(self, node: ast.AST, paths: set[Trace], fn: Fn) -> set[tuple[Trace, bool | None]]:
        """The paths after node's calls; with each, whether node's value is None (a helper's)."""
        results: set[tuple[Trace, bool | None]] = {(p, None) for p in paths}
        for call, certain in calls(node):
            # its result is node's value: `call(...)`, `x = call(...)`, `return call(...)`
            value = call is node or (
                isinstance(node, ast.Assign | ast.Return | ast.Expr) and node.value is call
            )
            after: set[tuple[Trace, bool | None]] = set()
            for path, _ in results:
                for new, none in self.call(call, path, fn):
                    after.add((new, none if value else None))
                if not certain:
                    after.add((path, None))
            results = after
        return results

    def call(self, call: ast.Call, path: Trace, fn: Fn) -> set[tuple[Trace, bool | None]]:
        name = tail(call.func)
        if name == PREPARE:
            self.note(fn, call.lineno, f"{text(call.func)}()")
            early = path.early or path.waited
            return {(replace(path, prepared=True, waited=False, early=early, unsure=False), None)}
        if name == PROCESS:
            args = ", ".join(text(a) for a in call.args)
            seeds = self.note(fn, call.lineno, f"{text(call.func)}({args}) seeds the prebuilt rows")
            kind = "unsure" if path.unsure else "early" if path.early else "unordered"
            if not path.prepared or path.waited:
                kind = "ordered" if path.prepared else "unprepared"
            self.outcomes.setdefault((kind, seeds), None)
            return {(path, None)}
        owner = text(call.func.value) if isinstance(call.func, ast.Attribute) else "self"
        if name == "record" and owner != "self":  # an event's record: on which stream
            on = tail(call.args[0]) if call.args else ["schedule_stream", *self.current][-1]
            event = (fn.name, owner)
            kept = path.recorded - {event} | ({event} if on == "forward_stream" else set())
            return {(replace(path, recorded=kept), None)}
        mine = frozenset(event for f, event in path.recorded if f == fn.name)
        if (found := ordering(call, *self.current[-1:], recorded=mine)) is not None:
            kind, what = found
            where = f" (runs only when {' and '.join(self.conditions)})" if self.conditions else ""
            self.note(fn, call.lineno, _SAID[kind] + what + where)
            if kind == "full":
                path = replace(path, waited=True) if path.prepared else replace(path, early=True)
            elif kind == "unknown" and path.prepared:
                path = replace(path, unsure=True)
            return {(path, None)}
        helper = self.helper(call, fn)
        if helper is None:
            return {(path, None)}
        done = self.run(helper, {path})
        return {(p, True) for p in done.normal} | {(p, none) for p, none in done.returns}

    def helper(self, call: ast.Call, fn: Fn) -> Fn | None:
        """The function a self.NAME(...) or NAME(...) call runs, if it touches the prebuilt path."""
        func = call.func
        if isinstance(func, ast.Name):
            name, method = func.id, False
        elif isinstance(func, ast.Attribute) and text(func.value) == "self":
            name, method = func.attr, True
        else:
            return None
        if len(self.stack) >= _MAX_DEPTH or any(f.node.name == name for f in self.stack):
            return None
        found = defined(self.sources, name, fn.file, method)
        same = [f for f in found if f.owner == fn.owner] or found
        chosen = [f for f in same if self.relevant(f)]
        if len(chosen) > 1:
            raise CannotTell(
                f"{fn.name} calls {name}, which {len(chosen)} functions of the tree define",
                *(Evidence(f.file, f.node.lineno, f.name, "one of them") for f in chosen),
            )
        if chosen:
            moved = " (another module)" if chosen[0].file != fn.file else ""
            self.note(chosen[0], chosen[0].node.lineno, f"followed from {fn.name}{moved}")
        return chosen[0] if chosen else None

    def relevant(self, fn: Fn, depth: int = 0) -> bool:
        """Whether fn, or a helper it calls in its own file, prepares, seeds or orders."""
        key = (fn.file, fn.name)
        if key not in self._relevant:
            self._relevant[key] = False  # a call cycle is not relevant by itself
            locals_ = {f.node.name: f for f in functions(self.sources.module(fn.file), fn.file)}
            self._relevant[key] = any(
                tail(c.func) in (PREPARE, PROCESS)
                or ordering(c) is not None
                or (depth < _MAX_DEPTH and self.relevant(locals_.get(tail(c.func), fn), depth + 1))
                for c in body_calls(fn)
            )
        return self._relevant[key]


def defined(sources: Sources, name: str, first: str, method: bool | None = None) -> list[Fn]:
    """The functions of this name (see named), in first's file, else wherever defined."""
    found = named(sources, first, name, method)
    for path in [] if found else sources.defining(name):
        found += named(sources, path, name, method) if path != first else []
    return found


def named(sources: Sources, path: str, name: str, method: bool | None = None) -> list[Fn]:
    """The functions of this name in path (methods only, or none, as method says)."""
    found = functions(sources.module(path), path)
    return [f for f in found if f.node.name == name and method in (None, bool(f.owner))]
