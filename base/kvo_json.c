/* kvo_json.c -- the strict JSON reader (see kvo_json.h).
 *
 * Recursive descent, one value per call, depth bounded by max_depth. The
 * elements of every open container wait on one of three stacks; when the
 * container closes its elements are copied into the arena, in one block,
 * and popped:
 *
 *   nodes  kvo_jv       elements of open arrays that are not all integers
 *   ints   uint64_t     elements of open arrays that so far are all
 *                       integers (+ signs, one bit each)
 *   mems   kvo_jmember  members of open objects
 *
 * An array starts on the ints stack; its first non-integer element moves
 * the integers read so far to the nodes stack, and the rest follow there.
 * An inner container is closed (and popped) before the outer one reads its
 * next element, so each open container owns the top segment of its stack.
 *
 * Memory: every stack growth and arena block is charged against max_mem
 * before it is taken; peak = stacks' capacity + arena bytes.
 */
#include "kvo_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEFAULT_DEPTH 64
#define MAX_DEPTH 1024 /* recursion: one parser frame per level */
#define DEFAULT_MEM_PER_BYTE 16
#define DEFAULT_MEM_SLACK (64u << 10)
#define MAX_NUMBER_TEXT 512 /* longest real we hand to strtod */
#define FIRST_STACK 64

typedef struct parser {
    const uint8_t *start, *p, *end;
    kvo_json *d;
    kvo_err *err;
    uint32_t max_depth;
    size_t max_mem, used; /* used: arena blocks + stack capacities */
    kvo_jv *nodes;
    size_t n_nodes, cap_nodes;
    uint64_t *ints, *signs; /* signs: bit i = ints[i] is negative */
    size_t n_ints, cap_ints;
    kvo_jmember *mems;
    size_t n_mems, cap_mems;
} parser;

static kvo_status fail(parser *ps, kvo_status st, const uint8_t *at,
                       const char *what) {
    return kvo_err_set(ps->err, st, (size_t)(at - ps->start), "%s", what);
}

static kvo_status over_budget(parser *ps) {
    return kvo_err_set(ps->err, KVO_ETOOBIG, (size_t)(ps->p - ps->start),
                       "the document needs more than %zu bytes", ps->max_mem);
}

static bool charge(parser *ps, size_t n) {
    if (n > ps->max_mem - ps->used) return false;
    ps->used += n;
    return true;
}

static void *arena_take(parser *ps, size_t n, kvo_status *st) {
    size_t rounded = (n + 15) & ~(size_t)15;
    if (rounded < n || !charge(ps, rounded)) {
        *st = over_budget(ps);
        return NULL;
    }
    void *b = kvo_arena_alloc(&ps->d->arena, n ? n : 1);
    if (!b) *st = fail(ps, KVO_ENOMEM, ps->p, "out of memory");
    return b;
}

/* Make room for one more element on a stack, charging the growth. */
static kvo_status stack_room(parser *ps, void *items_pp, size_t *cap, size_t n,
                             size_t elem) {
    if (n < *cap) return KVO_OK;
    size_t old = *cap;
    if (old > SIZE_MAX / 2 / elem) return over_budget(ps);
    /* kvo_grow doubles from FIRST_STACK too, so this is what it takes */
    size_t more = old ? old : FIRST_STACK;
    if (!charge(ps, more * elem)) return over_budget(ps);
    if (kvo_grow(items_pp, cap, n + 1, elem, FIRST_STACK) != KVO_OK)
        return fail(ps, KVO_ENOMEM, ps->p, "out of memory");
    return KVO_OK;
}

static kvo_status ints_push(parser *ps, uint64_t u, bool neg) {
    size_t old = ps->cap_ints;
    kvo_status st =
        stack_room(ps, &ps->ints, &ps->cap_ints, ps->n_ints, sizeof(uint64_t));
    if (st != KVO_OK) return st;
    if (ps->cap_ints != old) {
        size_t words = (ps->cap_ints + 63) / 64, old_words = (old + 63) / 64;
        if (!charge(ps, (words - old_words) * sizeof(uint64_t)))
            return over_budget(ps);
        uint64_t *s = kvo_realloc(ps->signs, words * sizeof(uint64_t));
        if (!s) return fail(ps, KVO_ENOMEM, ps->p, "out of memory");
        memset(s + old_words, 0, (words - old_words) * sizeof(uint64_t));
        ps->signs = s;
    }
    size_t i = ps->n_ints++;
    ps->ints[i] = u;
    if (neg)
        ps->signs[i / 64] |= 1ull << (i % 64);
    else
        ps->signs[i / 64] &= ~(1ull << (i % 64));
    return KVO_OK;
}

static bool int_neg(const parser *ps, size_t i) {
    return (ps->signs[i / 64] >> (i % 64)) & 1;
}

static kvo_status nodes_push(parser *ps, const kvo_jv *v) {
    kvo_status st =
        stack_room(ps, &ps->nodes, &ps->cap_nodes, ps->n_nodes, sizeof(kvo_jv));
    if (st == KVO_OK) ps->nodes[ps->n_nodes++] = *v;
    return st;
}

static void skip_ws(parser *ps) {
    while (ps->p < ps->end && (*ps->p == ' ' || *ps->p == '\t' ||
                               *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static kvo_status value(parser *ps, uint32_t depth, kvo_jv *out);

/* ---- strings ---------------------------------------------------------------*/

static int hex4(const uint8_t *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        int c = p[i], d;
        if (c >= '0' && c <= '9')
            d = c - '0';
        else if (c >= 'a' && c <= 'f')
            d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F')
            d = c - 'A' + 10;
        else
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static size_t put_utf8(uint8_t *o, uint32_t cp) {
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | cp >> 6);
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | cp >> 12);
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | cp >> 18);
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at p (1-4), 0 when invalid. */
static size_t utf8_len(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    size_t n;
    uint32_t min, cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        n = 2, min = 0x80, cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3, min = 0x800, cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4, min = 0x10000, cp = c & 0x07;
    } else {
        return 0;
    }
    if ((size_t)(end - p) < n) return 0;
    for (size_t i = 1; i < n; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (p[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return n;
}

/* ps->p at the opening quote. */
static kvo_status string(parser *ps, kvo_jv *out) {
    const uint8_t *q = ps->p + 1;
    /* the closing quote bounds the decoded length */
    size_t left = (size_t)(ps->end - q), i = 0;
    while (i < left && q[i] != '"') i += q[i] == '\\' ? 2 : 1;
    if (i >= left)
        return fail(ps, KVO_ETRUNC, ps->p, "the input ends inside a string");
    if (i > UINT32_MAX) return fail(ps, KVO_ETOOBIG, ps->p, "string too long");
    const uint8_t *close = q + i;
    kvo_status st = KVO_OK;
    uint8_t *o = arena_take(ps, (size_t)(close - q) + 1, &st);
    if (!o) return st;
    size_t n = 0;
    while (q < close) {
        uint8_t c = *q;
        if (c < 0x20)
            return fail(ps, KVO_EPROTO, q, "control character in a string");
        if (c != '\\') {
            size_t k = utf8_len(q, close);
            if (k == 0)
                return fail(ps, KVO_EPROTO, q, "invalid UTF-8 in a string");
            memcpy(o + n, q, k);
            n += k;
            q += k;
            continue;
        }
        const uint8_t *esc = q;
        char e = (char)q[1];
        q += 2;
        switch (e) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            int hi = close - q >= 4 ? hex4(q) : -1;
            if (hi < 0) return fail(ps, KVO_EPROTO, esc, "bad \\u escape");
            q += 4;
            uint32_t cp = (uint32_t)hi;
            if (cp >= 0xDC00 && cp <= 0xDFFF)
                return fail(ps, KVO_EPROTO, esc, "unpaired surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                int lo = close - q >= 6 && q[0] == '\\' && q[1] == 'u'
                             ? hex4(q + 2)
                             : -1;
                if (lo < 0xDC00 || lo > 0xDFFF)
                    return fail(ps, KVO_EPROTO, esc, "unpaired surrogate");
                q += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
            }
            if (cp == 0)
                return fail(ps, KVO_EPROTO, esc, "a string holds U+0000");
            n += put_utf8(o + n, cp);
            break;
        }
        default: return fail(ps, KVO_EPROTO, esc, "bad escape in a string");
        }
    }
    o[n] = '\0';
    *out = (kvo_jv){.type = KVO_JSON_STR, .len = (uint32_t)n, .v.s = (char *)o};
    ps->p = close + 1;
    return KVO_OK;
}

/* ---- numbers ---------------------------------------------------------------*/

static bool digit(const parser *ps, const uint8_t *q) {
    return q < ps->end && *q >= '0' && *q <= '9';
}

static kvo_status number(parser *ps, kvo_jv *out) {
    const uint8_t *q = ps->p, *s = q;
    bool neg = *q == '-';
    if (neg) q++;
    if (!digit(ps, q)) return fail(ps, KVO_EPROTO, s, "bad number");
    if (*q == '0' && digit(ps, q + 1))
        return fail(ps, KVO_EPROTO, s, "a number has a leading zero");
    const uint8_t *int_start = q;
    while (digit(ps, q)) q++;
    const uint8_t *int_end = q;
    bool real = false;
    if (q < ps->end && *q == '.') {
        real = true;
        q++;
        if (!digit(ps, q)) return fail(ps, KVO_EPROTO, s, "bad number");
        while (digit(ps, q)) q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        real = true;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (!digit(ps, q)) return fail(ps, KVO_EPROTO, s, "bad number");
        while (digit(ps, q)) q++;
    }
    if (!real) {
        uint64_t u = 0;
        for (const uint8_t *c = int_start; c < int_end; c++)
            if (__builtin_mul_overflow(u, 10u, &u) ||
                __builtin_add_overflow(u, (unsigned)(*c - '0'), &u))
                return fail(ps, KVO_EPROTO, s, "integer out of range");
        if (neg && u > (1ull << 63))
            return fail(ps, KVO_EPROTO, s, "integer out of range");
        *out = (kvo_jv){
            .type = KVO_JSON_INT, .neg = neg && u != 0, .v.u = neg ? 0 - u : u};
    } else {
        if (q - s > MAX_NUMBER_TEXT)
            return fail(ps, KVO_EPROTO, s, "number too long");
        char buf[MAX_NUMBER_TEXT + 1];
        memcpy(buf, s, (size_t)(q - s));
        buf[q - s] = '\0';
        double d = strtod(buf, NULL);
        if (!isfinite(d)) return fail(ps, KVO_EPROTO, s, "number out of range");
        *out = (kvo_jv){.type = KVO_JSON_REAL, .v.d = d};
    }
    ps->p = q;
    return KVO_OK;
}

/* ---- containers ------------------------------------------------------------*/

/* After an element of the container opened at open (closed by close): a
 * ',' (*more: another element follows) or the closing byte. */
static kvo_status after_element(parser *ps, const uint8_t *open, char close,
                                bool *more) {
    bool arr = close == ']';
    skip_ws(ps);
    if (ps->p >= ps->end)
        return fail(ps, KVO_ETRUNC, open,
                    arr ? "the input ends inside an array"
                        : "the input ends inside an object");
    *more = *ps->p == ',';
    if (!*more && *ps->p != (uint8_t)close)
        return fail(ps, KVO_EPROTO, ps->p,
                    arr ? "expected ',' or ']'" : "expected ',' or '}'");
    ps->p++;
    return KVO_OK;
}

static kvo_status array(parser *ps, uint32_t depth, kvo_jv *out) {
    const uint8_t *open = ps->p++;
    size_t base_ints = ps->n_ints, base_nodes = ps->n_nodes, n = 0;
    bool packed = true;
    kvo_status st = KVO_OK;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == ']') {
        ps->p++;
    } else {
        for (;;) {
            kvo_jv v;
            if ((st = value(ps, depth, &v)) != KVO_OK) return st;
            if (packed && v.type != KVO_JSON_INT) {
                /* the integers so far become nodes */
                for (size_t i = base_ints; i < ps->n_ints && st == KVO_OK;
                     i++) {
                    kvo_jv iv = {.type = KVO_JSON_INT,
                                 .neg = int_neg(ps, i),
                                 .v.u = ps->ints[i]};
                    st = nodes_push(ps, &iv);
                }
                ps->n_ints = base_ints;
                packed = false;
            }
            if (st == KVO_OK)
                st = packed ? ints_push(ps, v.v.u, v.neg) : nodes_push(ps, &v);
            if (st != KVO_OK) return st;
            if (++n > UINT32_MAX)
                return fail(ps, KVO_ETOOBIG, open, "array too long");
            bool more;
            if ((st = after_element(ps, open, ']', &more)) != KVO_OK) return st;
            if (!more) break;
        }
    }
    *out = (kvo_jv){.type = KVO_JSON_ARR, .packed = packed, .len = (uint32_t)n};
    if (packed) {
        bool any_neg = false;
        for (size_t i = base_ints; i < ps->n_ints && !any_neg; i++)
            any_neg = int_neg(ps, i);
        size_t words = any_neg ? (n + 63) / 64 : 0;
        uint64_t *b = arena_take(ps, (n + words) * sizeof(uint64_t), &st);
        if (!b) return st;
        if (n) memcpy(b, ps->ints + base_ints, n * sizeof(uint64_t));
        uint64_t *signs = b + n;
        if (words) memset(signs, 0, words * sizeof(uint64_t));
        for (size_t i = 0; words && i < n; i++)
            if (int_neg(ps, base_ints + i)) signs[i / 64] |= 1ull << (i % 64);
        out->neg = any_neg;
        out->v.ints = b;
        ps->n_ints = base_ints;
    } else {
        kvo_jv *b = arena_take(ps, n * sizeof(kvo_jv), &st);
        if (!b) return st;
        memcpy(b, ps->nodes + base_nodes, n * sizeof(kvo_jv));
        out->v.items = b;
        ps->n_nodes = base_nodes;
    }
    return KVO_OK;
}

static int member_cmp(const void *a, const void *b) {
    return strcmp(((const kvo_jmember *)a)->key, ((const kvo_jmember *)b)->key);
}

static kvo_status object(parser *ps, uint32_t depth, kvo_jv *out) {
    const uint8_t *open = ps->p++;
    size_t base = ps->n_mems, n = 0;
    kvo_status st;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == '}') {
        ps->p++;
    } else {
        for (;;) {
            skip_ws(ps);
            if (ps->p >= ps->end)
                return fail(ps, KVO_ETRUNC, open,
                            "the input ends inside an object");
            if (*ps->p != '"')
                return fail(ps, KVO_EPROTO, ps->p, "expected a key string");
            kvo_jv key;
            if ((st = string(ps, &key)) != KVO_OK) return st;
            skip_ws(ps);
            if (ps->p >= ps->end)
                return fail(ps, KVO_ETRUNC, open,
                            "the input ends inside an object");
            if (*ps->p != ':')
                return fail(ps, KVO_EPROTO, ps->p, "expected ':'");
            ps->p++;
            kvo_jv v;
            if ((st = value(ps, depth, &v)) != KVO_OK) return st;
            if ((st = stack_room(ps, &ps->mems, &ps->cap_mems, ps->n_mems,
                                 sizeof(kvo_jmember))) != KVO_OK)
                return st;
            ps->mems[ps->n_mems++] = (kvo_jmember){key.v.s, v};
            if (++n > UINT32_MAX)
                return fail(ps, KVO_ETOOBIG, open, "object too large");
            bool more;
            if ((st = after_element(ps, open, '}', &more)) != KVO_OK) return st;
            if (!more) break;
        }
    }
    st = KVO_OK;
    kvo_jmember *m = arena_take(ps, n * sizeof(kvo_jmember), &st);
    if (!m) return st;
    if (n) memcpy(m, ps->mems + base, n * sizeof(kvo_jmember));
    ps->n_mems = base;
    qsort(m, n, sizeof(*m), member_cmp);
    for (size_t i = 1; i < n; i++)
        if (strcmp(m[i - 1].key, m[i].key) == 0)
            return kvo_err_set(ps->err, KVO_EPROTO, (size_t)(open - ps->start),
                               "duplicate key \"%.64s\" in an object",
                               m[i].key);
    *out = (kvo_jv){.type = KVO_JSON_OBJ, .len = (uint32_t)n, .v.members = m};
    return KVO_OK;
}

static bool literal(parser *ps, const char *word) {
    size_t n = strlen(word);
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0)
        return false;
    ps->p += n;
    return true;
}

static kvo_status value(parser *ps, uint32_t depth, kvo_jv *out) {
    skip_ws(ps);
    if (ps->p >= ps->end)
        return fail(ps, KVO_ETRUNC, ps->p,
                    "the input ends where a value "
                    "should start");
    switch (*ps->p) {
    case '{':
    case '[':
        if (depth >= ps->max_depth)
            return kvo_err_set(ps->err, KVO_ETOOBIG,
                               (size_t)(ps->p - ps->start),
                               "nesting deeper than %u", ps->max_depth);
        return *ps->p == '{' ? object(ps, depth + 1, out)
                             : array(ps, depth + 1, out);
    case '"': return string(ps, out);
    case 't':
        if (!literal(ps, "true")) break;
        *out = (kvo_jv){.type = KVO_JSON_BOOL, .v.b = true};
        return KVO_OK;
    case 'f':
        if (!literal(ps, "false")) break;
        *out = (kvo_jv){.type = KVO_JSON_BOOL, .v.b = false};
        return KVO_OK;
    case 'n':
        if (!literal(ps, "null")) break;
        *out = (kvo_jv){.type = KVO_JSON_NULL};
        return KVO_OK;
    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9'))
            return number(ps, out);
    }
    return fail(ps, KVO_EPROTO, ps->p, "expected a JSON value");
}

/* ---- document ----------------------------------------------------------------*/

void kvo_json_init(kvo_json *d) {
    d->root = NULL;
    d->mem = 0;
    kvo_arena_init(&d->arena);
}

void kvo_json_fini(kvo_json *d) {
    kvo_arena_fini(&d->arena);
    d->root = NULL;
}

kvo_status kvo_json_parse(kvo_json *d, const void *text, size_t len,
                          const kvo_json_limits *lim, kvo_err *err) {
    kvo_arena_reset(&d->arena);
    d->root = NULL;
    parser ps = {.start = text,
                 .p = text,
                 .end = (const uint8_t *)text + len,
                 .d = d,
                 .err = err};
    ps.max_depth = lim && lim->max_depth ? lim->max_depth : DEFAULT_DEPTH;
    if (ps.max_depth > MAX_DEPTH) ps.max_depth = MAX_DEPTH;
    ps.max_mem = lim && lim->max_mem ? lim->max_mem
                 : len > (SIZE_MAX - DEFAULT_MEM_SLACK) / DEFAULT_MEM_PER_BYTE
                     ? SIZE_MAX
                     : len * DEFAULT_MEM_PER_BYTE + DEFAULT_MEM_SLACK;
    kvo_status st = KVO_OK;
    kvo_jv *root = arena_take(&ps, sizeof(kvo_jv), &st);
    if (root) st = value(&ps, 0, root);
    if (st == KVO_OK) {
        skip_ws(&ps);
        if (ps.p != ps.end)
            st = fail(&ps, KVO_EPROTO, ps.p,
                      "trailing characters after the JSON value");
    }
    kvo_free(ps.nodes);
    kvo_free(ps.ints);
    kvo_free(ps.signs);
    kvo_free(ps.mems);
    d->mem = ps.used;
    if (st == KVO_OK) d->root = root;
    return st;
}

/* ---- reading ---------------------------------------------------------------*/

const kvo_jv *kvo_json_get(const kvo_jv *obj, const char *key) {
    if (!kvo_json_is(obj, KVO_JSON_OBJ)) return NULL;
    size_t lo = 0, hi = obj->len;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(obj->v.members[mid].key, key);
        if (c == 0) return &obj->v.members[mid].value;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static bool packed_neg(const kvo_jv *arr, size_t i) {
    return arr->neg && (arr->v.ints[arr->len + i / 64] >> (i % 64)) & 1;
}

bool kvo_json_at(const kvo_jv *arr, size_t i, kvo_jv *out) {
    if (!kvo_json_is(arr, KVO_JSON_ARR) || i >= arr->len) return false;
    if (!arr->packed) {
        *out = arr->v.items[i];
        return true;
    }
    *out = (kvo_jv){
        .type = KVO_JSON_INT, .neg = packed_neg(arr, i), .v.u = arr->v.ints[i]};
    return true;
}

bool kvo_json_u64(const kvo_jv *v, uint64_t *out) {
    if (!kvo_json_is(v, KVO_JSON_INT) || v->neg) return false;
    *out = v->v.u;
    return true;
}

bool kvo_json_i64(const kvo_jv *v, int64_t *out) {
    if (!kvo_json_is(v, KVO_JSON_INT) || (!v->neg && v->v.u > INT64_MAX))
        return false;
    *out = (int64_t)v->v.u;
    return true;
}

bool kvo_json_u32(const kvo_jv *v, uint32_t *out) {
    uint64_t u;
    if (!kvo_json_u64(v, &u) || u > UINT32_MAX) return false;
    *out = (uint32_t)u;
    return true;
}

bool kvo_json_num(const kvo_jv *v, double *out) {
    if (kvo_json_is(v, KVO_JSON_REAL)) {
        *out = v->v.d;
        return true;
    }
    if (!kvo_json_is(v, KVO_JSON_INT)) return false;
    *out = v->neg ? (double)(int64_t)v->v.u : (double)v->v.u;
    return true;
}

bool kvo_json_bool(const kvo_jv *v, bool *out) {
    if (!kvo_json_is(v, KVO_JSON_BOOL)) return false;
    *out = v->v.b;
    return true;
}

const char *kvo_json_str(const kvo_jv *v, size_t *len) {
    if (!kvo_json_is(v, KVO_JSON_STR)) return NULL;
    if (len) *len = v->len;
    return v->v.s;
}

/* The first element of arr that is not an integer (SIZE_MAX: none). */
static size_t first_non_int(const kvo_jv *arr) {
    if (arr->packed) return SIZE_MAX;
    for (size_t i = 0; i < arr->len; i++)
        if (arr->v.items[i].type != KVO_JSON_INT) return i;
    return SIZE_MAX; /* unreachable: all-integer arrays are packed */
}

kvo_status kvo_json_u64s(const kvo_jv *arr, const uint64_t **out, size_t *n,
                         kvo_err *err) {
    if (!kvo_json_is(arr, KVO_JSON_ARR))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "expected an array of integers");
    size_t bad = first_non_int(arr);
    if (bad != SIZE_MAX)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "[%zu]: expected an integer", bad);
    for (size_t i = 0; arr->neg && i < arr->len; i++)
        if (packed_neg(arr, i))
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "[%zu]: expected an integer >= 0", i);
    *out = arr->v.ints;
    *n = arr->len;
    return KVO_OK;
}

kvo_status kvo_json_i64s(const kvo_jv *arr, const int64_t **out, size_t *n,
                         kvo_err *err) {
    if (!kvo_json_is(arr, KVO_JSON_ARR))
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "expected an array of integers");
    size_t bad = first_non_int(arr);
    if (bad != SIZE_MAX)
        return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                           "[%zu]: expected an integer", bad);
    for (size_t i = 0; i < arr->len; i++)
        if (!packed_neg(arr, i) && arr->v.ints[i] > INT64_MAX)
            return kvo_err_set(err, KVO_EPROTO, KVO_ERR_NO_OFFSET,
                               "[%zu]: integer out of the int64 range", i);
    *out = (const int64_t *)arr->v.ints;
    *n = arr->len;
    return KVO_OK;
}
