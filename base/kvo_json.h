/* kvo_json.h -- the one strict JSON reader: every HTTP body and every
 * answer kvoracle parses goes through it.
 *
 * Strict (RFC 8259, then tighter):
 *   - exactly one value, then whitespace only (no trailing bytes, no NUL);
 *   - strings are valid UTF-8 (no overlong forms, no surrogates, nothing
 *     above U+10FFFF), escapes are JSON's, \u surrogates come in pairs, and
 *     a string may not hold U+0000 (readers use C strings);
 *   - integers are exact in [-2^63, 2^64 - 1]; beyond that is an error, not
 *     a rounded double; numbers with a fraction or exponent are reals and
 *     must be finite;
 *   - an object may not repeat a key;
 *   - nesting is bounded (max_depth).
 *
 * Bounded: the document's memory (tree + parse stacks) never exceeds
 * max_mem, by default 16 bytes per input byte plus 64 KiB. A value costs
 * 16 bytes, and an array of integers is packed at 8 bytes per element
 * (a token array of 50 MB costs about its own size, not 30 times it).
 *
 * The tree lives in the document's arena: every pointer below is valid
 * until the next kvo_json_parse on the same document or kvo_json_fini.
 *
 *   kvo_json doc;
 *   kvo_json_init(&doc);
 *   if (kvo_json_parse(&doc, body, len, NULL, &err) != KVO_OK) ... 400 err.msg
 *   const kvo_jv *ids = kvo_json_get(doc.root, "token_ids");
 *   const uint64_t *v; size_t n;
 *   if (kvo_json_u64s(ids, &v, &n, &err) != KVO_OK) ... 400 err.msg
 *   kvo_json_fini(&doc);
 */
#ifndef KVO_JSON_H
#define KVO_JSON_H

#include "kvo.h"

typedef enum kvo_jtype {
    KVO_JSON_NULL = 0,
    KVO_JSON_BOOL,
    KVO_JSON_INT,  /* exact; see neg */
    KVO_JSON_REAL, /* finite double */
    KVO_JSON_STR,
    KVO_JSON_ARR,
    KVO_JSON_OBJ
} kvo_jtype;

typedef struct kvo_jv kvo_jv;
typedef struct kvo_jmember kvo_jmember;

/* One value, 16 bytes. INT: u holds the two's-complement bits; neg says
 * the value is negative (so u = 2^64 - |value|). ARR: packed arrays (every
 * element an integer) hold ints[len] and, when any is negative, a sign
 * bitmap after them; other arrays hold items[len]. OBJ: members sorted by
 * key (byte order). STR: s is NUL-terminated, len bytes. */
struct kvo_jv {
    uint8_t type;   /* kvo_jtype */
    uint8_t neg;    /* INT: negative; packed ARR: has a negative element */
    uint8_t packed; /* ARR: ints[] instead of items[] */
    uint32_t len;   /* STR bytes, ARR elements, OBJ members */
    union {
        uint64_t u;
        double d;
        bool b;
        const char *s;
        const kvo_jv *items;
        const uint64_t *ints;
        const kvo_jmember *members;
    } v;
};

struct kvo_jmember {
    const char *key; /* NUL-terminated */
    kvo_jv value;
};

typedef struct kvo_json_limits {
    uint32_t max_depth; /* containers inside containers; 0 = 64, <= 1024 */
    size_t max_mem;     /* bytes of tree and stacks; 0 = 16 * len + 64 KiB */
} kvo_json_limits;

typedef struct kvo_json {
    const kvo_jv *root; /* after a successful parse; NULL otherwise */
    kvo_arena arena;
    size_t mem; /* bytes the last parse used at its peak */
} kvo_json;

void kvo_json_init(kvo_json *d);
void kvo_json_fini(kvo_json *d);
/* Parse text[0, len) into d (whatever d held before is released).
 * KVO_EPROTO (malformed, with the byte offset), KVO_ETRUNC (ends early),
 * KVO_ETOOBIG (depth or memory budget), KVO_ENOMEM. lim NULL = defaults. */
kvo_status kvo_json_parse(kvo_json *d, const void *text, size_t len,
                          const kvo_json_limits *lim, kvo_err *err);

/* ---- Reading ------------------------------------------------------------
 * Lookups take NULL and answer NULL/false, so chains need no checks in
 * between: kvo_json_get(kvo_json_get(root, "a"), "b"). */
static inline bool kvo_json_is(const kvo_jv *v, kvo_jtype t) {
    return v && v->type == t;
}
/* Member of an object, or NULL (absent, or v not an object). */
const kvo_jv *kvo_json_get(const kvo_jv *obj, const char *key);
/* Element i of an array, copied into *out (packed arrays have no nodes);
 * false when out of range or not an array. */
bool kvo_json_at(const kvo_jv *arr, size_t i, kvo_jv *out);
/* Scalars: false when the type or range does not fit. */
bool kvo_json_u64(const kvo_jv *v, uint64_t *out); /* int >= 0 */
bool kvo_json_i64(const kvo_jv *v, int64_t *out);  /* int in int64 */
bool kvo_json_u32(const kvo_jv *v, uint32_t *out); /* int in [0, 2^32) */
bool kvo_json_num(const kvo_jv *v, double *out);   /* int or real */
bool kvo_json_bool(const kvo_jv *v, bool *out);
/* The string (NUL-terminated; *len its bytes when len is not NULL), or
 * NULL when v is not a string. */
const char *kvo_json_str(const kvo_jv *v, size_t *len);
/* An array of integers >= 0, without copying: *out points into the tree.
 * KVO_EPROTO naming the first element that is not one (err->msg says
 * "[i]: ..."); an empty array is fine. */
kvo_status kvo_json_u64s(const kvo_jv *arr, const uint64_t **out, size_t *n,
                         kvo_err *err);
/* The same for integers in int64 (two's complement, no copy). */
kvo_status kvo_json_i64s(const kvo_jv *arr, const int64_t **out, size_t *n,
                         kvo_err *err);

#endif /* KVO_JSON_H */
