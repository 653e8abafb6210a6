"""smg_grpc_proto.tensors: pack/unpack for every layout and transport, errors, kernel parity."""

from __future__ import annotations

import os
import threading
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from smg_grpc_proto import sglang_scheduler_pb2, tensors, tokenspeed_scheduler_pb2, vllm_engine_pb2
from smg_grpc_proto.errors import TensorError, TensorTypeError, TransportNotImplementedError
from smg_grpc_proto.tensors import _fallback

LAYOUTS = [
    vllm_engine_pb2.TensorData,
    tokenspeed_scheduler_pb2.TensorData,
    sglang_scheduler_pb2.TensorData,
]
SHM_LAYOUTS = LAYOUTS[:2]
WIRE = {"float32": "<f4", "float16": "<f2", "int64": "<i8", "uint32": "<u4", "uint8": "|u1"}


def native():
    from smg_grpc_proto import _native

    missing = [
        k
        for k in ("convert", "convert_into", "decode_frames", "encode_frames")
        if not hasattr(_native, k)
    ]
    assert not missing, f"native module lacks {missing}"
    return _native


def test_native_backend_is_active_unless_disabled():
    expected = "numpy" if os.environ.get("SMG_GRPC_PROTO_NATIVE") == "0" else "native"
    assert tensors.backend == expected


# ---------------------------------------------------------------- round trips, every layout
arrays = hnp.arrays(
    dtype=st.sampled_from(
        [np.dtype(d).newbyteorder(o) for d in ("f4", "f2", "i8", "u4") for o in "<>"]
        + [np.dtype("u1")]
    ),
    shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6),
)


@st.composite
def strided(draw):
    """Arrays that are often non-contiguous (slices, transposes) and of either byte order."""
    base = draw(arrays)
    if base.ndim >= 1 and draw(st.booleans()):
        base = base[:: draw(st.integers(1, 3))]
    if base.ndim >= 2 and draw(st.booleans()):
        base = base.T
    return base


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(array=strided(), layout=st.sampled_from(LAYOUTS), shm=st.booleans())
def test_round_trip_exact(array, layout, shm, tmp_path_factory):
    transport = "shm" if shm and layout in SHM_LAYOUTS else "inline"
    shm_dir = tmp_path_factory.getbasetemp()
    msg = tensors.pack(array, layout, transport=transport, shm_dir=shm_dir)
    wire = msg.SerializeToString()
    back = tensors.unpack(type(msg).FromString(wire), shm_dir=shm_dir)
    assert back.shape == array.shape
    assert back.dtype == array.dtype.newbyteorder("<")
    assert back.tobytes() == array.astype(array.dtype.newbyteorder("<")).tobytes()
    assert not back.flags.writeable
    assert msg.WhichOneof("payload") == transport if layout in SHM_LAYOUTS else True


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(array=strided(), layout=st.sampled_from(LAYOUTS))
def test_native_and_fallback_pack_identically(array, layout):
    msg = tensors.pack(array, layout)
    src = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    wire_dtype = msg.dtype
    assert _fallback.convert(src, wire_dtype) == native().convert(src, wire_dtype)
    assert getattr(msg, tensors.LAYOUTS[layout.DESCRIPTOR.full_name].payload_field) == (
        _fallback.convert(src, wire_dtype)
    )


# ---------------------------------------------------------------- bfloat16 / float16
SPECIAL = np.array(
    [
        0.0,
        -0.0,
        1.0,
        -1.0,
        3.14159,
        1e-40,
        -1e-45,
        65504.0,
        65520.0,
        1e6,
        3.4e38,
        -3.4e38,
        np.inf,
        -np.inf,
        np.nan,
        -np.nan,
        1.00390625,
        1.01171875,
        5.9604645e-08,
        2.9802322e-08,
    ],
    dtype=np.float32,
)
NAN_BITS = np.array(
    [0x7F800001, 0xFF800001, 0x7FC00000, 0xFFFFFFFF, 0x7F80FFFF, 0x7FBFFFFF], dtype="<u4"
).view("<f4")


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_conversion_matches_reference_rounding(target):
    rng = np.random.default_rng(7)
    values = np.concatenate(
        [
            SPECIAL,
            rng.standard_normal(100_000).astype(np.float32) * 1e3,
            rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype("<u4").view("<f4"),
        ]
    )
    finite = values[~np.isnan(values)]
    msg = tensors.pack(finite, vllm_engine_pb2.TensorData, dtype=target)
    with np.errstate(over="ignore"):
        ref = finite.astype(ml_dtypes.bfloat16 if target == "bfloat16" else np.float16)
    # ml_dtypes and numpy round to nearest even: identical bits for every non-NaN input.
    assert msg.inline == ref.tobytes()
    back = tensors.unpack(msg)
    assert np.array_equal(back.astype(np.float32), ref.astype(np.float32))


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_nan_and_inf_survive_conversion(target):
    values = np.concatenate([NAN_BITS, np.array([np.inf, -np.inf], np.float32)])
    back = tensors.unpack(
        tensors.pack(values, vllm_engine_pb2.TensorData, dtype=target), bf16="float32"
    ).astype(np.float32)
    assert np.isnan(back[: len(NAN_BITS)]).all()
    assert np.signbit(back[: len(NAN_BITS)]).tolist() == np.signbit(NAN_BITS).tolist()
    assert back[-2:].tolist() == [np.inf, -np.inf]


@pytest.mark.parametrize("target", ["bfloat16", "float16"])
def test_nan_and_inf_convert_identically_native_and_fallback(target):
    src = np.concatenate([NAN_BITS, np.array([np.inf, -np.inf], np.float32)])
    assert native().convert(src, target) == _fallback.convert(src, target)


@pytest.mark.parametrize("mode", ["auto", "ml_dtypes", "float32", "uint16"])
def test_bf16_output_modes(mode):
    values = np.array([1.5, -2.25, np.inf], np.float32)
    out = tensors.unpack(
        tensors.pack(values, vllm_engine_pb2.TensorData, dtype="bfloat16"), bf16=mode
    )
    if mode == "uint16":
        assert out.dtype == np.uint16
        assert out.tolist() == [0x3FC0, 0xC010, 0x7F80]
    else:
        assert out.dtype == (np.float32 if mode == "float32" else ml_dtypes.bfloat16)
        assert out.astype(np.float32).tolist() == [1.5, -2.25, np.inf]


def test_ml_dtypes_bfloat16_input_is_sent_as_is():
    values = np.array([1.0, 2.5, -3.0], dtype=ml_dtypes.bfloat16)
    msg = tensors.pack(values, tokenspeed_scheduler_pb2.TensorData)
    assert msg.dtype == "bfloat16"
    assert msg.inline == values.tobytes()


def test_big_endian_and_non_contiguous_inputs_are_converted():
    base = np.arange(24, dtype=">f4").reshape(4, 6)
    view = base[:, ::2].T
    msg = tensors.pack(view, vllm_engine_pb2.TensorData)
    assert list(msg.shape) == [3, 4]
    assert msg.inline == np.ascontiguousarray(view, dtype="<f4").tobytes()


def test_inline_unpack_is_zero_copy():
    msg = tensors.pack(np.arange(1000, dtype=np.int64), vllm_engine_pb2.TensorData)
    payload = msg.inline  # protobuf hands out a bytes object; the array views it
    arr = tensors.unpack(msg)
    assert arr.base is not None
    assert not arr.flags.owndata
    assert arr.nbytes == len(payload)


# ---------------------------------------------------------------- errors
def td(layout=vllm_engine_pb2.TensorData, **kw):
    return layout(**kw)


@pytest.mark.parametrize(
    ("message", "error", "match"),
    [
        (td(inline=b"\0" * 4, shape=[1], dtype="float64"), TensorError, "unknown dtype 'float64'"),
        (td(inline=b"\0" * 7, shape=[2], dtype="float32"), TensorError, "7 bytes, but shape"),
        (
            td(inline=b"", shape=[2**31, 2**31], dtype="uint8"),
            TensorError,
            "needs 4611686018427387904",
        ),
        (td(shape=[2], dtype="float32"), TensorError, "no payload"),
        (
            td(shape=[1], dtype="uint8", remote={"transport": "ucx", "nbytes": 1}),
            TransportNotImplementedError,
            "remote.transport = 'ucx': only the 'nixl'",
        ),
        (
            td(shape=[2], dtype="float32", remote={"transport": "nixl", "nbytes": 4}),
            TensorError,
            "remote.nbytes = 4, but the shape and dtype need 8",
        ),
        (
            td(shape=[4], dtype="uint8", shm={"name": "../etc/passwd", "nbytes": 4}),
            TensorError,
            "not a plain file name",
        ),
        (
            td(shape=[4], dtype="uint8", shm={"name": "x", "nbytes": 5}),
            TensorError,
            "shm.nbytes = 5, but shape",
        ),
        (
            td(sglang_scheduler_pb2.TensorData, data=b"\0" * 3, shape=[4], dtype="uint8"),
            TensorError,
            "data: 3 bytes",
        ),
        (
            td(tokenspeed_scheduler_pb2.TensorData, inline=b"", shape=[1], dtype=""),
            TensorError,
            "unknown dtype ''",
        ),
    ],
    ids=[
        "dtype",
        "length",
        "overflow",
        "missing",
        "remote-transport",
        "remote-nbytes",
        "traversal",
        "shm-size",
        "sglang",
        "empty-dtype",
    ],
)
def test_bad_messages_raise_precise_errors(message, error, match):
    with pytest.raises(error, match=match) as info:
        tensors.unpack(message)
    assert isinstance(info.value, ValueError | NotImplementedError)
    assert info.value.field


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        ((np.zeros(2, np.float64), vllm_engine_pb2.TensorData), {}, TensorError, "float64"),
        (
            (np.zeros(2, np.int64), vllm_engine_pb2.TensorData),
            {"dtype": "bfloat16"},
            TensorError,
            "cannot send a int64 array as bfloat16",
        ),
        (
            (np.zeros(2, np.float32), vllm_engine_pb2.TensorData),
            {"dtype": "complex"},
            TensorError,
            "unknown dtype",
        ),
        (
            (np.zeros(2, np.float32), vllm_engine_pb2.GenerateRequest),
            {},
            TensorTypeError,
            "expected an SGLang, vLLM or TokenSpeed TensorData",
        ),
        (("text", vllm_engine_pb2.TensorData), {}, TensorTypeError, "got str"),
        (
            (np.zeros(2, np.float32), sglang_scheduler_pb2.TensorData),
            {"transport": "shm"},
            TensorError,
            "inline only",
        ),
        (
            (np.zeros(2, np.float32), vllm_engine_pb2.TensorData),
            {"transport": "pigeon"},
            TensorError,
            "transport must be",
        ),
        (
            (
                np.broadcast_to(np.zeros(1, np.uint8), (2**16, 2**16, 2**2)),
                vllm_engine_pb2.TensorData,
            ),
            {},
            TensorError,
            "do not fit an inline protobuf field",
        ),
    ],
    ids=[
        "float64",
        "int-to-bf16",
        "bad-dtype",
        "not-tensordata",
        "str",
        "sglang-shm",
        "transport",
        "over-2GiB",
    ],
)
def test_bad_pack_arguments(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        tensors.pack(*args, **kwargs)


def test_errors_pickle_with_their_details():
    import pickle

    with pytest.raises(TensorError) as info:
        tensors.unpack(td(inline=b"\0" * 7, shape=[2], dtype="float32"))
    again = pickle.loads(pickle.dumps(info.value))
    assert type(again) is TensorError
    assert (again.field, again.expected, again.actual) == (
        info.value.field,
        info.value.expected,
        info.value.actual,
    )
    assert again.expected == 8
    assert again.actual == 7


# ---------------------------------------------------------------- concurrency
def test_eight_threads_pack_and_unpack_identically():
    rng = np.random.default_rng(3)
    inputs = [rng.standard_normal((256, 1024)).astype(np.float32) for _ in range(8)]
    expected = [
        tensors.pack(a, vllm_engine_pb2.TensorData, dtype="bfloat16").inline for a in inputs
    ]
    results: dict[int, list[bytes]] = {}

    def work(i):
        out = []
        for _ in range(10):
            msg = tensors.pack(inputs[i], vllm_engine_pb2.TensorData, dtype="bfloat16")
            back = tensors.unpack(msg, bf16="uint16")
            out.append(back.tobytes())
        results[i] = out

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(8):
        assert results[i] == [expected[i]] * 10


@pytest.mark.slow
def test_gil_is_released_during_conversion():
    """A pure-Python thread keeps running while a large conversion is in progress."""
    big = np.ones(64 * 1024 * 1024 // 4 * 4, dtype=np.float32)  # 256 MiB
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    t = threading.Thread(target=ticker)
    t.start()
    time.sleep(0.01)
    start = time.perf_counter()
    native().convert(big, "bfloat16")
    end = time.perf_counter()
    stop.set()
    t.join()
    during = [x for x in ticks if start < x < end]
    # The conversion takes tens of milliseconds; with the GIL held the ticker could not run.
    assert end - start > 0.01
    assert len(during) >= 3, (end - start, len(during))
