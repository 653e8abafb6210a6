/*
 * The libjpeg half of src/image/decode/jpeg.rs: the only C in the crate.
 *
 * libjpeg reports fatal errors by calling error_exit, which must not return. Rust cannot catch a
 * longjmp, and unwinding through C frames is undefined, so every libjpeg call happens here,
 * below a setjmp in the same C function; error_exit formats the message and longjmps back, and
 * each entry point returns a status code. No Rust frame is ever between a setjmp and its longjmp.
 *
 * The source manager behaves like Pillow's: all the data is handed over up front and running
 * out of it *suspends* the decoder (fill_input_buffer returns FALSE) instead of inserting a fake
 * EOI. Suspension before the last scanline is the truncation Pillow reports as "image file is
 * truncated"; suspension in jpeg_finish_decompress (no EOI marker after complete image data)
 * is accepted, as Pillow does. Warnings (corrupt-data recoveries) are ignored, as in Pillow.
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

static void smg_progress(j_common_ptr cinfo) {
    smg_jpeg *self = (smg_jpeg *)cinfo;
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
    struct jpeg_source_mgr *src = cinfo->src;
    if (num_bytes <= 0) {
        return;
    }
    if ((size_t)num_bytes > src->bytes_in_buffer) {
        src->next_input_byte += src->bytes_in_buffer;
        src->bytes_in_buffer = 0;
    } else {
        src->next_input_byte += (size_t)num_bytes;
        src->bytes_in_buffer -= (size_t)num_bytes;
    }
}

static void smg_term_source(j_decompress_ptr cinfo) { (void)cinfo; }

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
    self->src.next_input_byte = data;
    self->src.bytes_in_buffer = len;
    self->cinfo.src = &self->src;
    self->progress.progress_monitor = smg_progress;
    self->cinfo.progress = &self->progress;
    do {
        status = jpeg_read_header(&self->cinfo, FALSE);
    } while (status == JPEG_HEADER_TABLES_ONLY);
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
 * SMG_SUSPENDED (the data ended before the last row).
 */
int smg_jpeg_decode(
    smg_jpeg *self, unsigned char *out, size_t out_len, size_t stride, int out_components,
    unsigned int *rows
) {
    JSAMPROW row_pointers[16];
    *rows = 0;
    if (setjmp(self->err.jump)) {
        *rows = self->cinfo.output_scanline;
        return SMG_ERROR;
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
    if (!jpeg_start_decompress(&self->cinfo)) {
        return SMG_SUSPENDED;
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
        if (got == 0) {
            *rows = self->cinfo.output_scanline;
            return SMG_SUSPENDED;
        }
    }
    *rows = self->cinfo.output_height;
    /* A missing EOI after complete image data suspends here; Pillow accepts that. */
    (void)jpeg_finish_decompress(&self->cinfo);
    return SMG_OK;
}
