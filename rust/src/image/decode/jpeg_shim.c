/*
 * The libjpeg half of src/image/decode/jpeg.rs: the only C in the crate.
 *
 * libjpeg reports fatal errors by calling error_exit, which must not return. Rust cannot catch a
 * longjmp, and unwinding through C frames is undefined, so every libjpeg call happens here,
 * below a setjmp in the same C function; error_exit formats the message and longjmps back, and
 * each entry point returns a status code. No Rust frame is ever between a setjmp and its longjmp.
 *
 * The source manager behaves like Pillow's: running out of data *suspends* the decoder
 * (fill_input_buffer returns FALSE) instead of inserting a fake EOI, and the data is handed over
 * in Pillow's pieces: ImageFile.load reads the file from its start 65 536 bytes at a time
 * (ImageFile.MAXBLOCK) and calls the decoder again after each suspension, so libjpeg sees the
 * first 65 536·k bytes, k growing by one per suspension (smg_feed). This matters after the last
 * scanline: jpeg_finish_decompress reads the markers after the image data only as far as the
 * piece at hand, so a bad marker there is an error when it lies in that piece and is never seen
 * when it lies beyond (Pillow then decodes the image). Suspension before the last scanline with
 * the whole file handed over is the truncation Pillow reports as "image file is truncated";
 * suspension in jpeg_finish_decompress is accepted, as Pillow does. Warnings (corrupt-data
 * recoveries) are ignored, as in Pillow.
 *
 * An entropy hook (jpeg_huffman.rs) may take over Huffman decoding of single-scan sequential
 * files: after jpeg_start_decompress, libjpeg's decode_mcu is replaced by a trampoline into Rust.
 * In progressive files (jpeg_progressive.rs) every scan is offered to it as libjpeg starts the
 * scan, after libjpeg's own start_pass has checked it (the first from the progress monitor, the
 * others from a wrapper around start_pass), all inside jpeg_start_decompress.
 * In a progressive scan of one component, the hook may decode the rest of a block row in one
 * call (see smg_hooked_decode_mcu).
 * The Rust side never calls libjpeg and returns a status; when it reports an anomaly (something
 * libjpeg would recover from in its own way), it also says where libjpeg's own decoder would
 * stand at the start of that MCU (smg_resume_point): the trampoline sets libjpeg's Huffman
 * decoder to that state and lets libjpeg decode the rest of the scan (smg_resume), so a file
 * damaged late in a scan is not decoded twice. Where that cannot be done exactly, the
 * trampoline longjmps out, still below the setjmp and with no Rust frame in between, and
 * smg_jpeg_decode returns SMG_RETRY: the caller decodes the image again without the hook.
 */
#include <setjmp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jpeglib.h"

#define SMG_OK 0
#define SMG_ERROR 1
#define SMG_SUSPENDED 2
#define SMG_RETRY 3

/* The size of the pieces Pillow reads a file in (PIL.ImageFile.MAXBLOCK, 13.0.0). */
#define SMG_PIECE ((size_t)65536)

/* Blocks in an MCU at most (libjpeg's D_MAX_BLOCKS_IN_MCU). */
#define SMG_MAX_BLOCKS 10

/* What the entropy hook needs to know of the scan; tables 0-3 are the DC slots, 4-7 the AC
 * slots (NULL when absent), each as a DHT segment gives it: 17 counts (index 0 unused) and 256
 * symbols. */
typedef struct {
    const unsigned char *data;
    size_t len;
    int blocks_in_mcu;
    int block_component[SMG_MAX_BLOCKS];
    int block_dc[SMG_MAX_BLOCKS];
    int block_ac[SMG_MAX_BLOCKS];
    const unsigned char *table_counts[8];
    const unsigned char *table_symbols[8];
    unsigned int restart_interval;
    unsigned long long mcus;
    /* 1 in a progressive file, whose scan codes band Ss..Se, bits Ah/Al. */
    int progressive;
    int Ss, Se, Ah, Al;
    /* A progressive scan of one component: its MCUs (blocks) per block row; else 0. */
    unsigned int mcus_per_row;
} smg_scan_desc;

/* start: 1 when the hook takes the scan. decode_mcu: 0 = decoded, more follow; 1 = the last
 * MCU decoded, *consumed bytes of the data are the hook's; 3 = decoded, and so were the next
 * *consumed blocks of the block row, through the block pointer's successors (a progressive
 * scan of one component: libjpeg's coefficient controller, jdcoefct.c's consume_data, hands
 * out the blocks of a row left to right as consecutive JBLOCKs of the row of its coefficient
 * array, MCUs_per_row of them); -1 = anomaly, decode again. */
/* Where libjpeg's own decode_mcu can take a scan over from the hook (decode_mcu status -2): the
 * state of libjpeg's Huffman decoder at the start of the MCU the hook stopped in, had libjpeg
 * decoded every MCU before it. `pos` indexes the whole file; the next
 * `bits_left` bits of the scan are the low bits of `get_buffer`; the DC predictions by
 * component of the scan; MCUs left in the restart interval (0: a restart marker comes first)
 * and the number of the next restart marker; MCUs left in the scan, this one included. */
typedef struct {
    size_t pos;
    unsigned long long get_buffer;
    int bits_left;
    int last_dc_val[4];
    unsigned int restarts_to_go;
    int next_restart_num;
    unsigned long long mcus_left;
    unsigned int eobrun; /* a progressive scan's end-of-band run (0 in a sequential one) */
} smg_resume_point;

typedef struct {
    void *ctx;
    int (*start)(void *ctx, const smg_scan_desc *desc);
    int (*decode_mcu)(
        void *ctx, JBLOCKROW *blocks, int count, size_t *consumed, smg_resume_point *resume
    );
} smg_entropy_hook;

/* libjpeg-turbo 3.1's struct jpeg_entropy_decoder (jpegint.h, not an installed header). */
struct smg_entropy_public {
    void (*start_pass)(j_decompress_ptr cinfo);
    boolean (*decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
    void *decode_mcus;
    boolean (*process_restart)(j_decompress_ptr cinfo);
    boolean insufficient_data;
};

/* The state of its sequential Huffman decoder, huff_entropy_decoder (private to jdhuff.c, as
 * libjpeg-turbo 3.1.0 defines it, the version turbojpeg-sys 1.2.0 builds): written only to hand
 * a scan over (smg_resume), and only after smg_resume_layout_ok has found in it the values
 * libjpeg's start_pass leaves (table pointers, counters) where this layout puts them. */
struct smg_huff_entropy {
    struct smg_entropy_public pub;
    struct {
        size_t get_buffer; /* bit_buf_type: size_t on 64-bit targets */
        int bits_left;
    } bitstate;
    struct {
        int last_dc_val[4]; /* MAX_COMPS_IN_SCAN */
    } saved;
    unsigned int restarts_to_go;
    void *dc_derived_tbls[4]; /* NUM_HUFF_TBLS */
    void *ac_derived_tbls[4];
    void *dc_cur_tbls[SMG_MAX_BLOCKS];
    void *ac_cur_tbls[SMG_MAX_BLOCKS];
    boolean dc_needed[SMG_MAX_BLOCKS];
    boolean ac_needed[SMG_MAX_BLOCKS];
};

/* The state of its progressive Huffman decoder, phuff_entropy_decoder (private to jdphuff.c,
 * libjpeg-turbo 3.1.0), written and checked likewise (smg_resume_layout_ok). */
struct smg_phuff_entropy {
    struct smg_entropy_public pub;
    struct {
        size_t get_buffer;
        int bits_left;
    } bitstate;
    struct {
        unsigned int EOBRUN;
        int last_dc_val[4];
    } saved;
    unsigned int restarts_to_go;
    void *derived_tbls[4];
    void *ac_derived_tbl;
};

/* libjpeg's struct jpeg_marker_reader (jpegint.h): next_restart_num is the restart marker
 * its process_restart expects next. */
struct smg_marker_reader {
    void (*reset_marker_reader)(j_decompress_ptr cinfo);
    int (*read_markers)(j_decompress_ptr cinfo);
    jpeg_marker_parser_method read_restart_marker;
    boolean saw_SOI;
    boolean saw_SOF;
    int next_restart_num;
    unsigned int discarded_bytes;
};

typedef struct {
    struct jpeg_error_mgr pub;
    jmp_buf jump;
} smg_error_mgr;

typedef struct {
    /* cinfo first: the progress monitor gets a j_common_ptr to it. */
    struct jpeg_decompress_struct cinfo;
    smg_error_mgr err;
    struct jpeg_source_mgr src;
    struct jpeg_progress_mgr progress;
    int max_scans;
    int created;
    /* The whole file, and how much of it libjpeg has been handed (Pillow's pieces). */
    const JOCTET *data;
    size_t len;
    size_t visible;
    /* Bytes still to skip (a marker segment that ran past the piece at hand), as Pillow's
     * source manager keeps them for its next piece. */
    size_t skip;
    const smg_entropy_hook *hook;
    int hook_declined;
    /* Blocks of the current row the hook has decoded ahead (status 3), and where the next of
     * them must be: libjpeg's calls for them are answered here, each pointer checked. */
    size_t hook_row_left;
    JBLOCKROW hook_row_next;
    /* A progressive file's scans are offered to this hook as libjpeg starts each one: the
     * first from the progress monitor (libjpeg started it in jinit_master_decompress), the
     * others from a wrapper around the entropy decoder's start_pass, libjpeg's own kept here
     * (NULL until the wrapper is in place). */
    const smg_entropy_hook *progressive_hook;
    void (*libjpeg_start_pass)(j_decompress_ptr cinfo);
    const JOCTET *hook_base;
    size_t hook_len;
    /* libjpeg's decode_mcu for the scan the hook took; whether its state may be set to resume
     * the scan (smg_resume_layout_ok); once resumed, libjpeg decodes the rest of the scan
     * (`delegated_left` MCUs) through smg_delegated_decode_mcu, and `resumed` stays set. */
    boolean (*libjpeg_decode_mcu)(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
    int resumable;
    unsigned long long delegated_left;
    int resumed;
    char message[JMSG_LENGTH_MAX + 64];
} smg_jpeg;

typedef struct {
    unsigned int width;
    unsigned int height;
    int components;
    int jpeg_color_space;
    int data_precision;
    int progressive;
} smg_jpeg_info;

static void smg_error_exit(j_common_ptr cinfo) {
    smg_jpeg *self = (smg_jpeg *)cinfo;
    (*cinfo->err->format_message)(cinfo, self->message);
    longjmp(self->err.jump, 1);
}

static void smg_output_message(j_common_ptr cinfo) { (void)cinfo; }

static void smg_offer_progressive_scan(smg_jpeg *self);
static boolean smg_delegated_decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data);
static void smg_wrapped_start_pass(j_decompress_ptr cinfo);

static void smg_progress(j_common_ptr cinfo) {
    smg_jpeg *self = (smg_jpeg *)cinfo;
    if (self->progressive_hook != NULL && self->libjpeg_start_pass == NULL &&
        cinfo->is_decompressor && self->cinfo.progressive_mode && self->cinfo.entropy != NULL) {
        /* The first call of jpeg_start_decompress's loop over the scans: libjpeg has started
         * the first scan and read none of its data yet. */
        struct smg_entropy_public *entropy = (struct smg_entropy_public *)self->cinfo.entropy;
        self->libjpeg_start_pass = entropy->start_pass;
        entropy->start_pass = smg_wrapped_start_pass;
        smg_offer_progressive_scan(self);
    }
    if (cinfo->is_decompressor && self->max_scans > 0 &&
        self->cinfo.input_scan_number > self->max_scans) {
        snprintf(
            self->message, sizeof(self->message),
            "progressive JPEG has more than %d scans", self->max_scans
        );
        longjmp(self->err.jump, 1);
    }
}

static void smg_init_source(j_decompress_ptr cinfo) { (void)cinfo; }

static boolean smg_fill_input_buffer(j_decompress_ptr cinfo) {
    (void)cinfo;
    return FALSE; /* suspend: there is no more data */
}

static void smg_skip_input_data(j_decompress_ptr cinfo, long num_bytes) {
    smg_jpeg *self = (smg_jpeg *)cinfo;
    struct jpeg_source_mgr *src = cinfo->src;
    if (num_bytes <= 0) {
        return;
    }
    if ((size_t)num_bytes > src->bytes_in_buffer) {
        /* The rest is skipped from the next pieces (smg_feed); libjpeg suspends meanwhile. */
        self->skip = (size_t)num_bytes - src->bytes_in_buffer;
        src->next_input_byte += src->bytes_in_buffer;
        src->bytes_in_buffer = 0;
    } else {
        src->next_input_byte += (size_t)num_bytes;
        src->bytes_in_buffer -= (size_t)num_bytes;
        self->skip = 0;
    }
}

static void smg_term_source(j_decompress_ptr cinfo) { (void)cinfo; }

/* Hands libjpeg the next piece of the file, as Pillow's next read does after a suspension (and
 * skips what a marker segment left to skip, piece after piece, as Pillow's decoder does before
 * calling libjpeg again); 0 when there is no more. */
static int smg_feed(smg_jpeg *self) {
    do {
        size_t pos = (size_t)(self->src.next_input_byte - self->data);
        if (self->visible >= self->len) {
            return 0;
        }
        self->visible =
            self->len - self->visible > SMG_PIECE ? self->visible + SMG_PIECE : self->len;
        self->src.bytes_in_buffer = self->visible - pos;
        if (self->skip > 0) {
            smg_skip_input_data(&self->cinfo, (long)self->skip);
        }
    } while (self->skip > 0);
    return 1;
}

/* Makes the file visible up to the end of the piece holding byte `end - 1` (and no less than
 * before): where Pillow's reads stand once libjpeg has needed the bytes before `end`. */
static void smg_see_up_to(smg_jpeg *self, size_t end) {
    size_t upto = end % SMG_PIECE ? end - end % SMG_PIECE + SMG_PIECE : end;
    if (upto > self->len || upto < end) {
        upto = self->len;
    }
    if (upto > self->visible) {
        self->visible = upto;
    }
}

/* Whether, with the data of a scan read up to byte `pos` (at most 16 bytes past its last bit),
 * a boundary of Pillow's pieces lies between those bytes and the marker code byte after them:
 * libjpeg reads somewhere in that window before it reads the marker, so how far Pillow's reads
 * stand at the scan's end would depend on how far ahead libjpeg's own bit buffer read. */
static int smg_piece_edge_near(const smg_jpeg *self, size_t pos) {
    size_t marker = pos, lo = pos > 16 ? pos - 16 : 0;
    while (marker < self->len) {
        if (self->data[marker] != 0xFF) {
            marker++;
            continue;
        }
        while (marker + 1 < self->len && self->data[marker + 1] == 0xFF) {
            marker++;
        }
        marker++; /* the byte after the 0xFFs: 0 (a stuffed byte) or the marker's code */
        if (marker >= self->len || self->data[marker] != 0) {
            break;
        }
    }
    return marker >= self->len || lo / SMG_PIECE != marker / SMG_PIECE;
}

static void smg_give_back(smg_jpeg *self, const char *why) {
    self->hook_declined = 1;
    snprintf(self->message, sizeof(self->message), "entropy hook declined (%s)", why);
    longjmp(self->err.jump, 1);
}

/* Whether libjpeg's decoder state lies where struct smg_huff_entropy (sequential) or
 * smg_phuff_entropy (progressive) says, as its start_pass leaves it for the scan (checked before
 * the hook decodes anything): the table pointers the scan uses where the derived tables are,
 * the restart counter, an empty bit buffer, no end-of-band run, zero predictions, and the
 * marker reader expecting RST0 after SOI and SOF. */
static int smg_resume_layout_ok(smg_jpeg *self) {
    j_decompress_ptr cinfo = &self->cinfo;
    const struct smg_entropy_public *pub = (const struct smg_entropy_public *)cinfo->entropy;
    const struct smg_marker_reader *marker = (const struct smg_marker_reader *)cinfo->marker;
    int b, ci;
    if (marker == NULL || marker->saw_SOI != TRUE || marker->saw_SOF != TRUE ||
        marker->next_restart_num != 0 || pub->decode_mcu != self->libjpeg_decode_mcu ||
        pub->insufficient_data != FALSE || cinfo->comps_in_scan > 4 ||
        cinfo->unread_marker != 0) {
        return 0;
    }
    for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
        const jpeg_component_info *comp = cinfo->cur_comp_info[ci];
        if (comp->dc_tbl_no < 0 || comp->dc_tbl_no > 3 || comp->ac_tbl_no < 0 ||
            comp->ac_tbl_no > 3) {
            return 0;
        }
    }
    if (cinfo->progressive_mode) {
        const struct smg_phuff_entropy *ph = (const struct smg_phuff_entropy *)cinfo->entropy;
        if (ph->bitstate.bits_left != 0 || ph->saved.EOBRUN != 0 ||
            ph->restarts_to_go != cinfo->restart_interval) {
            return 0;
        }
        for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
            const jpeg_component_info *comp = cinfo->cur_comp_info[ci];
            if (ph->saved.last_dc_val[ci] != 0 ||
                (cinfo->Ss == 0 && cinfo->Ah == 0 && ph->derived_tbls[comp->dc_tbl_no] == NULL)) {
                return 0;
            }
        }
        return cinfo->Ss == 0 ||
               (cinfo->comps_in_scan == 1 && ph->ac_derived_tbl != NULL &&
                ph->ac_derived_tbl == ph->derived_tbls[cinfo->cur_comp_info[0]->ac_tbl_no]);
    } else {
        const struct smg_huff_entropy *huff = (const struct smg_huff_entropy *)cinfo->entropy;
        if (huff->bitstate.bits_left != 0 || huff->restarts_to_go != cinfo->restart_interval) {
            return 0;
        }
        for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
            if (huff->saved.last_dc_val[ci] != 0) {
                return 0;
            }
        }
        for (b = 0; b < cinfo->blocks_in_MCU; b++) {
            const jpeg_component_info *comp = cinfo->cur_comp_info[cinfo->MCU_membership[b]];
            if (huff->dc_cur_tbls[b] == NULL || huff->ac_cur_tbls[b] == NULL ||
                huff->dc_cur_tbls[b] != huff->dc_derived_tbls[comp->dc_tbl_no] ||
                huff->ac_cur_tbls[b] != huff->ac_derived_tbls[comp->ac_tbl_no]) {
                return 0;
            }
        }
        return 1;
    }
}

/* Whether the scan data from `pos` holds 0xFF fill bytes before a stuffed zero (FF FF 00) before
 * the marker that ends it. libjpeg's fast and slow paths read that pattern differently (the
 * fast path takes FF FF for a marker, then redoes the MCU on the slow path over the blocks it
 * wrote), and which path an MCU takes depends on how many bytes libjpeg holds in its buffer, so
 * a resumed decode reproduces the stock one there only by chance: the image is decoded again
 * instead. Only without restart markers: with them, libjpeg always takes the slow path. */
static int smg_fill_before_stuffing(const smg_jpeg *self, size_t pos) {
    while (pos < self->len) {
        size_t run = 0;
        if (self->data[pos] != 0xFF) {
            pos++;
            continue;
        }
        while (pos < self->len && self->data[pos] == 0xFF) {
            pos++;
            run++;
        }
        if (pos >= self->len || self->data[pos] != 0) {
            return 0; /* a marker: the scan's data ends for libjpeg */
        }
        if (run > 1) {
            return 1;
        }
        pos++;
    }
    return 0;
}

/* Hands the scan to libjpeg's decode_mcu at the MCU the hook stopped in, with the decoder state
 * libjpeg would have there (`r`, from the hook), so that only the rest of the scan is decoded by
 * libjpeg instead of the whole image again; 0 when it cannot (the image is decoded again). In a
 * progressive scan the hook has already put the MCU's block back as libjpeg expects it. */
static int smg_resume(smg_jpeg *self, const smg_resume_point *r, JBLOCKROW *MCU_data) {
    j_decompress_ptr cinfo = &self->cinfo;
    struct smg_marker_reader *marker = (struct smg_marker_reader *)cinfo->marker;
    int b, ci;
    if (!self->resumable || r->pos < (size_t)(self->hook_base - self->data) || r->pos > self->len ||
        r->bits_left < 0 || r->bits_left > 63 || r->mcus_left == 0 || r->next_restart_num < 0 ||
        r->next_restart_num > 7 || r->restarts_to_go > cinfo->restart_interval ||
        (!cinfo->progressive_mode && r->eobrun != 0) ||
        (!cinfo->progressive_mode && cinfo->restart_interval == 0 &&
         smg_fill_before_stuffing(self, r->pos))) {
        return 0;
    }
    if (cinfo->progressive_mode) {
        struct smg_phuff_entropy *ph = (struct smg_phuff_entropy *)cinfo->entropy;
        ph->bitstate.get_buffer = (size_t)r->get_buffer;
        ph->bitstate.bits_left = r->bits_left;
        ph->saved.EOBRUN = r->eobrun;
        for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
            ph->saved.last_dc_val[ci] = r->last_dc_val[ci];
        }
        ph->restarts_to_go = r->restarts_to_go;
    } else {
        struct smg_huff_entropy *huff = (struct smg_huff_entropy *)cinfo->entropy;
        huff->bitstate.get_buffer = (size_t)r->get_buffer;
        huff->bitstate.bits_left = r->bits_left;
        for (ci = 0; ci < cinfo->comps_in_scan; ci++) {
            huff->saved.last_dc_val[ci] = r->last_dc_val[ci];
        }
        huff->restarts_to_go = r->restarts_to_go;
        /* The hook wrote some of this MCU's coefficients; libjpeg decodes into zeroed blocks. */
        if (MCU_data != NULL) {
            for (b = 0; b < cinfo->blocks_in_MCU; b++) {
                memset(MCU_data[b], 0, sizeof(JBLOCK));
            }
        }
    }
    ((struct smg_entropy_public *)cinfo->entropy)->insufficient_data = FALSE;
    marker->next_restart_num = r->next_restart_num;
    cinfo->unread_marker = 0;
    /* libjpeg has read the scan up to `pos` (its reads under Pillow stand in that piece; where
     * they stand at the scan's end is checked then). */
    smg_see_up_to(self, r->pos);
    cinfo->src->next_input_byte = self->data + r->pos;
    cinfo->src->bytes_in_buffer = self->visible - r->pos;
    ((struct smg_entropy_public *)cinfo->entropy)->decode_mcu = smg_delegated_decode_mcu;
    self->delegated_left = r->mcus_left;
    self->resumed = 1;
    return 1;
}

/* libjpeg's decode_mcu for the rest of a resumed scan (smg_resume installs it). After the last
 * MCU, where libjpeg's reads stand must not depend on how far ahead its bit buffer read
 * (smg_piece_edge_near); they do not once libjpeg has read a marker (it never reads past one,
 * and stock libjpeg, having reached it too, stands just after it as well). */
static boolean smg_delegated_decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    smg_jpeg *self = (smg_jpeg *)cinfo;
    if (!self->libjpeg_decode_mcu(cinfo, MCU_data)) {
        return FALSE; /* suspended: libjpeg asks for this MCU again */
    }
    if (--self->delegated_left == 0 && self->cinfo.unread_marker == 0 &&
        smg_piece_edge_near(self, (size_t)(self->cinfo.src->next_input_byte - self->data))) {
        smg_give_back(self, "piece edge after resuming");
    }
    return TRUE;
}

static boolean smg_hooked_decode_mcu(j_decompress_ptr cinfo, JBLOCKROW *MCU_data) {
    smg_jpeg *self = (smg_jpeg *)cinfo;
    size_t consumed = 0;
    smg_resume_point resume;
    int status;
    if (self->hook_row_left > 0) {
        if (MCU_data[0] != self->hook_row_next) {
            /* Not the block the hook wrote: libjpeg's layout is not the one assumed. */
            smg_give_back(self, "row layout");
        }
        self->hook_row_next++;
        self->hook_row_left--;
        return TRUE;
    }
    /* Filled by the hook only when it returns -2, and read only then. */
    status = self->hook->decode_mcu(
        self->hook->ctx, MCU_data, cinfo->blocks_in_MCU, &consumed, &resume
    );
    if (status == 3) {
        self->hook_row_left = consumed;
        self->hook_row_next = MCU_data[0] + 1;
        return TRUE;
    }
    if (status == -2 && smg_resume(self, &resume, MCU_data)) {
        return smg_delegated_decode_mcu(cinfo, MCU_data);
    }
    if (status < 0 || consumed > self->hook_len) {
        smg_give_back(self, "anomaly");
    }
    if (status == 1) {
        /* The hook read the scan from the whole file. Under Pillow, libjpeg would have been
         * handed the pieces up to somewhere between the byte holding the scan's last bit (at
         * most 8 bytes before `pos`: the hook's bit buffer) and the marker's code byte after it
         * (libjpeg reads up to a marker to see it is one). When a piece boundary falls in that
         * window, how far Pillow's reads stand depends on libjpeg's own reading: the hook gives
         * the image back and libjpeg decodes it alone, in Pillow's pieces. Otherwise they stand
         * at the end of the piece holding `pos - 1`. */
        size_t pos = (size_t)(self->hook_base + consumed - self->data);
        if (smg_piece_edge_near(self, pos)) {
            smg_give_back(self, "piece edge");
        }
        smg_see_up_to(self, pos);
        cinfo->src->next_input_byte = self->data + pos;
        cinfo->src->bytes_in_buffer = self->visible - pos;
    }
    return TRUE;
}

/* The hook took the scan described by `desc`: libjpeg's decode_mcu calls it from now on. */
static void smg_take_scan(
    smg_jpeg *self, const smg_entropy_hook *hook, const smg_scan_desc *desc
) {
    self->hook = hook;
    self->hook_base = desc->data;
    self->hook_len = desc->len;
    self->hook_row_left = 0;
    self->hook_row_next = NULL;
    self->libjpeg_decode_mcu = ((struct smg_entropy_public *)self->cinfo.entropy)->decode_mcu;
    self->resumable = smg_resume_layout_ok(self);
    ((struct smg_entropy_public *)self->cinfo.entropy)->decode_mcu = smg_hooked_decode_mcu;
}

/* Fills what the hook needs of the current scan's blocks and tables. */
static void smg_describe_scan(smg_jpeg *self, smg_scan_desc *desc) {
    j_decompress_ptr cinfo = &self->cinfo;
    int b, t;
    memset(desc, 0, sizeof(*desc));
    /* The hook gets the rest of the whole file (libjpeg may have been handed less so far). */
    desc->data = cinfo->src->next_input_byte;
    desc->len = (size_t)(self->data + self->len - desc->data);
    desc->blocks_in_mcu = cinfo->blocks_in_MCU;
    for (b = 0; b < cinfo->blocks_in_MCU; b++) {
        int ci = cinfo->MCU_membership[b];
        jpeg_component_info *comp = cinfo->cur_comp_info[ci];
        desc->block_component[b] = ci;
        desc->block_dc[b] = comp->dc_tbl_no;
        desc->block_ac[b] = 4 + comp->ac_tbl_no;
    }
    for (t = 0; t < 4; t++) {
        JHUFF_TBL *dc = cinfo->dc_huff_tbl_ptrs[t];
        JHUFF_TBL *ac = cinfo->ac_huff_tbl_ptrs[t];
        desc->table_counts[t] = dc ? dc->bits : NULL;
        desc->table_symbols[t] = dc ? dc->huffval : NULL;
        desc->table_counts[4 + t] = ac ? ac->bits : NULL;
        desc->table_symbols[4 + t] = ac ? ac->huffval : NULL;
    }
    desc->restart_interval = cinfo->restart_interval;
    desc->mcus = (unsigned long long)cinfo->MCUs_per_row * cinfo->MCU_rows_in_scan;
    desc->Ss = cinfo->Ss;
    desc->Se = cinfo->Se;
    desc->Ah = cinfo->Ah;
    desc->Al = cinfo->Al;
    desc->mcus_per_row =
        cinfo->progressive_mode && cinfo->comps_in_scan == 1 ? cinfo->MCUs_per_row : 0;
}

/* Offers the scan libjpeg has just started (its start_pass checked the band, built its own
 * tables and recorded the progression) to the progressive hook; libjpeg's decode_mcu, which
 * that start_pass chose, stays when the hook declines. */
static void smg_offer_progressive_scan(smg_jpeg *self) {
    j_decompress_ptr cinfo = &self->cinfo;
    const smg_entropy_hook *hook = self->progressive_hook;
    smg_scan_desc desc;
    if (hook == NULL || !cinfo->progressive_mode || cinfo->arith_code ||
        cinfo->data_precision != 8 || cinfo->buffered_image || cinfo->blocks_in_MCU < 1 ||
        cinfo->blocks_in_MCU > SMG_MAX_BLOCKS || cinfo->entropy == NULL) {
        return;
    }
    smg_describe_scan(self, &desc);
    desc.progressive = 1;
    if (!hook->start(hook->ctx, &desc)) {
        return;
    }
    smg_take_scan(self, hook, &desc);
}

static void smg_wrapped_start_pass(j_decompress_ptr cinfo) {
    smg_jpeg *self = (smg_jpeg *)cinfo;
    self->libjpeg_start_pass(cinfo);
    smg_offer_progressive_scan(self);
}

/* Offers the scan to the hook when libjpeg reads it with its sequential Huffman decoder in one
 * pass (one scan holding every component, 8-bit, no arithmetic coding, not lossless). */
static void smg_install_hook(smg_jpeg *self, const smg_entropy_hook *hook) {
    j_decompress_ptr cinfo = &self->cinfo;
    smg_scan_desc desc;
    if (hook == NULL || cinfo->progressive_mode || cinfo->arith_code ||
        cinfo->data_precision != 8 || cinfo->buffered_image ||
        cinfo->comps_in_scan != cinfo->num_components || cinfo->Ss != 0 || cinfo->Se != 63 ||
        cinfo->Ah != 0 || cinfo->Al != 0 || cinfo->blocks_in_MCU < 1 ||
        cinfo->blocks_in_MCU > SMG_MAX_BLOCKS || cinfo->entropy == NULL) {
        return;
    }
    smg_describe_scan(self, &desc);
    if (!hook->start(hook->ctx, &desc)) {
        return;
    }
    smg_take_scan(self, hook, &desc);
}

/* The layout of smg_scan_desc as compiled here (its size and where its last field lies) and the
 * size of smg_resume_point. The Rust side compares them with its own #[repr(C)] copies before
 * handing libjpeg a hook, so that a build pairing a stale object of this file with newer Rust
 * (or the reverse) leaves Huffman decoding to libjpeg instead of reading a description of
 * another shape. */
void smg_scan_desc_layout(size_t *size, size_t *last_field, size_t *resume_size) {
    *size = sizeof(smg_scan_desc);
    *last_field = offsetof(smg_scan_desc, mcus_per_row);
    *resume_size = sizeof(smg_resume_point);
}

/* 1 when libjpeg took over a scan from the hook where the hook stopped (smg_resume). */
int smg_jpeg_resumed(const smg_jpeg *self) { return self->resumed; }

smg_jpeg *smg_jpeg_new(void) { return (smg_jpeg *)calloc(1, sizeof(smg_jpeg)); }

void smg_jpeg_free(smg_jpeg *self) {
    if (self == NULL) {
        return;
    }
    if (self->created) {
        jpeg_destroy_decompress(&self->cinfo);
    }
    free(self);
}

const char *smg_jpeg_message(const smg_jpeg *self) { return self->message; }

/* Reads the headers up to the first scan. Returns SMG_OK, SMG_ERROR or SMG_SUSPENDED. */
int smg_jpeg_read_header(
    smg_jpeg *self, const unsigned char *data, size_t len, int max_scans, smg_jpeg_info *info
) {
    int status;
    self->message[0] = '\0';
    self->max_scans = max_scans;
    self->cinfo.err = jpeg_std_error(&self->err.pub);
    self->err.pub.error_exit = smg_error_exit;
    self->err.pub.output_message = smg_output_message;
    if (setjmp(self->err.jump)) {
        return SMG_ERROR;
    }
    jpeg_create_decompress(&self->cinfo);
    self->created = 1;
    self->src.init_source = smg_init_source;
    self->src.fill_input_buffer = smg_fill_input_buffer;
    self->src.skip_input_data = smg_skip_input_data;
    self->src.resync_to_restart = jpeg_resync_to_restart;
    self->src.term_source = smg_term_source;
    self->data = data;
    self->len = len;
    self->visible = len < SMG_PIECE ? len : SMG_PIECE;
    self->src.next_input_byte = data;
    self->src.bytes_in_buffer = self->visible;
    self->cinfo.src = &self->src;
    self->progress.progress_monitor = smg_progress;
    self->cinfo.progress = &self->progress;
    for (;;) {
        status = jpeg_read_header(&self->cinfo, FALSE);
        if (status == JPEG_HEADER_TABLES_ONLY) {
            continue;
        }
        if (status != JPEG_SUSPENDED || !smg_feed(self)) {
            break;
        }
    }
    if (status == JPEG_SUSPENDED) {
        return SMG_SUSPENDED;
    }
    info->width = self->cinfo.image_width;
    info->height = self->cinfo.image_height;
    info->components = self->cinfo.num_components;
    info->jpeg_color_space = (int)self->cinfo.jpeg_color_space;
    info->data_precision = self->cinfo.data_precision;
    info->progressive = self->cinfo.progressive_mode ? 1 : 0;
    return SMG_OK;
}

/*
 * Decodes the image into `out` (rows of `stride` bytes) as grayscale (1), RGB (3) or CMYK (4)
 * samples, with libjpeg's defaults: ISLOW IDCT, fancy upsampling, no block smoothing changes.
 * `rows` receives the number of complete rows written. Returns SMG_OK, SMG_ERROR or
 * SMG_SUSPENDED (the data ended before the last row); with an entropy `hook` (or NULL), also
 * SMG_RETRY (the hook declined mid-scan: decode again, with a fresh decoder, without it).
 */
int smg_jpeg_decode(
    smg_jpeg *self, unsigned char *out, size_t out_len, size_t stride, int out_components,
    const smg_entropy_hook *hook, unsigned int *rows
) {
    JSAMPROW row_pointers[16];
    *rows = 0;
    if (setjmp(self->err.jump)) {
        *rows = self->cinfo.output_scanline;
        return self->hook_declined ? SMG_RETRY : SMG_ERROR;
    }
    switch (out_components) {
        case 1:
            self->cinfo.out_color_space = JCS_GRAYSCALE;
            break;
        case 3:
            self->cinfo.out_color_space = JCS_RGB;
            break;
        case 4:
            self->cinfo.out_color_space = JCS_CMYK;
            break;
        default:
            snprintf(self->message, sizeof(self->message), "bad output components");
            return SMG_ERROR;
    }
    /* A progressive file's scans are all read in jpeg_start_decompress. */
    self->progressive_hook = hook;
    while (!jpeg_start_decompress(&self->cinfo)) {
        if (!smg_feed(self)) {
            return SMG_SUSPENDED;
        }
    }
    if (self->cinfo.output_components != out_components ||
        (size_t)self->cinfo.output_width * (size_t)out_components > stride ||
        (size_t)self->cinfo.output_height * stride > out_len) {
        snprintf(
            self->message, sizeof(self->message),
            "decoder output %ux%u with %d components does not fit the buffer",
            self->cinfo.output_width, self->cinfo.output_height,
            self->cinfo.output_components
        );
        return SMG_ERROR;
    }
    smg_install_hook(self, hook);
    while (self->cinfo.output_scanline < self->cinfo.output_height) {
        unsigned int want = self->cinfo.output_height - self->cinfo.output_scanline;
        unsigned int i, got;
        if (want > 16) {
            want = 16;
        }
        for (i = 0; i < want; i++) {
            row_pointers[i] = out + (size_t)(self->cinfo.output_scanline + i) * stride;
        }
        got = jpeg_read_scanlines(&self->cinfo, row_pointers, want);
        if (got == 0 && !smg_feed(self)) {
            *rows = self->cinfo.output_scanline;
            return SMG_SUSPENDED;
        }
    }
    *rows = self->cinfo.output_height;
    /* A missing EOI after complete image data suspends here, and so does a marker beyond the
     * piece at hand (Pillow is not handed more data at this point); Pillow accepts both. */
    (void)jpeg_finish_decompress(&self->cinfo);
    return SMG_OK;
}
