//! A fast inflate for PNG image data: one whole zlib stream whose inflated size is known.
//!
//! [`inflate_exact`] either inflates the stream into all of `out` and returns how many input
//! bytes the stream took, or gives up (`None`) and leaves the caller to run zlib-rs, which
//! decides what Pillow's zlib would do. It succeeds only on a stream zlib inflates without
//! error to exactly `out.len()` bytes and then ends, with a matching adler32; on those streams
//! the bytes are zlib's (inflating is deterministic) and so is the count of input bytes read
//! (zlib reads the adler32 right after the final block, even with no output space left). Every
//! check zlib makes is made here, or a stricter one: a code-length code that is not complete,
//! more than 286 literal/length or 30 distance codes, a repeat with nothing to repeat or past
//! the last length, no end-of-block code, an over-subscribed code, an incomplete code other
//! than zlib's exception (a single one-bit code), symbols 286/287 and distance codes 30/31 of
//! the fixed code, a distance before the start of the output, a stored block whose lengths
//! disagree, block type 3, a bad header or adler32. Anything else out of the ordinary (output
//! that would overflow `out`, a stream that ends early or before the output is full) also gives
//! up, so the fast path never has to imitate how zlib stops.
//!
//! The speed comes from what zlib's table format does not do: a literal/length entry holds two
//! literals when both codes fit in the [`LIT_BITS`] bits looked up (`motorcycle_left.png`:
//! 798 000 literals, 581 000 of them decoded in pairs), a length of 3 to 10 and the distance
//! code after it are decoded by one lookup when both codes fit in those bits (`chelsea.png`:
//! 103 000 matches, most of 3 or 4 bytes; see [`combine_lengths`]), a length or distance entry
//! is dropped with its extra bits in one shift, the next entry is looked up before the bit
//! buffer is refilled (eight bytes at a time, without a branch on its level), and one or two
//! literals are written without a branch between the two. Matches are copied 16 bytes at a time, by
//! whole periods when the distance is short, in one copy when they do not overlap their source
//! (see [`copy_match`]). The tables are kept per thread, the fixed code's built once.

use std::cell::Cell;
use std::sync::OnceLock;

use zlib_rs::adler32::adler32;

/// Bits of the literal/length code looked up at once; longer codes take a second lookup.
const LIT_BITS: u32 = 11;
/// The literal/length table: 2^11 entries, then one subtable of 2^(longest - 11) entries per
/// 11-bit prefix of a longer code (at most 286 prefixes of 16 entries).
const LIT_TABLE: usize = 8192;
/// Bits of the distance code looked up at once.
const DIST_BITS: u32 = 8;
/// 2^8 entries and at most 30 subtables of 2^(15 - 8) entries.
const DIST_TABLE: usize = 4096;

// An entry (u32): bits 0-4 the bits it decodes (its code, or both literal codes, or a length's
// or distance's code and extra bits: dropped with one shift), bits 5-9 the length of its
// (first) code (the index bits for `SUB`), bits 10-12 the kind, bits 16-31 the value (a
// length's or distance's base, a subtable's start, one literal in 16-23 and a second in 24-31;
// `LEN_DIST` entries also use bits 13-15).
const KIND: u32 = 7 << 10;
const LIT: u32 = 0;
const LIT2: u32 = 1 << 10;
const LEN: u32 = 2 << 10;
const SUB: u32 = 3 << 10;
const EOB: u32 = 4 << 10;
const BAD: u32 = 5 << 10;
/// A length of 3 to 10 (no extra bits) and the distance code after it, both within the
/// [`LIT_BITS`] looked up: bits 0-4 everything to drop (both codes and the distance's extra
/// bits), 5-9 the two codes' bits (where the extra bits start), 13-15 the length minus 3,
/// 16-31 the distance's base. A match then costs one lookup instead of two dependent ones.
const LEN_DIST: u32 = 6 << 10;

const LEN_BASE: [u16; 29] = [
    3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131,
    163, 195, 227, 258,
];
const LEN_EXTRA: [u8; 29] = [
    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0,
];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537,
    2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577,
];
const DIST_EXTRA: [u8; 30] = [
    0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13,
    13,
];
/// The order in which a dynamic block sends the code-length code's lengths.
const CL_ORDER: [usize; 19] = [
    16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15,
];

/// Which code a table decodes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Code {
    /// Literal/length symbols; those from `valid` on (286 and 287 of the fixed code) are errors.
    Litlen { valid: usize },
    /// Distance symbols; those from `valid` on (30 and 31 of the fixed code) are errors.
    Dist { valid: usize },
    /// The code-length code's symbols 0-18 (as literals): it must be complete.
    Lengths,
}

/// The entry a symbol of `code` decodes to, its code being `len` bits long.
fn entry(code: Code, sym: usize, len: u32) -> u32 {
    match code {
        Code::Litlen { valid } if sym >= valid => BAD | len,
        Code::Litlen { .. } | Code::Lengths if sym < 256 => {
            LIT | len | len << 5 | (sym as u32) << 16
        }
        Code::Litlen { .. } if sym == 256 => EOB | len,
        Code::Litlen { .. } | Code::Lengths => {
            let i = sym - 257;
            LEN | (len + u32::from(LEN_EXTRA[i])) | len << 5 | u32::from(LEN_BASE[i]) << 16
        }
        Code::Dist { valid } if sym >= valid => BAD | len,
        Code::Dist { .. } => {
            (len + u32::from(DIST_EXTRA[sym])) | len << 5 | u32::from(DIST_BASE[sym]) << 16
        }
    }
}

/// `code` reversed in its low `len` bits (deflate sends Huffman codes most significant bit
/// first into a stream read least significant bit first).
fn reversed(code: u32, len: u32) -> usize {
    (code.reverse_bits() >> (32 - len)) as usize
}

/// Fills `table` (primary entries of `bits` bits, then subtables) for the code with these
/// lengths, with zlib's acceptance rule: over-subscribed codes are refused, and so are
/// incomplete ones unless the longest code is one bit long (zlib's single-code exception) or,
/// for distances, there is no code at all; their unused entries are `BAD`. The code-length
/// code must be complete. `None` when zlib would refuse the code.
///
/// Symbols are taken in canonical order (by length, then symbol): codes then increase, so the
/// long codes sharing an 11-bit prefix come one after another and share one subtable.
fn build(table: &mut [u32], bits: u32, lengths: &[u8], code: Code) -> Option<LenCodes> {
    let mut count = [0u16; 16];
    for &len in lengths {
        count[usize::from(len & 15)] += 1;
    }
    count[0] = 0;
    let max = (1..16).rev().find(|&l| count[l] > 0).unwrap_or(0) as u32;
    let mut left: i32 = 1;
    for &n in &count[1..] {
        left = 2 * left - i32::from(n);
        if left < 0 {
            return None; // over-subscribed
        }
    }
    let primary = 1usize << bits;
    if left > 0 {
        let allowed = match code {
            Code::Lengths => false,
            Code::Litlen { .. } => max == 1,
            Code::Dist { .. } => max <= 1,
        };
        if !allowed {
            return None;
        }
        table[..primary].fill(BAD | 1);
    }
    // Counting sort into canonical order.
    let mut offset = [0u16; 16];
    for len in 1..15 {
        offset[len + 1] = offset[len] + count[len];
    }
    let mut sorted = [0u16; 288];
    for (sym, &len) in lengths.iter().enumerate() {
        if len != 0 {
            let len = usize::from(len & 15);
            sorted[usize::from(offset[len])] = sym as u16;
            offset[len] += 1;
        }
    }
    let total: usize = count.iter().map(|&n| usize::from(n)).sum();
    let sub_bits = max.saturating_sub(bits);
    let mut free = primary;
    let mut prefix_now = usize::MAX;
    let (mut next, mut len_now) = (0u32, 0u32);
    // The literal codes short enough to leave room for another, by length (reversed code,
    // length, literal): for `pair_literals`.
    let mut short = [(0u16, 0u8, 0u8); 256];
    let mut shorts = 0;
    let mut len_codes = LenCodes::default();
    for &sym in &sorted[..total] {
        let sym = usize::from(sym);
        let len = u32::from(lengths[sym]);
        next <<= len - len_now;
        len_now = len;
        let rev = reversed(next, len);
        next += 1;
        let e = entry(code, sym, len);
        if matches!(code, Code::Litlen { .. }) && sym < 256 && len < LIT_BITS {
            short[shorts] = (rev as u16, len as u8, sym as u8);
            shorts += 1;
        }
        if matches!(code, Code::Litlen { .. }) && (257..=264).contains(&sym) && len < LIT_BITS {
            len_codes.codes[len_codes.n] = (rev as u16, len as u8);
            len_codes.n += 1;
        }
        if len <= bits {
            let mut i = rev;
            while i < primary {
                table[i] = e;
                i += 1 << len;
            }
        } else {
            let prefix = rev & (primary - 1);
            if prefix != prefix_now {
                prefix_now = prefix;
                table[prefix] = SUB | bits | sub_bits << 5 | (free as u32) << 16;
                free += 1 << sub_bits;
            }
            let start = (table[prefix] >> 16) as usize;
            let mut i = rev >> bits;
            while i < 1 << sub_bits {
                table[start + i] = e;
                i += 1 << (len - bits);
            }
        }
    }
    pair_literals(table, &short[..shorts]);
    Some(len_codes)
}

/// The codes of lengths 3 to 10 (symbols 257-264, no extra bits) shorter than [`LIT_BITS`], as
/// [`build`] found them: (reversed code, length).
#[derive(Default)]
struct LenCodes {
    codes: [(u16, u8); 8],
    n: usize,
}

/// Turns each primary entry of a length of 3 to 10 whose remaining bits hold a whole distance
/// code into a [`LEN_DIST`] entry decoding both (`dist` built for the same block). Entries
/// whose distance code is longer, a subtable's or invalid keep their `LEN` entry, and the
/// distance is then looked up as before. The work is the entries written.
fn combine_lengths(lit: &mut [u32], dist: &[u32], len_codes: &LenCodes) {
    for &(rev, len) in &len_codes.codes[..len_codes.n] {
        let len = u32::from(len);
        let room = LIT_BITS - len;
        let length = (lit[usize::from(rev)] >> 16) - 3;
        for rest in 0..1usize << room {
            // The primary entry of the bits after the length code (a distance code longer
            // than `DIST_BITS` has a subtable there, and is skipped).
            let d = dist[rest & ((1 << DIST_BITS) - 1)];
            let (kind, code) = (d & KIND, (d >> 5) & 31);
            if kind != 0 || code > room {
                continue; // a subtable, an invalid code, or a code longer than the room left
            }
            let i = usize::from(rev) | rest << len;
            lit[i] = LEN_DIST | (len + (d & 31)) | (len + code) << 5 | length << 13 | d & !0xffff;
        }
    }
}

/// Turns each primary entry of a single literal whose code leaves room for a whole second
/// literal code into a `LIT2` entry decoding both. `short` holds the literal codes shorter than
/// [`LIT_BITS`], by length, as [`build`] found them; the work is the entries written.
fn pair_literals(table: &mut [u32], short: &[(u16, u8, u8)]) {
    // Two codes fit only if the shortest literal code has at most half the bits.
    if short.first().is_none_or(|s| 2 * u32::from(s.1) > LIT_BITS) {
        return;
    }
    for &(rev1, len1, v1) in short {
        let room = LIT_BITS as u8 - len1;
        for &(rev2, len2, v2) in short.iter().take_while(|s| s.1 <= room) {
            let both = u32::from(len1 + len2);
            let e = LIT2 | both | u32::from(len1) << 5 | u32::from(v1) << 16 | u32::from(v2) << 24;
            let mut i = usize::from(rev1) | usize::from(rev2) << len1;
            while i < 1 << LIT_BITS {
                table[i] = e;
                i += 1 << both;
            }
        }
    }
}

/// The bit reader: `bits` valid bits in `buf` (read least significant first), the rest of
/// `buf` zero or the stream's next bits; `pos` the next input byte not yet in `buf`.
struct Bits<'a> {
    input: &'a [u8],
    pos: usize,
    buf: u64,
    bits: u32,
}

impl Bits<'_> {
    /// Tops the buffer up to at least 56 bits. Past the end of the input it shifts in zeros,
    /// and `None` once the bits already used must have come from past the end.
    #[inline(always)]
    fn refill(&mut self) -> Option<()> {
        if let Some(word) = self.input.get(self.pos..self.pos + 8) {
            let word = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
            self.buf |= word << self.bits;
            self.pos += ((63 - self.bits) >> 3) as usize;
            self.bits |= 56;
            return Some(());
        }
        self.refill_slow()
    }

    #[cold]
    fn refill_slow(&mut self) -> Option<()> {
        while self.bits < 56 {
            let byte = self.input.get(self.pos).copied().unwrap_or(0);
            self.buf |= u64::from(byte) << self.bits;
            self.bits += 8;
            self.pos += 1;
        }
        // Up to 8 bytes of zeros may sit unused in the buffer; more means some were used.
        (self.pos <= self.input.len() + 8).then_some(())
    }

    #[inline(always)]
    fn take(&mut self, n: u32) -> u32 {
        let v = (self.buf & ((1u64 << n) - 1)) as u32;
        self.drop_bits(n);
        v
    }

    #[inline(always)]
    fn drop_bits(&mut self, n: u32) {
        self.buf >>= n;
        self.bits -= n;
    }

    /// The input bytes the stream has used up to here (whole bytes: called when aligned).
    fn used(&self) -> usize {
        self.pos - (self.bits / 8) as usize
    }
}

/// Inflates the zlib stream at the start of `input` into all of `out`: `Some(bytes of input
/// the stream took)` when it fills `out` exactly and ends with a matching adler32, `None` for
/// anything else (see the module documentation: the caller then asks zlib-rs).
pub(crate) fn inflate_exact(input: &[u8], out: &mut [u8]) -> Option<usize> {
    // The tables (48 KiB) are kept per thread: allocating and clearing them cost a small PNG's
    // decode more than inflating it.
    let mut tables = TABLES.with(Cell::take);
    if tables.len() != LIT_TABLE + DIST_TABLE {
        tables = vec![0; LIT_TABLE + DIST_TABLE];
    }
    let (lit, dist) = tables.split_at_mut(LIT_TABLE);
    let result = inflate_with(input, out, lit, dist);
    TABLES.with(|kept| kept.set(tables));
    result
}

thread_local! {
    /// This thread's literal/length and distance tables, between calls.
    static TABLES: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
}

/// Dynamic blocks taken before their average output is checked against [`MIN_BLOCK_OUTPUT`].
const TRIAL_BLOCKS: usize = 8;
/// The least output per dynamic block, on average, for which the fast path goes on: zlib's
/// deflate ends a block every 16 384 symbols (at its default memory level), so tens of
/// kilobytes; a block of a few hundred bytes is faster in zlib-rs, whose tables are smaller.
const MIN_BLOCK_OUTPUT: usize = 4096;

/// The fixed code's tables (literal/length, then distance), built once.
fn fixed_tables() -> &'static [u32] {
    static FIXED: OnceLock<Vec<u32>> = OnceLock::new();
    FIXED.get_or_init(|| {
        let mut lengths = [8u8; 288 + 32];
        lengths[144..256].fill(9);
        lengths[256..280].fill(7);
        lengths[288..].fill(5);
        let mut tables = vec![0; LIT_TABLE + DIST_TABLE];
        let (lit, dist) = tables.split_at_mut(LIT_TABLE);
        let len_codes = build(lit, LIT_BITS, &lengths[..288], Code::Litlen { valid: 286 });
        let built = build(dist, DIST_BITS, &lengths[288..], Code::Dist { valid: 30 });
        debug_assert!(
            len_codes.is_some() && built.is_some(),
            "the fixed code is complete"
        );
        if let Some(len_codes) = len_codes {
            combine_lengths(lit, dist, &len_codes);
        }
        tables
    })
}

/// [`inflate_exact`] with the tables to build the stream's codes in.
fn inflate_with(input: &[u8], out: &mut [u8], lit: &mut [u32], dist: &mut [u32]) -> Option<usize> {
    let (&cmf, &flg) = (input.first()?, input.get(1)?);
    if cmf & 15 != 8 || cmf >> 4 > 7 || (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
        return None;
    }
    if flg & 0x20 != 0 {
        return None; // a preset dictionary: zlib asks for it
    }
    let mut bits = Bits {
        input,
        pos: 2,
        buf: 0,
        bits: 0,
    };
    let mut o = 0usize;
    let mut lengths = [0u8; 286 + 30];
    let mut dynamic_blocks = 0usize;
    loop {
        bits.refill()?;
        let last = bits.take(1);
        match bits.take(2) {
            0 => {
                bits.drop_bits(bits.bits & 7);
                bits.refill()?;
                let len = bits.take(16) as usize;
                if bits.take(16) as usize != len ^ 0xffff {
                    return None;
                }
                let at = bits.used();
                let src = input.get(at..at.checked_add(len)?)?;
                out.get_mut(o..o + len)?.copy_from_slice(src);
                o += len;
                bits.pos = at + len;
                (bits.buf, bits.bits) = (0, 0);
            }
            1 => {
                let (lit, dist) = fixed_tables().split_at(LIT_TABLE);
                o = inflate_block(&mut bits, lit, dist, out, o)?;
            }
            2 => {
                // Building a dynamic block's tables costs ~2-3 µs, several times zlib's: a
                // stream of tiny blocks (hand-made: real encoders write kilobytes per block)
                // would cost us far more than zlib-rs. Past the first few, blocks must average
                // `MIN_BLOCK_OUTPUT` bytes, else zlib-rs takes the stream.
                if dynamic_blocks >= TRIAL_BLOCKS && o < dynamic_blocks * MIN_BLOCK_OUTPUT {
                    return None;
                }
                dynamic_blocks += 1;
                let nlit = 257 + bits.take(5) as usize;
                let ndist = 1 + bits.take(5) as usize;
                let ncl = 4 + bits.take(4) as usize;
                if nlit > 286 || ndist > 30 {
                    return None;
                }
                let mut cl_lengths = [0u8; 19];
                for &sym in &CL_ORDER[..ncl] {
                    bits.refill()?;
                    cl_lengths[sym] = bits.take(3) as u8;
                }
                let mut cl = [0u32; 128];
                build(&mut cl, 7, &cl_lengths, Code::Lengths)?;
                let total = nlit + ndist;
                let mut i = 0;
                while i < total {
                    bits.refill()?;
                    let e = cl[(bits.buf & 127) as usize];
                    if e & KIND == BAD {
                        return None;
                    }
                    bits.drop_bits(e & 31);
                    let sym = (e >> 16) as u8;
                    let (value, times) = match sym {
                        0..=15 => (sym, 1),
                        16 => (*lengths[..i].last()?, 3 + bits.take(2) as usize),
                        17 => (0, 3 + bits.take(3) as usize),
                        _ => (0, 11 + bits.take(7) as usize),
                    };
                    lengths.get_mut(i..i + times)?.fill(value);
                    i += times;
                    if i > total {
                        return None;
                    }
                }
                if lengths[256] == 0 {
                    return None; // no end-of-block code
                }
                let len_codes =
                    build(lit, LIT_BITS, &lengths[..nlit], Code::Litlen { valid: 286 })?;
                build(
                    dist,
                    DIST_BITS,
                    &lengths[nlit..total],
                    Code::Dist { valid: 30 },
                )?;
                combine_lengths(lit, dist, &len_codes);
                o = inflate_block(&mut bits, lit, dist, out, o)?;
            }
            _ => return None,
        }
        if last == 1 {
            break;
        }
    }
    if o != out.len() {
        return None;
    }
    bits.drop_bits(bits.bits & 7);
    bits.refill()?;
    let check = bits.take(32).swap_bytes();
    let used = bits.used();
    (used <= input.len() && check == adler32(1, out)).then_some(used)
}

/// Decodes one Huffman block's symbols into `out` from `o` on; returns the new output position.
fn inflate_block(
    reader: &mut Bits<'_>,
    lit: &[u32],
    dist: &[u32],
    out: &mut [u8],
    o: usize,
) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("bmi2") {
        // SAFETY: `inflate_block_bmi2` only requires the CPU to have BMI2, checked just above.
        return unsafe { inflate_block_bmi2(reader, lit, dist, out, o) };
    }
    inflate_block_inlined(reader, lit, dist, out, o)
}

/// [`inflate_block`] compiled with BMI2: the bit buffer's variable shifts (one per entry, on
/// the lookup-and-shift chain that bounds the decoder) are one-cycle `shrx`/`shlx`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2")]
unsafe fn inflate_block_bmi2(
    reader: &mut Bits<'_>,
    lit: &[u32],
    dist: &[u32],
    out: &mut [u8],
    o: usize,
) -> Option<usize> {
    inflate_block_inlined(reader, lit, dist, out, o)
}

/// The block decoder. The bit reader's state lives in locals (registers). After a literal the
/// next entry is looked up before the refill, in the bits already there (at least 41 of them,
/// enough for any code): the refill is then off the chain from one lookup to the next.
#[inline(always)]
fn inflate_block_inlined(
    reader: &mut Bits<'_>,
    lit: &[u32],
    dist: &[u32],
    out: &mut [u8],
    mut o: usize,
) -> Option<usize> {
    let lit_mask = (1u64 << LIT_BITS) - 1;
    let dist_mask = (1u64 << DIST_BITS) - 1;
    let input = reader.input;
    let (mut pos, mut buf, mut bits) = (reader.pos, reader.buf, reader.bits);
    // Tops the buffer up to at least 56 bits (see `Bits::refill`).
    macro_rules! refill {
        () => {
            if let Some(word) = input.get(pos..pos + 8) {
                let word = u64::from_le_bytes(word.try_into().unwrap_or([0; 8]));
                buf |= word << bits;
                pos += ((63 - bits) >> 3) as usize;
                bits |= 56;
            } else {
                (reader.pos, reader.buf, reader.bits) = (pos, buf, bits);
                reader.refill_slow()?;
                (pos, buf, bits) = (reader.pos, reader.buf, reader.bits);
            }
        };
    }
    refill!();
    let mut e = lit[(buf & lit_mask) as usize];
    let end = loop {
        // Here `bits >= 56` and `e` is the entry of the low bits of `buf`.
        if e & KIND == SUB {
            let sub = (buf >> LIT_BITS) & ((1 << ((e >> 5) & 31)) - 1);
            e = lit[((e >> 16) as usize + sub as usize) & (LIT_TABLE - 1)];
        }
        // One or two literals (`LIT` is 0, `LIT2` 1 << 10): both bytes written, the position
        // advanced by one or two, no branch between the two kinds (they alternate at random).
        if e & (6 << 10) == 0 {
            let n = 1 + ((e >> 10) & 1) as usize;
            if let Some(dst) = out.get_mut(o..o + 2) {
                dst[0] = (e >> 16) as u8;
                dst[1] = (e >> 24) as u8;
            } else if n == 1 && o < out.len() {
                out[o] = (e >> 16) as u8; // the last byte
            } else {
                break None;
            }
            o += n;
            buf >>= e & 31;
            bits -= e & 31;
            e = lit[(buf & lit_mask) as usize];
            refill!();
            continue;
        }
        let kind = e & KIND;
        if kind == LEN_DIST {
            // Both codes and the distance's extra bits dropped with one shift. (The tail is the
            // `LEN` path's, written twice: one shared tail was ~5 % slower on `chelsea.png`.)
            let len = 3 + ((e >> 13) & 7) as usize;
            let distance = (e >> 16) as usize + above_code(buf, e);
            buf >>= e & 31;
            bits -= e & 31;
            if distance > o || len > out.len() - o {
                break None;
            }
            e = lit[(buf & lit_mask) as usize];
            refill!();
            copy_match(out, o, distance, len);
            o += len;
            continue;
        }
        if kind != LEN {
            buf >>= e & 31;
            bits -= e & 31;
            break (kind == EOB).then_some(o);
        }
        // Code and extra bits dropped with one shift: the value is the bits above the code.
        let len = (e >> 16) as usize + above_code(buf, e);
        buf >>= e & 31;
        bits -= e & 31;
        // At least 36 bits left: the distance entry is looked up before the refill, and the
        // next literal/length entry after the distance, before the second refill.
        let mut d = dist[(buf & dist_mask) as usize];
        refill!();
        if d & KIND == SUB {
            let sub = (buf >> DIST_BITS) & ((1 << ((d >> 5) & 31)) - 1);
            d = dist[((d >> 16) as usize + sub as usize) & (DIST_TABLE - 1)];
        }
        if d & KIND == BAD {
            break None;
        }
        let distance = (d >> 16) as usize + above_code(buf, d);
        buf >>= d & 31;
        bits -= d & 31;
        if distance > o || len > out.len() - o {
            break None;
        }
        e = lit[(buf & lit_mask) as usize];
        refill!();
        copy_match(out, o, distance, len);
        o += len;
    };
    (reader.pos, reader.buf, reader.bits) = (pos, buf, bits);
    end
}

/// The extra bits of entry `e` in `buf`: those between its code's bits (`e` bits 5-9) and
/// everything it decodes (bits 0-4).
#[inline(always)]
fn above_code(buf: u64, e: u32) -> usize {
    ((buf & ((1 << (e & 31)) - 1)) >> ((e >> 5) & 31)) as usize
}

/// Copies `len` bytes from `distance` back to `o` (overlapping: a short distance repeats),
/// `o + len <= out.len()` and `distance <= o`.
///
/// A long match that does not overlap its source is one copy. With 16 bytes to spare after the
/// match and a distance of at least 16 (most of a photo's matches), 16 bytes at a time: each
/// piece reads only bytes written before it, and the bytes written past the match are
/// rewritten later (or the inflate fails). A run of one byte is a fill. Otherwise the bytes
/// from `o - distance` on repeat with period `distance`: each copy takes the longest whole
/// number of periods already written (a non-overlapping copy), which about doubles what is
/// written, so a long run of 3- or 4-byte pixels takes a few copies, not a loop over its bytes.
#[inline(always)]
fn copy_match(out: &mut [u8], o: usize, distance: usize, len: usize) {
    if distance >= len && len > 32 {
        // No overlap: one `memmove` (flat images: rows of 258-byte matches from the row above).
        out.copy_within(o - distance..o - distance + len, o);
    } else if distance >= 16 && out.len() - o >= len + 16 {
        let mut i = 0;
        loop {
            out.copy_within(o - distance + i..o - distance + i + 16, o + i);
            i += 16;
            if i >= len {
                break;
            }
        }
    } else if distance == 1 {
        let byte = out[o - 1];
        out[o..o + len].fill(byte);
    } else if len <= 16 {
        for i in o..o + len {
            out[i] = out[i - distance];
        }
    } else {
        let mut done = 0;
        while done < len {
            let period = (done + distance) / distance * distance;
            let n = period.min(len - done);
            let from = o + done - period;
            out.copy_within(from..from + n, o + done);
            done += n;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// zlib-rs inflating `input` into a buffer of `n` bytes in one call: the bytes, the input
    /// used and whether it reached the stream's end with the buffer exactly full.
    fn zlib(input: &[u8], n: usize) -> (Vec<u8>, usize, bool) {
        let mut out = vec![0u8; n];
        let mut z = zlib_rs::Inflate::new(true, 15);
        let status = z.decompress(input, &mut out, zlib_rs::InflateFlush::NoFlush);
        let ended = matches!(status, Ok(zlib_rs::Status::StreamEnd)) && z.total_out() as usize == n;
        (out, z.total_in() as usize, ended)
    }

    fn compress(data: &[u8], level: i32, strategy: zlib_rs::Strategy, window_bits: i32) -> Vec<u8> {
        let mut out = vec![0u8; data.len() * 2 + 1024];
        let config = zlib_rs::DeflateConfig {
            level,
            method: zlib_rs::Method::Deflated,
            window_bits,
            mem_level: 8,
            strategy,
        };
        let (done, rc) = zlib_rs::compress_slice(&mut out, data, config);
        assert_eq!(rc as i32, 0, "compress failed");
        done.to_vec()
    }

    /// Our result against zlib-rs's on `stream` inflated to `n` bytes: when ours succeeds,
    /// zlib's reaches the end with the same bytes and the same input used. Returns whether
    /// ours succeeded, and whether zlib's did.
    fn agree(stream: &[u8], n: usize) -> (bool, bool) {
        let mut ours = vec![0xAAu8; n];
        let got = inflate_exact(stream, &mut ours);
        let (theirs, used, ended) = zlib(stream, n);
        if let Some(our_used) = got {
            assert!(
                ended,
                "ours accepted a stream zlib does not inflate to its end"
            );
            assert!(
                ours == theirs,
                "ours accepted a stream with other bytes than zlib's"
            );
            assert_eq!(our_used, used, "input used");
        }
        (got.is_some(), ended)
    }

    /// A small xorshift generator (tests only need variety, not quality).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// Data of several kinds: like filtered photo rows (small values, a few bytes of stride:
    /// short literal codes, so two literals per lookup), short-distance repeats, runs, noise,
    /// text-like, and a mix.
    fn sample(kind: u64, n: usize, rng: &mut Rng) -> Vec<u8> {
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            match kind {
                0 => {
                    let x = rng.next();
                    let small = (x.trailing_zeros() as u8).min(9);
                    v.push(if x & 1 << 40 != 0 {
                        small
                    } else {
                        small.wrapping_neg()
                    });
                }
                1 => {
                    let d = 1 + rng.below(24) as usize;
                    let len = 3 + rng.below(40) as usize;
                    if v.len() < d {
                        v.push(rng.next() as u8);
                    } else {
                        for _ in 0..len {
                            v.push(v[v.len() - d]);
                        }
                    }
                }
                2 => {
                    let b = rng.next() as u8;
                    for _ in 0..rng.below(600) {
                        v.push(b);
                    }
                }
                3 => v.push(rng.next() as u8),
                4 => {
                    let words: [&[u8]; 6] =
                        [b"pixel ", b"row ", b"inflate ", b"the ", b"a ", b"\n"];
                    v.extend_from_slice(words[rng.below(6) as usize]);
                }
                _ => {
                    let k = rng.below(5);
                    let m = 1 + rng.below(3000) as usize;
                    let part = sample(k, m, rng);
                    v.extend_from_slice(&part);
                }
            }
        }
        v.truncate(n);
        v
    }

    const STRATEGIES: [zlib_rs::Strategy; 5] = [
        zlib_rs::Strategy::Default,
        zlib_rs::Strategy::Filtered,
        zlib_rs::Strategy::HuffmanOnly,
        zlib_rs::Strategy::Rle,
        zlib_rs::Strategy::Fixed,
    ];

    #[test]
    fn every_kind_of_zlib_stream_inflates_exactly() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut cases = 0;
        for kind in 0..6 {
            for &n in &[1usize, 2, 3, 100, 4097, 70_000, 300_000] {
                let data = sample(kind, n, &mut rng);
                for level in [0, 1, 6, 9] {
                    for (s, &strategy) in STRATEGIES.iter().enumerate() {
                        if (level == 0 && s > 0) || (n > 70_000 && (level + s as i32) % 3 != 0) {
                            continue;
                        }
                        let window = 9 + ((kind as i32 + level + s as i32) % 7);
                        let z = compress(&data, level, strategy, window);
                        let mut out = vec![0u8; n];
                        let used = inflate_exact(&z, &mut out);
                        assert_eq!(used, Some(z.len()), "kind {kind} n {n} level {level} {s}");
                        assert!(out == data, "kind {kind} n {n} level {level} strategy {s}");
                        assert_eq!(agree(&z, n), (true, true));
                        cases += 1;
                    }
                }
            }
        }
        assert!(cases > 300, "{cases}");
    }

    #[test]
    fn damaged_streams_are_never_accepted_unlike_zlib() {
        // SMG_INFLATE_FUZZ_ROUNDS=N (default 150) and SMG_INFLATE_FUZZ_SEED for longer runs.
        let env = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(d)
        };
        let rounds = env("SMG_INFLATE_FUZZ_ROUNDS", 150);
        let mut rng = Rng(env("SMG_INFLATE_FUZZ_SEED", 0x2545_f491_4f6c_dd1d) | 1);
        let (mut ours, mut theirs, mut tried) = (0, 0, 0);
        for kind in 0..6 {
            for &n in &[60usize, 5000, 40_000] {
                let data = sample(kind, n, &mut rng);
                for (s, &strategy) in STRATEGIES.iter().enumerate() {
                    let z = compress(&data, 1 + 4 * (s as i32 % 3), strategy, 15);
                    for _ in 0..rounds {
                        let mut bad = z.clone();
                        let mut want = n;
                        match rng.below(6) {
                            0 | 1 => {
                                let at = rng.below(bad.len() as u64 * 8) as usize;
                                bad[at / 8] ^= 1 << (at % 8);
                            }
                            2 => {
                                let at = rng.below(bad.len() as u64) as usize;
                                bad[at] = rng.next() as u8;
                            }
                            3 => bad.truncate(rng.below(bad.len() as u64) as usize),
                            4 => want = (n as i64 + rng.below(5) as i64 - 2).max(0) as usize,
                            _ => {
                                let at = rng.below(bad.len() as u64) as usize;
                                let extra = rng.below(8) as usize;
                                for k in 0..extra {
                                    bad.insert(at, k as u8 ^ rng.next() as u8);
                                }
                            }
                        }
                        let (o, t) = agree(&bad, want);
                        ours += usize::from(o);
                        theirs += usize::from(t);
                        tried += 1;
                    }
                }
            }
        }
        // zlib inflates some damaged streams to the end (those whose change the adler32 does
        // not catch, or where it only changed the tail after the adler32): ours takes exactly
        // the same ones (it may leave a stream to zlib only for a code-length code zlib refuses
        // later anyway).
        assert!(tried >= 10_000, "{tried}");
        assert!(theirs > 100 && theirs < tried, "{theirs} of {tried}");
        assert_eq!(ours, theirs, "of {tried}");
    }

    /// Writes a deflate stream bit by bit, least significant first.
    #[derive(Default)]
    struct Writer {
        bytes: Vec<u8>,
        acc: u64,
        n: u32,
    }

    impl Writer {
        fn zlib() -> Self {
            let mut w = Self::default();
            w.bytes.extend_from_slice(&[0x78, 0x9c]);
            w
        }
        fn bits(&mut self, v: u32, n: u32) {
            self.acc |= u64::from(v) << self.n;
            self.n += n;
            while self.n >= 8 {
                self.bytes.push(self.acc as u8);
                self.acc >>= 8;
                self.n -= 8;
            }
        }
        /// A Huffman code, most significant bit first.
        fn code(&mut self, (code, len): (u32, u32)) {
            self.bits(reversed(code, len) as u32, len);
        }
        fn align(&mut self) {
            if !self.n.is_multiple_of(8) {
                self.bits(0, 8 - self.n % 8);
            }
        }
        /// Ends the stream with the adler32 of `data`.
        fn finish(mut self, data: &[u8]) -> Vec<u8> {
            self.align();
            self.bytes
                .extend_from_slice(&adler32(1, data).to_be_bytes());
            self.bytes
        }
    }

    /// Canonical codes for these lengths (an independent, plain version).
    fn canonical(lengths: &[u8]) -> Vec<(u32, u32)> {
        let mut order: Vec<usize> = (0..lengths.len()).filter(|&s| lengths[s] > 0).collect();
        order.sort_by_key(|&s| (lengths[s], s));
        let mut codes = vec![(0, 0); lengths.len()];
        let (mut code, mut len) = (0u32, 0u32);
        for (k, &s) in order.iter().enumerate() {
            let l = u32::from(lengths[s]);
            if k > 0 {
                code += 1;
            }
            code <<= l - len;
            len = l;
            codes[s] = (code, l);
        }
        codes
    }

    enum Sym {
        Lit(u8),
        /// (length symbol 257.., its extra bits, distance symbol, its extra bits)
        Match(usize, u32, usize, u32),
        /// (length symbol without extra bits, a distance code's bits and length, as sent)
        RawDist(usize, u32, u32),
        Eob,
    }

    /// The code-length sequence `(symbol, extra value)` for these lengths, sent plainly.
    fn plain(lengths: &[u8]) -> Vec<(usize, u32)> {
        lengths.iter().map(|&l| (usize::from(l), 0)).collect()
    }

    /// The code-length code [`dynamic`] sends: symbols 0-12 four bits, 13-18 five (complete).
    const CL_LENGTHS: [u8; 19] = [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5];

    /// A final dynamic block: HLIT/HDIST as given, the code-length code `cl_lengths`, the
    /// code-length sequence `cl_seq`, then the symbols with codes from `lit` and `dist` lengths.
    #[allow(clippy::too_many_arguments)]
    fn dynamic(
        w: &mut Writer,
        cl_lengths: &[u8; 19],
        nlit: usize,
        ndist: usize,
        cl_seq: &[(usize, u32)],
        lit: &[u8],
        dist: &[u8],
        syms: &[Sym],
    ) {
        dynamic_block(w, true, cl_lengths, nlit, ndist, cl_seq, lit, dist, syms);
    }

    /// [`dynamic`], final (`last`) or not.
    #[allow(clippy::too_many_arguments)]
    fn dynamic_block(
        w: &mut Writer,
        last: bool,
        cl_lengths: &[u8; 19],
        nlit: usize,
        ndist: usize,
        cl_seq: &[(usize, u32)],
        lit: &[u8],
        dist: &[u8],
        syms: &[Sym],
    ) {
        w.bits(u32::from(last), 1);
        w.bits(2, 2);
        w.bits((nlit - 257) as u32, 5);
        w.bits((ndist - 1) as u32, 5);
        w.bits(19 - 4, 4);
        for &sym in &CL_ORDER {
            w.bits(u32::from(cl_lengths[sym]), 3);
        }
        let cl_codes = canonical(cl_lengths);
        for &(sym, extra) in cl_seq {
            w.code(cl_codes[sym]);
            match sym {
                16 => w.bits(extra, 2),
                17 => w.bits(extra, 3),
                18 => w.bits(extra, 7),
                _ => {}
            }
        }
        let (lc, dc) = (canonical(lit), canonical(dist));
        for sym in syms {
            match *sym {
                Sym::Lit(v) => w.code(lc[usize::from(v)]),
                Sym::Eob => w.code(lc[256]),
                Sym::Match(ls, lx, ds, dx) => {
                    w.code(lc[ls]);
                    w.bits(lx, u32::from(LEN_EXTRA[ls - 257]));
                    w.code(dc[ds]);
                    w.bits(dx, u32::from(DIST_EXTRA[ds]));
                }
                Sym::RawDist(ls, code, len) => {
                    w.code(lc[ls]);
                    w.code((code, len));
                }
            }
        }
    }

    /// Literal/length lengths: every literal 9 bits, EOB and the length symbols as given,
    /// filled up to a complete code with 8-bit ones... simply: 256 literals at 9 bits (half
    /// the code space) and 30 symbols 256..286 given.
    fn lit_lengths(nlit: usize) -> Vec<u8> {
        // 256 literals of 9 bits = 1/2; 256..nlit: fill the other half with 6- to 9-bit codes.
        let mut l = vec![9u8; 256];
        // 1..=30 symbols share the other half of the code space: k codes of length a and the
        // rest one longer fill it exactly.
        let rest = nlit - 256;
        let mut best = Vec::new();
        for a in 2..15u32 {
            // k codes at a, (rest - k) at a + 1: k/2^a + (rest-k)/2^(a+1) = 1/2
            // => 2k + rest - k = 2^a => k = 2^a - rest
            let k = (1i64 << a) - rest as i64;
            if k >= 0 && k <= rest as i64 {
                best = (0..rest)
                    .map(|i| if (i as i64) < k { a as u8 } else { a as u8 + 1 })
                    .collect();
                break;
            }
        }
        assert_eq!(best.len(), rest);
        l.extend(best);
        l
    }

    fn stream(build: impl FnOnce(&mut Writer), data: &[u8]) -> Vec<u8> {
        let mut w = Writer::zlib();
        build(&mut w);
        w.finish(data)
    }

    #[test]
    fn zlib_rules_hand_made_streams() {
        let lit = lit_lengths(286);
        let dist = vec![5u8; 30]
            .into_iter()
            .chain([4, 4])
            .take(30)
            .collect::<Vec<_>>();
        // 30 distance codes: 28 at 5 bits, 2 at 4 bits = 28/32 + 2/16 = 1.
        let mut dist30 = vec![5u8; 30];
        dist30[0] = 4;
        dist30[1] = 4;
        let _ = dist;
        let ok = |lits: &[u8], ms: Vec<Sym>, data: &[u8]| {
            let mut syms: Vec<Sym> = lits.iter().map(|&v| Sym::Lit(v)).collect();
            syms.extend(ms);
            syms.push(Sym::Eob);
            let mut seq = plain(&lit);
            seq.extend(plain(&dist30));
            stream(
                |w| dynamic(w, &CL_LENGTHS, 286, 30, &seq, &lit, &dist30, &syms),
                data,
            )
        };
        // A valid block: "abc" then a match of length 3 at distance 3 -> "abcabc".
        let good = ok(b"abc", vec![Sym::Match(257, 0, 2, 0)], b"abcabc");
        assert_eq!(agree(&good, 6), (true, true));
        // The distance reaching one byte before the start.
        let far = ok(b"abc", vec![Sym::Match(257, 0, 3, 0)], b"abc\0\0\0");
        assert_eq!(agree(&far, 6), (false, false));
        // Output one byte shorter or longer than the stream's.
        assert_eq!(agree(&good, 5), (false, false));
        assert_eq!(agree(&good, 7), (false, false));
        // Trailing bytes after the adler32: accepted, not counted as used.
        let mut trailing = good.clone();
        trailing.extend_from_slice(b"junk");
        assert_eq!(agree(&trailing, 6), (true, true));
        let mut out = [0u8; 6];
        assert_eq!(inflate_exact(&trailing, &mut out), Some(good.len()));
        // A wrong adler32, a cut adler32.
        let mut bad = good.clone();
        *bad.last_mut().unwrap() ^= 1;
        assert_eq!(agree(&bad, 6), (false, false));
        assert_eq!(agree(&good[..good.len() - 1], 6), (false, false));
        // Headers: preset dictionary, method 7, window 2^16, check bits.
        // (FLG's check bits make the header a multiple of 31 unless `broken`.)
        for (cmf, dict, broken) in [
            (0x78u8, true, false),
            (0x77, false, false),
            (0x88, false, false),
            (0x78, false, true),
        ] {
            let mut h = good.clone();
            h[0] = cmf;
            let level = if dict { 0x20u8 } else { 0 };
            let check = (31 - ((u16::from(cmf) << 8 | u16::from(level)) % 31) as u8) % 31;
            h[1] = level | (check + u8::from(broken));
            assert_eq!(agree(&h, 6), (false, false), "{cmf:x} {dict} {broken}");
        }
        // Smaller windows declared (CINFO 0..7) are accepted by both.
        for cinfo in 0..8u8 {
            let mut h = good.clone();
            h[0] = cinfo << 4 | 8;
            h[1] = 0;
            h[1] = (31 - ((u16::from(h[0]) << 8) % 31) as u8) % 31;
            assert_eq!(agree(&h, 6), (true, true), "cinfo {cinfo}");
        }
    }

    /// A match's (length, distance, bits used) from the tables at the low bits of `buf`, by
    /// the `LEN_DIST` entry when there is one, else by the `LEN` and distance entries one
    /// after the other; `None` for anything but a match (or an invalid distance code).
    fn match_at(lit: &[u32], dist: &[u32], buf: u64) -> Option<(usize, usize, u32)> {
        let field = |v: u64, e: u32| (v & ((1 << (e & 31)) - 1)) >> ((e >> 5) & 31);
        let e = lit[(buf & ((1 << LIT_BITS) - 1)) as usize];
        match e & KIND {
            LEN_DIST => {
                let len = 3 + ((e >> 13) & 7) as usize;
                Some((len, (e >> 16) as usize + field(buf, e) as usize, e & 31))
            }
            LEN => {
                let len = (e >> 16) as usize + field(buf, e) as usize;
                let rest = buf >> (e & 31);
                let mut d = dist[(rest & ((1 << DIST_BITS) - 1)) as usize];
                if d & KIND == SUB {
                    let sub = (rest >> DIST_BITS) & ((1 << ((d >> 5) & 31)) - 1);
                    d = dist[(d >> 16) as usize + sub as usize];
                }
                if d & KIND != 0 {
                    return None;
                }
                Some((
                    len,
                    (d >> 16) as usize + field(rest, d) as usize,
                    (e & 31) + (d & 31),
                ))
            }
            _ => None,
        }
    }

    #[test]
    fn length_and_distance_entries_decode_as_the_two_lookups() {
        // Random complete codes (literal/length lengths from real streams' shapes: short
        // length codes, distance codes of 1 to 15 bits), the tables built with and without
        // `combine_lengths`: every 11-bit index, under random higher bits, decodes the same
        // match from both, and combined entries do occur.
        let mut rng = Rng(0x51ed_2701_a3c9_4e6b);
        let mut combined = 0usize;
        for round in 0..300 {
            let data = sample(round % 6, 20_000, &mut rng);
            let z = compress(
                &data,
                1 + (round as i32 % 9),
                zlib_rs::Strategy::Default,
                15,
            );
            // The first block's code lengths, read with a plain decoder of the header.
            let Some((lit_lengths, dist_lengths)) = first_dynamic_lengths(&z) else {
                continue;
            };
            let mut lit = vec![0u32; LIT_TABLE];
            let mut dist = vec![0u32; DIST_TABLE];
            let codes = build(
                &mut lit,
                LIT_BITS,
                &lit_lengths,
                Code::Litlen { valid: 286 },
            );
            let Some(codes) = codes else { continue };
            if build(
                &mut dist,
                DIST_BITS,
                &dist_lengths,
                Code::Dist { valid: 30 },
            )
            .is_none()
            {
                continue;
            }
            let plain = lit.clone();
            combine_lengths(&mut lit, &dist, &codes);
            for i in 0..1u64 << LIT_BITS {
                let buf = i | (rng.next() << LIT_BITS);
                assert_eq!(
                    match_at(&lit, &dist, buf),
                    match_at(&plain, &dist, buf),
                    "round {round}, index {i}"
                );
                combined += usize::from(lit[i as usize] & KIND == LEN_DIST);
            }
        }
        assert!(combined > 10_000, "{combined} combined entries");
    }

    /// The literal/length and distance code lengths of the first block of a zlib stream, when
    /// it is a dynamic block.
    fn first_dynamic_lengths(z: &[u8]) -> Option<(Vec<u8>, Vec<u8>)> {
        let mut bits = Bits {
            input: z,
            pos: 2,
            buf: 0,
            bits: 0,
        };
        bits.refill()?;
        bits.take(1);
        if bits.take(2) != 2 {
            return None;
        }
        let nlit = 257 + bits.take(5) as usize;
        let ndist = 1 + bits.take(5) as usize;
        let ncl = 4 + bits.take(4) as usize;
        let mut cl_lengths = [0u8; 19];
        for &sym in &CL_ORDER[..ncl] {
            bits.refill()?;
            cl_lengths[sym] = bits.take(3) as u8;
        }
        let mut cl = [0u32; 128];
        build(&mut cl, 7, &cl_lengths, Code::Lengths)?;
        let mut lengths = vec![0u8; nlit + ndist];
        let mut i = 0;
        while i < nlit + ndist {
            bits.refill()?;
            let e = cl[(bits.buf & 127) as usize];
            bits.drop_bits(e & 31);
            let sym = (e >> 16) as u8;
            let (value, times) = match sym {
                0..=15 => (sym, 1),
                16 => (lengths[i - 1], 3 + bits.take(2) as usize),
                17 => (0, 3 + bits.take(3) as usize),
                _ => (0, 11 + bits.take(7) as usize),
            };
            lengths.get_mut(i..i + times)?.fill(value);
            i += times;
        }
        let dist = lengths.split_off(nlit);
        Some((lengths, dist))
    }

    #[test]
    fn streams_of_tiny_dynamic_blocks_are_left_to_zlib() {
        // Blocks of 64 literals each, with the full 286/30 codes to build: after the trial
        // blocks, their average output is far below `MIN_BLOCK_OUTPUT`, and zlib-rs takes the
        // stream (which it inflates, as ours would have, to the same bytes).
        let lit = lit_lengths(286);
        let mut dist30 = vec![5u8; 30];
        dist30[0] = 4;
        dist30[1] = 4;
        let mut seq = plain(&lit);
        seq.extend(plain(&dist30));
        let tiny = |blocks: usize| -> (Vec<u8>, Vec<u8>) {
            let data: Vec<u8> = (0..blocks * 64).map(|i| (i * 7 % 251) as u8).collect();
            let mut w = Writer::zlib();
            for (k, part) in data.chunks(64).enumerate() {
                let mut syms: Vec<Sym> = part.iter().map(|&v| Sym::Lit(v)).collect();
                syms.push(Sym::Eob);
                let last = k + 1 == blocks;
                dynamic_block(
                    &mut w,
                    last,
                    &CL_LENGTHS,
                    286,
                    30,
                    &seq,
                    &lit,
                    &dist30,
                    &syms,
                );
            }
            (w.finish(&data), data)
        };
        for blocks in [1, TRIAL_BLOCKS, TRIAL_BLOCKS + 1, 500] {
            let (stream, data) = tiny(blocks);
            let (theirs, _, ended) = zlib(&stream, data.len());
            assert!(
                ended && theirs == data,
                "{blocks} blocks: zlib-rs inflates it"
            );
            let mut out = vec![0u8; data.len()];
            let ours = inflate_exact(&stream, &mut out);
            if blocks <= TRIAL_BLOCKS {
                assert_eq!(ours, Some(stream.len()), "{blocks} blocks: ours takes it");
                assert_eq!(out, data);
            } else {
                assert_eq!(ours, None, "{blocks} blocks: left to zlib-rs");
            }
        }
        // Blocks as large as zlib writes them are taken whatever their number.
        // Like filtered photo rows, Huffman codes only: a block every 16 384 literals (zlib's
        // default memory level), so ~24 dynamic blocks of 16 KiB.
        let data = sample(0, 400_000, &mut Rng(0x2545_f491_4f6c_dd1d));
        for level in [1, 6, 9] {
            let stream = compress(&data, level, zlib_rs::Strategy::HuffmanOnly, 15);
            let mut out = vec![0u8; data.len()];
            assert_eq!(
                inflate_exact(&stream, &mut out),
                Some(stream.len()),
                "level {level}"
            );
            assert_eq!(out, data);
        }
    }

    #[test]
    fn zlib_rules_code_lengths() {
        let lit = lit_lengths(286);
        let mut dist30 = vec![5u8; 30];
        dist30[0] = 4;
        dist30[1] = 4;
        let syms = || vec![Sym::Lit(b'x'), Sym::Lit(b'y'), Sym::Eob];
        let run_with = |cl: &[u8; 19],
                        nlit: usize,
                        ndist: usize,
                        seq: Vec<(usize, u32)>,
                        lit: &[u8],
                        dist: &[u8]| {
            let s = stream(
                |w| dynamic(w, cl, nlit, ndist, &seq, lit, dist, &syms()),
                b"xy",
            );
            agree(&s, 2)
        };
        let run = |nlit: usize, ndist: usize, seq: Vec<(usize, u32)>, lit: &[u8], dist: &[u8]| {
            run_with(&CL_LENGTHS, nlit, ndist, seq, lit, dist)
        };
        let both = |a: &[u8], b: &[u8]| {
            let mut seq = plain(a);
            seq.extend(plain(b));
            seq
        };
        assert_eq!(
            run(286, 30, both(&lit, &dist30), &lit, &dist30),
            (true, true)
        );
        // An incomplete code-length code (12/16 + 7/32; its codes enough to send these lengths).
        let mut holed = CL_LENGTHS;
        holed[0] = 5;
        let sent = run_with(&holed, 286, 30, both(&lit, &dist30), &lit, &dist30);
        assert_eq!(sent, (false, false));
        // Repeats: 16 (previous), 17 and 18 (zeros) give the same lengths.
        let mut seq = vec![(9, 0), (16, 3), (16, 3), (16, 3), (16, 3)]; // 1 + 4 * 6 = 25 nines
        for _ in 0..(256 - 25) / 6 {
            seq.push((16, 3));
        }
        while seq
            .iter()
            .map(|&(s, x)| if s == 16 { 3 + x as usize } else { 1 })
            .sum::<usize>()
            < 256
        {
            seq.push((9, 0));
        }
        seq.extend(plain(&lit[256..]));
        seq.extend(plain(&dist30));
        assert_eq!(run(286, 30, seq.clone(), &lit, &dist30), (true, true));
        // A repeat with nothing before it (as if it repeated a zero, the code would be
        // complete: literals 0-2 absent, 3-5 one bit shorter).
        let mut holes = lit.clone();
        holes[..3].fill(0);
        holes[3..6].fill(8);
        let mut first = vec![(16, 0)];
        first.extend(plain(&holes[3..]));
        first.extend(plain(&dist30));
        assert_eq!(run(286, 30, first, &holes, &dist30), (false, false));
        let mut zeros = vec![(17, 0)];
        zeros.extend(plain(&holes[3..]));
        zeros.extend(plain(&dist30));
        assert_eq!(run(286, 30, zeros, &holes, &dist30), (true, true));
        // A repeat running past the last length (one distance code of one bit, then 3 zeros
        // for the last 2 lengths).
        let mut one = vec![0u8; 30];
        one[4] = 1;
        let lit285 = lit_lengths(285);
        let mut past = both(&lit285, &one[..28]);
        past.push((17, 0));
        assert_eq!(run(285, 30, past, &lit285, &one), (false, false));
        let mut exact = both(&lit285, &one[..27]);
        exact.push((17, 0));
        assert_eq!(run(285, 30, exact, &lit285, &one), (true, true));
        // 287 literal/length codes, 31 distance codes (with the other count lowered, so that
        // the lengths alone would fit).
        let lit287 = lit_lengths(287);
        let dist29 = &one[..29];
        assert_eq!(
            run(287, 29, both(&lit287, dist29), &lit287, dist29),
            (false, false)
        );
        let mut dist31 = one.clone();
        dist31.push(0);
        assert_eq!(
            run(285, 31, both(&lit285, &dist31), &lit285, &dist31),
            (false, false)
        );
        assert_eq!(
            run(285, 30, both(&lit285, &one), &lit285, &one),
            (true, true)
        );
        // No end-of-block code (its code space given to symbol 257, so the code is complete).
        let mut no_eob = lit.clone();
        assert_eq!((no_eob[256], no_eob[257]), (5, 5));
        no_eob[256] = 0;
        no_eob[257] = 4;
        let s = both(&no_eob, &dist30);
        let bytes = stream(
            |w| dynamic(w, &CL_LENGTHS, 286, 30, &s, &no_eob, &dist30, &[]),
            b"",
        );
        assert_eq!(agree(&bytes, 0), (false, false));
        // Over-subscribed and incomplete literal/length codes.
        let mut over = lit.clone();
        over[0] = 8;
        assert_eq!(
            run(286, 30, both(&over, &dist30), &over, &dist30),
            (false, false)
        );
        let mut under = lit.clone();
        under[0] = 10;
        assert_eq!(
            run(286, 30, both(&under, &dist30), &under, &dist30),
            (false, false)
        );
        // A single one-bit distance code (incomplete, zlib's exception), and no distance code.
        assert_eq!(run(286, 30, both(&lit, &one), &lit, &one), (true, true));
        let none = vec![0u8; 30];
        assert_eq!(run(286, 30, both(&lit, &none), &lit, &none), (true, true));
        // ... but a match through the missing half of that code, or with no code, fails:
        // after ten literals, a length code and then a one-bit distance code the table lacks.
        for (dist, missing) in [(&one, 1), (&none, 0)] {
            let s = both(&lit, dist);
            let mut syms: Vec<Sym> = (0..10).map(|_| Sym::Lit(b'a')).collect();
            syms.push(Sym::RawDist(257, missing, 1));
            syms.push(Sym::Eob);
            let bytes = stream(
                |w| dynamic(w, &CL_LENGTHS, 286, 30, &s, &lit, dist, &syms),
                &[b'a'; 13],
            );
            assert_eq!(agree(&bytes, 13), (false, false));
        }
    }

    #[test]
    fn zlib_rules_fixed_and_stored_blocks() {
        // Fixed code: literal 0-143 8 bits from 0x30, 144-255 9 bits from 0x190, 256-279
        // 7 bits from 0, 280-287 8 bits from 0xc0; distances 5 bits.
        fn fixed_lit(w: &mut Writer, sym: u32) {
            match sym {
                0..=143 => w.code((0x30 + sym, 8)),
                144..=255 => w.code((0x190 + sym - 144, 9)),
                256..=279 => w.code((sym - 256, 7)),
                _ => w.code((0xc0 + sym - 280, 8)),
            }
        }
        let fixed = |tail: &dyn Fn(&mut Writer), data: &[u8]| {
            stream(
                |w| {
                    w.bits(1, 1);
                    w.bits(1, 2);
                    for &b in b"ab" {
                        fixed_lit(w, u32::from(b));
                    }
                    tail(w);
                    fixed_lit(w, 256);
                },
                data,
            )
        };
        // "ab" + match length 3 (257) distance 2 (symbol 1) = "ababa".
        let good = fixed(
            &|w| {
                fixed_lit(w, 257);
                w.code((1, 5));
            },
            b"ababa",
        );
        assert_eq!(agree(&good, 5), (true, true));
        // Length symbols 286 and 287, distance symbols 30 and 31.
        for sym in [286, 287] {
            let s = fixed(
                &|w| {
                    fixed_lit(w, sym);
                    w.code((0, 5));
                },
                b"ab",
            );
            assert_eq!(agree(&s, 2), (false, false));
        }
        // After 40 literals, so that the distance a decoder would get by reading the entry's
        // fields (the code's own 5 bits, reversed: 15 or 31) is in range, and the adler32 is
        // of the bytes it would write: only the symbol check refuses the stream.
        for dsym in [30u32, 31] {
            let mut data: Vec<u8> = (0..40).map(|i| b'A' + i).collect();
            let from = 40 - reversed(dsym, 5);
            data.extend_from_within(from..from + 3);
            let s = stream(
                |w| {
                    w.bits(1, 1);
                    w.bits(1, 2);
                    for &b in &data[..40] {
                        fixed_lit(w, u32::from(b));
                    }
                    fixed_lit(w, 257);
                    w.code((dsym, 5));
                    fixed_lit(w, 256);
                },
                &data,
            );
            assert_eq!(agree(&s, 43), (false, false));
        }
        // Block type 3.
        let s = stream(
            |w| {
                w.bits(1, 1);
                w.bits(3, 2);
            },
            b"",
        );
        assert_eq!(agree(&s, 0), (false, false));
        // Stored blocks: fine, lengths disagreeing, running past the input; then a fixed
        // block after a stored one (the bit reader restarts at a byte boundary).
        fn stored(w: &mut Writer, len: u16, nlen: u16, body: &[u8], last: bool) {
            w.bits(u32::from(last), 1);
            w.bits(0, 2);
            w.align();
            w.bits(u32::from(len), 16);
            w.bits(u32::from(nlen), 16);
            for &b in body {
                w.bits(u32::from(b), 8);
            }
        }
        let s = stream(|w| stored(w, 5, !5, b"hello", true), b"hello");
        assert_eq!(agree(&s, 5), (true, true));
        let s = stream(|w| stored(w, 5, !6, b"hello", true), b"hello");
        assert_eq!(agree(&s, 5), (false, false));
        let s = stream(|w| stored(w, 0, !0, b"", true), b"");
        assert_eq!(agree(&s, 0), (true, true));
        let s = stream(
            |w| {
                stored(w, 3, !3, b"abc", false);
                w.bits(1, 1);
                w.bits(1, 2);
                fixed_lit(w, 257);
                w.code((2, 5));
                fixed_lit(w, 256);
            },
            b"abcabc",
        );
        assert_eq!(agree(&s, 6), (true, true));
        let mut cut = stream(|w| stored(w, 5, !5, b"hello", true), b"hello");
        cut.truncate(9);
        assert_eq!(agree(&cut, 5), (false, false));
    }
}
