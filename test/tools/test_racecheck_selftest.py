"""The race checker checked on its own: torch only, no sglang.

It must flag a missing wait (not blind) and pass every correctly ordered case
(not paranoid), track rows rather than whole buffers, and refuse a torch whose
private sanitizer API it was not written for.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import subprocess
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from command_server import SERVER
from conftest import TORCH_IN_PROCESS
from patchset import plays as catalogue
from patchset.errors import BackportError, Exit
from patchset.manifest import PinManifest, Series
from racecheck import csan, report
from racecheck.csan import SimDevice, SimStream
from racecheck.report import Race
from racecheck.watch import BufferWatch, simulated_gpu

pytestmark = TORCH_IN_PROCESS

HERE = Path(__file__).resolve()
SCRIPTS = HERE.parents[2] / "scripts"


def rows(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@pytest.fixture
def gpu():
    """A simulated device with streams A, B, C and a watched 8x4 buffer 'buf'."""
    with simulated_gpu(code_roots=[HERE.parent]) as (device, watch):
        buf = torch.zeros(8, 4)
        watch.watch_attributes(SimpleNamespace(buf=buf), suffix="buf")
        streams = {name: device.Stream(name=name) for name in "ABC"}
        yield device, watch, buf, streams


def on(device: SimDevice, stream: SimStream, action: Callable[[], object]) -> None:
    """Run action with stream current."""
    with device.stream(stream):
        action()


def write_row(buf: torch.Tensor, row: int) -> Callable[[], None]:
    def action() -> None:
        buf[rows(row)] = torch.ones(1, 4)

    return action


# --- not blind -------------------------------------------------------------


def test_a_missing_wait_is_flagged_with_both_sites(gpu) -> None:
    device, watch, buf, s = gpu
    with device.stream(s["A"]):
        first_line = inspect.currentframe().f_lineno + 1
        buf[rows(2)] = torch.ones(1, 4)
    with device.stream(s["B"]):
        second_line = inspect.currentframe().f_lineno + 1
        buf[rows(2)] = torch.full((1, 4), 2.0)
    assert len(watch.races) == 1
    race = watch.races[0]
    assert (race.buffer, race.row, race.kind) == ("buf", 2, "write/write")
    assert (race.first.stream, race.second.stream) == ("A", "B")
    assert race.first.operator == race.second.operator == "aten::index_put_"
    assert race.first.code[0].file.endswith(HERE.name)
    assert race.first.code[0].line == first_line
    assert race.second.code[0].line == second_line
    assert race.second.code[0].function == inspect.currentframe().f_code.co_name


def test_a_read_without_wait_is_flagged(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], write_row(buf, 1))
    on(device, s["B"], lambda: buf[rows(1, 5)].sum())
    assert [(r.row, r.kind, r.first.stream, r.second.stream) for r in watch.races] == [
        (1, "write/read", "A", "B")
    ]


def test_a_write_over_an_unordered_read_is_flagged(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], lambda: buf[rows(6)].sum())
    on(device, s["B"], write_row(buf, 6))
    assert [(r.row, r.kind) for r in watch.races] == [(6, "read/write")]


def test_an_event_recorded_before_the_write_does_not_order_it(gpu) -> None:
    # What patch 0001 leaves open for stash(): the fence predates the write.
    device, watch, buf, s = gpu
    event = device.Event()
    with device.stream(s["A"]):
        event.record()
        buf[rows(3)] = 1.0
    s["B"].wait_event(event)
    on(device, s["B"], write_row(buf, 3))
    assert [(r.row, r.kind) for r in watch.races] == [(3, "write/write")]


def test_a_re_recorded_event_forgets_its_earlier_fence(gpu) -> None:
    # The base's publish_ready: the prebuilt record replaces the forward's.
    device, watch, buf, s = gpu
    event = device.Event()
    with device.stream(s["A"]):
        buf[rows(0)] = 1.0
        event.record()
    with device.stream(s["B"]):
        buf[rows(4)] = 1.0
        event.record()
    s["C"].wait_event(event)
    on(device, s["C"], lambda: buf[rows(0, 4)].sum())
    assert [(r.row, r.kind, r.first.stream) for r in watch.races] == [(0, "write/read", "A")]


# --- not paranoid ----------------------------------------------------------


def _event_wait(device: SimDevice, a: SimStream, b: SimStream) -> None:
    event = device.Event()
    event.record(a)
    b.wait_event(event)


def _event_wait_on_current(device: SimDevice, a: SimStream, b: SimStream) -> None:
    event = device.Event()
    with device.stream(a):
        event.record()
    with device.stream(b):
        event.wait()


def _record_event(device: SimDevice, a: SimStream, b: SimStream) -> None:
    b.wait_event(a.record_event())


def _wait_stream(device: SimDevice, a: SimStream, b: SimStream) -> None:
    b.wait_stream(a)


def _device_synchronize(device: SimDevice, a: SimStream, b: SimStream) -> None:
    device.synchronize()


def _stream_synchronize(device: SimDevice, a: SimStream, b: SimStream) -> None:
    a.synchronize()


def _event_synchronize(device: SimDevice, a: SimStream, b: SimStream) -> None:
    event = device.Event()
    event.record(a)
    event.synchronize()


ORDERINGS = {
    "event record/wait": _event_wait,
    "event.wait on the current stream": _event_wait_on_current,
    "stream.record_event": _record_event,
    "wait_stream": _wait_stream,
    "device synchronize": _device_synchronize,
    "stream synchronize": _stream_synchronize,
    "event synchronize": _event_synchronize,
}


@pytest.mark.parametrize("ordering", ORDERINGS)
def test_ordered_accesses_are_clean_and_the_same_without_order_are_not(ordering: str) -> None:
    def play(order: bool) -> list[Race]:
        with simulated_gpu() as (device, watch):
            buf = torch.zeros(8)
            watch.watch_attributes(SimpleNamespace(buf=buf), suffix="buf")
            a, b = device.Stream(name="A"), device.Stream(name="B")
            with device.stream(a):
                buf[rows(5)] = 1.0
            if order:
                ORDERINGS[ordering](device, a, b)
            with device.stream(b):
                buf[rows(5)].sum()
                buf[rows(5)] = 2.0
            return watch.races

    assert play(order=True) == []
    assert [r.kind for r in play(order=False)] == ["write/read"]


def test_ordering_is_transitive(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], write_row(buf, 7))
    _event_wait(device, s["A"], s["B"])
    s["C"].wait_stream(s["B"])
    on(device, s["C"], write_row(buf, 7))
    assert watch.races == []


def test_one_stream_never_races_with_itself(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], write_row(buf, 0))
    on(device, s["A"], lambda: buf.sum())
    on(device, s["A"], write_row(buf, 0))
    assert watch.races == []


# --- rows, views, what is watched ------------------------------------------


def test_different_rows_on_two_streams_are_not_a_race(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], write_row(buf, 1))
    on(device, s["B"], write_row(buf, 2))
    on(device, s["B"], lambda: buf[rows(2, 3)].sum())
    assert watch.races == []


def test_rows_are_found_through_views_and_masks(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], lambda: buf[2:4].fill_(1.0))  # a slice: rows 2, 3
    on(device, s["B"], lambda: buf[rows(5)].sum())  # row 5: untouched
    mask = torch.zeros(8, dtype=torch.bool)
    mask[3] = True
    on(device, s["B"], lambda: buf.__setitem__(mask, 2.0))  # row 3 through a bool mask
    assert [(r.row, r.kind) for r in watch.races] == [(3, "write/write")]


def test_an_op_without_index_touches_every_row(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], write_row(buf, 6))
    on(device, s["B"], lambda: buf[:, 0].fill_(0.0))  # a column spans all rows
    assert [(r.row, r.second.stream) for r in watch.races] == [(6, "B")]
    s["C"].wait_stream(s["B"])
    on(device, s["C"], lambda: buf.sum())  # every row, each last written by B
    assert len(watch.races) == 1


def test_index_select_and_index_copy_use_their_index(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], lambda: buf.index_copy_(0, rows(1), torch.ones(1, 4)))
    on(device, s["B"], lambda: buf.index_select(0, rows(0, 2)))
    assert watch.races == []
    on(device, s["B"], lambda: buf.index_select(0, rows(1)))
    assert [(r.row, r.kind) for r in watch.races] == [(1, "write/read")]


def test_unwatched_tensors_are_ignored_and_lazy_buffers_are_watched() -> None:
    class Relay:
        pass

    relay = Relay()
    with simulated_gpu() as (device, watch):
        watch.watch_attributes(relay)
        a, b = device.Stream(name="A"), device.Stream(name="B")
        other = torch.zeros(4)
        relay.late_buf = torch.zeros(4)  # appears after watching began
        relay.not_a_relay = torch.zeros(4)  # wrong suffix
        for tensor in (other, relay.late_buf, relay.not_a_relay):
            with device.stream(a):
                tensor[rows(0)] = 1.0
            with device.stream(b):
                tensor[rows(0)] = 2.0
        assert [r.buffer for r in watch.races] == ["late_buf"]


def test_the_simulated_device_stands_in_for_get_device_module() -> None:
    with simulated_gpu() as (device, _):
        assert torch.get_device_module("cuda") is device
        stream = device.Stream(name="mine")
        with device.StreamContext(stream):
            assert device.current_stream() is stream
        assert device.current_stream() is device.default_stream()
    assert torch.get_device_module("cpu") is not device


def test_a_watch_reports_nothing_without_any_access() -> None:
    device = SimDevice()
    watch = BufferWatch(device)
    with watch:
        torch.ones(3).sum()
    assert watch.races == [] and watch.seen == set()


# --- the private torch API -------------------------------------------------


def test_any_torch_with_the_sanitizer_shape_is_used_and_named(monkeypatch) -> None:
    assert csan.check_shape(csan.load()) == []
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    csan.load()  # no version check: the API's shape decides
    assert csan.torch_text("2.99.0") == (
        "torch 2.99.0 (sanitizer API checked; table not yet verified on it)"
    )
    verified = csan.VERIFIED_TORCH[0]
    assert csan.torch_text(f"{verified}+cu130") == f"torch {verified}+cu130 (verified)"


def test_a_changed_sanitizer_api_is_refused(monkeypatch) -> None:
    from torch.cuda import _sanitizer

    monkeypatch.delattr(_sanitizer.EventHandler, "_handle_event_wait")

    def kernel_launch(self, stream, reads, writes, outputs, operator):  # one parameter fewer
        return []

    monkeypatch.setattr(_sanitizer.EventHandler, "_handle_kernel_launch", kernel_launch)
    problems = csan.check_shape(_sanitizer)
    assert any("_handle_event_wait is gone" in p for p in problems)
    assert any(p.startswith("EventHandler._handle_kernel_launch(") for p in problems)
    with pytest.raises(BackportError, match="changed shape") as raised:
        csan.load()
    assert raised.value.code == Exit.ENVIRONMENT


# --- table and reports -----------------------------------------------------


def test_the_expected_table_covers_every_scenario_and_step(series: Series) -> None:
    table = report.expected_table(series.manifest, catalogue.SCENARIOS)
    assert set(table) == set(catalogue.SCENARIOS)
    for row in table.values():
        assert list(row) == series.manifest.steps
        assert row[series.manifest.final_step] == frozenset()


def test_a_manifest_without_a_column_for_a_step_is_refused(patch_set: Path) -> None:
    pin = patch_set / "pin.toml"
    text = pin.read_text(encoding="utf-8")
    start = text.index("[races.S2]\n")
    pin.write_text(text[:start] + text[start:].replace('"0001" = []\n', "", 1), encoding="utf-8")
    with pytest.raises(BackportError, match=r"races\.S2\.0001 is missing") as raised:
        PinManifest.load(pin)
    assert raised.value.code == Exit.PATCHSET_INVALID
    pin.write_text(text, encoding="utf-8")
    manifest = dataclasses.replace(PinManifest.load(pin), races={})
    with pytest.raises(BackportError, match=r"has no \[races.S2\]") as raised:
        report.expected_table(manifest, ["S2"])
    assert raised.value.code == Exit.PATCHSET_INVALID


def test_cells_read_like_the_issue(gpu) -> None:
    device, watch, buf, s = gpu
    on(device, s["A"], write_row(buf, 1))
    on(device, s["B"], write_row(buf, 1))
    on(device, s["A"], write_row(buf, 4))
    on(device, s["B"], write_row(buf, 4))
    cell = report.cell_of(watch.races)
    assert cell == {("write/write", "buf", 1), ("write/write", "buf", 4)}
    assert report.describe(cell) == "unordered writes to buf in rows 1, 4"
    assert report.describe(frozenset()) == "clean"
    text = report.race_text(watch.races[0])
    assert "buf row 1: unordered writes" in text
    assert "write on A" in text and "write on B" in text
    assert HERE.name in text
    # The worker hands races from its child to the parent pickled.
    assert pickle.loads(pickle.dumps(watch.races[0])) == watch.races[0]


# --- the command's refusals ------------------------------------------------


def race_check(*args: str) -> subprocess.CompletedProcess[str]:
    """race-check ARGS, forked from the command server (the start is test_startup's)."""
    return SERVER.run(SCRIPTS / "race-check", list(args))


def test_a_tree_without_sglang_is_refused_without_a_traceback(tmp_path: Path) -> None:
    result = race_check("--tree", str(tmp_path))
    assert result.returncode == 16
    assert "holds no python/sglang/__init__.py" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_interpreter_is_refused(tmp_path: Path) -> None:
    result = race_check("--python", str(tmp_path / "nope"), "--tree", str(tmp_path))
    assert result.returncode == 16
    assert "no such file" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("python", ["/bin/true", "/usr/bin/env", "3.10.13"])
def test_an_interpreter_that_cannot_run_the_check_is_refused(python: str) -> None:
    """The whole command runs again on --python: a program that is no Python 3.11+ is
    refused first, not run (one that exits 0 would have passed with no output)."""
    if python[0].isdigit():
        python = str(Path.home() / ".pyenv" / "versions" / python / "bin" / "python3")
        assert Path(python).is_file(), f"this machine's pyenv has no {python}"
    result = race_check("--python", python, "--step", "base")
    assert result.returncode == 16, result.stdout + result.stderr
    assert f"--python {python} is not a Python 3.11 or newer" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_bad_usage_exits_2() -> None:
    result = race_check("--step", "9999")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr
    result = race_check("--base", "all", "--tree", ".")
    assert result.returncode == 2
    assert "--tree takes one base" in result.stderr
