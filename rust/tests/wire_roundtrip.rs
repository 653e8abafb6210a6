//! Property tests of the frame codec: random plans, random messages along them.
//!
//! A message is a tree of records; records of planned fields hold sub-messages of the child
//! plan (or, sometimes, a non-LEN value that must be copied verbatim), tensors hold payloads,
//! and unplanned records hold anything. A model serializer writes each message three ways —
//! plainly, with tokens for payloads, and with converted payloads — and the codec must agree
//! with it byte for byte.

use proptest::prelude::*;
use smg_grpc_proto::tensor::convert::convert_to_vec;
use smg_grpc_proto::tensor::wire::{decode_frames, encode_frames, Plan, Source, NONCE_LEN};
use smg_grpc_proto::tensor::WireDtype;

const NONCE: [u8; NONCE_LEN] = *b"\x00\x11\x22\x33\x44\x55\x66\x77\x88\x99\xaa\xbb\xcc\xdd\xee\xff";

#[derive(Debug, Clone)]
enum Value {
    Varint(u64),
    Fixed64(u64),
    Fixed32(u32),
    /// Opaque LEN value of an unplanned field.
    Bytes(Vec<u8>),
    /// A sub-message of a planned field.
    Message(Vec<Record>),
    /// A tensor payload (float32 elements: a multiple of 4 bytes).
    Payload(Vec<u8>),
}

#[derive(Debug, Clone)]
struct Record {
    field: u32,
    value: Value,
}

/// Field numbers 1..=6 may be planned; 7..=9 never are, so opaque LEN records use those.
fn plan_strategy() -> impl Strategy<Value = Plan> {
    let leaf = (1u32..=4).prop_map(Plan::Tensor);
    leaf.prop_recursive(4, 16, 3, |inner| {
        prop::collection::vec((1u32..=6, inner), 0..=3).prop_map(|mut fields| {
            let mut seen = Vec::new();
            fields.retain(|(n, _)| {
                let fresh = !seen.contains(n);
                seen.push(*n);
                fresh
            });
            Plan::Message(fields)
        })
    })
}

fn scalar_strategy(field: impl Strategy<Value = u32>) -> impl Strategy<Value = Record> {
    let value = prop_oneof![
        any::<u64>().prop_map(Value::Varint),
        any::<u64>().prop_map(Value::Fixed64),
        any::<u32>().prop_map(Value::Fixed32),
    ];
    (field, value).prop_map(|(field, value)| Record { field, value })
}

fn opaque_strategy() -> impl Strategy<Value = Record> {
    (7u32..=9, prop::collection::vec(any::<u8>(), 0..40)).prop_map(|(field, b)| Record {
        field,
        value: Value::Bytes(b),
    })
}

fn payload_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<[u8; 4]>(), 0..40).prop_map(|v| v.concat())
}

/// Records of a message of type `plan`.
fn message_strategy(plan: Plan) -> BoxedStrategy<Vec<Record>> {
    let mut options: Vec<BoxedStrategy<Record>> =
        vec![scalar_strategy(1u32..=9).boxed(), opaque_strategy().boxed()];
    match plan {
        Plan::Tensor(payload) => {
            options.push(
                payload_strategy()
                    .prop_map(move |p| Record {
                        field: payload,
                        value: Value::Payload(p),
                    })
                    .boxed(),
            );
        }
        Plan::Message(fields) => {
            for (field, child) in fields {
                options.push(
                    message_strategy(child)
                        .prop_map(move |m| Record {
                            field,
                            value: Value::Message(m),
                        })
                        .boxed(),
                );
            }
        }
    }
    prop::collection::vec(prop::strategy::Union::new(options), 0..6).boxed()
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// How payloads are written by the model serializer.
#[derive(Clone, Copy)]
enum Payloads {
    /// As they are.
    Plain,
    /// As tokens, numbered in encounter order.
    Tokens,
    /// Converted to the wire dtype the test assigns to payload `i`.
    Converted,
}

fn wire_dtype_for(index: usize) -> WireDtype {
    [WireDtype::Float32, WireDtype::Bfloat16, WireDtype::Float16][index % 3]
}

fn serialize(records: &[Record], how: Payloads, counter: &mut usize, out: &mut Vec<u8>) {
    for r in records {
        let field = u64::from(r.field) << 3;
        match &r.value {
            Value::Varint(v) => {
                put_varint(out, field);
                put_varint(out, *v);
            }
            Value::Fixed64(v) => {
                put_varint(out, field | 1);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Value::Fixed32(v) => {
                put_varint(out, field | 5);
                out.extend_from_slice(&v.to_le_bytes());
            }
            Value::Bytes(b) => {
                put_varint(out, field | 2);
                put_varint(out, b.len() as u64);
                out.extend_from_slice(b);
            }
            Value::Message(m) => {
                let mut inner = Vec::new();
                serialize(m, how, counter, &mut inner);
                put_varint(out, field | 2);
                put_varint(out, inner.len() as u64);
                out.extend_from_slice(&inner);
            }
            Value::Payload(p) => {
                let i = *counter;
                *counter += 1;
                let bytes = match how {
                    Payloads::Plain => p.clone(),
                    Payloads::Tokens => [&NONCE[..], &(i as u32).to_le_bytes()].concat(),
                    Payloads::Converted => {
                        convert_to_vec(p, WireDtype::Float32, wire_dtype_for(i)).unwrap()
                    }
                };
                put_varint(out, field | 2);
                put_varint(out, bytes.len() as u64);
                out.extend_from_slice(&bytes);
            }
        }
    }
}

fn model(records: &[Record], how: Payloads) -> Vec<u8> {
    let mut out = Vec::new();
    serialize(records, how, &mut 0, &mut out);
    out
}

fn payloads(records: &[Record], out: &mut Vec<Vec<u8>>) {
    for r in records {
        match &r.value {
            Value::Payload(p) => out.push(p.clone()),
            Value::Message(m) => payloads(m, out),
            _ => {}
        }
    }
}

fn plan_and_message() -> impl Strategy<Value = (Plan, Vec<Record>)> {
    plan_strategy().prop_flat_map(|plan| {
        let records = message_strategy(plan.clone());
        (Just(plan), records)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// decode: the header is the model with tokens, the spans point at the payloads.
    #[test]
    fn decode_matches_the_model((plan, records) in plan_and_message()) {
        let data = model(&records, Payloads::Plain);
        let layout = decode_frames(&data, &plan, &NONCE).unwrap();
        prop_assert_eq!(layout.to_vec().unwrap(), model(&records, Payloads::Tokens));
        let mut expected = Vec::new();
        payloads(&records, &mut expected);
        let got: Vec<&[u8]> = layout.spans().iter().map(|&(o, l)| &data[o..o + l]).collect();
        prop_assert_eq!(got, expected.iter().map(Vec::as_slice).collect::<Vec<_>>());
    }

    /// encode(decode(x)) == x, and decode(encode(h)) == h.
    #[test]
    fn encode_inverts_decode((plan, records) in plan_and_message()) {
        let data = model(&records, Payloads::Plain);
        let decoded = decode_frames(&data, &plan, &NONCE).unwrap();
        let header = decoded.to_vec().unwrap();
        let sources: Vec<Source<'_>> = decoded
            .spans()
            .iter()
            .map(|&(o, l)| Source::new(&data[o..o + l], WireDtype::Uint8, WireDtype::Uint8).unwrap())
            .collect();
        let encoded = encode_frames(&header, &plan, &NONCE, &sources).unwrap().to_vec().unwrap();
        prop_assert_eq!(&encoded, &data);
        let again = decode_frames(&encoded, &plan, &NONCE).unwrap();
        prop_assert_eq!(again.to_vec().unwrap(), header);
    }

    /// encode with conversions equals putting the converted bytes in the payloads directly.
    #[test]
    fn encode_converts_like_the_model((plan, records) in plan_and_message()) {
        let header = model(&records, Payloads::Tokens);
        let mut tensors = Vec::new();
        payloads(&records, &mut tensors);
        let sources: Vec<Source<'_>> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| Source::new(t, WireDtype::Float32, wire_dtype_for(i)).unwrap())
            .collect();
        let layout = encode_frames(&header, &plan, &NONCE, &sources).unwrap();
        let expected = model(&records, Payloads::Converted);
        prop_assert_eq!(layout.len(), expected.len());
        prop_assert_eq!(layout.to_vec().unwrap(), expected);
    }

    /// Arbitrary bytes with an arbitrary plan: a result or an error, never a panic; a
    /// successful decode re-decodes to itself.
    #[test]
    fn arbitrary_bytes_never_panic(plan in plan_strategy(), data in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(layout) = decode_frames(&data, &plan, &NONCE) {
            let header = layout.to_vec().unwrap();
            let again = decode_frames(&header, &plan, &NONCE).unwrap();
            prop_assert_eq!(again.spans().len(), layout.spans().len());
        }
        let _ = encode_frames(&data, &plan, &NONCE, &[]);
    }
}
