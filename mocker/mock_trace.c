/* mock_trace.c -- Mooncake JSONL traces (DESIGN §8) and their prompts.
 *
 * One JSON object per line: {"timestamp": ms, "input_length": n,
 * "output_length": m, "hash_ids": [id, ...]}; one hash id per 512-token
 * trace block, standing for that block and everything before it. The
 * prompt is, for each id h in order, tokens mock_trace_token(h, 0..511),
 * concatenated and cut to input_length.
 *
 * The reader is bounded: a line longer than MOCK_TRACE_MAX_LINE, or with
 * more than MOCK_TRACE_MAX_IDS ids, or whose shape is wrong (missing or
 * mistyped field, input_length outside (512(k-1), 512k], output_length 0),
 * is skipped and reported to the caller (KVO_EPROTO / KVO_ETOOBIG with a
 * message), counted, and reading goes on. Unknown keys are ignored.
 */
#include "mock_int.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* Token j of trace block h: splitmix64's finalizer applied to a mix of
 * (h, j), reduced to the vocabulary. Any fixed function would do; this one
 * is cheap and spreads neighbouring ids. */
uint32_t mock_trace_token(uint64_t hash_id, uint32_t j) {
    uint64_t x = kvo_mix64(hash_id * 0x9E3779B97F4A7C15ull + j);
    return (uint32_t)(x % MOCK_TRACE_VOCAB);
}

struct mock_trace {
    FILE *f;
    char *buf;       /* read buffer */
    size_t len, pos; /* valid bytes, consumed bytes */
    size_t cap;
    bool eof;
    uint64_t line;
    uint64_t malformed;
    uint64_t *ids;
    uint32_t cap_ids;
    json_tokener *tok;
};

/* Bytes read from the file at a time (the buffer also holds a whole line
 * of up to MOCK_TRACE_MAX_LINE). */
#define READ_CHUNK (1u << 20)
/* JSON nesting a trace line may have (it needs 2). */
#define TRACE_JSON_DEPTH 16

kvo_status mock_trace_open(mock_trace **out, const char *path) {
    if (!out || !path) return KVO_EINVAL;
    mock_trace *t = kvo_calloc(1, sizeof(*t));
    if (!t) return KVO_ENOMEM;
    t->cap = MOCK_TRACE_MAX_LINE + READ_CHUNK;
    t->buf = kvo_malloc(t->cap);
    t->tok = json_tokener_new_ex(TRACE_JSON_DEPTH);
    if (!t->buf || !t->tok) {
        mock_trace_free(t);
        return KVO_ENOMEM;
    }
    t->f = fopen(path, "rb");
    if (!t->f) {
        mock_trace_free(t);
        return errno == ENOENT ? KVO_ENOTFOUND : KVO_EIO;
    }
    *out = t;
    return KVO_OK;
}

void mock_trace_free(mock_trace *t) {
    if (!t) return;
    if (t->f) fclose(t->f);
    if (t->tok) json_tokener_free(t->tok);
    kvo_free(t->buf);
    kvo_free(t->ids);
    kvo_free(t);
}

uint64_t mock_trace_malformed(const mock_trace *t) { return t->malformed; }

/* Refill so that buf[pos..len) holds as much as fits. */
static kvo_status refill(mock_trace *t) {
    if (t->pos > 0) {
        memmove(t->buf, t->buf + t->pos, t->len - t->pos);
        t->len -= t->pos;
        t->pos = 0;
    }
    if (t->eof) return KVO_OK;
    size_t n = fread(t->buf + t->len, 1, t->cap - t->len, t->f);
    if (n == 0) {
        if (ferror(t->f)) return KVO_EIO;
        t->eof = true;
    }
    t->len += n;
    return KVO_OK;
}

/* Next line as [*p, *p + *n) without the newline. KVO_ETOOBIG: the line
 * was longer than the limit and has been skipped. */
static kvo_status next_line(mock_trace *t, const char **p, size_t *n) {
    for (;;) {
        char *start = t->buf + t->pos;
        char *nl = memchr(start, '\n', t->len - t->pos);
        if (nl) {
            *p = start;
            *n = (size_t)(nl - start);
            t->pos += *n + 1;
            t->line++;
            if (*n > MOCK_TRACE_MAX_LINE) return KVO_ETOOBIG;
            return KVO_OK;
        }
        if (t->eof) {
            if (t->pos == t->len) return KVO_EOF;
            *p = start; /* last line without a newline */
            *n = t->len - t->pos;
            t->pos = t->len;
            t->line++;
            if (*n > MOCK_TRACE_MAX_LINE) return KVO_ETOOBIG;
            return KVO_OK;
        }
        if (t->pos == 0 && t->len == t->cap) {
            /* Longer than the buffer: drop it up to its newline. */
            t->pos = t->len;
            for (;;) {
                kvo_status st = refill(t);
                if (st != KVO_OK) return st;
                nl = memchr(t->buf, '\n', t->len);
                if (nl) {
                    t->pos = (size_t)(nl - t->buf) + 1;
                    break;
                }
                t->pos = t->len;
                if (t->eof) break;
            }
            t->line++;
            return KVO_ETOOBIG;
        }
        kvo_status st = refill(t);
        if (st != KVO_OK) return st;
    }
}

static bool get_u32(json_object *o, const char *key, uint32_t *out) {
    json_object *v;
    if (!json_object_object_get_ex(o, key, &v) ||
        !json_object_is_type(v, json_type_int))
        return false;
    int64_t x = json_object_get_int64(v);
    if (x < 0 || x > UINT32_MAX) return false;
    *out = (uint32_t)x;
    return true;
}

kvo_status mock_trace_validate(const uint64_t *hash_ids, uint32_t n_ids,
                               uint32_t input_length) {
    (void)hash_ids;
    if (n_ids == 0 || input_length == 0 || n_ids > MOCK_TRACE_MAX_IDS)
        return KVO_EPROTO;
    uint64_t hi = (uint64_t)n_ids * MOCK_TRACE_BLOCK;
    if (input_length > hi || input_length <= hi - MOCK_TRACE_BLOCK)
        return KVO_EPROTO;
    return KVO_OK;
}

void mock_trace_tokens_at(const uint64_t *hash_ids, uint64_t first, uint32_t n,
                          uint64_t *out) {
    uint64_t b = first / MOCK_TRACE_BLOCK;
    uint32_t j = (uint32_t)(first % MOCK_TRACE_BLOCK);
    for (uint32_t k = 0; k < n; b++, j = 0)
        for (; j < MOCK_TRACE_BLOCK && k < n; j++)
            out[k++] = mock_trace_token(hash_ids[b], j);
}

void mock_trace_tokens(const uint64_t *hash_ids, uint32_t n_ids,
                       uint32_t input_length, uint64_t *out) {
    uint64_t all = (uint64_t)n_ids * MOCK_TRACE_BLOCK;
    mock_trace_tokens_at(
        hash_ids, 0, input_length < all ? input_length : (uint32_t)all, out);
}

static kvo_status parse_line(mock_trace *t, const char *p, size_t n,
                             mock_trace_req *req, char *msg, size_t msgsz) {
    json_tokener_reset(t->tok);
    json_object *o = json_tokener_parse_ex(t->tok, p, (int)n);
    kvo_status st = KVO_EPROTO;
    if (!o || json_tokener_get_error(t->tok) != json_tokener_success) {
        snprintf(msg, msgsz, "line %llu: not JSON",
                 (unsigned long long)t->line);
        goto done;
    }
    if (!json_object_is_type(o, json_type_object)) {
        snprintf(msg, msgsz, "line %llu: not an object",
                 (unsigned long long)t->line);
        goto done;
    }
    json_object *ts, *ids;
    if (!json_object_object_get_ex(o, "timestamp", &ts) ||
        !(json_object_is_type(ts, json_type_int) ||
          json_object_is_type(ts, json_type_double)) ||
        json_object_get_double(ts) < 0) {
        snprintf(msg, msgsz,
                 "line %llu: timestamp missing or not a number >= 0",
                 (unsigned long long)t->line);
        goto done;
    }
    if (!get_u32(o, "input_length", &req->input_length) ||
        !get_u32(o, "output_length", &req->output_length) ||
        req->output_length == 0) {
        snprintf(msg, msgsz,
                 "line %llu: input_length/output_length missing or not an "
                 "integer >= 1",
                 (unsigned long long)t->line);
        goto done;
    }
    if (!json_object_object_get_ex(o, "hash_ids", &ids) ||
        !json_object_is_type(ids, json_type_array)) {
        snprintf(msg, msgsz, "line %llu: hash_ids missing or not an array",
                 (unsigned long long)t->line);
        goto done;
    }
    size_t k = json_object_array_length(ids);
    if (k > MOCK_TRACE_MAX_IDS) {
        st = KVO_ETOOBIG;
        snprintf(msg, msgsz, "line %llu: %zu hash_ids (limit %u)",
                 (unsigned long long)t->line, k, MOCK_TRACE_MAX_IDS);
        goto done;
    }
    if (k > t->cap_ids) {
        uint64_t *v = kvo_realloc(t->ids, k * sizeof(uint64_t));
        if (!v) {
            st = KVO_ENOMEM;
            snprintf(msg, msgsz, "line %llu: out of memory",
                     (unsigned long long)t->line);
            goto done;
        }
        t->ids = v;
        t->cap_ids = (uint32_t)k;
    }
    for (size_t i = 0; i < k; i++) {
        json_object *v = json_object_array_get_idx(ids, i);
        if (!json_object_is_type(v, json_type_int) ||
            json_object_get_int64(v) < 0) {
            snprintf(msg, msgsz, "line %llu: hash_ids[%zu] not an integer >= 0",
                     (unsigned long long)t->line, i);
            goto done;
        }
        t->ids[i] = json_object_get_uint64(v);
    }
    if (mock_trace_validate(t->ids, (uint32_t)k, req->input_length) != KVO_OK) {
        snprintf(msg, msgsz,
                 "line %llu: input_length %u does not fit %zu hash_ids of %u "
                 "tokens",
                 (unsigned long long)t->line, req->input_length, k,
                 MOCK_TRACE_BLOCK);
        goto done;
    }
    req->line = t->line;
    req->timestamp_ms = json_object_get_double(ts);
    req->n_hash_ids = (uint32_t)k;
    req->hash_ids = t->ids;
    st = KVO_OK;
done:
    json_object_put(o);
    return st;
}

kvo_status mock_trace_next(mock_trace *t, mock_trace_req *req, char *msg,
                           size_t msgsz) {
    char dummy[8];
    if (!msg || msgsz == 0) {
        msg = dummy;
        msgsz = sizeof(dummy);
    }
    msg[0] = '\0';
    for (;;) {
        const char *p = NULL;
        size_t n = 0;
        kvo_status st = next_line(t, &p, &n);
        if (st == KVO_EOF || st == KVO_EIO) return st;
        if (st == KVO_ETOOBIG) {
            t->malformed++;
            snprintf(msg, msgsz, "line %llu: longer than %u bytes",
                     (unsigned long long)t->line, MOCK_TRACE_MAX_LINE);
            return st;
        }
        /* Blank lines (and a trailing \r) are not requests. */
        while (n > 0 &&
               (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
            n--;
        if (n == 0) continue;
        st = parse_line(t, p, n, req, msg, msgsz);
        if (st != KVO_OK) t->malformed++;
        return st;
    }
}
