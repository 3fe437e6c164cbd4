/* wire_capture.c -- capture files (DESIGN §3).
 *
 *   file    = "KVOCAP1\n" record*
 *   record  = unix_ns:u64 BE  n_frames:u32 BE  frame{n_frames}
 *   frame   = len:u32 BE  bytes{len}
 *
 * A ZMQ message is recorded as its 3 frames, a NATS message as 2 (subject,
 * body). The writer is a buffered stdio stream (records reach the disk on
 * flush, on close, or when the buffer fills). The reader checks every
 * declared size against the limits before using it, and never allocates
 * ahead of the bytes actually read: a frame buffer grows in steps of at
 * most READ_STEP as data arrives, so a lying length on a short file costs
 * at most one step. All frames of a record share one buffer, reused from
 * record to record.
 *
 * Damage: a file that ends inside a record gives KVO_ETRUNC with the
 * record's offset, and the reader rewinds to that record, so a later call
 * can pick it up once a live writer has finished it. A record that breaks
 * the limits (too many frames, a frame longer than max_bytes) gives
 * KVO_ETOOBIG; framing is lost after it, so that error is sticky.
 */
#include "wire_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define CAP_MAGIC_LEN 8u
#define CAP_REC_HDR 12u
#define WRITE_BUF (256u * 1024u)
#define READ_STEP (1u << 20)

/* ======================================================================== */
/* Writer                                                                    */
/* ======================================================================== */

struct wire_cap_writer {
    FILE *f;
    char *vbuf; /* stdio buffer, owned */
};

static kvo_status open_status(void) {
    return errno == ENOENT ? KVO_ENOTFOUND : KVO_EIO;
}

kvo_status wire_cap_create(wire_cap_writer **out, const char *path) {
    if (!out || !path) return KVO_EINVAL;
    wire_cap_writer *w = kvo_calloc(1, sizeof(*w));
    if (!w) return KVO_ENOMEM;
    kvo_status st = KVO_ENOMEM;
    w->vbuf = kvo_malloc(WRITE_BUF);
    if (!w->vbuf) goto fail;
    w->f = fopen(path, "wbe");
    if (!w->f) {
        st = open_status();
        goto fail;
    }
    setvbuf(w->f, w->vbuf, _IOFBF, WRITE_BUF);
    if (fwrite(WIRE_CAP_MAGIC, 1, CAP_MAGIC_LEN, w->f) != CAP_MAGIC_LEN) {
        st = KVO_EIO;
        goto fail;
    }
    *out = w;
    return KVO_OK;
fail:
    if (w->f) fclose(w->f);
    kvo_free(w->vbuf);
    kvo_free(w);
    return st;
}

kvo_status wire_cap_write(wire_cap_writer *w, uint64_t unix_ns,
                          const wire_frame *frames, uint32_t n_frames) {
    if (!w || n_frames > WIRE_CAP_MAX_FRAMES || (n_frames && !frames))
        return KVO_EINVAL;
    for (uint32_t i = 0; i < n_frames; i++) {
        if (frames[i].len > UINT32_MAX) return KVO_ETOOBIG;
        if (frames[i].len && !frames[i].data) return KVO_EINVAL;
    }
    uint8_t hdr[CAP_REC_HDR];
    wire_put_be(hdr, unix_ns, 8);
    wire_put_be(hdr + 8, n_frames, 4);
    if (fwrite(hdr, 1, CAP_REC_HDR, w->f) != CAP_REC_HDR) return KVO_EIO;
    for (uint32_t i = 0; i < n_frames; i++) {
        uint8_t len[4];
        wire_put_be(len, frames[i].len, 4);
        if (fwrite(len, 1, 4, w->f) != 4) return KVO_EIO;
        if (frames[i].len &&
            fwrite(frames[i].data, 1, frames[i].len, w->f) != frames[i].len)
            return KVO_EIO;
    }
    return KVO_OK;
}

kvo_status wire_cap_flush(wire_cap_writer *w) {
    if (!w) return KVO_EINVAL;
    return fflush(w->f) == 0 ? KVO_OK : KVO_EIO;
}

void wire_cap_close(wire_cap_writer *w) {
    if (!w) return;
    fclose(w->f);
    kvo_free(w->vbuf);
    kvo_free(w);
}

/* ======================================================================== */
/* Reader                                                                    */
/* ======================================================================== */

struct wire_cap_reader {
    FILE *f;
    uint64_t pos; /* file offset of the next byte to read */
    wire_limits lim;
    kvo_buf buf;       /* frames of the current record */
    kvo_status sticky; /* KVO_OK, or the error that lost the framing */
    kvo_err sticky_err;
};

/* Read up to n bytes; returns how many were read (short = end of file or
 * error; ferror tells). */
static size_t read_some(wire_cap_reader *r, void *p, size_t n) {
    size_t got = fread(p, 1, n, r->f);
    r->pos += got;
    return got;
}

kvo_status wire_cap_open(wire_cap_reader **out, const char *path,
                         const wire_limits *lim) {
    if (!out || !path) return KVO_EINVAL;
    wire_cap_reader *r = kvo_calloc(1, sizeof(*r));
    if (!r) return KVO_ENOMEM;
    kvo_status st;
    kvo_buf_init(&r->buf);
    if (lim)
        r->lim = *lim;
    else
        wire_limits_default(&r->lim);
    /* Reserve now so frame pointers are never NULL, even for empty frames. */
    if (kvo_buf_reserve(&r->buf, 0) != KVO_OK) {
        st = KVO_ENOMEM;
        goto fail;
    }
    r->f = fopen(path, "rbe");
    if (!r->f) {
        st = open_status();
        goto fail;
    }
    uint8_t magic[CAP_MAGIC_LEN];
    size_t got = read_some(r, magic, CAP_MAGIC_LEN);
    if (ferror(r->f)) {
        st = KVO_EIO;
        goto fail;
    }
    if (memcmp(magic, WIRE_CAP_MAGIC, got) != 0) {
        st = KVO_EPROTO;
        goto fail;
    }
    if (got < CAP_MAGIC_LEN) {
        st = got == 0 ? KVO_EPROTO : KVO_ETRUNC; /* empty: not a capture */
        goto fail;
    }
    *out = r;
    return KVO_OK;
fail:
    if (r->f) fclose(r->f);
    kvo_buf_fini(&r->buf);
    kvo_free(r);
    return st;
}

void wire_cap_free(wire_cap_reader *r) {
    if (!r) return;
    fclose(r->f);
    kvo_buf_fini(&r->buf);
    kvo_free(r);
}

/* Ends a read that ran out of file inside the record at rec_off: rewind to
 * it so the record can be read again once it is complete. */
static kvo_status truncated(wire_cap_reader *r, uint64_t rec_off, kvo_err *err,
                            const char *what) {
    if (ferror(r->f)) {
        clearerr(r->f);
        return kvo_err_set(err, KVO_EIO, (size_t)r->pos, "read error in %s",
                           what);
    }
    clearerr(r->f);
    uint64_t at = r->pos;
    if (fseeko(r->f, (off_t)rec_off, SEEK_SET) == 0) r->pos = rec_off;
    return kvo_err_set(err, KVO_ETRUNC, (size_t)rec_off,
                       "record at byte %llu: file ends in %s (byte %llu)",
                       (unsigned long long)rec_off, what,
                       (unsigned long long)at);
}

/* Records the error that lost the framing; every later call returns it. */
static kvo_status make_sticky(wire_cap_reader *r, kvo_err *err) {
    r->sticky = r->sticky_err.status;
    if (err) *err = r->sticky_err;
    return r->sticky;
}

kvo_status wire_cap_next(wire_cap_reader *r, wire_cap_record *rec,
                         kvo_err *err) {
    if (!r || !rec) return KVO_EINVAL;
    if (r->sticky != KVO_OK) {
        if (err) *err = r->sticky_err;
        return r->sticky;
    }
    uint64_t rec_off = r->pos;
    uint8_t hdr[CAP_REC_HDR];
    size_t got = read_some(r, hdr, CAP_REC_HDR);
    if (got == 0 && !ferror(r->f)) {
        clearerr(r->f); /* a live writer may append more */
        return KVO_EOF;
    }
    if (got < CAP_REC_HDR) return truncated(r, rec_off, err, "record header");
    uint32_t n = (uint32_t)wire_be_w(hdr + 8, 4);
    if (n > WIRE_CAP_MAX_FRAMES) {
        kvo_err_set(&r->sticky_err, KVO_ETOOBIG, (size_t)rec_off + 8,
                    "record at byte %llu: %u frames (max %u)",
                    (unsigned long long)rec_off, n, WIRE_CAP_MAX_FRAMES);
        return make_sticky(r, err);
    }

    /* Frame lengths first (offsets into buf), pointers once buf is final. */
    size_t off[WIRE_CAP_MAX_FRAMES], len[WIRE_CAP_MAX_FRAMES];
    kvo_buf_reset(&r->buf);
    for (uint32_t i = 0; i < n; i++) {
        uint8_t lb[4];
        uint64_t len_at = r->pos;
        if (read_some(r, lb, 4) < 4)
            return truncated(r, rec_off, err, "a frame length");
        uint64_t fl = wire_be_w(lb, 4);
        if (fl > r->lim.max_bytes) {
            kvo_err_set(&r->sticky_err, KVO_ETOOBIG, (size_t)len_at,
                        "frame of %llu bytes exceeds the limit of %zu",
                        (unsigned long long)fl, r->lim.max_bytes);
            return make_sticky(r, err);
        }
        off[i] = r->buf.len;
        len[i] = (size_t)fl;
        while (fl > 0) {
            size_t step = fl < READ_STEP ? (size_t)fl : READ_STEP;
            if (kvo_buf_reserve(&r->buf, step) != KVO_OK)
                return kvo_err_set(err, KVO_ENOMEM, (size_t)r->pos,
                                   "out of memory for a frame");
            size_t k = read_some(r, r->buf.data + r->buf.len, step);
            r->buf.len += k;
            if (k < step) return truncated(r, rec_off, err, "a frame");
            fl -= k;
        }
    }
    rec->unix_ns = wire_be_w(hdr, 8);
    rec->n_frames = n;
    rec->offset = rec_off;
    for (uint32_t i = 0; i < n; i++) {
        rec->frames[i].data = r->buf.data + off[i];
        rec->frames[i].len = len[i];
    }
    return KVO_OK;
}
