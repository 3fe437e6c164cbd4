/* fuzz_json.c -- libFuzzer target for the strict JSON reader (kvo_json).
 *
 * For every input: kvo_json_parse must return, within its memory budget.
 * When it accepts: the tree, written back as compact JSON, parses again to
 * the same tree (every string, integer, real and member order), and that
 * writing is byte-identical (abort otherwise).
 *
 * Built by tests/fuzz/CMakeLists.txt; replayed over the corpus and the
 * crash files by tests/base/test_json.c (KVO_FUZZ_REPLAY).
 */
#include "kvo_json.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JFUZZ_CHECK(c)                                                         \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_json: check failed: %s (line %d)\n", #c,     \
                    __LINE__);                                                 \
            abort();                                                           \
        }                                                                      \
    } while (0)

int kvo_fuzz_json(const uint8_t *data, size_t size);

static void write_str(kvo_buf *b, const char *s, size_t n) {
    kvo_buf_append(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            kvo_buf_printf(b, "\\%c", c);
        else if (c < 0x20)
            kvo_buf_printf(b, "\\u%04x", c);
        else
            kvo_buf_append(b, &s[i], 1);
    }
    kvo_buf_append(b, "\"", 1);
}

static void write_int(kvo_buf *b, const kvo_jv *v) {
    if (v->neg)
        kvo_buf_printf(b, "-%" PRIu64, 0 - v->v.u);
    else
        kvo_buf_printf(b, "%" PRIu64, v->v.u);
}

/* A real stays a real: "1" or "-0" would read back as an integer. */
static void write_real(kvo_buf *b, double d) {
    char t[64];
    snprintf(t, sizeof(t), "%.17g", d);
    kvo_buf_printf(b, "%s%s", t, strpbrk(t, ".e") ? "" : ".0");
}

static void write_jv(kvo_buf *b, const kvo_jv *v) {
    switch (v->type) {
    case KVO_JSON_NULL: kvo_buf_printf(b, "null"); break;
    case KVO_JSON_BOOL: kvo_buf_printf(b, v->v.b ? "true" : "false"); break;
    case KVO_JSON_INT: write_int(b, v); break;
    case KVO_JSON_REAL: write_real(b, v->v.d); break;
    case KVO_JSON_STR: write_str(b, v->v.s, v->len); break;
    case KVO_JSON_ARR:
        kvo_buf_append(b, "[", 1);
        for (uint32_t i = 0; i < v->len; i++) {
            kvo_jv e;
            JFUZZ_CHECK(kvo_json_at(v, i, &e));
            if (i) kvo_buf_append(b, ",", 1);
            write_jv(b, &e);
        }
        kvo_buf_append(b, "]", 1);
        break;
    case KVO_JSON_OBJ:
        kvo_buf_append(b, "{", 1);
        for (uint32_t i = 0; i < v->len; i++) {
            const kvo_jmember *m = &v->v.members[i];
            if (i) kvo_buf_append(b, ",", 1);
            write_str(b, m->key, strlen(m->key));
            kvo_buf_append(b, ":", 1);
            write_jv(b, &m->value);
            /* members are sorted, and lookup finds each */
            JFUZZ_CHECK(kvo_json_get(v, m->key) == &m->value);
            JFUZZ_CHECK(i == 0 || strcmp(v->v.members[i - 1].key, m->key) < 0);
        }
        kvo_buf_append(b, "}", 1);
        break;
    default: JFUZZ_CHECK(!"unknown type");
    }
}

int kvo_fuzz_json(const uint8_t *data, size_t size) {
    kvo_json d;
    kvo_json_init(&d);
    kvo_err err;
    kvo_status st = kvo_json_parse(&d, data, size, NULL, &err);
    JFUZZ_CHECK(d.mem <= size * 16 + (64u << 10));
    if (st != KVO_OK) {
        JFUZZ_CHECK(d.root == NULL);
        JFUZZ_CHECK(err.status == st);
        JFUZZ_CHECK(err.offset == KVO_ERR_NO_OFFSET || err.offset <= size);
        kvo_json_fini(&d);
        return 0;
    }
    kvo_buf a, b;
    kvo_buf_init(&a);
    kvo_buf_init(&b);
    write_jv(&a, d.root);
    kvo_json d2;
    kvo_json_init(&d2);
    /* the rewrite is compact: its own budget is the default of its size */
    JFUZZ_CHECK(kvo_json_parse(&d2, a.data, a.len, NULL, NULL) == KVO_OK);
    write_jv(&b, d2.root);
    JFUZZ_CHECK(a.len == b.len && memcmp(a.data, b.data, a.len) == 0);
    kvo_buf_fini(&a);
    kvo_buf_fini(&b);
    kvo_json_fini(&d2);
    kvo_json_fini(&d);
    return 0;
}

#ifndef KVO_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return kvo_fuzz_json(data, size);
}
#endif
