//! A prompt's token ids, expanded for an engine: each media item's anchor token becomes its run
//! of placeholder tokens (Qwen-VL's `<|image_pad|>` repeated as many times as the image has
//! tokens), written at once as the packed `repeated uint32` field of a request, with each item's
//! `(offset, length)` range in the expanded ids.
//!
//! This is the common case of the Python builders' `expand_placeholders` (families whose items
//! expand to runs of their anchor token, no replacement text, no joins), done in one pass over
//! the ids and one over the output: for a 32 000-token prompt a few hundred µs less than numpy's
//! repeat, cumulative sums and temporaries. Whatever the general path would refuse is
//! [`Refused`] here, and the caller takes that path, whose errors name the problem.

use crate::memory::AllocError;
use crate::tensor::wire::{put_varint, varint_len};

/// One media of a prompt: its anchor token and, in prompt order, the run length of each of its
/// items (its token count).
#[derive(Clone, Copy, Debug)]
pub struct Anchor<'a> {
    pub token: u32,
    pub counts: &'a [u64],
}

/// Why a prompt is not expanded here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Two media share an anchor token.
    SharedAnchor,
    /// A media's anchor occurs other than once per item.
    AnchorCount { media: usize },
    /// An item's run is empty.
    EmptyRun { media: usize },
    /// The expanded field's size overflows `u64` or `usize` (a size that fits but cannot be
    /// allocated is [`ExpandError::OutOfMemory`]).
    TooLong,
    /// The field number is not one protobuf allows (1 to 2^29 - 1).
    FieldNumber,
}

/// Why [`expand_runs`] produced nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExpandError {
    Refused(Refused),
    OutOfMemory(AllocError),
}

/// The expanded prompt: the field's whole record (tag, length, varints), for protobuf to merge
/// into a message, and per media each item's `(offset, length)` in the expanded ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expanded {
    /// The record is `buffer[start..]` (its header is written in front of the varints once
    /// their length is known).
    buffer: Vec<u8>,
    start: usize,
    pub ranges: Vec<Vec<(u64, u64)>>,
}

impl Expanded {
    /// The field's record: tag, length, varints.
    pub fn record(&self) -> &[u8] {
        &self.buffer[self.start..]
    }
}

/// Room for the record's header in front of the varints: a tag of up to 5 bytes (field numbers
/// below 2^29) and a length of up to 10.
const HEADER: usize = 15;
/// Each varint is written as a whole 8-byte word (the bytes past its end are overwritten by the
/// next one, or cut off at the end): this many bytes of slack after the last.
const WORD: usize = 8;

/// Expands `ids` for `media` into the packed record of field number `field`: every id as its
/// minimal varint, each occurrence of an anchor as its item's count of copies of it.
///
/// Refused when two media share an anchor, when a media's anchor occurs other than exactly once
/// per item, when an item's count is 0, or when the record's size overflows `usize`; out of
/// memory when it cannot be allocated.
pub fn expand_runs(ids: &[u32], media: &[Anchor<'_>], field: u32) -> Result<Expanded, ExpandError> {
    let refused = |r| Err(ExpandError::Refused(r));
    if !(1..1 << 29).contains(&field) {
        return refused(Refused::FieldNumber);
    }
    // Every anchor's position, with its media, in prompt order.
    let mut anchors: Vec<(usize, usize)> = Vec::new();
    for (m, a) in media.iter().enumerate() {
        if media[..m].iter().any(|b| b.token == a.token) {
            return refused(Refused::SharedAnchor);
        }
        if a.counts.contains(&0) {
            return refused(Refused::EmptyRun { media: m });
        }
        let before = anchors.len();
        let found = ids.iter().enumerate().filter(|&(_, &t)| t == a.token);
        anchors.extend(found.map(|(p, _)| (p, m)));
        if anchors.len() - before != a.counts.len() {
            return refused(Refused::AnchorCount { media: m });
        }
    }
    anchors.sort_unstable();
    // Each anchor's run and range; the expanded length.
    let mut ranges: Vec<Vec<(u64, u64)>> = media
        .iter()
        .map(|a| Vec::with_capacity(a.counts.len()))
        .collect();
    let mut runs = Vec::with_capacity(anchors.len());
    let mut added = 0u64; // tokens the runs before add
    for &(p, m) in &anchors {
        let count = media[m].counts[ranges[m].len()];
        let (Some(offset), Some(sum)) =
            ((p as u64).checked_add(added), added.checked_add(count - 1))
        else {
            return refused(Refused::TooLong);
        };
        ranges[m].push((offset, count));
        runs.push(count);
        added = sum;
    }
    let size = (ids.len() as u64)
        .checked_add(added)
        .and_then(|n| n.checked_mul(5))
        .and_then(|n| n.checked_add((HEADER + WORD) as u64))
        .and_then(|n| usize::try_from(n).ok());
    let Some(size) = size else {
        return refused(Refused::TooLong);
    };
    let mut buffer =
        crate::memory::fallible::zeros::<u8>(size).map_err(ExpandError::OutOfMemory)?;
    let mut o = HEADER;
    let mut from = 0;
    for (&(p, _), &run) in anchors.iter().zip(&runs) {
        o = put_words(&mut buffer, o, &ids[from..p]);
        let (word, n) = varint_word(ids[p]);
        for _ in 0..run {
            buffer[o..o + WORD].copy_from_slice(&word.to_le_bytes());
            o += n;
        }
        from = p + 1;
    }
    o = put_words(&mut buffer, o, &ids[from..]);
    buffer.truncate(o);
    let (mut tag, mut len) = ([0u8; 10], [0u8; 10]);
    let tag_len = put_varint(u64::from(field) << 3 | 2, &mut tag);
    let len_len = put_varint((o - HEADER) as u64, &mut len);
    let start = HEADER - (tag_len + len_len);
    buffer[start..start + tag_len].copy_from_slice(&tag[..tag_len]);
    buffer[start + tag_len..HEADER].copy_from_slice(&len[..len_len]);
    Ok(Expanded {
        buffer,
        start,
        ranges,
    })
}

/// Writes the varints of `ids` from `buffer[o]` on, each as a whole word; returns the end of the
/// last. `buffer` must hold [`WORD`] bytes past it.
fn put_words(buffer: &mut [u8], mut o: usize, ids: &[u32]) -> usize {
    for &id in ids {
        let (word, n) = varint_word(id);
        buffer[o..o + WORD].copy_from_slice(&word.to_le_bytes());
        o += n;
    }
    o
}

/// The minimal varint of `value` as the low bytes of a little-endian word, and its length:
/// seven bits a byte, the high bit set on every byte but the last, without a branch.
fn varint_word(value: u32) -> (u64, usize) {
    let v = u64::from(value);
    let spread = (v & 0x7f)
        | (v << 1 & 0x7f00)
        | (v << 2 & 0x7f_0000)
        | (v << 3 & 0x7f00_0000)
        | (v << 4 & 0x7f_0000_0000);
    let n = varint_len(v);
    let more = 0x80_8080_8080u64 & ((1u64 << (8 * (n - 1))) - 1);
    (spread | more, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expansion the slow way: each id, or its run, one varint at a time.
    fn by_hand(ids: &[u32], media: &[Anchor<'_>], field: u32) -> (Vec<u8>, Vec<Vec<(u64, u64)>>) {
        let mut expanded: Vec<u32> = Vec::new();
        let mut ranges = vec![Vec::new(); media.len()];
        for &id in ids {
            match media.iter().position(|a| a.token == id) {
                Some(m) => {
                    let count = media[m].counts[ranges[m].len()];
                    ranges[m].push((expanded.len() as u64, count));
                    expanded.extend(std::iter::repeat_n(id, count as usize));
                }
                None => expanded.push(id),
            }
        }
        let varint = |out: &mut Vec<u8>, v: u64| {
            let mut bytes = [0u8; 10];
            let n = put_varint(v, &mut bytes);
            out.extend_from_slice(&bytes[..n]);
        };
        let mut payload = Vec::new();
        for &v in &expanded {
            varint(&mut payload, u64::from(v));
        }
        let mut record = Vec::new();
        varint(&mut record, u64::from(field) << 3 | 2);
        varint(&mut record, payload.len() as u64);
        record.extend_from_slice(&payload);
        (record, ranges)
    }

    #[test]
    fn runs_and_varints_equal_the_expansion_by_hand() {
        let edges = [
            0,
            1,
            127,
            128,
            16_383,
            16_384,
            (1 << 21) - 1,
            1 << 21,
            1 << 28,
            u32::MAX,
        ];
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for trial in 0..200 {
            let (a, b) = (edges[trial % edges.len()], 151_655);
            let counts_a: Vec<u64> = (0..trial % 4).map(|_| 1 + next() % 300).collect();
            let counts_b: Vec<u64> = (0..trial % 3).map(|_| 1 + next() % 5).collect();
            let mut ids: Vec<u32> = (0..next() % 400)
                .map(|_| match next() % 3 {
                    0 => edges[(next() % edges.len() as u64) as usize],
                    _ => next() as u32,
                })
                .filter(|&t| t != a && t != b)
                .collect();
            for _ in &counts_a {
                ids.insert((next() % (ids.len() as u64 + 1)) as usize, a);
            }
            for _ in &counts_b {
                ids.insert((next() % (ids.len() as u64 + 1)) as usize, b);
            }
            let media = [
                Anchor {
                    token: a,
                    counts: &counts_a,
                },
                Anchor {
                    token: b,
                    counts: &counts_b,
                },
            ];
            for field in [1, 2, 15, 16, (1 << 29) - 1] {
                let got = expand_runs(&ids, &media, field).expect("a valid prompt");
                assert_eq!(
                    (got.record().to_vec(), got.ranges),
                    by_hand(&ids, &media, field),
                    "trial {trial}, field {field}"
                );
            }
        }
    }

    #[test]
    fn an_empty_prompt_is_an_empty_record() {
        let got = expand_runs(&[], &[], 1).expect("valid");
        assert_eq!(got.record(), [0x0a, 0x00]);
        assert!(got.ranges.is_empty());
        let none = Anchor {
            token: 7,
            counts: &[],
        };
        assert_eq!(
            expand_runs(&[1, 2], &[none], 1).expect("valid").ranges,
            vec![vec![]]
        );
    }

    #[test]
    fn refuses_what_the_general_path_refuses() {
        let one = Anchor {
            token: 9,
            counts: &[3],
        };
        let err = |ids: &[u32], media: &[Anchor<'_>]| match expand_runs(ids, media, 1) {
            Err(ExpandError::Refused(r)) => r,
            other => panic!("not refused: {other:?}"),
        };
        assert_eq!(err(&[1, 9, 9], &[one]), Refused::AnchorCount { media: 0 });
        assert_eq!(err(&[1, 2], &[one]), Refused::AnchorCount { media: 0 });
        assert_eq!(err(&[9], &[one, one]), Refused::SharedAnchor);
        let empty = Anchor {
            token: 9,
            counts: &[0],
        };
        assert_eq!(err(&[9], &[empty]), Refused::EmptyRun { media: 0 });
        let huge = Anchor {
            token: 9,
            counts: &[u64::MAX / 2, u64::MAX / 2],
        };
        assert_eq!(err(&[9, 9], &[huge]), Refused::TooLong);
        // A run that leaves the next anchor's offset past `u64` (checked before the sum).
        let past = Anchor {
            token: 9,
            counts: &[u64::MAX, 1],
        };
        assert_eq!(err(&[9, 1, 9], &[past]), Refused::TooLong);
        for field in [0, 1 << 29] {
            assert_eq!(
                expand_runs(&[1], &[], field),
                Err(ExpandError::Refused(Refused::FieldNumber))
            );
        }
    }

    #[test]
    fn a_record_too_large_to_allocate_is_out_of_memory() {
        // 2^61 one-byte varints: the size fits in `usize`, the allocation cannot succeed.
        let huge = Anchor {
            token: 9,
            counts: &[1 << 61],
        };
        assert!(matches!(
            expand_runs(&[9], &[huge], 1),
            Err(ExpandError::OutOfMemory(_))
        ));
    }
}
