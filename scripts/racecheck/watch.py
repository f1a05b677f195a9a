"""Per-row reads and writes of watched buffers for CSAN, which keys an access by data
pointer: each row gets its own key, else two streams writing different rows would race."""

import contextlib
import functools
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import csan
from .csan import SimDevice
from .report import Access, Race, Site

# The checker's own frames are never a call site worth reporting.
_MACHINERY = {os.path.realpath(__file__), os.path.realpath(csan.__file__)}
_DRIVER = os.path.dirname(os.path.realpath(__file__))
_FIRST_KEY = 1 << 40  # far above real stream/event ids, and small enough to stay an int key


class BufferWatch(TorchDispatchMode):
    """Reports each aten op's row accesses on watched buffers to the device's CSAN handler;
    buffers are looked up at every op, so a lazily allocated one is watched too."""

    def __init__(self, device: SimDevice, code_roots: Sequence[Path] = ()) -> None:
        super().__init__()
        self.device = device
        self.races: list[Race] = []
        self.seen: set[tuple[str, str, str]] = set()  # (stream, kind, buffer) of each access
        self._sources: list[Callable[[], dict[str, torch.Tensor]]] = []
        self._keys: dict[tuple[str, int], int] = {}  # (buffer, row) -> its CSAN key
        # frames in the code under test, and in the scenarios that drive it (this package)
        self._code_roots = tuple(os.path.realpath(r) for r in code_roots)

    def watch_attributes(self, obj: object, suffix: str = "_buf") -> None:
        """Watch every tensor attribute of obj whose name ends with suffix, now and later."""
        self._sources.append(
            lambda: {
                name: value
                for name, value in vars(obj).items()
                if name.endswith(suffix) and isinstance(value, torch.Tensor)
            }
        )

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func is torch.ops.aten.record_stream.default:
            return func(*args, **kwargs)
        watched = {_storage_key(t): (n, t) for source in self._sources for n, t in source().items()}
        watched.pop(0, None)  # a tensor without storage
        reads: dict[int, list[str]] = {}
        writes: dict[int, list[str]] = {}
        bound = _bind(func._schema, args, kwargs) if watched else []
        row_index = _row_index(func, bound) if watched else None
        for argument, value in bound:
            alias = argument.alias_info
            if alias is not None and not alias.is_write:
                continue  # a view: no data moves
            kind, target = ("write", writes) if alias is not None else ("read", reads)
            for tensor in _tensors(value):
                if (hit := watched.get(_storage_key(tensor))) is None:
                    continue
                name, base = hit
                self.seen.add((self.device.current_stream().name, kind, name))
                for row in _rows(tensor, base, row_index if argument.name == "self" else None):
                    target.setdefault(self._key(name, row), []).append(argument.name)
        result = func(*args, **kwargs)
        if reads or writes:
            launch = (set(reads) - set(writes), set(writes), set(), func._schema, reads | writes)
            stream_id = self.device.current_stream().stream_id
            for error in self.device.handler._handle_kernel_launch(stream_id, *launch):
                before, now = error.previous_access, error.current_access
                buffer, row = list(self._keys)[error.data_ptr - _FIRST_KEY]
                self.races.append(Race(buffer, row, self._access(before), self._access(now)))
        return result

    def _key(self, name: str, row: int) -> int:
        if (name, row) not in self._keys:
            self._keys[(name, row)] = _FIRST_KEY + len(self._keys)
            self.device.handler._handle_memory_allocation(self._keys[(name, row)])
        return self._keys[(name, row)]

    def _access(self, access: Any) -> Access:
        sites: dict[str, list[Site]] = {"code": [], "driver": []}
        for frame in reversed(list(access.stack_trace)):
            if (where := _where(frame.filename, self._code_roots)) is not None:
                sites[where[0]].append(Site(where[1], frame.lineno, frame.name))
        kind = "write" if access.type.name == "WRITE" else "read"
        stream, operator = self.device.streams[access.stream].name, str(access.operator.name)
        return Access(kind, stream, operator, tuple(sites["code"]), tuple(sites["driver"]))


@functools.cache
def _where(filename: str, code_roots: tuple[str, ...]) -> tuple[str, str] | None:
    """("code" or "driver", the file relative to its root's parent), or None."""
    real = os.path.realpath(filename)
    for kind, root in [*(("code", root) for root in code_roots), ("driver", _DRIVER)]:
        if real.startswith(root + os.sep) and real not in _MACHINERY:
            return kind, os.path.relpath(real, os.path.dirname(root))
    return None


@contextlib.contextmanager
def simulated_gpu(code_roots: Sequence[Path] = ()) -> Iterator[tuple[SimDevice, BufferWatch]]:
    device = SimDevice()
    watch = BufferWatch(device, code_roots)
    # The tree's code reaches the device through torch.get_device_module; code that names
    # torch.cuda's streams and events itself (a fork's, a fix's) gets the same simulation.
    with (
        mock.patch.object(torch, "get_device_module", lambda device_=None: device),
        mock.patch.multiple(torch.cuda, **{name: getattr(device, name) for name in _CUDA.split()}),
        watch,
    ):
        yield device, watch


_CUDA = "Stream Event current_stream default_stream set_stream stream StreamContext synchronize"


def _bind(schema: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[Any, Any]]:
    bound = list(zip(schema.arguments, args, strict=False))
    by_name = {argument.name: argument for argument in schema.arguments[len(args) :]}
    return bound + [(by_name[name], value) for name, value in kwargs.items() if name in by_name]


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


def _storage_key(tensor: torch.Tensor) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


def _row_index(func: Any, bound: list[tuple[Any, Any]]) -> torch.Tensor | None:
    """The index an op applies to dim 0 of its self argument, if it has one."""
    values = {argument.name: value for argument, value in bound}
    if "indices" in values:
        indices = values["indices"]
        first = indices[0] if isinstance(indices, list | tuple) and indices else None
        return first if isinstance(first, torch.Tensor) else None
    index, dim, base = values.get("index"), values.get("dim"), values.get("self")
    if not func._schema.name.startswith("aten::index_") or not isinstance(index, torch.Tensor):
        return None
    on_rows = isinstance(base, torch.Tensor) and isinstance(dim, int) and dim in (0, -base.dim())
    return index if on_rows else None


def _rows(view: torch.Tensor, base: torch.Tensor, index: torch.Tensor | None) -> list[int]:
    """Rows of base an access through view touches: all it spans, or those index picks."""
    if view.numel() == 0:
        return []
    if base.dim() == 0:
        return [0]
    row_bytes = max(1, base.stride(0) * base.element_size())
    base_start = base.storage_offset() * base.element_size()
    size = view.element_size()
    offset = view.storage_offset() * size
    sizes, strides = list(view.shape), [s * size for s in view.stride()]
    if index is None or view.dim() == 0:
        starts = [offset]
    else:
        picked = index.flatten()
        if index.dtype == torch.bool:
            picked = index.reshape(index.shape[0], -1).any(dim=1).nonzero().flatten()
        starts = [offset + (int(i) % sizes[0]) * strides[0] for i in picked.tolist()]
        sizes, strides = sizes[1:], strides[1:]
    low = sum((n - 1) * s for n, s in zip(sizes, strides, strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(sizes, strides, strict=True) if s > 0) + size - 1
    rows: set[int] = set()
    for start in starts:
        first = (start + low - base_start) // row_bytes
        last = (start + high - base_start) // row_bytes
        rows.update(range(max(first, 0), min(last, base.shape[0] - 1) + 1))
    return sorted(rows)
