//! Huffman decoding of baseline JPEG scans, in place of libjpeg-turbo's own `decode_mcu`.
//!
//! libjpeg-turbo spends most of a high-quality photo's decode in its Huffman decoder, and on files
//! with restart markers it always takes its slow, byte-at-a-time path. For single-scan sequential
//! Huffman files, `jpeg_shim.c` swaps in [`Scan::decode_mcu`] after `jpeg_start_decompress`; the
//! IDCT, upsampling and colour conversion stay libjpeg-turbo's, so pixels stay Pillow's.
//!
//! The coefficients written are exactly libjpeg-turbo's on every stream this decoder accepts:
//! the same canonical code assignment, DC prediction in wrapping 32-bit arithmetic stored as a
//! truncated 16-bit value, AC positions past 63 landing on 63 (libjpeg's extended zigzag table),
//! restart intervals resetting the predictions. Whatever libjpeg-turbo handles with a recovery of
//! its own is an [`Anomaly`] here, and libjpeg's own decoder takes the scan over at the MCU where
//! it happened ([`Scan::resume_point`]: where libjpeg's decoder would stand there, found by
//! decoding again from the last checkpoint, kept every [`CHECKPOINT_MCUS`] MCUs): a code no
//! table holds, a segment that runs out of bits (libjpeg pads zeros and blanks the rest of the
//! interval), a restart marker missing or out of sequence, more MCUs asked for than the frame
//! has. So the fast path never has to imitate a recovery, and a corrupt file costs no extra
//! decode. Where libjpeg's own reading could differ from a resumed one (data that ends without a
//! marker, where libjpeg suspends; see `jpeg_shim.c`'s `smg_resume` for the others), the whole
//! image is decoded again by the stock decoder.
//!
//! The bit reader refills 8 bytes at a time when none of them is 0xFF (almost always), byte by
//! byte otherwise, with libjpeg's reading of `FF 00` (a data byte), `FF FF …` (fill) and
//! `FF xx` (a marker: the segment ends, zeros follow). Codes of up to [`FAST_BITS`] bits are one
//! table lookup; an AC code whose value bits also fit is decoded whole by that lookup, and so is
//! the AC symbol after it when that one fits in the bits left (most of a photo's late, small
//! coefficients: one lookup for two symbols, [`AcEntry`]).
//!
//! Each symbol costs a chain of one table lookup and one shift, which bounds a single stream
//! (compiled with BMI2 where the CPU has it, so that the shift takes one cycle, not two).
//! With restart markers, intervals are independent streams: the decoder finds the next
//! interval's marker and decodes the two intervals symbol by symbol in turn ([`Ahead`]), so
//! the two chains overlap; the second interval's blocks wait (up to 512 KiB) until libjpeg
//! asks for them.

/// Bits looked up at once. 11 decodes more of a dense photo's codes with their values in one
/// lookup than 10 did (up to 11 % faster decodes on the Intel VM); 12 was 3–9 % slower on five
/// of six photos measured and level on the sixth (a table's lookups, 4 KiB of codes and 16 KiB
/// of whole symbols at 11 bits, would double and crowd the L1 cache).
pub(crate) const FAST_BITS: u32 = 11;
const FAST_SIZE: usize = 1 << FAST_BITS;

/// libjpeg's `jpeg_natural_order`: zigzag index to position in the 8 × 8 block, then 63 for
/// the indices past the block that corrupt runs reach (libjpeg has 16 such entries; the 64 here
/// also cover the end-of-block entries of [`HuffTable::whole`], which jump 64 ahead).
pub(crate) const NATURAL_ORDER: [u8; 128] = {
    let zigzag: [u8; 64] = [
        0, 1, 8, 16, 9, 2, 3, 10, 17, 24, 32, 25, 18, 11, 4, 5, 12, 19, 26, 33, 40, 48, 41, 34, 27,
        20, 13, 6, 7, 14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51,
        58, 59, 52, 45, 38, 31, 39, 46, 53, 60, 61, 54, 47, 55, 62, 63,
    ];
    let mut table = [63u8; 128];
    let mut i = 0;
    while i < 64 {
        table[i] = zigzag[i];
        i += 1;
    }
    table
};

/// The most blocks an MCU may have (JPEG's limit, libjpeg's `D_MAX_BLOCKS_IN_MCU`).
pub(crate) const MAX_BLOCKS_IN_MCU: usize = 10;

/// Why the fast path gave the image back to libjpeg-turbo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Anomaly(pub(crate) &'static str);

/// Which coefficients a table codes (a DHT segment's table class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableClass {
    Dc,
    Ac,
}

/// One decoding table, built from a DHT segment's code counts and symbols.
///
/// A scan's tables are built where they stay ([`HuffTable::blanks`], [`HuffTable::build`]):
/// returned by value, a 21 KiB table was copied two or three times on its way into the scan's
/// list, which for a small photo cost about as much as building it. (`Copy` only so that blank
/// tables can come from zeroed memory; nothing copies a built one.)
#[derive(Clone, Copy)]
pub(crate) struct HuffTable {
    /// Indexed by the next [`FAST_BITS`] bits: `length << 8 | symbol`, 0 when the code is longer.
    fast: [u16; FAST_SIZE],
    /// Indexed the same way, whole symbols with their value bits (0 when the first does not fit
    /// in [`FAST_BITS`]): for an AC table up to two AC symbols, as [`AcEntry`] packs them; for a
    /// DC table the DC difference, as [`DcEntry`] packs it.
    whole: [u64; FAST_SIZE],
    /// libjpeg's `maxcode` (the largest code of each length, -1 for none) and `valoffset`.
    maxcode: [i32; 17],
    valoffset: [i32; 17],
    symbols: [u8; 256],
}

impl HuffTable {
    /// The code of up to [`FAST_BITS`] bits at the top of the `FAST_BITS`-bit `window`: its
    /// length and symbol (`None` when the code is longer).
    pub(crate) fn short_code(&self, window: u32) -> Option<(u32, u8)> {
        let entry = *self.fast.get(window as usize)?;
        (entry != 0).then(|| (u32::from(entry >> 8), (entry & 0xFF) as u8))
    }

    /// `n` blank tables (every entry zero) in zeroed memory, for [`Self::build`] to fill in
    /// place; `None` when the memory is not there.
    pub(crate) fn blanks(n: usize) -> Option<Vec<HuffTable>> {
        crate::memory::fallible::zeros(n).ok()
    }

    /// [`Self::build`] into a new table, returned by value (for tests).
    #[cfg(test)]
    pub(crate) fn new(
        counts: &[u8; 17],
        symbols: &[u8; 256],
        class: TableClass,
        whole: bool,
    ) -> Option<Self> {
        let mut t = Self {
            fast: [0; FAST_SIZE],
            whole: [0; FAST_SIZE],
            maxcode: [0; 17],
            valoffset: [0; 17],
            symbols: [0; 256],
        };
        t.build(counts, symbols, class, whole)?;
        Some(t)
    }

    /// Builds the table of `counts[1..=16]` codes per length over `symbols` into this blank
    /// table (every lookup entry zero, as [`Self::blanks`] and [`Self::new`] make them),
    /// assigned as libjpeg's `jpeg_make_d_derived_tbl` assigns them, with the whole-symbol
    /// lookups of [`Self::whole`] for its `class` when `whole` is set (they cost a few µs to
    /// build, more than a scan of a few hundred blocks gains from them; without them every
    /// symbol takes the code lookup and reads its value bits after it). `None` for tables libjpeg
    /// refuses too (more than 256 codes, or codes that do not fit their length); the table is
    /// then partly built and must not be used.
    pub(crate) fn build(
        &mut self,
        counts: &[u8; 17],
        symbols: &[u8; 256],
        class: TableClass,
        whole: bool,
    ) -> Option<()> {
        debug_assert!(
            self.fast.iter().all(|&e| e == 0) && self.whole.iter().all(|&e| e == 0),
            "a table built over another"
        );
        let t = self;
        t.maxcode = [-1; 17];
        t.valoffset = [0; 17];
        t.symbols = *symbols;
        let total: usize = counts[1..].iter().map(|&c| usize::from(c)).sum();
        if total > 256 {
            return None;
        }
        // The codes of up to `FAST_BITS` bits, shortest first: (code, length, symbol).
        let mut short = [(0u32, 0u32, 0u8); 256];
        let mut shorts = 0;
        let mut code: u32 = 0;
        let mut index: usize = 0;
        for len in 1..=16u32 {
            let count = u32::from(counts[len as usize]);
            if count > 0 {
                t.valoffset[len as usize] = index as i32 - code as i32;
                for _ in 0..count {
                    if code >= 1 << len {
                        return None; // the codes of this length overflow it
                    }
                    if len <= FAST_BITS {
                        let shift = FAST_BITS - len;
                        let entry = (len as u16) << 8 | u16::from(symbols[index]);
                        let first = (code << shift) as usize;
                        t.fast[first..first + (1 << shift)].fill(entry);
                        short[shorts] = (code, len, symbols[index]);
                        shorts += 1;
                    }
                    code += 1;
                    index += 1;
                }
                t.maxcode[len as usize] = code as i32 - 1;
            }
            // libjpeg also refuses a length whose codes end on its all-ones code.
            if code >= 1 << len {
                return None;
            }
            code <<= 1;
        }
        if !whole {
            return Some(());
        }
        // Every whole symbol: a short code followed by each value its size allows, when the
        // two fit in `FAST_BITS` bits (at most `FAST_SIZE` of them: they are prefix-free), as
        // (the bits, how many, the symbol), fewest bits first. Filling the table from them
        // writes each entry once, without a branchy decode of every window (which cost a
        // 128 × 128 photo a quarter of its decode time).
        let mut whole: Vec<(u32, u32, Symbol)> = Vec::new();
        whole.try_reserve_exact(FAST_SIZE).ok()?;
        for used in 1..=FAST_BITS {
            for &(code, len, symbol) in &short[..shorts] {
                // A DC symbol is the size of its difference; an AC symbol a run and a size.
                let size = u32::from(symbol & 15);
                if len + size != used {
                    continue;
                }
                for raw in 0..1u32 << size {
                    let (skip, value) = match (class, size) {
                        (TableClass::Dc, 0) => (0, 0),
                        (TableClass::Dc, _) => (0, extend(raw, size) as i16),
                        // A run of 16 zeros: value 0 written 15 ahead, on a coefficient still
                        // 0. Any other zero-size symbol ends the block (libjpeg reads them so):
                        // value 0 written 64 ahead, where the index has left the block and lands
                        // on position 63, still 0.
                        (TableClass::Ac, 0) => (if symbol >> 4 == 15 { 15 } else { 64 }, 0),
                        (TableClass::Ac, _) => (u32::from(symbol >> 4), extend(raw, size) as i16),
                    };
                    whole.push((code << size | raw, used, Symbol { skip, value }));
                }
            }
        }
        for &(bits, used, first) in &whole {
            let room = FAST_BITS - used;
            let at = (bits << room) as usize;
            if class == TableClass::Dc {
                t.whole[at..at + (1 << room)].fill(DcEntry::pack(first.value, used));
                continue;
            }
            t.whole[at..at + (1 << room)].fill(AcEntry::pack(first, used, None));
            // A second symbol follows in the same bits when it fits whole in what is left, and
            // the first does not end the block (an end of block, or a zero-size symbol libjpeg
            // reads as one); whether a run ends it is only known while decoding, which then
            // leaves the second alone.
            if first.skip == 64 {
                continue;
            }
            for &(bits2, used2, second) in whole.iter().take_while(|w| w.1 <= room) {
                let rest = room - used2;
                let at2 = at | (bits2 << rest) as usize;
                t.whole[at2..at2 + (1 << rest)].fill(AcEntry::pack(
                    first,
                    used,
                    Some((second, used2)),
                ));
            }
        }
        Some(())
    }
}

// SAFETY: every field is an array of integers, for which all-zero bytes are valid (`0`); the
// type is not zero-sized.
unsafe impl crate::memory::Zeroable for HuffTable {}

/// A symbol decoded with its value bits. AC: the decoder writes `value` at zigzag index
/// `k + skip`, then goes on from there plus one. DC: `value` is the difference (`skip` 0).
#[derive(Clone, Copy)]
struct Symbol {
    skip: u32,
    value: i16,
}

/// The packing of an AC table's [`HuffTable::whole`] entries, laid out for the decoder's chain
/// of dependent instructions: bits 0–5 hold the bits both symbols take (the first's alone when
/// there is no second; at most [`FAST_BITS`], so bits 4 and 5 are 0), so that the whole entry
/// is the shift count of one `shlx`, which reads only those six bits. The first symbol's skip
/// (up to 64) is in bits 6–12 and its own bits in 13–16; the second's skip in 17–23 and 1 in bit
/// 24 (both 0 without a second symbol); the first value in bits 32–47, the second in 48–63.
struct AcEntry;

impl AcEntry {
    fn pack(first: Symbol, used: u32, second: Option<(Symbol, u32)>) -> u64 {
        let mut e = u64::from(used)
            | u64::from(first.skip) << 6
            | u64::from(used) << 13
            | u64::from(first.value as u16) << 32;
        if let Some((symbol, bits)) = second {
            e += u64::from(bits); // used + bits <= FAST_BITS: bits 4 and 5 stay 0
            e |= u64::from(symbol.skip) << 17 | 1 << 24;
            e |= u64::from(symbol.value as u16) << 48;
        }
        e
    }
}

/// The packing of a DC table's [`HuffTable::whole`] entries: the bits of the code and its
/// value (1 to [`FAST_BITS`]) in bits 0–3 (4 and 5 stay 0), 1 in bit 23 (so that a difference
/// of 0 is not an empty entry), the difference in bits 32–47.
struct DcEntry;

impl DcEntry {
    fn pack(diff: i16, used: u32) -> u64 {
        u64::from(used) | 1 << 23 | u64::from(diff as u16) << 32
    }
}

/// JPEG's sign extension of a `size`-bit value (F.2.2.1): the lower half of the range stands
/// for negative values.
#[inline(always)]
pub(crate) fn extend(raw: u32, size: u32) -> i32 {
    let v = raw as i32;
    if v < 1 << (size - 1) {
        v - (1 << size) + 1
    } else {
        v
    }
}

/// True when one of the 8 bytes of `w` is 0xFF.
#[inline(always)]
fn has_ff(w: u64) -> bool {
    let inv = !w;
    inv.wrapping_sub(0x0101_0101_0101_0101) & !inv & 0x8080_8080_8080_8080 != 0
}

/// The next marker at or after `pos` as libjpeg's `next_marker` finds it (skipping data bytes,
/// `FF 00` pairs and fill `FF`s): the index of its code byte, `None` at the end of the data.
pub(crate) fn find_marker(data: &[u8], mut pos: usize) -> Option<usize> {
    loop {
        pos += data.get(pos..)?.iter().position(|&b| b == 0xFF)?;
        while data.get(pos) == Some(&0xFF) {
            pos += 1;
        }
        match data.get(pos)? {
            0 => pos += 1,
            _ => return Some(pos),
        }
    }
}

/// A big-endian bit reader over one entropy-coded segment. It is `Copy` so that the block
/// decoder works on a local copy the compiler keeps in registers; the out-of-line slow paths
/// take and return it by value.
#[derive(Clone, Copy)]
pub(crate) struct Bits {
    /// The next bits, most significant first; `n` of them are valid (bits below them may hold
    /// the next byte's bits already, which the following refill writes again).
    buf: u64,
    n: u32,
    /// The next byte of the data to read.
    pos: usize,
    /// Zero bits appended after the segment's end (`n` counts them).
    pad: u32,
    /// Where the marker that ended the segment has its code byte, once reached.
    marker: Option<usize>,
    /// The data ended without a marker.
    hit_end: bool,
    /// Fill bytes before a stuffed zero (`FF FF 00`) were read as a data byte, as libjpeg's
    /// slow path reads them; its fast path takes `FF FF` for a marker, fills zeros, then redoes
    /// the MCU on the slow path without clearing the blocks, so the fast path's coefficients
    /// stay where the slow path writes none. Valid streams never hold the pattern: the image
    /// goes back to libjpeg.
    fill_in_data: bool,
}

impl Bits {
    pub(crate) fn at(pos: usize) -> Self {
        Self {
            buf: 0,
            n: 0,
            pos,
            pad: 0,
            marker: None,
            hit_end: false,
            fill_in_data: false,
        }
    }

    /// Makes at least 32 bits valid.
    #[inline(always)]
    pub(crate) fn refill(&mut self, data: &[u8]) {
        if self.n >= 32 {
            return;
        }
        if let Some(Ok(w)) = data.get(self.pos..self.pos + 8).map(<[u8; 8]>::try_from) {
            let w = u64::from_be_bytes(w);
            if !has_ff(w) {
                self.buf |= w >> self.n;
                self.pos += ((63 - self.n) >> 3) as usize;
                self.n |= 56;
                return;
            }
        }
        *self = Self::refill_bytes(*self, data);
    }

    #[inline(never)]
    fn refill_bytes(mut self, data: &[u8]) -> Self {
        while self.n <= 56 {
            let byte = self.next_byte(data);
            self.buf |= u64::from(byte) << (56 - self.n);
            self.n += 8;
        }
        self
    }

    fn next_byte(&mut self, data: &[u8]) -> u8 {
        if self.marker.is_none() && !self.hit_end {
            match data.get(self.pos) {
                None => self.hit_end = true,
                Some(&b) if b != 0xFF => {
                    self.pos += 1;
                    return b;
                }
                Some(_) => {
                    let mut q = self.pos + 1;
                    while data.get(q) == Some(&0xFF) {
                        q += 1;
                    }
                    match data.get(q) {
                        None => self.hit_end = true,
                        Some(0) => {
                            self.fill_in_data |= q > self.pos + 1;
                            self.pos = q + 1;
                            return 0xFF;
                        }
                        Some(_) => self.marker = Some(q),
                    }
                }
            }
        }
        self.pad += 8;
        0
    }

    #[inline(always)]
    pub(crate) fn peek(&self, bits: u32) -> u32 {
        (self.buf >> (64 - bits)) as u32
    }

    /// The next `bits` bits, 0 to 32 (0 for none, without a branch).
    #[inline(always)]
    pub(crate) fn peek_up_to_32(&self, bits: u32) -> u32 {
        (self.buf >> 32 >> (32 - bits)) as u32
    }

    #[inline(always)]
    pub(crate) fn consume(&mut self, bits: u32) {
        self.buf <<= bits;
        self.n -= bits;
    }

    /// Consumes the bits a [`HuffTable::whole`] entry counts in its low six bits (at most
    /// [`FAST_BITS`]: [`AcEntry`], [`DcEntry`]), shifting by the entry itself (`wrapping_shl`
    /// takes the count modulo 64, as `shlx` does: no masking).
    #[inline(always)]
    fn consume_entry(&mut self, e: u64) {
        self.buf = self.buf.wrapping_shl(e as u32);
        self.n -= (e & 63) as u32; // the count the shift takes
    }

    /// Undoes [`Self::consume_entry`]`(e)` after a lookup of `window` (the `FAST_BITS` bits
    /// it looked up): the bits shifted out are the top of the window.
    #[inline(always)]
    fn give_back(&mut self, e: u64, window: u32) {
        let both = (e & 63) as u32; // both symbols' bits: at most `FAST_BITS`
        self.buf = self.buf >> both | u64::from(window) << (64 - FAST_BITS);
        self.n += both;
    }

    /// `size` (1–15) bits as a signed value; needs `size` valid bits.
    #[inline(always)]
    pub(crate) fn value(&mut self, size: u32) -> i32 {
        let raw = self.peek(size);
        self.consume(size);
        extend(raw, size)
    }

    /// The next symbol of `t`; needs 16 valid bits.
    #[inline(always)]
    pub(crate) fn symbol(&mut self, t: &HuffTable) -> Result<u32, Anomaly> {
        let entry = t.fast[self.peek(FAST_BITS) as usize];
        if entry != 0 {
            self.consume(u32::from(entry >> 8));
            return Ok(u32::from(entry & 0xFF));
        }
        let len = long_code(self.peek(16), t).ok_or(Anomaly("a Huffman code no table holds"))?;
        let code = self.peek(len) as i32;
        self.consume(len);
        let index = (code + t.valoffset[len as usize]) as usize & 0xFF;
        Ok(u32::from(t.symbols[index]))
    }

    /// The next DC difference of `dc`: a size, then that many value bits (one lookup when the
    /// table has its whole-symbol entries and both fit).
    #[inline(always)]
    pub(crate) fn dc_difference(&mut self, data: &[u8], dc: &HuffTable) -> Result<i32, Anomaly> {
        // Each refill leaves at least 32 bits: a code (at most 16) and its value (at most 15).
        self.refill(data);
        let e = dc.whole[self.peek(FAST_BITS) as usize];
        if e != 0 {
            self.consume_entry(e);
            return Ok(i32::from((e >> 32) as i16));
        }
        // DC symbols above 15 are refused by libjpeg's table check; `& 15` keeps the shift in
        // range for a table that got here anyway (and `DcEntry` reads them the same way).
        let size = self.symbol(dc)? & 15;
        Ok(if size == 0 { 0 } else { self.value(size) })
    }

    /// Checks that the segment read held all the bits taken from it and that a marker ends
    /// it; the index of the marker's code byte.
    pub(crate) fn segment_end(&self, data: &[u8]) -> Result<usize, Anomaly> {
        if !self.within_segment() {
            return Err(Anomaly("a segment ran out of data"));
        }
        match self.marker {
            Some(at) => Ok(at),
            None => find_marker(data, self.pos).ok_or(Anomaly("the data ends without a marker")),
        }
    }

    /// Where the next byte of the data would be read.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// How many bits have been taken from the data, padding included (readers that refill at
    /// different moments agree on it).
    #[cfg(test)]
    pub(crate) fn taken(&self) -> u64 {
        self.pos as u64 * 8 + u64::from(self.pad) - u64::from(self.n)
    }

    /// The bits still to be decoded as libjpeg's bit buffer holds them: `(get_buffer,
    /// bits_left)`, the next `bits_left` bits of the segment in the low bits of `get_buffer`,
    /// its reading going on at [`Self::position`] (where a marker, once reached, has its `FF`).
    /// `None` when the reader is where libjpeg would stand differently: past the segment's end,
    /// at the end of the data (whether libjpeg then suspends, as on a truncated file, or
    /// decodes the last MCUs from what its bit buffer holds depends on how full the buffer is
    /// when it reaches the end, which a resumed decode does not reproduce; such scans go to
    /// libjpeg whole, `HookState::placement`), or after fill bytes read as data.
    pub(crate) fn for_libjpeg(&self) -> Option<(u64, u32)> {
        if self.fill_in_data || !self.within_segment() {
            return None;
        }
        // The zeros appended after a marker follow the segment's bits: the top `n - pad` bits
        // are the segment's.
        let valid = self.n - self.pad;
        Some((self.buf.checked_shr(64 - valid).unwrap_or(0), valid))
    }

    /// Whether the bits read so far all came from the segment (none of the zeros after it).
    fn within_segment(&self) -> bool {
        self.n >= self.pad && !self.hit_end
    }

    /// What libjpeg would decode otherwise, if anything (checked after each MCU). A segment
    /// that ran out of data is caught here, at the first MCU past its end, and not only where
    /// it should end: a frame declaring millions of MCUs over a few bytes of scan would
    /// otherwise be decoded to its end on zeros before libjpeg decodes it all again.
    pub(crate) fn anomaly(&self) -> Option<Anomaly> {
        if self.hit_end {
            Some(Anomaly("the data ends without a marker"))
        } else if self.fill_in_data {
            Some(Anomaly("0xFF fill bytes inside the data"))
        } else if !self.within_segment() {
            Some(Anomaly("a segment ran out of data"))
        } else {
            None
        }
    }
}

/// The length of the code longer than [`FAST_BITS`] at the top of `bits16`, by libjpeg's
/// canonical search (`jpeg_huff_decode`); `None` when no code of up to 16 bits matches.
#[inline(never)]
fn long_code(bits16: u32, t: &HuffTable) -> Option<u32> {
    (FAST_BITS + 1..=16).find(|&len| (bits16 >> (16 - len)) as i32 <= t.maxcode[len as usize])
}

/// One block of an MCU: its component in the scan and its tables.
#[derive(Clone, Copy)]
pub(crate) struct BlockSpec {
    pub(crate) component: usize,
    pub(crate) dc: usize,
    pub(crate) ac: usize,
}

/// The state of one scan being decoded.
pub(crate) struct Scan {
    tables: Vec<HuffTable>,
    blocks: Vec<BlockSpec>,
    restart_interval: u32,
    /// MCUs left in the current restart interval.
    left_in_interval: u32,
    next_restart: u8,
    mcus_left: u64,
    predictions: [i32; 4],
    bits: Bits,
    /// The next restart interval, decoded in step with the current one (see [`Ahead`]).
    ahead: Option<Ahead>,
    /// Whether `ahead` is being handed out (the current interval) rather than filled.
    serving: bool,
    /// The blocks of a finished [`Ahead`], kept for the next one.
    spare: Vec<[i16; 64]>,
    /// The latest [`Checkpoint`].
    checkpoint: Checkpoint,
    /// Whether intervals may be decoded in pairs ([`Ahead`]; off for the decode from a
    /// checkpoint).
    pairing: bool,
    /// After an anomaly: where libjpeg can take the scan over ([`Self::resume_point`]).
    failed: Option<Resume>,
}

/// Where libjpeg-turbo's own decoder would stand at the start of an MCU, had it decoded every
/// MCU before it: what `jpeg_shim.c` needs to hand it the rest of a scan ([`Scan::resume_point`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Resume {
    /// The next byte of the data to read.
    pub(crate) pos: usize,
    /// The next `bits_left` bits (at most 63) in the low bits.
    pub(crate) get_buffer: u64,
    pub(crate) bits_left: u32,
    /// The DC predictions, by component of the scan.
    pub(crate) predictions: [i32; 4],
    /// MCUs left in the restart interval, this one included (0: a restart marker comes first;
    /// always 0 without restart markers), and the number of the next restart marker.
    pub(crate) restarts_to_go: u32,
    pub(crate) next_restart: u8,
    /// MCUs left in the scan, this one included.
    pub(crate) mcus_left: u64,
    /// A progressive scan's end-of-band run: blocks still to pass over (0 in a sequential one).
    pub(crate) eobrun: u32,
}

impl Resume {
    /// The state with the reader `bits` ([`Bits::for_libjpeg`]: `None` where libjpeg would
    /// stand differently) and the rest as given.
    pub(crate) fn at(
        bits: &Bits,
        predictions: [i32; 4],
        restarts_to_go: u32,
        next_restart: u8,
        mcus_left: u64,
        eobrun: u32,
    ) -> Option<Self> {
        let (get_buffer, bits_left) = bits.for_libjpeg()?;
        Some(Self {
            pos: bits.position(),
            get_buffer,
            bits_left,
            predictions,
            restarts_to_go,
            next_restart,
            mcus_left,
            eobrun,
        })
    }
}

/// The decoder's state at the start of an MCU of its own interval (not one decoded ahead):
/// from there a plain decode reaches any later MCU ([`Scan::resume_point`]).
#[derive(Clone, Copy)]
struct Checkpoint {
    bits: Bits,
    predictions: [i32; 4],
    left_in_interval: u32,
    next_restart: u8,
    mcus_left: u64,
}

/// A checkpoint is taken every this many MCUs (a power of two): after an anomaly, at most this
/// many MCUs (and the intervals decoded ahead in between) are decoded again to find where
/// libjpeg would stand, and an MCU pays one test for it.
const CHECKPOINT_MCUS: u64 = 256;

/// The most blocks an interval may have to be decoded ahead (512 KiB of coefficients).
const MAX_AHEAD_BLOCKS: usize = 4096;

/// A restart interval decoded together with the one before it. The two are independent
/// streams (each starts after its restart marker, with fresh predictions), so decoding them
/// symbol by symbol in turn lets the processor overlap their lookup-and-shift chains, which
/// bound a single stream. Its blocks wait here until libjpeg asks for them.
struct Ahead {
    /// Where the interval's data starts (after its restart marker).
    start: usize,
    /// The interval's reader, where it stopped.
    bits: Bits,
    predictions: [i32; 4],
    /// Its blocks, MCU after MCU.
    blocks: Vec<[i16; 64]>,
    /// MCUs decoded (while filling) or handed out (while serving).
    count: usize,
}

/// What [`Scan::decode_mcu`] did.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    /// The MCU was decoded; more follow.
    More,
    /// The last MCU was decoded; the data from this offset on is the decoder's again.
    Done(usize),
}

impl Scan {
    /// A scan of `mcus` MCUs made of `blocks` (each naming its component, below 4, and its
    /// tables in `tables`), with a restart marker every `restart_interval` MCUs (0: none),
    /// starting at `start` in the data.
    pub(crate) fn new(
        tables: Vec<HuffTable>,
        blocks: Vec<BlockSpec>,
        restart_interval: u32,
        mcus: u64,
        start: usize,
    ) -> Option<Self> {
        let fits = |b: &BlockSpec| b.component < 4 && b.dc < tables.len() && b.ac < tables.len();
        if blocks.is_empty() || blocks.len() > MAX_BLOCKS_IN_MCU || !blocks.iter().all(fits) {
            return None;
        }
        let mut scan = Self {
            tables,
            blocks,
            restart_interval,
            left_in_interval: restart_interval,
            next_restart: 0,
            mcus_left: mcus,
            predictions: [0; 4],
            bits: Bits::at(start),
            ahead: None,
            serving: false,
            spare: Vec::new(),
            checkpoint: Checkpoint {
                bits: Bits::at(start),
                predictions: [0; 4],
                left_in_interval: 0,
                next_restart: 0,
                mcus_left: 0,
            },
            pairing: true,
            failed: None,
        };
        scan.take_checkpoint();
        Some(scan)
    }

    fn take_checkpoint(&mut self) {
        self.checkpoint = Checkpoint {
            bits: self.bits,
            predictions: self.predictions,
            left_in_interval: self.left_in_interval,
            next_restart: self.next_restart,
            mcus_left: self.mcus_left,
        };
    }

    /// The number of blocks in an MCU.
    pub(crate) fn blocks_in_mcu(&self) -> usize {
        self.blocks.len()
    }

    /// MCUs per restart interval (0: no restart markers).
    pub(crate) fn restart_interval(&self) -> u32 {
        self.restart_interval
    }

    /// A scan with the same tables and blocks, not started (position it with
    /// [`Self::reposition`]); `None` when its tables cannot be allocated.
    pub(crate) fn fork(&self) -> Option<Self> {
        let mut tables = Vec::new();
        tables.try_reserve_exact(self.tables.len()).ok()?;
        tables.extend(self.tables.iter().cloned());
        let mut blocks = Vec::new();
        blocks.try_reserve_exact(self.blocks.len()).ok()?;
        blocks.extend_from_slice(&self.blocks);
        Self::new(tables, blocks, self.restart_interval, 0, 0)
    }

    /// Makes the scan decode `mcus` MCUs from the start of restart interval `interval`, whose
    /// data starts at `start` (after the restart marker before it, or at the scan's start):
    /// fresh predictions and reader, the restart markers numbered from `interval` on.
    pub(crate) fn reposition(&mut self, start: usize, interval: u64, mcus: u64) {
        if let Some(ahead) = self.ahead.take() {
            self.spare = ahead.blocks;
        }
        self.serving = false;
        self.bits = Bits::at(start);
        self.predictions = [0; 4];
        self.left_in_interval = self.restart_interval;
        self.next_restart = (interval & 7) as u8;
        self.mcus_left = mcus;
        self.failed = None;
        self.take_checkpoint();
    }

    /// After the last MCU ([`Step::Done`]): the index of the code byte of the marker that ends
    /// the data decoded, checked as at every segment's end.
    pub(crate) fn end_marker(&mut self, data: &[u8]) -> Result<usize, Anomaly> {
        self.end_of_segment(data)
    }

    /// Decodes the next MCU into `out` (one zeroed block per [`Self::blocks_in_mcu`], in order;
    /// `None` blocks are decoded and dropped). After an anomaly, [`Self::resume_point`] says
    /// where libjpeg can take the scan over.
    pub(crate) fn decode_mcu(
        &mut self,
        data: &[u8],
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<Step, Anomaly> {
        let mcus_left = self.mcus_left;
        if mcus_left & (CHECKPOINT_MCUS - 1) == 0 && !self.serving {
            self.take_checkpoint();
        }
        let step = self.decode_mcu_dispatched(data, out);
        if step.is_err() {
            // None for an MCU past the scan's end.
            self.failed = (mcus_left > 0)
                .then(|| self.resume_at(data, mcus_left))
                .flatten();
        }
        step
    }

    /// Where libjpeg would stand at the start of the next MCU (the scan between MCUs, none
    /// failed; after its last MCU, at the end of its data): for a caller that finds something
    /// wrong between two of them, or after the MCUs it was positioned for
    /// ([`Self::reposition`]).
    pub(crate) fn resume_point_here(&self, data: &[u8]) -> Option<Resume> {
        self.resume_at(data, self.mcus_left)
    }

    /// After [`Self::decode_mcu`] failed: libjpeg's decoder state at the start of that MCU, had
    /// it decoded the scan so far (the MCUs before it decoded without an anomaly, so exactly
    /// as libjpeg decodes them); `None` when the decoder cannot say.
    pub(crate) fn resume_point(&self) -> Option<Resume> {
        self.failed
    }

    /// Where libjpeg would stand at the start of the MCU with `mcus_left` MCUs left (this one
    /// included; 0: after the last): the MCUs since the last checkpoint decoded again, plainly
    /// (one interval at a time, into no blocks), by a copy of the scan started there. They
    /// decoded without an anomaly the first time, so they do again. Out of line: the per-MCU
    /// path only takes checkpoints.
    #[cold]
    #[inline(never)]
    fn resume_at(&self, data: &[u8], mcus_left: u64) -> Option<Resume> {
        let c = self.checkpoint;
        let again = c.mcus_left.checked_sub(mcus_left)?;
        let mut scan = self.fork()?;
        scan.pairing = false;
        scan.bits = c.bits;
        scan.predictions = c.predictions;
        scan.left_in_interval = c.left_in_interval;
        scan.next_restart = c.next_restart;
        scan.mcus_left = c.mcus_left;
        let mut none: [Option<&mut [i16; 64]>; MAX_BLOCKS_IN_MCU] = Default::default();
        let n = self.blocks.len();
        for i in 0..again {
            match scan.decode_mcu_dispatched(data, &mut none[..n]) {
                Ok(Step::More) => {}
                Ok(Step::Done(_)) if i + 1 == again && mcus_left == 0 => {}
                _ => return None,
            }
        }
        Resume::at(
            &scan.bits,
            scan.predictions,
            scan.left_in_interval,
            scan.next_restart,
            mcus_left,
            0,
        )
    }

    fn decode_mcu_dispatched(
        &mut self,
        data: &[u8],
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<Step, Anomaly> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("bmi2") {
            // SAFETY: `decode_mcu_bmi2` only requires the CPU to have BMI2, checked just above.
            return unsafe { self.decode_mcu_bmi2(data, out) };
        }
        self.decode_mcu_inlined(data, out)
    }

    /// [`Self::decode_mcu`] compiled with BMI2: every variable shift of the bit reader (one or
    /// two per symbol, on the lookup-and-shift chain that bounds the decoder) is a one-cycle
    /// `shlx`/`shrx` instead of a `shl`/`shr` through `cl` and the flags.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "bmi2")]
    unsafe fn decode_mcu_bmi2(
        &mut self,
        data: &[u8],
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<Step, Anomaly> {
        self.decode_mcu_inlined(data, out)
    }

    #[inline(always)]
    fn decode_mcu_inlined(
        &mut self,
        data: &[u8],
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<Step, Anomaly> {
        if out.len() != self.blocks.len() {
            return Err(Anomaly("an MCU of another size"));
        }
        if self.mcus_left == 0 {
            return Err(Anomaly("more MCUs than the frame has"));
        }
        if self.restart_interval != 0 {
            if self.left_in_interval == 0 {
                self.restart(data)?;
            }
            if self.left_in_interval == self.restart_interval && !self.serving && self.pairing {
                self.pair_up(data);
            }
            self.left_in_interval -= 1;
        }
        if self.serving {
            return self.serve(data, out);
        }
        // A local copy, kept in registers through the blocks.
        let mut bits = self.bits;
        if let Some(ahead) = self.ahead.as_mut() {
            let mut other = ahead.bits;
            let n = self.blocks.len();
            let first = ahead.count * n;
            let Some(theirs) = ahead.blocks.get_mut(first..first + n) else {
                return Err(Anomaly("an interval longer than its restart interval"));
            };
            for ((spec, block), their) in self.blocks.iter().zip(out.iter_mut()).zip(theirs) {
                Self::decode_two(
                    [&mut bits, &mut other],
                    data,
                    &self.tables[spec.dc],
                    &self.tables[spec.ac],
                    [
                        &mut self.predictions[spec.component],
                        &mut ahead.predictions[spec.component],
                    ],
                    block.as_deref_mut(),
                    their,
                )?;
            }
            if let Some(anomaly) = other.anomaly() {
                return Err(anomaly);
            }
            ahead.bits = other;
            ahead.count += 1;
        } else {
            for (spec, block) in self.blocks.iter().zip(out.iter_mut()) {
                Self::decode_coefficients(
                    &mut bits,
                    data,
                    &self.tables[spec.dc],
                    &self.tables[spec.ac],
                    &mut self.predictions[spec.component],
                    block.as_deref_mut(),
                )?;
            }
        }
        self.bits = bits;
        if let Some(anomaly) = self.bits.anomaly() {
            return Err(anomaly);
        }
        self.finish_mcu(data)
    }

    fn finish_mcu(&mut self, data: &[u8]) -> Result<Step, Anomaly> {
        self.mcus_left -= 1;
        if self.mcus_left > 0 {
            return Ok(Step::More);
        }
        self.end_of_segment(data)?;
        Ok(Step::Done(self.bits.pos))
    }

    /// At the start of an interval: when a whole interval follows this one and starts where
    /// a scan for its restart marker says, decode it alongside ([`Ahead`]).
    fn pair_up(&mut self, data: &[u8]) {
        let r = self.restart_interval as usize;
        let n = self.blocks.len();
        if self.mcus_left < 2 * r as u64 || r * n > MAX_AHEAD_BLOCKS {
            return;
        }
        let Some(at) = find_marker(data, self.bits.pos) else {
            return;
        };
        if data[at] != 0xD0 + self.next_restart {
            return; // the current interval will find out
        }
        let mut blocks = std::mem::take(&mut self.spare);
        blocks.clear();
        if blocks.try_reserve_exact(r * n).is_err() {
            return;
        }
        blocks.resize(r * n, [0; 64]);
        self.ahead = Some(Ahead {
            start: at + 1,
            bits: Bits::at(at + 1),
            predictions: [0; 4],
            blocks,
            count: 0,
        });
    }

    /// Hands out the next MCU of the interval decoded ahead.
    fn serve(&mut self, data: &[u8], out: &mut [Option<&mut [i16; 64]>]) -> Result<Step, Anomaly> {
        let n = self.blocks.len();
        let Some(ahead) = self.ahead.as_mut() else {
            return Err(Anomaly("no interval decoded ahead"));
        };
        let first = ahead.count * n;
        let Some(theirs) = ahead.blocks.get(first..first + n) else {
            return Err(Anomaly("an interval longer than its restart interval"));
        };
        for (block, their) in out.iter_mut().zip(theirs) {
            if let Some(block) = block.as_deref_mut() {
                *block = *their;
            }
        }
        ahead.count += 1;
        self.finish_mcu(data)
    }

    /// Checks that the segment just decoded held all its bits and that a marker ends it; the
    /// index of the marker's code byte.
    fn end_of_segment(&mut self, data: &[u8]) -> Result<usize, Anomaly> {
        self.bits.segment_end(data)
    }

    fn restart(&mut self, data: &[u8]) -> Result<(), Anomaly> {
        let at = self.end_of_segment(data)?;
        if data.get(at) != Some(&(0xD0 + self.next_restart)) {
            return Err(Anomaly("a restart marker missing or out of order"));
        }
        self.next_restart = (self.next_restart + 1) & 7;
        self.predictions = [0; 4];
        self.left_in_interval = self.restart_interval;
        if self.serving {
            // The interval handed out is over: its reader has been checked above.
            self.serving = false;
            if let Some(ahead) = self.ahead.take() {
                self.spare = ahead.blocks;
            }
        }
        match self.ahead.as_mut() {
            Some(ahead) if ahead.count == self.restart_interval as usize => {
                // The interval starting here was decoded alongside the one just ended, from
                // the same marker: hand it out, its reader taking over for the checks at its end.
                if ahead.start != at + 1 {
                    return Err(Anomaly("an interval decoded ahead from elsewhere"));
                }
                self.bits = ahead.bits;
                ahead.count = 0;
                self.serving = true;
            }
            Some(_) => return Err(Anomaly("an interval decoded ahead only in part")),
            None => self.bits = Bits::at(at + 1),
        }
        Ok(())
    }

    /// Decodes the AC symbol at zigzag index `*k` of a block; `*k` ends at 64 or more when
    /// the block is complete (libjpeg's loop: a run of 16 zeros advances 16, any other
    /// zero-size symbol ends the block).
    #[inline(always)]
    fn ac_step(
        bits: &mut Bits,
        data: &[u8],
        ac: &HuffTable,
        k: &mut usize,
        block: &mut [i16; 64],
    ) -> Result<(), Anomaly> {
        bits.refill(data);
        let window = bits.peek(FAST_BITS);
        let e = ac.whole[window as usize];
        if e != 0 {
            // The refill left at least 32 bits; the two symbols take at most `FAST_BITS`. Both
            // are consumed by one shift, the entry its own shift count, before it is known
            // whether the first ends the block: the next lookup waits only for this one's load
            // and one `shlx` (1-6 % off a baseline photo's decode, against a shift per symbol
            // and a mask). Indices into `NATURAL_ORDER` stay below 128 (`*k < 64` before each
            // skip, a skip is at most 64, a run at most 15); `& 127` says so to the compiler,
            // which then drops the bounds checks (1.5-5 % of a decode).
            bits.consume_entry(e);
            *k += ((e >> 6) & 127) as usize;
            block[usize::from(NATURAL_ORDER[*k & 127])] = (e >> 32) as i16;
            *k += 1;
            if *k < 64 {
                // The second symbol (if any: else a 0 written where the index stands, on a
                // coefficient not written yet).
                *k += ((e >> 17) & 127) as usize;
                block[usize::from(NATURAL_ORDER[*k & 127])] = (e >> 48) as i16;
                *k += ((e >> 24) & 1) as usize;
            } else if e & 1 << 24 != 0 {
                // The first symbol ended the block, so the second's bits are the next block's:
                // given back, from the window looked up (nothing else kept alive: two streams
                // in turn are short of registers). An end of block has no second symbol; only
                // a run (or a run of 16 zeros) reaching or passing index 63 gets here.
                bits.give_back(e, window);
                bits.consume(((e >> 13) & 15) as u32);
            }
            return Ok(());
        }
        let symbol = bits.symbol(ac)?;
        let (run, size) = ((symbol >> 4) as usize, symbol & 15);
        if size != 0 {
            *k += run;
            block[usize::from(NATURAL_ORDER[*k & 127])] = bits.value(size) as i16;
            *k += 1;
        } else if run != 15 {
            *k = 64;
        } else {
            *k += 16;
        }
        Ok(())
    }

    /// Decodes a block's DC difference and adds it to `prediction` (wrapping, as libjpeg's
    /// `int`): the coefficient, truncated to 16 bits as libjpeg stores it.
    #[inline(always)]
    fn dc_step(
        bits: &mut Bits,
        data: &[u8],
        dc: &HuffTable,
        prediction: &mut i32,
    ) -> Result<i16, Anomaly> {
        let diff = bits.dc_difference(data, dc)?;
        *prediction = prediction.wrapping_add(diff);
        Ok(*prediction as i16)
    }

    /// The same block of an MCU in two independent streams, symbol by symbol in turn (`None`:
    /// the first block is decoded and dropped).
    #[inline(always)]
    fn decode_two(
        [a, b]: [&mut Bits; 2],
        data: &[u8],
        dc: &HuffTable,
        ac: &HuffTable,
        [pred_a, pred_b]: [&mut i32; 2],
        block_a: Option<&mut [i16; 64]>,
        block_b: &mut [i16; 64],
    ) -> Result<(), Anomaly> {
        let mut scratch;
        let block_a = match block_a {
            Some(block) => block,
            None => {
                scratch = [0i16; 64]; // zeroed only when needed: off the hot path
                &mut scratch
            }
        };
        block_a[0] = Self::dc_step(a, data, dc, pred_a)?;
        block_b[0] = Self::dc_step(b, data, dc, pred_b)?;
        let (mut ka, mut kb) = (1usize, 1usize);
        while ka < 64 && kb < 64 {
            Self::ac_step(a, data, ac, &mut ka, block_a)?;
            Self::ac_step(b, data, ac, &mut kb, block_b)?;
        }
        while ka < 64 {
            Self::ac_step(a, data, ac, &mut ka, block_a)?;
        }
        while kb < 64 {
            Self::ac_step(b, data, ac, &mut kb, block_b)?;
        }
        Ok(())
    }

    /// One block (`None`: decoded and dropped).
    #[inline(always)]
    fn decode_coefficients(
        bits: &mut Bits,
        data: &[u8],
        dc: &HuffTable,
        ac: &HuffTable,
        prediction: &mut i32,
        block: Option<&mut [i16; 64]>,
    ) -> Result<(), Anomaly> {
        let mut scratch;
        let block = match block {
            Some(block) => block,
            None => {
                scratch = [0i16; 64];
                &mut scratch
            }
        };
        block[0] = Self::dc_step(bits, data, dc, prediction)?;
        let mut k: usize = 1;
        while k < 64 {
            Self::ac_step(bits, data, ac, &mut k, block)?;
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::jpeg_pipeline::{Pipeline, Plan};
    use super::*;

    /// A small deterministic generator (xorshift64*), for this module's tests and
    /// `jpeg_progressive.rs`'s.
    pub(crate) struct Rng(pub(crate) u64);
    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub(crate) fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// A canonical code: (counts, symbols) and each symbol's (code, length).
    struct Code {
        counts: [u8; 17],
        symbols: [u8; 256],
        codes: Vec<Option<(u32, u32)>>,
    }

    fn code(counts: &[u8], symbols: &[u8]) -> Code {
        let mut c = Code {
            counts: [0; 17],
            symbols: [0; 256],
            codes: vec![None; 256],
        };
        c.counts[1..=counts.len()].copy_from_slice(counts);
        c.symbols[..symbols.len()].copy_from_slice(symbols);
        let (mut next, mut k) = (0u32, 0usize);
        for len in 1..=16u32 {
            for _ in 0..c.counts[len as usize] {
                c.codes[usize::from(symbols[k])] = Some((next, len));
                next += 1;
                k += 1;
            }
            next <<= 1;
        }
        c
    }

    /// DC categories 0–11 and all 162 AC symbols (each shuffled: any category may get a short
    /// code), with the code lengths of the usual luminance tables.
    fn tables(rng: &mut Rng) -> (Code, Code) {
        let mut dc_symbols: Vec<u8> = (0..12).collect();
        for i in (1..dc_symbols.len()).rev() {
            dc_symbols.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let dc = code(&[0, 1, 5, 1, 1, 1, 1, 1, 1], &dc_symbols);
        let mut ac_symbols: Vec<u8> = vec![0x00, 0xF0];
        for run in 0..16u8 {
            for size in 1..=10u8 {
                ac_symbols.push(run << 4 | size);
            }
        }
        for i in (1..ac_symbols.len()).rev() {
            ac_symbols.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let ac = code(
            &[0, 2, 1, 3, 3, 2, 4, 3, 5, 5, 4, 4, 0, 0, 1, 125],
            &ac_symbols,
        );
        (dc, ac)
    }

    /// Writes bits most significant first, stuffing a zero after each 0xFF.
    #[derive(Default)]
    struct Writer {
        out: Vec<u8>,
        acc: u64,
        n: u32,
    }
    impl Writer {
        fn bits(&mut self, value: u32, len: u32) {
            for i in (0..len).rev() {
                self.acc = self.acc << 1 | u64::from(value >> i & 1);
                self.n += 1;
                if self.n == 8 {
                    let byte = self.acc as u8;
                    self.out.push(byte);
                    if byte == 0xFF {
                        self.out.push(0);
                    }
                    (self.acc, self.n) = (0, 0);
                }
            }
        }
        fn symbol(&mut self, c: &Code, symbol: u8) {
            let (code, len) = c.codes[usize::from(symbol)].expect("symbol in the table");
            self.bits(code, len);
        }
        /// Pads the last byte with ones (as encoders do) and writes a marker.
        fn marker(&mut self, code: u8) {
            if self.n > 0 {
                let pad = 8 - self.n;
                self.bits((1 << pad) - 1, pad);
            }
            self.out.extend([0xFF, code]);
        }
    }

    fn size_of(v: i32) -> u32 {
        32 - v.unsigned_abs().leading_zeros()
    }

    fn encode_value(w: &mut Writer, v: i32) {
        let size = size_of(v);
        if size > 0 {
            let raw = if v < 0 { v - 1 } else { v } as u32 & ((1 << size) - 1);
            w.bits(raw, size);
        }
    }

    fn encode_block(w: &mut Writer, dc: &Code, ac: &Code, block: &[i16; 64], pred: &mut i32) {
        let diff = i32::from(block[0]) - *pred;
        *pred = i32::from(block[0]);
        w.symbol(dc, size_of(diff) as u8);
        encode_value(w, diff);
        let mut run = 0u8;
        for k in 1..64 {
            let v = i32::from(block[usize::from(NATURAL_ORDER[k])]);
            if v == 0 {
                run += 1;
                continue;
            }
            while run >= 16 {
                w.symbol(ac, 0xF0);
                run -= 16;
            }
            w.symbol(ac, run << 4 | size_of(v) as u8);
            encode_value(w, v);
            run = 0;
        }
        if run > 0 {
            w.symbol(ac, 0x00);
        }
    }

    fn random_block(rng: &mut Rng) -> [i16; 64] {
        let mut b = [0i16; 64];
        // A DC value of a random size (0 to 10 bits), so that the differences between blocks
        // take every category, small ones too.
        b[0] = match rng.below(11) as u32 {
            0 => 0,
            size => {
                let magnitude = (1 << (size - 1)) + rng.below(1 << (size - 1)) as i16;
                if rng.below(2) == 0 {
                    magnitude
                } else {
                    -magnitude
                }
            }
        };
        let density = rng.below(64) + 1;
        for v in b.iter_mut().skip(1) {
            if rng.below(64) < density {
                let size = rng.below(10) as u32 + 1;
                let magnitude = (1 << (size - 1)) + rng.below(1 << (size - 1)) as i32;
                *v = if rng.below(2) == 0 {
                    magnitude
                } else {
                    -magnitude
                } as i16;
            }
        }
        b
    }

    struct Stream {
        data: Vec<u8>,
        blocks: Vec<[i16; 64]>,
        specs: Vec<BlockSpec>,
        tables: Vec<(Code, Code)>,
        restart_interval: u32,
        mcus: u64,
        /// Where each MCU's first bit is (its byte in `data`, bits of that byte before it),
        /// and the DC predictions before it.
        mcu_starts: Vec<(usize, u32, [i32; 4])>,
    }

    /// A scan of `mcus` MCUs of the layout `comps` (blocks per component), two table pairs,
    /// a restart every `restart_interval` MCUs, ending with EOI.
    fn stream(rng: &mut Rng, comps: &[usize], mcus: u64, restart_interval: u32) -> Stream {
        let tables = vec![tables(rng), tables(rng)];
        let mut specs = Vec::new();
        for (c, &n) in comps.iter().enumerate() {
            let t = usize::from(c > 0);
            specs.extend((0..n).map(|_| BlockSpec {
                component: c,
                dc: 2 * t,
                ac: 2 * t + 1,
            }));
        }
        let mut w = Writer::default();
        let mut blocks = Vec::new();
        let mut preds = [0i32; 4];
        let mut rst = 0u8;
        let mut mcu_starts = Vec::new();
        for m in 0..mcus {
            if restart_interval > 0 && m > 0 && m % u64::from(restart_interval) == 0 {
                w.marker(0xD0 + rst);
                rst = (rst + 1) & 7;
                preds = [0; 4];
            }
            mcu_starts.push((w.out.len(), w.n, preds));
            for s in &specs {
                let b = random_block(rng);
                let (dc, ac) = &tables[s.dc / 2];
                encode_block(&mut w, dc, ac, &b, &mut preds[s.component]);
                blocks.push(b);
            }
        }
        w.marker(0xD9);
        Stream {
            data: w.out,
            blocks,
            specs,
            tables,
            restart_interval,
            mcus,
            mcu_starts,
        }
    }

    fn scan(s: &Stream, start: usize) -> Scan {
        scan_with(s, start, true)
    }

    /// [`scan`], with or without the tables' whole-symbol lookups; the tables built in place
    /// into blank ones, as the decoder builds them.
    fn scan_with(s: &Stream, start: usize, whole: bool) -> Scan {
        let codes: Vec<_> = s
            .tables
            .iter()
            .flat_map(|(dc, ac)| [(dc, TableClass::Dc), (ac, TableClass::Ac)])
            .collect();
        let mut tables = HuffTable::blanks(codes.len()).expect("memory");
        for (table, (c, class)) in tables.iter_mut().zip(codes) {
            table
                .build(&c.counts, &c.symbols, class, whole)
                .expect("table");
        }
        Scan::new(tables, s.specs.clone(), s.restart_interval, s.mcus, start).expect("scan")
    }

    /// Decodes the whole scan; the blocks and where the decoder hands the data back. Every
    /// stream goes through both builds of the decoder, which must agree: the one this CPU runs
    /// (BMI2 on any x86-64 of the last decade) and the portable one, which the tests would
    /// otherwise never reach here.
    fn decode_all(
        s: &Stream,
        data: &[u8],
        start: usize,
    ) -> Result<(Vec<[i16; 64]>, usize), Anomaly> {
        let chosen = decode_all_with(s, data, start, Scan::decode_mcu, true);
        let portable = decode_all_with(s, data, start, Scan::decode_mcu_inlined, true);
        assert_eq!(chosen, portable, "the two builds of the decoder disagree");
        let by_codes = decode_all_with(s, data, start, Scan::decode_mcu, false);
        assert_eq!(
            chosen, by_codes,
            "decoding with and without whole symbols disagrees"
        );
        chosen
    }

    type DecodeMcu = fn(&mut Scan, &[u8], &mut [Option<&mut [i16; 64]>]) -> Result<Step, Anomaly>;

    fn decode_all_with(
        s: &Stream,
        data: &[u8],
        start: usize,
        decode_mcu: DecodeMcu,
        whole: bool,
    ) -> Result<(Vec<[i16; 64]>, usize), Anomaly> {
        let mut scan = scan_with(s, start, whole);
        let mut out = Vec::new();
        loop {
            let mut blocks = vec![[0i16; 64]; s.specs.len()];
            let mut refs: Vec<Option<&mut [i16; 64]>> = blocks.iter_mut().map(Some).collect();
            let step = decode_mcu(&mut scan, data, &mut refs)?;
            out.extend(blocks);
            if let Step::Done(pos) = step {
                return Ok((out, pos));
            }
        }
    }

    #[test]
    fn decodes_what_was_encoded() {
        let mut rng = Rng(0x5EED_1234_ABCD_0001);
        let layouts: [&[usize]; 5] = [&[1], &[1, 1, 1], &[4, 1, 1], &[2, 1, 1], &[1, 1, 1, 1]];
        for round in 0..60 {
            let comps = layouts[round % layouts.len()];
            let mcus = rng.below(40) + 1;
            let interval = [0, 1, 3, 7][round % 4];
            let s = stream(&mut rng, comps, mcus, interval);
            // The scan starts after some header bytes, as in a file.
            let mut data = vec![0x12; 7];
            data.extend(&s.data);
            let (blocks, pos) = decode_all(&s, &data, 7).expect("a valid stream decodes");
            assert_eq!(blocks.len(), s.blocks.len());
            for (i, (got, want)) in blocks.iter().zip(&s.blocks).enumerate() {
                assert_eq!(got, want, "round {round}, block {i}");
            }
            // Handed back at or before the EOI marker, after every data byte.
            let eoi = data.len() - 2;
            assert!(pos <= eoi && data[pos..eoi].iter().all(|&b| b != 0xFF || pos == eoi));
        }
    }

    /// An MCU's output: the blocks `keep` names, `None` for the others (decoded and dropped).
    fn kept<'a>(
        blocks: &'a mut [[i16; 64]],
        keep: &impl Fn(usize) -> bool,
    ) -> Vec<Option<&'a mut [i16; 64]>> {
        blocks
            .iter_mut()
            .enumerate()
            .map(|(b, block)| keep(b).then_some(block))
            .collect()
    }

    /// Decodes every MCU of `s` asking only for the blocks `keep` names (the others are
    /// dropped); per MCU, its blocks (zeros where dropped) and whether it was handed out from
    /// an interval decoded ahead.
    fn mcu_by_mcu(s: &Stream, keep: impl Fn(usize) -> bool) -> Vec<(Vec<[i16; 64]>, bool)> {
        let mut sc = scan(s, 0);
        (0..s.mcus)
            .map(|_| {
                let mut blocks = vec![[0i16; 64]; s.specs.len()];
                sc.decode_mcu(&s.data, &mut kept(&mut blocks, &keep))
                    .expect("decodes");
                (blocks, sc.serving)
            })
            .collect()
    }

    #[test]
    fn intervals_are_decoded_in_pairs() {
        let mut rng = Rng(31);
        let s = stream(&mut rng, &[4, 1, 1], 7, 2);
        let serving: Vec<bool> = mcu_by_mcu(&s, |_| true).into_iter().map(|m| m.1).collect();
        // Intervals 0 and 1 together, then 2 and 3 (MCU 6 is the last interval's only one).
        assert_eq!(serving, [false, false, true, true, false, false, false]);
    }

    #[test]
    fn dropped_blocks_keep_the_stream_in_step() {
        let mut rng = Rng(77);
        let s = stream(&mut rng, &[2, 1, 1], 12, 5);
        let kept: Vec<[i16; 64]> = mcu_by_mcu(&s, |b| b == 1)
            .into_iter()
            .map(|m| m.0[1])
            .collect();
        let want: Vec<_> = s.blocks.iter().skip(1).step_by(4).copied().collect();
        assert_eq!(kept, want);
    }

    #[test]
    fn fill_bytes_before_markers_are_skipped() {
        let mut rng = Rng(99);
        let s = stream(&mut rng, &[1, 1, 1], 9, 2);
        // Encoders may put 0xFF fill bytes before a marker: libjpeg skips them.
        let mut data = Vec::new();
        let mut i = 0;
        while i < s.data.len() {
            if s.data[i] == 0xFF && s.data.get(i + 1).is_some_and(|&m| m != 0) {
                data.extend([0xFF, 0xFF, 0xFF]);
            }
            data.push(s.data[i]);
            i += 1;
        }
        let (blocks, _) = decode_all(&s, &data, 0).expect("decodes");
        assert_eq!(blocks, s.blocks);
    }

    /// A one-component scan of `mcus` blocks coded with `dc` and `ac`, without restarts.
    fn gray_scan(dc: &Code, ac: &Code, mcus: u64) -> Scan {
        let tables = vec![
            HuffTable::new(&dc.counts, &dc.symbols, TableClass::Dc, true).unwrap(),
            HuffTable::new(&ac.counts, &ac.symbols, TableClass::Ac, true).unwrap(),
        ];
        let spec = BlockSpec {
            component: 0,
            dc: 0,
            ac: 1,
        };
        Scan::new(tables, vec![spec], 0, mcus, 0).unwrap()
    }

    #[test]
    fn overlong_runs_land_on_the_last_coefficient() {
        // libjpeg's zigzag table maps positions past 63 to 63: a run of 15 zeros from
        // position 60 writes there instead of outside the block.
        let dc = code(&[0, 1, 5, 1, 1, 1, 1, 1, 1], &(0..12).collect::<Vec<u8>>());
        let ac = code(&[0, 2], &[0xF1, 0x00]);
        let mut w = Writer::default();
        w.symbol(&dc, 0);
        for _ in 0..4 {
            w.symbol(&ac, 0xF1); // 15 zeros, then a 1-bit value
            w.bits(1, 1);
        }
        w.marker(0xD9);
        let mut sc = gray_scan(&dc, &ac, 1);
        let mut block = [0i16; 64];
        sc.decode_mcu(&w.out, &mut [Some(&mut block)]).unwrap();
        let mut want = [0i16; 64];
        for k in [16, 32, 48] {
            want[usize::from(NATURAL_ORDER[k])] = 1;
        }
        want[63] = 1; // k = 64 → NATURAL_ORDER[64] = 63
        assert_eq!(block, want);
    }

    #[test]
    fn zero_size_symbols_end_the_block_or_skip_sixteen() {
        // libjpeg: a zero-size AC symbol is a run of 16 zeros when its run is 15 and ends the
        // block otherwise (0x00, but also 0x20 and the like, which encoders never write).
        let dc = code(&[0, 1, 5, 1, 1, 1, 1, 1, 1], &(0..12).collect::<Vec<u8>>());
        let ac = code(&[0, 3, 1], &[0x01, 0xF0, 0x20, 0x00]);
        let mut w = Writer::default();
        for end in [0x20u8, 0x00] {
            w.symbol(&dc, 0);
            w.symbol(&ac, 0x01); // 1 at zigzag 1
            w.bits(1, 1);
            w.symbol(&ac, 0xF0); // 16 zeros: zigzag 2-17
            w.symbol(&ac, 0x01); // 1 at zigzag 18
            w.bits(1, 1);
            w.symbol(&ac, end);
        }
        w.marker(0xD9);
        let mut sc = gray_scan(&dc, &ac, 2);
        let mut want = [0i16; 64];
        want[usize::from(NATURAL_ORDER[1])] = 1;
        want[usize::from(NATURAL_ORDER[18])] = 1;
        for _ in 0..2 {
            let mut block = [0i16; 64];
            sc.decode_mcu(&w.out, &mut [Some(&mut block)]).unwrap();
            assert_eq!(block, want);
        }
    }

    #[test]
    fn what_libjpeg_recovers_from_is_an_anomaly() {
        let mut rng = Rng(5);
        let s = stream(&mut rng, &[1, 1, 1], 6, 2);
        assert!(decode_all(&s, &s.data, 0).is_ok());
        let markers: Vec<usize> = (0..s.data.len() - 1)
            .filter(|&i| s.data[i] == 0xFF && s.data[i + 1] != 0)
            .collect();
        // A restart marker out of sequence.
        let mut wrong = s.data.clone();
        wrong[markers[0] + 1] = 0xD3;
        assert_eq!(
            decode_all(&s, &wrong, 0).unwrap_err(),
            Anomaly("a restart marker missing or out of order")
        );
        // An interval cut short: the decoder would need libjpeg's zero padding.
        let mut cut = s.data[..markers[0] - 6].to_vec();
        cut.extend(&s.data[markers[0]..]);
        assert!(decode_all(&s, &cut, 0).is_err());
        // No marker after the data (libjpeg would suspend).
        let open = &s.data[..s.data.len() - 2];
        assert_eq!(
            decode_all(&s, open, 0).unwrap_err(),
            Anomaly("the data ends without a marker")
        );
        // A code no table holds: sixteen 1 bits where a DC code starts.
        let mut bad = vec![0xFF, 0x00, 0xFF, 0x00];
        bad.extend(&s.data);
        assert_eq!(
            decode_all(&s, &bad, 0).unwrap_err(),
            Anomaly("a Huffman code no table holds")
        );
        // The same in an interval decoded ahead (the second, decoded alongside the first).
        let mut bad_ahead = s.data[..markers[0] + 2].to_vec();
        bad_ahead.extend([0xFF, 0x00, 0xFF, 0x00]);
        bad_ahead.extend(&s.data[markers[0] + 2..]);
        assert_eq!(
            decode_all(&s, &bad_ahead, 0).unwrap_err(),
            Anomaly("a Huffman code no table holds")
        );
        // Fill bytes before a stuffed zero inside the data (libjpeg's fast and slow paths
        // disagree on them).
        let stuffed = (0..s.data.len() - 1)
            .find(|&i| s.data[i] == 0xFF && s.data[i + 1] == 0)
            .expect("a stuffed zero");
        let mut filled = s.data[..stuffed].to_vec();
        filled.push(0xFF);
        filled.extend(&s.data[stuffed..]);
        assert_eq!(
            decode_all(&s, &filled, 0).unwrap_err(),
            Anomaly("0xFF fill bytes inside the data")
        );
        // More MCUs than the frame has.
        let mut sc = scan(&s, 0);
        let mut blocks = [[0i16; 64]; 3];
        for _ in 0..s.mcus {
            let mut refs: Vec<Option<&mut [i16; 64]>> = blocks.iter_mut().map(Some).collect();
            sc.decode_mcu(&s.data, &mut refs).unwrap();
        }
        let mut refs: Vec<Option<&mut [i16; 64]>> = blocks.iter_mut().map(Some).collect();
        assert_eq!(
            sc.decode_mcu(&s.data, &mut refs).unwrap_err(),
            Anomaly("more MCUs than the frame has")
        );
    }

    /// The bits libjpeg reads from `pos` on, after the `skip` first: the data bytes with their
    /// stuffed zeros taken out, up to the first marker.
    fn bits_from(data: &[u8], mut pos: usize, skip: u32) -> Vec<bool> {
        let mut out = Vec::new();
        while pos < data.len() {
            let byte = data[pos];
            if byte == 0xFF {
                if data.get(pos + 1) != Some(&0) {
                    break;
                }
                pos += 1;
            }
            pos += 1;
            out.extend((0..8).rev().map(|i| byte >> i & 1 == 1));
        }
        out.split_off((skip as usize).min(out.len()))
    }

    #[test]
    fn resume_points_are_where_libjpeg_stands() {
        // Scans whose data a marker cuts short (inserted, or replacing the rest of the data),
        // in every layout, with restart markers or without, in intervals decoded one by one
        // or two in step, short and past several checkpoints: the decoder stops at the first
        // MCU that reads past the cut, and says where libjpeg would stand at its start. That state is checked against the
        // encoder's: the next bits libjpeg would read from it (those of its bit buffer, then
        // the data after `pos`) are the MCU's bits as written, up to the cut; the predictions,
        // the restart count and the restart marker expected are the encoder's.
        let mut rng = Rng(0x2E5B_3E00_0000_0026);
        let (mut resumed, mut checked_bits) = (0, 0usize);
        for case in 0..600 {
            let comps: &[usize] = [&[1][..], &[1, 1, 1], &[4, 1, 1], &[2, 1, 1]][case % 4];
            let interval = [0, 1, 2, 3, 5][case / 4 % 5];
            // Scans past a few checkpoints too (every `CHECKPOINT_MCUS` MCUs).
            let mcus = if case % 3 == 0 {
                CHECKPOINT_MCUS + rng.below(3 * CHECKPOINT_MCUS)
            } else {
                4 + rng.below(40)
            };
            let s = stream(&mut rng, comps, mcus, interval);
            let end = s.data.len() - 2;
            // A cut at a byte boundary, never inside an FF 00 pair or at a marker.
            let at = 1 + rng.below(end as u64 - 1) as usize;
            if s.data[at - 1] == 0xFF || s.data[at..].starts_with(&[0xFF]) && s.data[at + 1] != 0 {
                continue;
            }
            let mut damaged = s.data[..at].to_vec();
            if rng.below(2) == 0 {
                damaged.extend([0xFF, 0xFE]);
                damaged.extend(&s.data[at..]);
            } else {
                damaged.extend([0xFF, 0xD9]);
            }
            let mut scan = scan(&s, 0);
            let outcome = loop {
                let mut blocks = vec![[0i16; 64]; s.specs.len()];
                let mut refs: Vec<Option<&mut [i16; 64]>> = blocks.iter_mut().map(Some).collect();
                match scan.decode_mcu(&damaged, &mut refs) {
                    Ok(Step::More) => {}
                    other => break other,
                }
            };
            if outcome.is_ok() {
                continue; // the cut fell in an interval's fill bits
            }
            let Some(r) = scan.resume_point() else {
                panic!("case {case}: no resume point after {outcome:?}");
            };
            resumed += 1;
            let g = (s.mcus - r.mcus_left) as usize;
            let (byte, bit, preds) = s.mcu_starts[g];
            let ri = u64::from(interval);
            // At an interval's first MCU, libjpeg stands before its restart marker (a restart
            // pending) or, when the decoder read the marker before failing, just after it
            // (a whole interval to go): where stock libjpeg stands before and after its
            // `process_restart`.
            let pending = ri > 0 && g > 0 && (g as u64).is_multiple_of(ri) && r.restarts_to_go == 0;
            let expected_left = match ri {
                0 => 0,
                _ if pending => 0,
                _ => ri - g as u64 % ri,
            };
            assert_eq!(u64::from(r.restarts_to_go), expected_left, "case {case}");
            if let Some(interval_index) = (g as u64).checked_div(ri) {
                let next = (interval_index + u64::from(!pending)).wrapping_sub(1) & 7;
                assert_eq!(u64::from(r.next_restart), next, "case {case}");
            }
            if !pending {
                assert_eq!(r.predictions, preds, "case {case}");
            }
            if pending {
                // libjpeg drops what its buffer holds and reads the marker: only the last
                // byte's fill bits may be left, and no data before the marker.
                assert!(r.bits_left < 8, "case {case}: {} bits left", r.bits_left);
                assert!(bits_from(&damaged, r.pos, 0).is_empty(), "case {case}");
                continue;
            }
            // The bits from the resume point: the bit buffer's, then the data's.
            let mut ours: Vec<bool> = (0..r.bits_left)
                .rev()
                .map(|i| r.get_buffer >> i & 1 == 1)
                .collect();
            ours.extend(bits_from(&damaged, r.pos, 0));
            // The MCU's bits as written, up to the cut (the damaged data's stop at its marker).
            let theirs = bits_from(&s.data, byte, bit);
            let n = ours.len().min(theirs.len());
            assert_eq!(ours[..n], theirs[..n], "case {case}: MCU {g}, {n} bits");
            assert!(r.pos <= at, "case {case}: read past the cut");
            checked_bits += n;
        }
        assert!(resumed > 300, "{resumed} resume points");
        assert!(checked_bits > 100_000, "{checked_bits} bits compared");
    }

    #[test]
    fn a_frame_far_larger_than_its_data_stops_at_the_first_mcu_past_it() {
        // The scan of 40 MCUs, but a frame of a million: libjpeg would go on on zeros to the
        // end of the frame, and so did this decoder (to find out only there that the segment
        // ran out). The anomaly now comes at the first MCU that reads past the data.
        for interval in [0, 8] {
            let mut rng = Rng(0xF4A3);
            let mut s = stream(&mut rng, &[1, 1, 1], 40, interval);
            assert!(decode_all(&s, &s.data, 0).is_ok());
            s.mcus = 1_000_000;
            let mut sc = scan(&s, 0);
            let mut blocks = [[0i16; 64]; 3];
            let mut decoded = 0u64;
            let anomaly = loop {
                let mut refs: Vec<Option<&mut [i16; 64]>> = blocks.iter_mut().map(Some).collect();
                match sc.decode_mcu(&s.data, &mut refs) {
                    Ok(Step::More) => decoded += 1,
                    Ok(Step::Done(_)) => panic!("a million MCUs from the data of 40"),
                    Err(anomaly) => break anomaly,
                }
            };
            // The 40 MCUs and at most one more (the EOI's bytes and the reader's look-ahead
            // may hold a few bits that decode as one).
            assert!(
                (40..=41).contains(&decoded),
                "interval {interval}: {decoded} MCUs"
            );
            assert!(
                matches!(
                    anomaly,
                    Anomaly(
                        "a segment ran out of data" | "a restart marker missing or out of order"
                    )
                ),
                "interval {interval}: {anomaly:?}"
            );
        }
    }

    #[test]
    fn tables_libjpeg_refuses_are_refused() {
        let symbols = [0u8; 256];
        let mut counts = [0u8; 17];
        counts[1] = 3; // three 1-bit codes
        assert!(HuffTable::new(&counts, &symbols, TableClass::Ac, true).is_none());
        let mut counts = [0u8; 17];
        counts[16] = 255;
        counts[15] = 2; // 257 codes
        assert!(HuffTable::new(&counts, &symbols, TableClass::Dc, false).is_none());
    }

    #[test]
    fn tables_built_in_place_read_codes_longer_than_a_lookup() {
        // Two 13-bit codes and nothing shorter: lengths 1 to 12 hold no code, and a window of
        // zeros must not be read as a code of any of them (libjpeg's `maxcode` of -1).
        let mut counts = [0u8; 17];
        counts[13] = 2;
        let mut symbols = [0u8; 256];
        symbols[..2].copy_from_slice(&[5, 9]);
        // 0000000000000 (5), 0000000000001 (9), then ones.
        let data = [0x00, 0x00, 0x00, 0x7F, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF];
        let mut blanks = HuffTable::blanks(2).expect("memory");
        for (table, whole) in blanks.iter_mut().zip([false, true]) {
            table
                .build(&counts, &symbols, TableClass::Ac, whole)
                .expect("a valid table");
            let mut bits = Bits::at(0);
            bits.refill(&data);
            assert_eq!(bits.symbol(table), Ok(5));
            assert_eq!(bits.symbol(table), Ok(9));
        }
    }

    #[test]
    fn ff_detection() {
        assert!(!has_ff(0x0102_0304_0506_07FE));
        for i in 0..8 {
            assert!(has_ff(0xFFu64 << (8 * i)));
            assert!(has_ff(0x7F7F_7F7F_7F7F_7F7F | 0xFFu64 << (8 * i)));
        }
        assert!(!has_ff(0x7F7F_7F7F_7F7F_7F7F));
        assert_eq!(find_marker(&[1, 0xFF, 0, 0xFF, 0xFF, 0xD9], 0), Some(5));
        assert_eq!(find_marker(&[1, 0xFF, 0], 0), None);
    }

    /// Where the data was handed back, or the anomaly and the MCU it reached libjpeg's side at.
    type PipelineEnd = Result<usize, (u64, Anomaly)>;

    /// Every MCU of `s` through a [`Pipeline`] (the Huffman decoding on a helper thread), the
    /// blocks `keep` names asked for (zeros elsewhere): the blocks, and where the data was
    /// handed back, or the anomaly and the MCU it reached libjpeg's side at.
    fn through_pipeline(
        s: &Stream,
        data: &[u8],
        start: usize,
        keep: impl Fn(usize) -> bool,
    ) -> (Vec<[i16; 64]>, PipelineEnd) {
        through_planned(s, data, start, keep, Plan::every(0, 0, 0))
    }

    /// [`through_pipeline`] with libjpeg's thread decoding the intervals `plan` gives it.
    fn through_planned(
        s: &Stream,
        data: &[u8],
        start: usize,
        keep: impl Fn(usize) -> bool,
        plan: Plan,
    ) -> (Vec<[i16; 64]>, PipelineEnd) {
        let sc = scan(s, start);
        // SAFETY: `data` outlives the pipeline, dropped at the end of this function.
        let mut pipeline =
            unsafe { Pipeline::start_planned(sc, data.as_ptr(), data.len(), start, s.mcus, plan) }
                .expect("started");
        let mut out = Vec::new();
        for k in 0..s.mcus {
            let mut blocks = vec![[0i16; 64]; s.specs.len()];
            let step = pipeline.next_mcu(data, &mut kept(&mut blocks, &keep));
            out.extend(blocks);
            match step {
                Ok(Step::More) => {}
                Ok(Step::Done(pos)) => return (out, Ok(pos)),
                Err(anomaly) => return (out, Err((k, anomaly))),
            }
        }
        panic!("no Done after {} MCUs", s.mcus);
    }

    #[test]
    fn a_helper_thread_gives_the_blocks_of_the_inline_decoder() {
        let mut rng = Rng(0x000B_10C5);
        let layouts: [&[usize]; 5] = [&[1], &[1, 1, 1], &[4, 1, 1], &[2, 1, 1], &[1, 1, 1, 1]];
        for round in 0..10 {
            let comps = layouts[round % layouts.len()];
            // Up to ~3 000 MCUs: the ring (4 096 blocks) wraps around several times, and the
            // helper waits for free slots.
            let mcus = [1, 7, 9, 700, 3000][round % 5] + rng.below(50);
            let interval = [0, 1, 5, 64, 0][round % 5];
            let s = stream(&mut rng, comps, mcus, interval);
            let mut data = vec![0x12; 3];
            data.extend(&s.data);
            let (want, want_pos) = decode_all(&s, &data, 3).expect("decodes inline");
            let (got, pos) = through_pipeline(&s, &data, 3, |_| true);
            assert_eq!(pos.ok(), Some(want_pos), "round {round}");
            assert!(got == want, "round {round}: blocks differ");
            // libjpeg's thread taking one interval in 2, 3 or 4 (whatever the data's density).
            for period in [2, 3, 4] {
                let plan = Plan::every(period, interval, s.mcus);
                let (got, pos) = through_planned(&s, &data, 3, |_| true, plan);
                assert_eq!(pos.ok(), Some(want_pos), "round {round}, period {period}");
                assert!(got == want, "round {round}, period {period}: blocks differ");
            }
            // Dropped blocks are dropped (zeros), the kept ones are right.
            let (got, _) = through_pipeline(&s, &data, 3, |b| b.is_multiple_of(2));
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let kept = (i % s.specs.len()).is_multiple_of(2);
                assert_eq!(
                    *g,
                    if kept { *w } else { [0; 64] },
                    "round {round} block {i}"
                );
            }
        }
    }

    #[test]
    fn an_anomaly_on_the_helper_reaches_libjpegs_side() {
        let mut rng = Rng(0xBAD);
        for (interval, mcus) in [(0, 2000), (4, 2000), (0, 30)] {
            let s = stream(&mut rng, &[2, 1, 1], mcus, interval);
            // An end-of-image marker in the middle of the data (the segment runs out of bits),
            // or data that ends early.
            let mut early = s.data.clone();
            let at = early.len() / 2;
            early.splice(at..at, [0xFF, 0xD9]);
            let cut = s.data[..s.data.len() / 3].to_vec();
            for data in [early, cut] {
                assert!(
                    decode_all(&s, &data, 0).is_err(),
                    "the inline decoder sees it"
                );
                let (got, result) = through_pipeline(&s, &data, 0, |_| true);
                let Err((k, _)) = result else {
                    panic!("the pipeline missed an anomaly ({interval}, {mcus})");
                };
                // libjpeg's thread decoding every other interval sees it too.
                let plan = Plan::every(2, interval, s.mcus);
                let (_, planned) = through_planned(&s, &data, 0, |_| true, plan);
                assert!(planned.is_err(), "({interval}, {mcus}) planned");
                // Everything handed out before it is what the inline decoder gives.
                let n = s.specs.len();
                let mut sc = scan(&s, 0);
                for m in 0..k as usize {
                    let mut blocks = vec![[0i16; 64]; n];
                    let mut refs: Vec<Option<&mut [i16; 64]>> =
                        blocks.iter_mut().map(Some).collect();
                    sc.decode_mcu(&data, &mut refs).expect("before the anomaly");
                    assert_eq!(&got[m * n..(m + 1) * n], &blocks[..], "MCU {m}");
                }
            }
        }
    }

    #[test]
    fn damage_around_the_calling_threads_intervals_is_seen_as_on_one_thread() {
        // Restart markers renumbered, bytes dropped, zeros and fill bytes inserted just before
        // or after each marker: with the calling thread decoding one interval in two or three,
        // the outcome must be the one-thread decoder's (the same blocks and end, or an anomaly).
        let mut rng = Rng(0x0000_51DE);
        let s = stream(&mut rng, &[2, 1, 1], 40, 4);
        let markers: Vec<usize> = (0..s.data.len() - 1)
            .filter(|&i| s.data[i] == 0xFF && (0xD0..=0xD7).contains(&s.data[i + 1]))
            .collect();
        assert_eq!(markers.len(), 9);
        let mut seen = [0usize; 2];
        for &at in &markers {
            let mut variants = Vec::new();
            let mut renumbered = s.data.clone();
            renumbered[at + 1] = 0xD0 + ((renumbered[at + 1] + 1) & 7);
            variants.push(renumbered);
            for (offset, insert) in [(0usize, 0x00u8), (0, 0xFF), (2, 0x00), (2, 0xFF)] {
                let mut v = s.data.clone();
                v.insert(at + offset, insert);
                variants.push(v);
            }
            for offset in [1usize, 3] {
                let mut v = s.data.clone();
                v.remove(at - 1 + offset - 1);
                variants.push(v);
            }
            for data in &variants {
                let want = decode_all(&s, data, 0);
                for period in [2, 3] {
                    let plan = Plan::every(period, s.restart_interval, s.mcus);
                    let (got, end) = through_planned(&s, data, 0, |_| true, plan);
                    match (&want, end) {
                        (Ok((blocks, pos)), Ok(end)) => {
                            assert_eq!(end, *pos, "marker at {at}, period {period}");
                            assert!(got == *blocks, "marker at {at}, period {period}");
                            seen[0] += 1;
                        }
                        (Err(_), Err(_)) => seen[1] += 1,
                        (want, end) => panic!(
                            "marker at {at}, period {period}: one thread {:?}, planned {:?}",
                            want.as_ref().map(|w| w.1),
                            end.map_err(|e| e.0)
                        ),
                    }
                }
            }
        }
        // Both outcomes occur: the damage is not all caught, nor all harmless.
        assert!(seen[0] > 0 && seen[1] > 0, "{seen:?}");
    }

    #[test]
    fn a_pipeline_dropped_early_stops_its_helper() {
        let mut rng = Rng(0xD20);
        let s = stream(&mut rng, &[4, 1, 1], 5000, 0);
        for taken in [0, 1, 700, 4999] {
            let sc = scan(&s, 0);
            // SAFETY: `s.data` outlives the pipeline, dropped in this iteration.
            let mut pipeline =
                unsafe { Pipeline::start(sc, s.data.as_ptr(), s.data.len(), 0, s.mcus) }.unwrap();
            for _ in 0..taken {
                let mut blocks = [[0i16; 64]; 6];
                let mut refs: Vec<Option<&mut [i16; 64]>> = blocks.iter_mut().map(Some).collect();
                assert_eq!(pipeline.next_mcu(&s.data, &mut refs).unwrap(), Step::More);
            }
            // The helper is blocked on a full ring (or still decoding): dropping must stop and
            // join it, not hang.
            drop(pipeline);
        }
        // More MCUs than the scan has, or an MCU of the wrong size, are anomalies.
        let s = stream(&mut rng, &[1], 3, 0);
        let mut pipeline =
            // SAFETY: as above.
            unsafe { Pipeline::start(scan(&s, 0), s.data.as_ptr(), s.data.len(), 0, 3) }.unwrap();
        let mut two = [[0i16; 64]; 2];
        let mut refs: Vec<Option<&mut [i16; 64]>> = two.iter_mut().map(Some).collect();
        assert!(pipeline.next_mcu(&s.data, &mut refs).is_err());
        for _ in 0..3 {
            let mut one = [0i16; 64];
            assert!(pipeline.next_mcu(&s.data, &mut [Some(&mut one)]).is_ok());
        }
        let mut one = [0i16; 64];
        assert!(pipeline.next_mcu(&s.data, &mut [Some(&mut one)]).is_err());
    }
}
