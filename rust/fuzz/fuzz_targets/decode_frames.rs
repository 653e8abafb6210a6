//! Arbitrary bytes into `decode_frames` and `encode_frames` under the engines' plans.
//!
//! The first byte picks the plan; the rest is the message. Besides "no panic", checks the
//! codec's own invariants on every input it accepts: spans lie inside the input, the header
//! re-decodes to the same number of payloads, and encoding the payloads back reproduces an
//! input that decodes to the same header.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smg_grpc_proto::tensor::wire::{decode_frames, encode_frames, Plan, Source};
use smg_grpc_proto::tensor::WireDtype;

const NONCE: [u8; 16] = *b"fuzz-nonce-16byt";

fn plans() -> [Plan; 4] {
    let vllm_mm = Plan::Message(vec![
        (2, Plan::Tensor(1)),
        (3, Plan::Message(vec![(2, Plan::Tensor(1))])),
    ]);
    let tokenspeed_item = Plan::Message(vec![
        (3, Plan::Tensor(3)),
        (4, Plan::Message(vec![(2, Plan::Tensor(3))])),
    ]);
    [
        // vLLM GenerateRequest: mm_inputs = 7, extra_mm_inputs = 11.
        Plan::Message(vec![(7, vllm_mm.clone()), (11, vllm_mm)]),
        // SGLang GenerateRequest: mm_inputs = 3 { pixel_values = 4, model_specific_tensors = 9 }.
        Plan::Message(vec![(
            3,
            Plan::Message(vec![
                (4, Plan::Tensor(1)),
                (9, Plan::Message(vec![(2, Plan::Tensor(1))])),
            ]),
        )]),
        // TokenSpeed GenerateRequest: mm_inputs = 9 { items = 1 }.
        Plan::Message(vec![(9, Plan::Message(vec![(1, tokenspeed_item)]))]),
        // A bare TensorData.
        Plan::Tensor(1),
    ]
}

fuzz_target!(|input: &[u8]| {
    let Some((&selector, data)) = input.split_first() else {
        return;
    };
    let plans = plans();
    let plan = &plans[usize::from(selector) % plans.len()];
    let _ = encode_frames(data, plan, &NONCE, &[]);
    let Ok(layout) = decode_frames(data, plan, &NONCE) else {
        return;
    };
    let header = layout.to_vec().unwrap();
    assert_eq!(header.len(), layout.len());
    for &(offset, len) in layout.spans() {
        assert!(offset.checked_add(len).is_some_and(|end| end <= data.len()));
    }
    let again = decode_frames(&header, plan, &NONCE).expect("a decoded header decodes again");
    assert_eq!(again.spans().len(), layout.spans().len());
    let sources: Vec<Source<'_>> = layout
        .spans()
        .iter()
        .map(|&(o, l)| Source::new(&data[o..o + l], WireDtype::Uint8, WireDtype::Uint8).unwrap())
        .collect();
    let rebuilt = encode_frames(&header, plan, &NONCE, &sources).expect("the header encodes");
    let rebuilt = rebuilt.to_vec().unwrap();
    let redecoded = decode_frames(&rebuilt, plan, &NONCE).expect("the rebuilt message decodes");
    assert_eq!(redecoded.to_vec().unwrap(), header);
});
