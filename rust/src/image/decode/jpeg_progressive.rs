//! Huffman decoding of progressive JPEG scans, in place of libjpeg-turbo's `jdphuff.c`.
//!
//! A progressive file sends each block's coefficients in several scans: the DC coefficients
//! first (of all components, in interleaved MCUs), then bands of AC coefficients of one
//! component at a time, and with successive approximation the high bits of each first and one
//! more bit per refinement scan. libjpeg-turbo reads these scans with a byte-at-a-time bit
//! reader and an 8-bit code lookup, and walks a refinement band coefficient by coefficient;
//! here the bit reader is [`Bits`] (8 bytes a refill), an AC code and its value bits are one
//! lookup ([`Whole`]), a refinement visits only the nonzero coefficients (a zigzag mask), and
//! a scan of one component is decoded a block row per call ([`ProgressiveScan::decode_row`]),
//! passing over the blocks of an end-of-band run that read no bits a run at a time:
//! about 0.55–0.8× of the time of libjpeg's progressive decode on real photos. (A progressive
//! photo still costs about twice its baseline twin: libjpeg keeps every coefficient of the image
//! and each scan walks them again.) For each scan, `jpeg_shim.c` calls libjpeg's own
//! `start_pass` (which checks the scan's parameters, builds its tables and records the
//! progression in `coef_bits`, all of which the output pass reads) and then hands the scan's
//! MCUs to [`ProgressiveScan::decode_mcu`]; the coefficient buffer, block smoothing, the IDCT,
//! upsampling and colour conversion stay libjpeg-turbo's.
//!
//! The coefficients written are exactly `jdphuff.c`'s on every stream this decoder accepts:
//! its four MCU decoders are followed step by step (DC first: a difference added to the
//! prediction, shifted left by `Al`, truncated to 16 bits; DC refinement: one bit OR-ed in; AC
//! first: runs, values shifted by `Al`, end-of-band runs of `2^r` plus `r` bits; AC
//! refinement: a new coefficient of `±2^Al` after `r` zero positions, one correction bit for
//! every nonzero coefficient passed, including in end-of-band runs), with libjpeg's indices past
//! the band landing where its extended `jpeg_natural_order` puts them, and restart markers
//! resetting the predictions and the end-of-band run. What libjpeg recovers from in its own way
//! is an [`Anomaly`] (a code no table holds, a segment that runs out of bits, a restart marker
//! missing or out of order, a DC prediction that overflows, libjpeg's `JERR_BAD_DCT_COEF`, more
//! MCUs than the scan has), and libjpeg takes the scan over at the block where it happened, as
//! for baseline scans (`jpeg_huffman.rs`): an MCU that fails commits nothing, and a refinement
//! block first takes back the coefficients it made nonzero
//! ([`ProgressiveScan::resume_point`]); after a refinement run past its band, which may have
//! overwritten a coefficient, the image is decoded again without the hook.

use super::jpeg_huffman::{
    extend, Anomaly, Bits, HuffTable, Resume, Step, FAST_BITS, MAX_BLOCKS_IN_MCU, NATURAL_ORDER,
};

const NO_BLOCK: Anomaly = Anomaly("an MCU without its blocks");

/// Which of `jdphuff.c`'s four MCU decoders a scan takes (by its `Ss` and `Ah`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pass {
    /// `Ss = 0`, `Ah = 0`: DC differences of every block of the MCU.
    DcFirst,
    /// `Ss = 0`, `Ah > 0`: one more bit of each block's DC coefficient.
    DcRefine,
    /// `Ss > 0`, `Ah = 0`: a band of one component's AC coefficients, one block per MCU.
    AcFirst,
    /// `Ss > 0`, `Ah > 0`: one more bit of a band, one block per MCU.
    AcRefine,
}

/// A progressive scan's parameters, as libjpeg has checked them in `start_pass`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Band {
    pub(crate) ss: u8,
    pub(crate) se: u8,
    pub(crate) ah: u8,
    pub(crate) al: u8,
}

impl Band {
    /// The pass of a band libjpeg accepts (`start_pass_phuff_decoder`'s checks, and one block
    /// per MCU for AC scans); `None` for any other.
    pub(crate) fn pass(&self, blocks_in_mcu: usize) -> Option<Pass> {
        let Band { ss, se, ah, al } = *self;
        if al > 13 || (ah != 0 && al + 1 != ah) || se > 63 || ss > se {
            return None;
        }
        match (ss, ah) {
            (0, _) if se != 0 => None,
            (0, 0) => Some(Pass::DcFirst),
            (0, _) => Some(Pass::DcRefine),
            _ if blocks_in_mcu != 1 => None,
            (_, 0) => Some(Pass::AcFirst),
            _ => Some(Pass::AcRefine),
        }
    }
}

/// An AC scan's symbols decoded whole by one lookup of the next [`FAST_BITS`] bits, where the
/// code and the bits after it fit: a coefficient (AC first: its value shifted by `Al`; AC
/// refinement: `±2^Al` by its sign bit) after a run of zeros, a run of 16 zeros, or an
/// end-of-band run with its length bits. Entries: the bits used in 0–3 (0: decode the slow
/// way), the kind in 4–5 ([`Whole::COEFFICIENT`], [`Whole::SIXTEEN_ZEROS`],
/// [`Whole::END_OF_BAND`]), the run in 6–9, the value or the end-of-band run in 16–31.
pub(crate) struct Whole(Vec<u32>);

impl Whole {
    const COEFFICIENT: u32 = 1;
    const SIXTEEN_ZEROS: u32 = 2;
    const END_OF_BAND: u32 = 3;

    /// The lookups of `table` for an AC scan of `pass` (`AcFirst` or `AcRefine`) and `band`;
    /// `None` for a DC pass or when the memory is not there.
    pub(crate) fn new(table: &HuffTable, pass: Pass, band: Band) -> Option<Self> {
        let refine = match pass {
            Pass::AcFirst => false,
            Pass::AcRefine => true,
            Pass::DcFirst | Pass::DcRefine => return None,
        };
        let p1 = 1i16 << band.al;
        let mut entries = Vec::new();
        entries.try_reserve_exact(1 << FAST_BITS).ok()?;
        for window in 0..1u32 << FAST_BITS {
            let entry = table.short_code(window).map_or(0, |(len, symbol)| {
                let (run, size) = (u32::from(symbol >> 4), u32::from(symbol & 15));
                // The `n` bits after the code, if they are in the window.
                let after = |n: u32| {
                    (len + n <= FAST_BITS)
                        .then(|| (window >> (FAST_BITS - len - n)) & ((1 << n) - 1))
                };
                let pack = |used: u32, kind: u32, value: u32| {
                    used | kind << 4 | run << 6 | (value & 0xFFFF) << 16
                };
                match (size, run) {
                    (0, 15) => pack(len, Self::SIXTEEN_ZEROS, 0),
                    (0, _) => after(run).map_or(0, |raw| {
                        pack(len + run, Self::END_OF_BAND, (1 << run) + raw)
                    }),
                    _ if refine => after(1).map_or(0, |sign| {
                        let value = if sign != 0 { p1 } else { p1.wrapping_neg() };
                        pack(len + 1, Self::COEFFICIENT, u32::from(value as u16))
                    }),
                    _ => after(size).map_or(0, |raw| {
                        let value = (extend(raw, size) as u32).wrapping_shl(u32::from(band.al));
                        pack(len + size, Self::COEFFICIENT, value)
                    }),
                }
            });
            entries.push(entry);
        }
        Some(Self(entries))
    }

    #[inline(always)]
    fn get(&self, bits: &Bits) -> u32 {
        // The window has `FAST_BITS` bits, the table `1 << FAST_BITS` entries.
        self.0[bits.peek(FAST_BITS) as usize & ((1 << FAST_BITS) - 1)]
    }
}

/// AC scans of fewer blocks decode without [`Whole`]: building its 2 048 entries costs more
/// than a few hundred blocks gain from them.
const WHOLE_MIN_BLOCKS: u64 = 256;

/// What [`ProgressiveScan::mcus`] decodes: one MCU (its blocks), or a row of one-block MCUs.
enum Mcus<'a, 'b> {
    One(&'a mut [Option<&'b mut [i16; 64]>]),
    Row(&'a mut [[i16; 64]]),
}

/// The state of one progressive scan being decoded.
pub(crate) struct ProgressiveScan {
    pass: Pass,
    band: Band,
    /// Per block of the MCU: its component in the scan and the index of its table in `tables`
    /// (the DC table for [`Pass::DcFirst`], the AC table for the AC passes, unused for
    /// [`Pass::DcRefine`]).
    blocks: Vec<(usize, usize)>,
    tables: Vec<HuffTable>,
    /// An AC scan's whole-symbol lookups (for scans of at least [`WHOLE_MIN_BLOCKS`] blocks).
    whole: Option<Whole>,
    restart_interval: u32,
    left_in_interval: u32,
    next_restart: u8,
    mcus_left: u64,
    /// The scan's MCUs, and per block row (a scan of one component whose rows the caller
    /// hands over whole, [`Self::decode_row`]; else 0).
    total_mcus: u64,
    mcus_per_row: u64,
    predictions: [i32; 4],
    /// Blocks still to pass over in the current end-of-band run (`jdphuff.c`'s `EOBRUN`).
    eobrun: u32,
    bits: Bits,
    /// A failed refinement block overwrote a coefficient it cannot restore: no resume point.
    lost: bool,
    /// After an anomaly: where libjpeg can take the scan over, and how many blocks of the row
    /// [`Self::decode_row`] was decoding came before the one it stopped in.
    failed: Option<Resume>,
    failed_after: usize,
}

impl ProgressiveScan {
    /// A scan of `band` over `mcus` MCUs of `blocks` (component below 4, table index into
    /// `tables`), with a restart marker every `restart_interval` MCUs (0: none), starting at
    /// `start` in the data; `None` for a band [`Band::pass`] declines.
    pub(crate) fn new(
        band: Band,
        tables: Vec<HuffTable>,
        blocks: Vec<(usize, usize)>,
        restart_interval: u32,
        mcus: u64,
        start: usize,
    ) -> Option<Self> {
        let pass = band.pass(blocks.len())?;
        let needs_table = pass != Pass::DcRefine;
        let fits = |&(component, table): &(usize, usize)| {
            component < 4 && (!needs_table || table < tables.len())
        };
        if blocks.is_empty() || blocks.len() > MAX_BLOCKS_IN_MCU || !blocks.iter().all(fits) {
            return None;
        }
        // An AC scan has one block per MCU and one table.
        let whole = match tables.first() {
            Some(table) if mcus >= WHOLE_MIN_BLOCKS => Whole::new(table, pass, band),
            _ => None,
        };
        Some(Self {
            pass,
            band,
            blocks,
            tables,
            whole,
            restart_interval,
            left_in_interval: restart_interval,
            next_restart: 0,
            mcus_left: mcus,
            total_mcus: mcus,
            mcus_per_row: 0,
            predictions: [0; 4],
            eobrun: 0,
            bits: Bits::at(start),
            lost: false,
            failed: None,
            failed_after: 0,
        })
    }

    /// The number of blocks in an MCU.
    pub(crate) fn blocks_in_mcu(&self) -> usize {
        self.blocks.len()
    }

    /// The scan of one component whose blocks come in rows of `mcus_per_row` (0: not known,
    /// or several components), the blocks of a row one after another in memory: then
    /// [`Self::row_blocks`] may exceed 1.
    pub(crate) fn with_rows(mut self, mcus_per_row: u32) -> Self {
        if self.blocks.len() == 1 {
            self.mcus_per_row = u64::from(mcus_per_row);
        }
        self
    }

    /// How many blocks [`Self::decode_row`] takes next: the rest of the current block row
    /// (MCUs go row by row, left to right), short of the scan's last MCU, which
    /// [`Self::decode_mcu`] decodes alone; 1 when the scan's rows are not known.
    pub(crate) fn row_blocks(&self) -> usize {
        if self.mcus_per_row == 0 {
            return 1;
        }
        let left_in_row =
            self.mcus_per_row - (self.total_mcus - self.mcus_left) % self.mcus_per_row;
        // At most `mcus_per_row`, a u32.
        left_in_row.min(self.mcus_left.saturating_sub(1)).max(1) as usize
    }

    /// Decodes the next MCU into `out` (one block per [`Self::blocks_in_mcu`], in order,
    /// holding what the scans before this one wrote; a `None` block is an anomaly).
    pub(crate) fn decode_mcu(
        &mut self,
        data: &[u8],
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<Step, Anomaly> {
        if out.len() != self.blocks.len() {
            return Err(Anomaly("an MCU of another size"));
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("bmi2") {
            // SAFETY: `mcus_bmi2` only requires the CPU to have BMI2, checked just above.
            return unsafe { self.mcus_bmi2(data, Mcus::One(out)) };
        }
        self.mcus::<false>(data, Mcus::One(out))
    }

    /// After [`Self::decode_mcu`] or [`Self::decode_row`] failed: where libjpeg's decoder
    /// would stand at the start of the MCU (block) it failed in, with that block as the scans
    /// before left it but for the correction bits already applied (which libjpeg's refinement
    /// does not apply twice: it tests the bit first); `None` when the decoder cannot say.
    pub(crate) fn resume_point(&self) -> Option<Resume> {
        self.failed
    }

    /// After [`Self::decode_row`] failed: how many blocks of the row came before the one it
    /// stopped in (decoded, and final).
    pub(crate) fn blocks_before_failure(&self) -> usize {
        self.failed_after
    }

    /// The state of the MCU a failure left (an MCU that fails commits nothing), as libjpeg's
    /// `phuff_entropy_decoder` holds it; `None` past the scan's last MCU (its end did not
    /// check out) and where the reader cannot say ([`Bits::for_libjpeg`]).
    #[cold]
    #[inline(never)]
    fn note_failure(&mut self, after: usize) {
        self.failed_after = after;
        self.failed = (self.mcus_left > 0 && !self.lost)
            .then(|| {
                Resume::at(
                    &self.bits,
                    self.predictions,
                    self.left_in_interval,
                    self.next_restart,
                    self.mcus_left,
                    self.eobrun,
                )
            })
            .flatten();
    }

    /// Decodes the next `row.len()` MCUs of a scan of one component, one block each, into
    /// `row` (the rest of a block row: at most [`Self::row_blocks`]).
    pub(crate) fn decode_row(
        &mut self,
        data: &[u8],
        row: &mut [[i16; 64]],
    ) -> Result<Step, Anomaly> {
        if self.blocks.len() != 1 || row.len() > self.row_blocks() {
            return Err(Anomaly("a row of blocks longer than the scan's"));
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("bmi2") {
            // SAFETY: `mcus_bmi2` only requires the CPU to have BMI2, checked just above.
            return unsafe { self.mcus_bmi2(data, Mcus::Row(row)) };
        }
        self.mcus::<false>(data, Mcus::Row(row))
    }

    /// [`Self::mcus`] compiled with BMI2: one-cycle variable shifts for the bit reader, and
    /// `pdep` to find where a refinement's run of zeros ends and which coefficients its
    /// correction bits raise.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "bmi2")]
    unsafe fn mcus_bmi2(&mut self, data: &[u8], mcus: Mcus<'_, '_>) -> Result<Step, Anomaly> {
        self.mcus::<true>(data, mcus)
    }

    /// Decodes one MCU, or a row of one-block MCUs, each after the restart marker due before
    /// it; then, after the scan's last MCU, checks the scan's end. `BMI2`: compiled into a
    /// function with BMI2 enabled, on a CPU that has it.
    #[inline(always)]
    fn mcus<const BMI2: bool>(&mut self, data: &[u8], mcus: Mcus<'_, '_>) -> Result<Step, Anomaly> {
        match mcus {
            Mcus::One(out) => {
                if let Err(anomaly) = self.mcu::<BMI2>(data, out) {
                    self.note_failure(0);
                    return Err(anomaly);
                }
            }
            Mcus::Row(row) => {
                let mut i = 0;
                while i < row.len() {
                    i += self.pass_run(&row[i..]);
                    if let Some(block) = row.get_mut(i) {
                        if let Err(anomaly) = self.mcu::<BMI2>(data, &mut [Some(block)]) {
                            self.note_failure(i);
                            return Err(anomaly);
                        }
                        i += 1;
                    }
                }
            }
        }
        if self.mcus_left > 0 {
            return Ok(Step::More);
        }
        if let Err(anomaly) = self.bits.segment_end(data) {
            self.failed = None;
            return Err(anomaly);
        }
        Ok(Step::Done(self.bits.position()))
    }

    /// One MCU (`out`: its blocks). An MCU that fails commits nothing (the reader, the
    /// predictions, the end-of-band run and the counts stay those of its start, or of the
    /// start of the interval a restart marker just began), and a refinement block that fails
    /// loses the coefficients it made nonzero: libjpeg can decode it again from there.
    #[inline(always)]
    fn mcu<const BMI2: bool>(
        &mut self,
        data: &[u8],
        out: &mut [Option<&mut [i16; 64]>],
    ) -> Result<(), Anomaly> {
        if self.mcus_left == 0 {
            return Err(Anomaly("more MCUs than the frame has"));
        }
        if self.restart_interval != 0 && self.left_in_interval == 0 {
            self.restart(data)?;
        }
        let mut bits = self.bits;
        let mut eobrun = self.eobrun;
        // A refinement block's nonzero coefficients as it came (see `undo`), and how it failed.
        let mut before = 0;
        let mut refinement_failed = None;
        match self.pass {
            Pass::DcFirst => {
                let al = u32::from(self.band.al);
                let mut predictions = self.predictions;
                for (&(component, table), block) in self.blocks.iter().zip(out.iter_mut()) {
                    let block = block.as_deref_mut().ok_or(NO_BLOCK)?;
                    let prediction = &mut predictions[component];
                    let diff = bits.dc_difference(data, &self.tables[table])?;
                    // libjpeg refuses a sum that leaves `int` (JERR_BAD_DCT_COEF).
                    *prediction = prediction
                        .checked_add(diff)
                        .ok_or(Anomaly("a DC coefficient out of range"))?;
                    block[0] = (*prediction as u32).wrapping_shl(al) as i16;
                }
                if let Some(anomaly) = bits.anomaly() {
                    return Err(anomaly);
                }
                self.predictions = predictions;
            }
            Pass::DcRefine => {
                let p1 = 1i16 << self.band.al;
                for block in out.iter_mut() {
                    let block = block.as_deref_mut().ok_or(NO_BLOCK)?;
                    bits.refill(data);
                    if bits.peek(1) != 0 {
                        block[0] |= p1;
                    }
                    bits.consume(1);
                }
            }
            Pass::AcFirst => {
                if eobrun > 0 {
                    eobrun -= 1;
                } else {
                    let table = &self.tables[self.blocks[0].1];
                    let block = out[0].as_deref_mut().ok_or(NO_BLOCK)?;
                    let whole = self.whole.as_ref();
                    eobrun = ac_first(&mut bits, data, table, whole, self.band, block)?;
                }
            }
            Pass::AcRefine => {
                let (table, whole) = (&self.tables[self.blocks[0].1], self.whole.as_ref());
                let block = out[0].as_deref_mut().ok_or(NO_BLOCK)?;
                let run = ac_refine::<BMI2>(
                    &mut bits,
                    data,
                    (table, whole),
                    self.band,
                    eobrun,
                    block,
                    &mut before,
                );
                match run {
                    Ok(run) => eobrun = run,
                    Err(anomaly) => refinement_failed = Some(anomaly),
                }
            }
        }
        if let Some(anomaly) = refinement_failed.or_else(|| bits.anomaly()) {
            if self.pass == Pass::AcRefine {
                if let Some(block) = out[0].as_deref_mut() {
                    self.undo(block, before);
                }
            }
            return Err(anomaly);
        }
        self.bits = bits;
        self.eobrun = eobrun;
        if self.restart_interval != 0 {
            self.left_in_interval -= 1;
        }
        self.mcus_left -= 1;
        Ok(())
    }

    /// Takes back the coefficients a failed refinement block made nonzero: those of the band
    /// nonzero now but not in `before` (its nonzero ones as it came, zigzag mask), which held
    /// zero, so that libjpeg's walk over the block sees what the scans before left (the
    /// correction bits applied stay: libjpeg tests a coefficient's bit before adding it). A
    /// walk that ran past the band (corrupt data; `before` all ones) may have written over a
    /// coefficient that was not zero: then libjpeg cannot take the scan over (`lost`; the image
    /// is decoded again).
    #[cold]
    #[inline(never)]
    fn undo(&mut self, block: &mut [i16; 64], before: u64) {
        if before == u64::MAX {
            self.lost = true;
            return;
        }
        let in_band = span(u32::from(self.band.ss), u32::from(self.band.se) + 1);
        let mut made = nonzero_zigzag(block) & in_band & !before;
        while made != 0 {
            block[usize::from(NATURAL_ORDER[made.trailing_zeros() as usize])] = 0;
            made &= made - 1;
        }
    }

    /// Passes over the first blocks of `row` that the current end-of-band run covers and that
    /// read no bits: in an AC-first scan every block of the run (`jdphuff.c` only counts
    /// `EOBRUN` down), in a refinement scan those with no nonzero coefficient in the band (no
    /// correction bits); stops before a restart marker is due. Returns how many it passed.
    ///
    /// One call per run instead of a [`Self::mcu`] per block: a progressive file can send a
    /// scan per coefficient, each one end-of-band run over millions of blocks (a 36 KB file of
    /// 99 such scans over 4000 × 4000 gray pixels: 0.39 s block by block, 0.18 s a run at a
    /// time, Pillow 0.28 s).
    #[inline(always)]
    fn pass_run(&mut self, row: &[[i16; 64]]) -> usize {
        if self.eobrun == 0 {
            return 0;
        }
        let mut n = row.len().min(self.eobrun as usize);
        if self.restart_interval != 0 {
            n = n.min(self.left_in_interval as usize);
        }
        n = n.min(usize::try_from(self.mcus_left).unwrap_or(usize::MAX));
        match self.pass {
            Pass::AcFirst => {}
            Pass::AcRefine => {
                let (ss, se) = (usize::from(self.band.ss), usize::from(self.band.se));
                let in_band = span(ss as u32, se as u32 + 1);
                let reads = |block: &[i16; 64]| {
                    if se - ss < 8 {
                        // A narrow band: its few coefficients looked at one by one.
                        NATURAL_ORDER[ss..=se]
                            .iter()
                            .any(|&at| block[usize::from(at)] != 0)
                    } else {
                        nonzero_zigzag(block) & in_band != 0
                    }
                };
                n = row[..n].iter().position(reads).unwrap_or(n);
            }
            Pass::DcFirst | Pass::DcRefine => return 0,
        }
        // `n` is at most each of these.
        self.eobrun -= n as u32;
        self.mcus_left -= n as u64;
        if self.restart_interval != 0 {
            self.left_in_interval -= n as u32;
        }
        n
    }

    fn restart(&mut self, data: &[u8]) -> Result<(), Anomaly> {
        let at = self.bits.segment_end(data)?;
        if data.get(at) != Some(&(0xD0 + self.next_restart)) {
            return Err(Anomaly("a restart marker missing or out of order"));
        }
        self.next_restart = (self.next_restart + 1) & 7;
        self.predictions = [0; 4];
        self.eobrun = 0;
        self.left_in_interval = self.restart_interval;
        self.bits = Bits::at(at + 1);
        Ok(())
    }
}

/// An AC symbol with what follows its code.
enum AcSymbol {
    /// A coefficient after `run` zeros: AC first, its value shifted by `Al`; AC refinement,
    /// `±2^Al` by its sign bit (libjpeg reads one sign bit whatever the size).
    Coefficient { run: u32, value: i16 },
    /// A run of 16 zeros (ZRL).
    SixteenZeros,
    /// An end-of-band run of this many blocks (this one included).
    EndOfBand(u32),
}

/// The next AC symbol, by one lookup in `whole` when the code and its bits fit.
#[inline(always)]
fn ac_symbol(
    bits: &mut Bits,
    data: &[u8],
    table: &HuffTable,
    whole: Option<&Whole>,
    band: Band,
    refine: bool,
) -> Result<AcSymbol, Anomaly> {
    // At least 32 bits: a code (at most 16) and its value or run length (at most 15).
    bits.refill(data);
    if let Some(whole) = whole {
        let e = whole.get(bits);
        if e != 0 {
            bits.consume(e & 15);
            let run = (e >> 6) & 15;
            return Ok(match (e >> 4) & 3 {
                Whole::COEFFICIENT => AcSymbol::Coefficient {
                    run,
                    value: (e >> 16) as u16 as i16,
                },
                Whole::SIXTEEN_ZEROS => AcSymbol::SixteenZeros,
                _ => AcSymbol::EndOfBand(e >> 16),
            });
        }
    }
    let symbol = bits.symbol(table)?;
    let (run, size) = (symbol >> 4, symbol & 15);
    Ok(if size != 0 {
        let value = if refine {
            let p1 = 1i16 << band.al;
            let sign = bits.peek(1);
            bits.consume(1);
            if sign != 0 {
                p1
            } else {
                p1.wrapping_neg()
            }
        } else {
            (bits.value(size) as u32).wrapping_shl(u32::from(band.al)) as i16
        };
        AcSymbol::Coefficient { run, value }
    } else if run == 15 {
        AcSymbol::SixteenZeros
    } else {
        let mut blocks = 1u32 << run;
        if run != 0 {
            blocks += bits.peek(run);
            bits.consume(run);
        }
        AcSymbol::EndOfBand(blocks)
    })
}

/// `decode_mcu_AC_first` for one block not in an end-of-band run: the band's first bits, each
/// value shifted left by `Al`. Returns the end-of-band run left after this block.
#[inline(always)]
fn ac_first(
    bits: &mut Bits,
    data: &[u8],
    table: &HuffTable,
    whole: Option<&Whole>,
    band: Band,
    block: &mut [i16; 64],
) -> Result<u32, Anomaly> {
    let se = usize::from(band.se);
    let mut k = usize::from(band.ss);
    while k <= se {
        match ac_symbol(bits, data, table, whole, band, false)? {
            AcSymbol::Coefficient { run, value } => {
                // `k + run` stays below 79; past the band it lands where libjpeg's extended
                // natural order puts it (position 63).
                k += run as usize;
                block[usize::from(NATURAL_ORDER[k & 127])] = value;
                k += 1;
            }
            AcSymbol::SixteenZeros => k += 16,
            AcSymbol::EndOfBand(blocks) => return Ok(blocks - 1),
        }
    }
    Ok(0)
}

/// Zigzag index of each natural position (the inverse of [`NATURAL_ORDER`]'s first 64).
const ZIGZAG_INDEX: [u8; 64] = {
    let mut table = [0u8; 64];
    let mut k = 0;
    while k < 64 {
        table[NATURAL_ORDER[k] as usize] = k as u8;
        k += 1;
    }
    table
};

/// `ZIGZAG_BITS[i][b]`: the zigzag-order bits of the natural positions `8 i + j` for each bit
/// `j` set in `b` (a natural-order mask turned into a zigzag-order one a byte at a time).
static ZIGZAG_BITS: [[u64; 256]; 8] = {
    let mut table = [[0u64; 256]; 8];
    let mut i = 0;
    while i < 8 {
        let mut b = 0;
        while b < 256 {
            let mut mask = 0u64;
            let mut j = 0;
            while j < 8 {
                if b >> j & 1 != 0 {
                    mask |= 1 << ZIGZAG_INDEX[8 * i + j];
                }
                j += 1;
            }
            table[i][b] = mask;
            b += 1;
        }
        i += 1;
    }
    table
};

/// Bit `p` set when coefficient `p` (natural order) of `block` is nonzero.
#[inline(always)]
fn nonzero_natural(block: &[i16; 64]) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{
            __m128i, _mm_cmpeq_epi16, _mm_loadu_si128, _mm_movemask_epi8, _mm_packs_epi16,
            _mm_setzero_si128,
        };
        let mut zero = 0u64;
        let base = block.as_ptr().cast::<__m128i>();
        for half in 0..4 {
            // SAFETY: SSE2 is part of x86_64; `base.add(2 * half)` and the vector after it
            // cover coefficients 16 half .. 16 half + 16 of the 64-element block (unaligned
            // loads).
            let bits = unsafe {
                let z = _mm_setzero_si128();
                let lo = _mm_cmpeq_epi16(_mm_loadu_si128(base.add(2 * half)), z);
                let hi = _mm_cmpeq_epi16(_mm_loadu_si128(base.add(2 * half + 1)), z);
                _mm_movemask_epi8(_mm_packs_epi16(lo, hi)) as u32 as u64
            };
            zero |= bits << (16 * half);
        }
        !zero
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        block
            .iter()
            .enumerate()
            .fold(0u64, |m, (p, &c)| m | (u64::from(c != 0) << p))
    }
}

/// Bit `k` set when the coefficient at zigzag index `k` of `block` is nonzero.
#[inline(always)]
fn nonzero_zigzag(block: &[i16; 64]) -> u64 {
    let natural = nonzero_natural(block);
    let mut zigzag = 0;
    for (i, row) in ZIGZAG_BITS.iter().enumerate() {
        zigzag |= row[(natural >> (8 * i)) as usize & 255];
    }
    zigzag
}

/// Zigzag indices `from..to` as a mask (`from <= to <= 64`).
#[inline(always)]
fn span(from: u32, to: u32) -> u64 {
    let below_to = if to >= 64 { u64::MAX } else { (1u64 << to) - 1 };
    below_to & !((1u64 << from) - 1)
}

/// `pdep`: the bits of `value`, lowest first, deposited on the set bits of `mask`, lowest
/// first. `BMI2` is true only in [`ProgressiveScan::decode_mcu_bmi2`], compiled with BMI2 and
/// called only on a CPU that has it.
#[inline(always)]
fn deposit<const BMI2: bool>(value: u64, mut mask: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if BMI2 {
        // SAFETY: `BMI2` is true only inside `decode_mcu_bmi2`, which runs only after
        // `is_x86_feature_detected!("bmi2")` (see `deposit`'s contract above).
        return unsafe { std::arch::x86_64::_pdep_u64(value, mask) };
    }
    let mut out = 0;
    let mut bit = 0;
    while mask != 0 {
        let lowest = mask & mask.wrapping_neg();
        if bit < 64 && value >> bit & 1 != 0 {
            out |= lowest;
        }
        mask ^= lowest;
        bit += 1;
    }
    out
}

/// The correction bits of the `count` nonzero coefficients marked in `reversed`, one each,
/// lowest zigzag index first. Masks here are *reversed*: zigzag index `k` is bit `63 - k`, so
/// the first bit read, the MSB of the next `count`, lands on the highest set bit by a plain
/// `pdep` (no bit reversal on the way). Up to 32 bits (almost always) are read at once without
/// a branch on their number, which is on the decoder's critical path. Returns the reversed
/// mask of the coefficients whose bit is set.
#[inline(always)]
fn correction_bits<const BMI2: bool>(
    bits: &mut Bits,
    data: &[u8],
    mut reversed: u64,
    count: u32,
) -> u64 {
    debug_assert_eq!(count, reversed.count_ones());
    if count <= 32 {
        bits.refill(data);
        // The next `count` bits (0 to 32), the first read in bit `count - 1`; 0 for none.
        let word = bits.peek_up_to_32(count);
        bits.consume(count);
        return deposit::<BMI2>(u64::from(word), reversed);
    }
    let mut raised = 0;
    while reversed != 0 {
        bits.refill(data);
        let left = reversed.count_ones();
        let count = left.min(32);
        // The next `count` bits (1 to 32), for the `count` highest set bits of `reversed`.
        let word = u64::from(bits.peek(count));
        bits.consume(count);
        let chunk = if count == left {
            reversed
        } else {
            // The highest `count` set bits: all but the lowest `left - count`.
            reversed & !deposit::<BMI2>((1u64 << (left - count)) - 1, reversed)
        };
        reversed &= !chunk;
        raised |= deposit::<BMI2>(word, chunk);
    }
    raised
}

/// Applies correction bits to the coefficients marked in `raised` (a reversed mask: zigzag
/// index `k` is bit `63 - k`): one whose bit at `p1` is not set yet grows in magnitude by `p1`
/// (`jdphuff.c`'s `*thiscoef += p1` or `m1`, in 16 bits; the sign without a branch).
#[inline(always)]
fn raise(block: &mut [i16; 64], mut raised: u64, p1: i16) {
    while raised != 0 {
        let k = raised.leading_zeros() as usize;
        raised ^= (1u64 << 63) >> k;
        let coef = &mut block[usize::from(NATURAL_ORDER[k])];
        let sign = *coef >> 15; // 0 or -1
        let step = (p1 ^ sign).wrapping_sub(sign); // p1 or -p1
        let unset = -i16::from(*coef & p1 == 0); // -1 when the bit is not set yet
        *coef = coef.wrapping_add(step & unset);
    }
}

/// `decode_mcu_AC_refine` for one block, `eobrun` blocks into an end-of-band run (0: none).
/// Returns the run left after this block. `before` receives the band's nonzero coefficients
/// (zigzag mask) as the block came, so that a failure can take back the ones it made nonzero;
/// all ones when the walk ran past the band (corrupt data: its last symbol may have written over
/// a coefficient that was not zero).
///
/// libjpeg walks the band coefficient by coefficient; here a mask of the band's nonzero
/// coefficients (which get a correction bit each) tells where each run of zeros ends, so only
/// the nonzero coefficients are visited. Coefficients made nonzero by this scan lie behind the
/// walk, so the mask taken at the start stays right for what is ahead of it.
#[inline(always)]
fn ac_refine<const BMI2: bool>(
    bits: &mut Bits,
    data: &[u8],
    (table, whole): (&HuffTable, Option<&Whole>),
    band: Band,
    mut eobrun: u32,
    block: &mut [i16; 64],
    before: &mut u64,
) -> Result<u32, Anomaly> {
    let (ss, se) = (u32::from(band.ss), u32::from(band.se));
    // `1 << Al` in 16 bits: Al is at most 13.
    let p1 = 1i16 << band.al;
    let in_band = span(ss, se + 1);
    let nonzero = nonzero_zigzag(block) & in_band;
    *before = nonzero;
    // The same, reversed (zigzag index `k` in bit `63 - k`), for `correction_bits`.
    let nonzero_reversed = nonzero.reverse_bits();
    // The coefficients whose correction bit is set (reversed), applied at the end: each
    // correction depends only on the coefficient as the earlier scans left it (the new ones
    // this scan writes lie on zero coefficients, behind the walk).
    let mut raised = 0;
    let mut k = ss;
    if eobrun == 0 {
        while k <= se {
            let (run, new) = match ac_symbol(bits, data, table, whole, band, true)? {
                AcSymbol::Coefficient { run, value } => (run, value),
                AcSymbol::SixteenZeros => (15, 0),
                AcSymbol::EndOfBand(blocks) => {
                    eobrun = blocks;
                    break;
                }
            };
            // libjpeg passes the nonzero coefficients (a correction bit each) and `run` zero
            // ones, and stops on the zero one after them; without one in the band, at `Se + 1`.
            let zeros = !nonzero & in_band & !((1u64 << k) - 1);
            let target = deposit::<BMI2>(1 << run, zeros);
            let stop = if target == 0 {
                se + 1
            } else {
                target.trailing_zeros()
            };
            // Between `k` and `stop` lie the `run` zero coefficients passed; the rest are
            // nonzero (when the band ended first, they are counted). Zigzag `k..stop` is
            // reversed bits `64 - stop..64 - k` (`k` is at least `Ss`, 1).
            let passed = nonzero_reversed & span(64 - stop, 64 - k);
            let count = if target == 0 {
                passed.count_ones()
            } else {
                stop - k - run
            };
            raised |= correction_bits::<BMI2>(bits, data, passed, count);
            k = stop;
            if new != 0 {
                // `k` is at most `Se + 1`: past 63 it lands on 63, as libjpeg's table has it.
                block[usize::from(NATURAL_ORDER[k as usize & 127])] = new;
            }
            k += 1;
        }
        if k > se + 1 {
            *before = u64::MAX;
        }
    }
    if eobrun > 0 {
        if k <= se {
            let rest = nonzero_reversed & span(63 - se, 64 - k);
            raised |= correction_bits::<BMI2>(bits, data, rest, rest.count_ones());
        }
        eobrun -= 1;
    }
    raise(block, raised, p1);
    Ok(eobrun)
}

#[cfg(test)]
mod tests {
    use super::super::jpeg_huffman::tests::Rng;
    use super::super::jpeg_huffman::TableClass;
    use super::*;

    fn bmi2() -> bool {
        #[cfg(target_arch = "x86_64")]
        return std::arch::is_x86_feature_detected!("bmi2");
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Every symbol a refinement scan uses: a new coefficient after a run (`r << 4 | 1`), a run
    /// of 16 (`0xF0`) and the end-of-band runs (`r << 4`, r < 15): 15 codes of 4 bits and 15 of
    /// 8 (the last 8-bit code, all ones, is left out as libjpeg requires, so random data also
    /// meets a code no table holds).
    fn refine_table() -> HuffTable {
        let mut counts = [0u8; 17];
        counts[4] = 15;
        counts[8] = 15;
        let mut symbols = [0u8; 256];
        let all: Vec<u8> = (0..16u8)
            .map(|r| r << 4 | 1)
            .chain((0..15u8).map(|r| r << 4))
            .chain(std::iter::once(0xF0))
            .collect();
        symbols[..30].copy_from_slice(&all[..30]);
        HuffTable::new(&counts, &symbols, TableClass::Ac, false).unwrap()
    }

    /// `decode_mcu_AC_refine`'s walk as `jdphuff.c` writes it, coefficient by coefficient.
    fn walk_refine(
        bits: &mut Bits,
        data: &[u8],
        table: &HuffTable,
        band: Band,
        mut eobrun: u32,
        block: &mut [i16; 64],
    ) -> Result<u32, Anomaly> {
        let (se, p1) = (usize::from(band.se), 1i16 << band.al);
        let m1 = p1.wrapping_neg();
        let correction = |bits: &mut Bits, coef: &mut i16| {
            bits.refill(data);
            if bits.peek(1) != 0 && *coef & p1 == 0 {
                *coef = coef.wrapping_add(if *coef >= 0 { p1 } else { m1 });
            }
            bits.consume(1);
        };
        let mut k = usize::from(band.ss);
        if eobrun == 0 {
            while k <= se {
                bits.refill(data);
                let symbol = bits.symbol(table)?;
                let (mut r, s) = ((symbol >> 4) as i32, symbol & 15);
                let mut new = 0;
                if s != 0 {
                    new = if bits.peek(1) != 0 { p1 } else { m1 };
                    bits.consume(1);
                } else if r != 15 {
                    eobrun = 1 << r;
                    if r != 0 {
                        eobrun += bits.peek(r as u32);
                        bits.consume(r as u32);
                    }
                    break;
                }
                loop {
                    let pos = usize::from(NATURAL_ORDER[k]);
                    if block[pos] != 0 {
                        correction(bits, &mut block[pos]);
                    } else {
                        r -= 1;
                        if r < 0 {
                            break;
                        }
                    }
                    k += 1;
                    if k > se {
                        break;
                    }
                }
                if new != 0 {
                    block[usize::from(NATURAL_ORDER[k])] = new;
                }
                k += 1;
            }
        }
        if eobrun > 0 {
            for &pos in NATURAL_ORDER.get(k..=se).unwrap_or(&[]) {
                let pos = usize::from(pos);
                if block[pos] != 0 {
                    correction(bits, &mut block[pos]);
                }
            }
            eobrun -= 1;
        }
        Ok(eobrun)
    }

    /// Earlier scans' coefficients: mostly zero, the others multiples of `2 << al` of either
    /// sign, and now and then one with the bit at `al` already set (which must stay as it is).
    fn earlier_block(rng: &mut Rng, al: u8) -> [i16; 64] {
        let mut block = [0i16; 64];
        let density = rng.below(100);
        for c in block.iter_mut() {
            if rng.below(100) < density {
                let magnitude = (1 + rng.below(6) as i32) << (al + 1);
                let magnitude = magnitude | i32::from(rng.below(10) == 0) << al;
                *c = (if rng.below(2) == 0 {
                    magnitude
                } else {
                    -magnitude
                }) as i16;
            }
        }
        block
    }

    fn random_data(rng: &mut Rng, len: usize) -> Vec<u8> {
        let mut data: Vec<u8> = (0..len).map(|_| rng.below(255) as u8).collect();
        data.extend_from_slice(&[0xFF, 0xD9]);
        data
    }

    #[test]
    fn deposit_is_pdep() {
        let mut rng = Rng(0x5EED_0001);
        for _ in 0..20_000 {
            let (value, mask) = (rng.next() >> rng.below(64), rng.next() & rng.next());
            let mut want = 0u64;
            let mut next = 0;
            for bit in 0..64 {
                if mask >> bit & 1 != 0 {
                    want |= (value >> next & 1) << bit;
                    next += 1;
                }
            }
            assert_eq!(deposit::<false>(value, mask), want, "{value:x} {mask:x}");
            if bmi2() {
                assert_eq!(deposit::<true>(value, mask), want, "{value:x} {mask:x}");
            }
        }
    }

    #[test]
    fn refinement_matches_libjpegs_walk() {
        let table = refine_table();
        let mut rng = Rng(0x5EED_0002);
        let (mut blocks, mut anomalies, mut undoable, mut overwrites) = (0, 0, 0, 0);
        for _ in 0..1500 {
            let ss = 1 + rng.below(63) as u8;
            let se = ss + rng.below(u64::from(64 - ss)) as u8;
            let al = rng.below(14) as u8;
            let band = Band {
                ss,
                se,
                ah: al + 1,
                al,
            };
            let len = 16 + rng.below(400) as usize;
            let data = random_data(&mut rng, len);
            // Each variant with and without the whole-symbol lookups, in turn.
            let lookups = Whole::new(&table, Pass::AcRefine, band).unwrap();
            let (with, without) = (Some(&lookups), None);
            let (fast_whole, bmi2_whole) = if rng.below(2) == 0 {
                (with, without)
            } else {
                (without, with)
            };
            let (mut want_bits, mut fast_bits, mut bmi2_bits) =
                (Bits::at(0), Bits::at(0), Bits::at(0));
            let (mut want_run, mut fast_run, mut bmi2_run) = (0u32, 0u32, 0u32);
            for _ in 0..40 {
                let earlier = earlier_block(&mut rng, al);
                let (mut want, mut fast, mut with_bmi2) = (earlier, earlier, earlier);
                let expected =
                    walk_refine(&mut want_bits, &data, &table, band, want_run, &mut want);
                let mut before = 0u64;
                let got = ac_refine::<false>(
                    &mut fast_bits,
                    &data,
                    (&table, fast_whole),
                    band,
                    fast_run,
                    &mut fast,
                    &mut before,
                );
                assert_eq!(got, expected);
                // The band's nonzero coefficients as the block came (zigzag), as the undo
                // after a failure needs them (all ones once the walk ran past the band).
                let came: u64 = (usize::from(ss)..=usize::from(se))
                    .filter(|&k| earlier[usize::from(NATURAL_ORDER[k])] != 0)
                    .fold(0, |m, k| m | 1 << k);
                let past = usize::from(NATURAL_ORDER[usize::from(se) + 1]);
                // A correction bit grows a nonzero coefficient away from +-2^Al: only a write
                // past the band can leave one there that was not zero.
                let p1 = 1i16 << al;
                let overwritten = earlier[past] != 0
                    && earlier[past] != want[past]
                    && (want[past] == p1 || want[past] == -p1);
                if expected.is_ok() && before != u64::MAX {
                    assert_eq!(before, came);
                    assert!(!overwritten, "position {past} overwritten");
                    // The undo gives back the block as it came but for the correction bits.
                    let mut scan = ProgressiveScan::new(band, vec![table], vec![(0, 0)], 0, 1, 0)
                        .expect("an AC refinement scan");
                    let mut undone = fast;
                    scan.undo(&mut undone, before);
                    assert!(!scan.lost);
                    for p in 0..64 {
                        let zero_before = earlier[p] == 0;
                        assert_eq!(undone[p] == 0, zero_before, "position {p}");
                    }
                    undoable += 1;
                } else if expected.is_ok() {
                    overwrites += usize::from(overwritten);
                } else {
                    assert_eq!(before, came);
                }
                if bmi2() {
                    let got = ac_refine::<true>(
                        &mut bmi2_bits,
                        &data,
                        (&table, bmi2_whole),
                        band,
                        bmi2_run,
                        &mut with_bmi2,
                        &mut 0,
                    );
                    assert_eq!(got, expected);
                    // After an anomaly the image goes back to libjpeg: the block does not matter.
                    if expected.is_ok() {
                        assert_eq!(with_bmi2, want);
                        assert_eq!(bmi2_bits.taken(), want_bits.taken());
                    }
                }
                let Ok(run) = expected else {
                    anomalies += 1;
                    break;
                };
                assert_eq!(fast, want, "band {ss}..={se}, al {al}");
                assert_eq!(fast_bits.taken(), want_bits.taken());
                (want_run, fast_run, bmi2_run) = (run, run, run);
                blocks += 1;
            }
        }
        // Both outcomes were exercised, most blocks decoded, most of them within their band.
        assert!(
            blocks > 20_000 && anomalies > 30 && undoable > blocks / 2 && overwrites > 0,
            "{blocks} blocks, {anomalies} anomalies, {undoable} undoable, {overwrites} overwrites"
        );
    }

    /// AC-first symbols: values of sizes 1 to 10 after runs, a run of 16, end-of-band runs of
    /// up to 2^14 blocks; 15 codes of 4 bits and 15 of 8, then 63 of 14 bits, so that some
    /// codes and values fit the whole-symbol window and others do not.
    fn first_table() -> HuffTable {
        let mut counts = [0u8; 17];
        counts[4] = 15;
        counts[8] = 15;
        counts[14] = 63;
        let mut symbols = [0u8; 256];
        let all: Vec<u8> = (0..16u8)
            .flat_map(|r| (1..=10u8).map(move |size| r << 4 | size))
            .chain((0..15u8).map(|r| r << 4))
            .chain(std::iter::once(0xF0))
            .collect();
        // Short codes for the common symbols: small values after short runs, end of band.
        let mut order: Vec<u8> = all.clone();
        order.sort_by_key(|&sym| (sym >> 4) + (sym & 15));
        symbols[..93].copy_from_slice(&order[..93]);
        HuffTable::new(&counts, &symbols, TableClass::Ac, false).unwrap()
    }

    #[test]
    fn whole_symbol_lookups_decode_as_symbol_by_symbol() {
        let table = first_table();
        let mut rng = Rng(0x5EED_0003);
        let mut blocks = 0;
        for _ in 0..1000 {
            let ss = 1 + rng.below(63) as u8;
            let se = ss + rng.below(u64::from(64 - ss)) as u8;
            let al = rng.below(14) as u8;
            let band = Band { ss, se, ah: 0, al };
            let whole = Whole::new(&table, Pass::AcFirst, band).unwrap();
            let len = 16 + rng.below(300) as usize;
            let data = random_data(&mut rng, len);
            let (mut slow_bits, mut fast_bits) = (Bits::at(0), Bits::at(0));
            for _ in 0..20 {
                let (mut slow, mut fast) = ([0i16; 64], [0i16; 64]);
                let want = ac_first(&mut slow_bits, &data, &table, None, band, &mut slow);
                let got = ac_first(&mut fast_bits, &data, &table, Some(&whole), band, &mut fast);
                assert_eq!(got, want);
                if want.is_err() {
                    break;
                }
                assert_eq!(fast, slow, "band {ss}..={se}, al {al}");
                assert_eq!(fast_bits.taken(), slow_bits.taken());
                blocks += 1;
            }
        }
        assert!(blocks > 5_000, "{blocks}");
    }

    /// A scan of one component decoded a block row per call, as `jpeg_shim.c` hands rows over
    /// (end-of-band runs passed over, [`ProgressiveScan::pass_run`]), and one block per call
    /// leave the same blocks, take the same bits and end the same way: AC-first and refinement
    /// scans of random bands over random data (end-of-band runs of up to 2^14 blocks), with and
    /// without restart markers every few blocks, narrow and wide bands, blocks whose band is
    /// zero and blocks holding earlier scans' coefficients.
    #[test]
    fn rows_decode_as_block_by_block() {
        let (first, refine) = (first_table(), refine_table());
        let mut rng = Rng(0x5EED_0004);
        let (mut runs_passed, mut done, mut anomalies) = (0, 0, 0);
        for case in 0..3000 {
            let refining = case % 2 == 1;
            let ss = 1 + rng.below(63) as u8;
            let width = if rng.below(2) == 0 { 8 } else { 64 };
            let se = ss + rng.below(u64::from(width.min(64 - ss))) as u8;
            let al = rng.below(13) as u8;
            let band = Band {
                ss,
                se,
                ah: if refining { al + 1 } else { 0 },
                al,
            };
            let table = if refining { &refine } else { &first };
            let (w, h) = (1 + rng.below(300) as usize, 1 + rng.below(4) as usize);
            let mcus = (w * h) as u64;
            let interval = if rng.below(3) == 0 {
                1 + rng.below(9) as u32
            } else {
                0
            };
            let data = if interval == 0 {
                let len = 8 + rng.below(200) as usize;
                random_data(&mut rng, len)
            } else {
                // Each interval's bits, then its restart marker; the last segment ends the scan.
                let mut data = Vec::new();
                for i in 0..mcus.div_ceil(u64::from(interval)) {
                    let len = 1 + rng.below(40) as usize;
                    data.extend((0..len).map(|_| rng.below(255) as u8));
                    data.extend_from_slice(&[0xFF, 0xD0 + (i % 8) as u8]);
                }
                data.extend_from_slice(&[0xFF, 0xD9]);
                data
            };
            let start: Vec<[i16; 64]> = (0..w * h)
                .map(|_| match refining {
                    true => earlier_block(&mut rng, al),
                    false => [0; 64],
                })
                .collect();
            let scan = || {
                ProgressiveScan::new(band, vec![*table], vec![(0, 0)], interval, mcus, 0)
                    .unwrap()
                    .with_rows(w as u32)
            };
            let (mut rows, mut ones) = (scan(), scan());
            let (mut by_row, mut by_block) = (start.clone(), start);
            let mut at = 0;
            let by_rows = loop {
                let n = rows.row_blocks();
                let step = if n > 1 {
                    runs_passed += usize::from(rows.eobrun > 1);
                    rows.decode_row(&data, &mut by_row[at..at + n])
                } else {
                    rows.decode_mcu(&data, &mut [Some(&mut by_row[at])])
                };
                at += n;
                match step {
                    Ok(Step::More) => continue,
                    other => break other,
                }
            };
            let one_by_one = by_block
                .iter_mut()
                .map(|block| ones.decode_mcu(&data, &mut [Some(block)]))
                .find(|step| step != &Ok(Step::More))
                .unwrap_or(Err(Anomaly("more blocks than the scan")));
            assert_eq!(by_rows, one_by_one, "case {case}");
            assert_eq!(by_row, by_block, "case {case}");
            assert_eq!(rows.bits.taken(), ones.bits.taken(), "case {case}");
            match by_rows {
                Ok(_) => done += 1,
                Err(_) => anomalies += 1,
            }
        }
        assert!(
            runs_passed > 1000 && done > 500 && anomalies > 500,
            "{runs_passed} rows from within a run, {done} scans done, {anomalies} anomalies"
        );
    }

    #[test]
    fn bands_libjpeg_refuses_are_declined() {
        let band = |ss, se, ah, al| Band { ss, se, ah, al };
        assert_eq!(band(0, 0, 0, 0).pass(3), Some(Pass::DcFirst));
        assert_eq!(band(0, 0, 2, 1).pass(6), Some(Pass::DcRefine));
        assert_eq!(band(1, 63, 0, 13).pass(1), Some(Pass::AcFirst));
        assert_eq!(band(5, 5, 1, 0).pass(1), Some(Pass::AcRefine));
        assert_eq!(band(0, 5, 0, 0).pass(1), None); // a DC scan reaching into AC
        assert_eq!(band(6, 5, 0, 0).pass(1), None); // Ss > Se
        assert_eq!(band(1, 64, 0, 0).pass(1), None); // Se past the block
        assert_eq!(band(1, 63, 0, 0).pass(2), None); // an AC scan of two blocks per MCU
        assert_eq!(band(1, 63, 3, 1).pass(1), None); // Al != Ah - 1
        assert_eq!(band(1, 63, 0, 14).pass(1), None); // Al past 13
    }
}
