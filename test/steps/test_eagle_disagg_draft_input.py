"""build_eagle_disagg_draft_input seeds the FutureMap rows of prebuilt requests.

The function and the FutureMap are real; the batch, the requests and the server
arguments are plain namespaces with the fields the function reads. The process
wide server arguments that FutureMap's first stash consults (and, from 0.5.18
on, that the function itself reads) are patched in, through whichever accessor
the release's code calls. Up to 0.5.17 the function takes server_args as an
argument; the test passes it where the real signature has it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from types import ModuleType, SimpleNamespace
from unittest.mock import patch

import pytest
import torch
from sglang.srt.managers import overlap_utils
from sglang.srt.managers.overlap_utils import FutureMap
from sglang.srt.speculative import eagle_disaggregation, spec_utils
from sglang.srt.speculative.eagle_disaggregation import build_eagle_disagg_draft_input
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

POOL_SIZE = 8
TOPK = 2
UNSET = -1
ROWS = [2, 5]
SEQ_LENS = [17, 33]
LAST_TOKENS = [101, 202]
TOPK_P = [[0.75, 0.25], [0.5, 0.125]]
TOPK_INDEX = [[11, 12], [21, 22]]
HIDDEN = [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]


class FakeEvent:
    def __init__(self) -> None:
        self.records = 0

    def record(self) -> None:
        self.records += 1


class FakeDeviceModule:
    """Stands in for torch.cuda; publish() only needs Event() here."""

    def Event(self) -> FakeEvent:
        return FakeEvent()


def new_batch(enable_overlap: bool) -> SimpleNamespace:
    reqs = [
        SimpleNamespace(
            # More candidates than topk: the function must keep the first TOPK.
            output_topk_p=[*p, 0.0625],
            output_topk_index=[*index, 99],
            hidden_states_tensor=torch.tensor(hidden),
            output_dsa_topk_indices=None,
        )
        for p, index, hidden in zip(TOPK_P, TOPK_INDEX, HIDDEN, strict=True)
    ]
    return SimpleNamespace(
        reqs=reqs,
        device=torch.device("cpu"),
        enable_overlap=enable_overlap,
        req_pool_indices=torch.tensor(ROWS, dtype=torch.int64),
        seq_lens=torch.tensor(SEQ_LENS, dtype=torch.int64),
    )


SERVER_ARGS = SimpleNamespace(
    speculative_eagle_topk=TOPK,
    enable_multi_layer_eagle=False,
    speculative_num_steps=3,
    speculative_algorithm="EAGLE",
)


# The process wide accessors for server arguments that sglang releases use:
# get_global_server_args up to 0.5.15.post1, get_server_args in 0.5.16 and
# 0.5.17, get_spec (a bag of the speculative settings) from 0.5.18 on.
ACCESSORS = ("get_global_server_args", "get_server_args", "get_spec")


def accessors_called(function: Callable[..., object]) -> list[str]:
    """The server-argument accessors that function looks up in its module."""
    return [name for name in ACCESSORS if name in function.__code__.co_names]


def patch_accessors(stack: ExitStack, module: ModuleType, function: Callable[..., object]) -> int:
    """Make the accessors function calls return SERVER_ARGS; how many there were."""
    names = accessors_called(function)
    for name in names:
        stack.enter_context(patch.object(module, name, return_value=SERVER_ARGS))
    return len(names)


def takes_server_args(function: Callable[..., object]) -> bool:
    return "server_args" in inspect.signature(function).parameters


@pytest.fixture
def future_map() -> Iterator[FutureMap]:
    pool = SimpleNamespace(req_to_token=torch.zeros((POOL_SIZE, 4), dtype=torch.int32))
    relay = FutureMap(
        device=torch.device("cpu"),
        spec_algo=SpeculativeAlgorithm.EAGLE,
        req_to_token_pool=pool,
        needs_cpu_seq_lens=True,
    )
    relay.new_seq_lens_buf.fill_(UNSET)
    relay.output_tokens_buf.fill_(UNSET)
    with ExitStack() as stack:
        stack.enter_context(
            patch.object(overlap_utils.torch, "get_device_module", return_value=FakeDeviceModule())
        )
        if patch_accessors(stack, spec_utils, spec_utils.spec_need_hidden_states) != 1:
            raise RuntimeError(
                "spec_need_hidden_states calls none of the known server-argument "
                f"accessors {ACCESSORS}; teach this test the release's accessor"
            )
        read_by_build = patch_accessors(
            stack, eagle_disaggregation, build_eagle_disagg_draft_input
        ) + takes_server_args(build_eagle_disagg_draft_input)
        if read_by_build != 1:
            raise RuntimeError(
                "build_eagle_disagg_draft_input neither takes server_args nor calls one of "
                f"{ACCESSORS}; teach this test how the release passes the settings"
            )
        yield relay


def log_relay_calls(relay: FutureMap) -> list[tuple[str, list[int]]]:
    """Wrap publish and stash so that each call is logged with its rows, then runs."""
    calls: list[tuple[str, list[int]]] = []
    publish, stash = relay.publish, relay.stash

    def logged_publish(indices: torch.Tensor, *args: object, **kwargs: object) -> None:
        calls.append(("publish", indices.tolist()))
        publish(indices, *args, **kwargs)

    # The payload is the draft input up to 0.5.14, a RelayPayload from 0.5.15 on.
    def logged_stash(indices: torch.Tensor, payload: object) -> None:
        calls.append(("stash", indices.tolist()))
        stash(indices, payload)

    relay.publish = logged_publish  # type: ignore[method-assign]
    relay.stash = logged_stash  # type: ignore[method-assign]
    return calls


def build(enable_overlap: bool, relay: FutureMap) -> EagleDraftInput:
    arguments: dict[str, object] = {
        "batch": new_batch(enable_overlap),
        "last_tokens_tensor": torch.tensor(LAST_TOKENS, dtype=torch.int64),
        "future_map": relay,
    }
    if takes_server_args(build_eagle_disagg_draft_input):
        arguments["server_args"] = SERVER_ARGS
    return build_eagle_disagg_draft_input(**arguments)


def test_overlap_publishes_then_stashes_the_seeded_rows(future_map: FutureMap) -> None:
    calls = log_relay_calls(future_map)

    spec_info = build(True, future_map)

    assert calls == [("publish", ROWS), ("stash", ROWS)]
    assert spec_info.future_indices.tolist() == ROWS
    assert future_map.publish_ready.records == 1
    untouched = [r for r in range(POOL_SIZE) if r not in ROWS]
    assert future_map.new_seq_lens_buf[ROWS].tolist() == SEQ_LENS
    assert future_map.new_seq_lens_buf[untouched].tolist() == [UNSET] * len(untouched)
    assert future_map.output_tokens_buf[ROWS].tolist() == LAST_TOKENS
    assert future_map.output_tokens_buf[untouched].tolist() == [UNSET] * len(untouched)
    assert future_map.topk_p_buf[ROWS].tolist() == TOPK_P
    assert future_map.topk_index_buf[ROWS].tolist() == TOPK_INDEX
    assert future_map.hidden_states_buf[ROWS].tolist() == HIDDEN


def test_without_overlap_nothing_is_published_or_stashed(future_map: FutureMap) -> None:
    calls = log_relay_calls(future_map)

    spec_info = build(False, future_map)

    assert calls == []
    assert spec_info.future_indices is None
    assert spec_info.topk_p.tolist() == TOPK_P
    assert spec_info.topk_index.tolist() == TOPK_INDEX
    assert spec_info.bonus_tokens.tolist() == LAST_TOKENS
    assert future_map.publish_ready is None
    assert future_map.new_seq_lens_buf.tolist() == [UNSET] * POOL_SIZE
    assert future_map.output_tokens_buf.tolist() == [UNSET] * POOL_SIZE
