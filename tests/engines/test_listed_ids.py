"""A prompt given as a list of Python ints is read by the native core in one pass
(``_native.uint32_list``) and, where its items expand to runs of their anchor token, expanded
into the request's packed record there too (``_native.packed_prompt``); any other prompt, and
any list the native core does not accept, goes the numpy way. Both must give the same expanded
ids, ranges, requests and errors, for every kind of expansion (runs of one token,
replacements, joins), with and without the native core."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from smg_grpc_proto import _core, _native, tensors
from smg_grpc_proto.engines import VisionModel, _media, expand_placeholders
from smg_grpc_proto.engines import mlx as mlx_adapter
from smg_grpc_proto.engines import sglang as sglang_adapter
from smg_grpc_proto.engines import tokenspeed as tokenspeed_adapter
from smg_grpc_proto.engines import trtllm as trtllm_adapter
from smg_grpc_proto.engines import vllm as vllm_adapter
from smg_grpc_proto.errors import PlaceholderError, TensorTypeError
from smg_grpc_proto.generated import vllm_engine_pb2

EDGES = [0, 1, 127, 128, 2**16, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]


class _Int(int):
    pass


def test_uint32_list_reads_every_int_of_the_range() -> None:
    rng = np.random.default_rng(11)
    for values in (EDGES, rng.integers(0, 2**32, 5000, dtype=np.uint64).tolist(), []):
        expected = np.asarray(values, dtype=np.uint32).tobytes()
        assert _native.uint32_list(values) == expected


@pytest.mark.parametrize(
    "bad",
    [
        *(-1, 2**32, 2**70, -(2**70), True, False, 1.0, None, "1", [1]),
        *(np.int64(3), np.uint32(3), _Int(3)),
    ],
    ids=repr,
)
@pytest.mark.parametrize("where", [0, 1, 4999])
def test_uint32_list_gives_up_on_anything_else(bad: Any, where: int) -> None:
    values: list[Any] = list(range(5000))
    values[where] = bad
    assert _native.uint32_list(values) is None


@pytest.mark.parametrize("values", [(1, 2), np.arange(3, dtype=np.uint32), b"\x01", None])
def test_uint32_list_takes_only_lists(values: Any) -> None:
    with pytest.raises(TensorTypeError) as err:
        _native.uint32_list(values)
    assert err.value.field == "values"
    assert type(values).__name__ in str(err.value)


@pytest.fixture(scope="module")
def media() -> dict[str, Any]:
    """Prepared media of three expansion kinds: Qwen2-VL (a run of one token per image), Llama 4
    (replacements) and Gemma 3 (replacements whose edges join the prompt's tokens)."""
    rng = np.random.default_rng(5)
    images = [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in [(60, 90), (120, 64)]]
    return {
        family: VisionModel.for_family(family).prepare(images, threads=1)
        for family in ("qwen2_vl", "llama4", "gemma3")
    }


def _prompt(media: Any, n: int, seed: int) -> list[int]:
    """``n`` random ids (none of them the anchor; of every varint length: below 2^7, 2^14, 2^21,
    2^28 and 2^32 in turn) with the media's anchors spread among them and, for a family with
    joins, tokens it joins on both sides of each anchor."""
    rng = np.random.default_rng(seed)
    joinable = sorted({t for left, right, _ in media.joins or () for t in (left, right)})
    bits = [7, 14, 21, 28, 32]
    drawn = [int(rng.integers(0, 2 ** bits[i % 5], dtype=np.uint64)) for i in range(n)]
    ids = [t for t in drawn if t != media.anchor]
    for at in sorted(rng.integers(0, len(ids) + 1, media.count).tolist(), reverse=True):
        ids.insert(at, media.anchor)
    # Joinable tokens next to the anchors (where the replacements' edges merge with them).
    for i, t in enumerate(list(ids) if joinable else []):
        for j in (i - 1, i + 1):
            if t == media.anchor and 0 <= j < len(ids) and ids[j] != media.anchor:
                ids[j] = joinable[j % len(joinable)]
    return ids


@pytest.mark.parametrize("family", ["qwen2_vl", "llama4", "gemma3"])
@pytest.mark.parametrize("n", [0, 3, 200, 5000])
@pytest.mark.parametrize("native", [True, False])
def test_list_and_array_prompts_expand_alike(
    media: dict[str, Any], family: str, n: int, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = media[family]
    prompt = _prompt(item, n, seed=n)
    # The numpy path's result, from an int64 array (never read by the native core).
    expected, expected_ranges = expand_placeholders(np.asarray(prompt, dtype=np.int64), [item])
    if not native:
        monkeypatch.setattr(_core, "AVAILABLE", False)
    ids, ranges = expand_placeholders(prompt, [item])
    assert ids.dtype == np.uint32
    assert ids.tolist() == expected.tolist()
    assert ranges == expected_ranges
    # And the runs by hand: every item's range holds its expansion, every other id is the prompt's.
    if family == "qwen2_vl":
        rebuilt: list[int] = []
        counts = iter(item.token_counts)
        for t in prompt:
            rebuilt += [t] * (next(counts) if t == item.anchor else 1)
        assert ids.tolist() == rebuilt


def test_an_empty_list_expands_to_nothing() -> None:
    ids, ranges = expand_placeholders([], [])
    assert ids.dtype == np.uint32
    assert ids.shape == (0,)
    assert ranges == []


@pytest.mark.parametrize(
    "bad",
    [-1, 2**32, True, 1.5, np.int64(7), [1]],
    ids=["negative", "2**32", "bool", "float", "np.int64", "nested"],
)
def test_long_list_prompts_refuse_what_arrays_refuse(media: dict[str, Any], bad: Any) -> None:
    item = media["qwen2_vl"]
    prompt: list[Any] = _prompt(item, 3000, seed=1)
    prompt[1500 if prompt[1500] != item.anchor else 1501] = bad
    try:
        expected: Any = expand_placeholders(np.asarray(prompt), [item])
    except (PlaceholderError, ValueError) as err:
        expected = (type(err), str(err))
    try:
        got: Any = expand_placeholders(prompt, [item])
    except (PlaceholderError, ValueError) as err:
        got = (type(err), str(err))
    if isinstance(expected, tuple) and isinstance(expected[0], type):
        assert got == expected
    else:
        # What numpy reads as integers (a bool, a numpy int) expands as the array does.
        assert got[0].tolist() == expected[0].tolist()
        assert got[1] == expected[1]


@pytest.mark.parametrize(
    "module", [vllm_adapter, sglang_adapter, tokenspeed_adapter, mlx_adapter, trtllm_adapter]
)
def test_an_empty_list_prompt_builds_what_an_empty_array_builds(module: Any) -> None:
    kwargs: dict[str, Any] = {"max_tokens": 4} if module is trtllm_adapter else {}
    built = [
        module.generate_request("r", p, **kwargs).message for p in ([], np.zeros(0, dtype=np.int64))
    ]
    # The same presence of `tokenized` (and of the prompt oneof), the same bytes.
    assert built[0].HasField("tokenized") == built[1].HasField("tokenized")
    assert built[0].SerializeToString() == built[1].SerializeToString()


@pytest.mark.parametrize(
    "module", [vllm_adapter, sglang_adapter, tokenspeed_adapter, mlx_adapter, trtllm_adapter]
)
def test_builders_expand_list_prompts_natively(
    media: dict[str, Any], module: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    item = media["qwen2_vl"]
    answers: list[Any] = []
    real = _native.packed_prompt

    def spy(*args: Any) -> Any:
        answers.append(real(*args))
        return answers[-1]

    monkeypatch.setattr(_media._native, "packed_prompt", spy)
    with_media = module not in (mlx_adapter, trtllm_adapter)
    prompt = _prompt(item, 1000, seed=4) if with_media else list(range(1000))
    args: tuple[Any, ...] = (item,) if with_media else ()
    kwargs: dict[str, Any] = {"max_tokens": 4} if module is trtllm_adapter else {}
    module.generate_request("r", prompt, *args, **kwargs)
    assert len(answers) == 1
    assert answers[0] is not None


def test_list_prompts_take_the_native_path(
    media: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    item = media["qwen2_vl"]
    read: list[int] = []
    real = _native.uint32_list

    def spy(values: list[int]) -> bytes | None:
        read.append(len(values))
        return real(values)

    monkeypatch.setattr(_media._native, "uint32_list", spy)
    prompt = _prompt(item, 3000, seed=2)
    expand_placeholders(prompt, [item])
    assert read == [len(prompt)]
    # Its checks after reading still hold: one anchor too many is refused as on numpy's path.
    with pytest.raises(PlaceholderError, match="anchor token"):
        expand_placeholders([*prompt, item.anchor], [item])
    assert read == [len(prompt), len(prompt) + 1]


def _record(field: int, ids: list[int]) -> bytes:
    """The packed record protobuf writes for ``ids`` in field number ``field``."""
    message = vllm_engine_pb2.TokenizedInput()
    message.input_ids.extend(ids)
    payload = message.SerializeToString()[len(_media._varint(1 << 3 | 2)) :]
    return _media._varint(field << 3 | 2) + payload


@pytest.mark.parametrize("n", [0, 1, 200, 5000])
@pytest.mark.parametrize("field", [1, 2, 15, 16, 2**29 - 1])
def test_packed_prompt_is_the_record_of_the_expanded_ids(
    media: dict[str, Any], n: int, field: int
) -> None:
    item = media["qwen2_vl"]
    prompt = _prompt(item, n, seed=n + field)
    expected, ranges = expand_placeholders(np.asarray(prompt, dtype=np.int64), [item])
    packed = _native.packed_prompt(prompt, [item.anchor], [item.token_counts], field)
    assert packed is not None
    record, got_ranges = packed
    assert got_ranges == ranges
    assert record == _record(field, expected.tolist())


def test_packed_prompt_runs_of_two_media() -> None:
    prompt = [1, 7, 2, 9, 7, 3, 9, 9]
    packed = _native.packed_prompt(prompt, [7, 9], [[2, 3], [1, 4, 2]], 2)
    assert packed is not None
    expanded = [1, 7, 7, 2, 9, 7, 7, 7, 3, 9, 9, 9, 9, 9, 9]
    assert packed[0] == _record(2, expanded)
    assert packed[1] == [[(1, 2), (5, 3)], [(4, 1), (9, 4), (13, 2)]]


@pytest.mark.parametrize(
    ("prompt", "anchors", "counts", "field"),
    [
        ([1, 7, True], [7], [[2]], 1),  # not an int
        ([1, 7, 2**32], [7], [[2]], 1),  # outside uint32
        ([1, 7, -1], [7], [[2]], 1),
        ([1, 7, 7], [7], [[2]], 1),  # an anchor too many
        ([1, 2], [7], [[2]], 1),  # too few
        ([7, 7], [7, 7], [[1], [1]], 1),  # a shared anchor
        ([7], [7], [[0]], 1),  # an empty run
        ([7], [7], [[-1]], 1),
        ([7], [2**32 + 7], [[1]], 1),  # an anchor outside uint32
        ([7], [7], [[1], [1]], 1),  # counts for a media not given
        ([7], [7], [[1, 1]], 1),  # more items than the prompt has ids
        ([7], [7, 8], [[1], []], 1),  # more media than the prompt has ids
        ([7], [7], [range(10**12)], 1),  # a huge sequence: refused by its length, unread
        ([7], [7], [None], 1),
        ([7], [7], [[1]], 0),  # no field number
        ([7], [7], [[1]], 2**29),
        ([7], [7], [[1]], -1),
    ],
)
def test_packed_prompt_gives_up_on_what_the_general_path_refuses(
    prompt: list[Any], anchors: list[Any], counts: list[Any], field: int
) -> None:
    assert _native.packed_prompt(prompt, anchors, counts, field) is None


def test_packed_prompt_takes_only_a_list() -> None:
    with pytest.raises(TensorTypeError) as err:
        _native.packed_prompt((1, 2), [], [], 1)
    assert err.value.field == "input_ids"


@pytest.mark.parametrize(
    ("module", "field"),
    [
        (vllm_adapter, "input_ids"),
        (sglang_adapter, "input_ids"),
        (tokenspeed_adapter, "input_ids"),
        (mlx_adapter, "input_ids"),
        (trtllm_adapter, "input_token_ids"),
    ],
)
def test_builders_write_list_and_array_prompts_alike(
    media: dict[str, Any], module: Any, field: str
) -> None:
    item = media["qwen2_vl"]
    with_media = module not in (mlx_adapter, trtllm_adapter)
    prompt = _prompt(item, 4000, seed=9) if with_media else list(range(10**9, 10**9 + 4000))
    args: tuple[Any, ...] = (item,) if with_media else ()
    if module is trtllm_adapter:
        kwargs: dict[str, Any] = {"max_tokens": 4}
    else:
        kwargs = {}
    built = []
    for p in (prompt, np.asarray(prompt, dtype=np.int64)):
        request = module.generate_request("r", p, *args, **kwargs)
        # Serialized with the tensors written, parsed back: the same message (maps compared by
        # their entries, not their order on the wire).
        built.append(type(request.message).FromString(tensors.serialize(request)))
    assert list(getattr(built[0].tokenized, field)) == list(getattr(built[1].tokenized, field))
    assert built[0] == built[1]


def _outcome(prompt: Any, item: Any) -> Any:
    """What ``expand_packed`` makes of ``prompt``: the expanded ids and ranges, or the error."""
    number = vllm_engine_pb2.TokenizedInput.DESCRIPTOR.fields_by_name["input_ids"].number
    try:
        packed, ids, ranges = _media.expand_packed(prompt, [item], number)
    except (PlaceholderError, ValueError, TypeError) as err:
        return type(err), str(err)
    if packed is not None:
        ids = np.asarray(vllm_engine_pb2.TokenizedInput.FromString(packed).input_ids)
    assert ids is not None
    return ids.tolist(), ranges


def test_random_prompts_expand_alike_with_and_without_the_native_core(
    media: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A differential fuzz: random lists of edge ids, anchors in and out of place and now and
    # then an item of another type; the native path must give what the Python and numpy paths
    # give, results and errors alike.
    item = media["qwen2_vl"]
    rng = np.random.default_rng(34)
    odd = [True, -1, 2**32, 2**64, 1.5, np.int64(3), None, "7"]
    for trial in range(400):
        n = int(rng.integers(0, 300))
        prompt: list[Any] = [EDGES[i] for i in rng.integers(0, len(EDGES), n)]
        for _ in range(int(rng.integers(0, 4))):
            prompt.insert(int(rng.integers(0, len(prompt) + 1)), item.anchor)
        if trial % 5 == 0 and prompt:
            prompt[int(rng.integers(0, len(prompt)))] = odd[trial // 5 % len(odd)]
        with monkeypatch.context() as patch:
            patch.setattr(_core, "AVAILABLE", False)
            expected = _outcome(prompt, item)
        assert _outcome(prompt, item) == expected, f"trial {trial}: {prompt[:20]}"
