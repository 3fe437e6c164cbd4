/* wire_json.c -- the normalized JSON view of a KVEventBatch (DESIGN §3, the
 * "fields" of the wire vectors) and its inverse.
 *
 *   {"ts": float, "events": [...], "data_parallel_rank": int|null}
 *
 * data_parallel_rank is left out for a 2-element batch (vLLM 0.9.0 had no
 * rank). Each event carries "type" and every field its layout knows, absent
 * ones as null:
 *   map events    the vLLM map fields (block_hashes .. session_id for
 *                 BlockStored; block_hashes, medium, group_idx, locality,
 *                 ownership for BlockRemoved), plus cache_salt / origin when
 *                 set;
 *   array events  the positional fields the array's length covers (every
 *                 older layout is a prefix of the latest one);
 *   both          "metadata" when SGLang's metadata map was present.
 * Hashes are JSON integers as they were on the wire (unsigned, or negative)
 * or {"bin": "<hex>"} for byte strings. extra_keys and metadata are the
 * generic JSON of their msgpack value (bins as {"bin": hex}).
 *
 * json-c reads and writes unsigned 64-bit integers exactly
 * (json_object_new_uint64 / json_object_get_uint64), which hashes need.
 * Raw msgpack values go through msgpack-c both ways (unpack for the view,
 * packer for the inverse), after wire_precheck bounds them.
 */
#include "wire_int.h"

#include <inttypes.h>
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#define JSON_MAX_DEPTH 64

/* Field names as they appear in the view, in view order. */
static const char *const stored_fields[] = {"block_hashes",
                                            "parent_block_hash",
                                            "token_ids",
                                            "block_size",
                                            "lora_id",
                                            "medium",
                                            "lora_name",
                                            "extra_keys",
                                            "group_idx",
                                            "kv_cache_spec_kind",
                                            "kv_cache_spec_sliding_window",
                                            "locality",
                                            "ownership",
                                            "session_id"};
#define STORED_ARRAY_NAMES 11u /* array positions 1..11 */
static const char *const removed_fields[] = {
    "block_hashes", "medium", "group_idx", "locality", "ownership"};
#define REMOVED_ARRAY_NAMES 3u

/* ======================================================================== */
/* Batch -> JSON                                                             */
/* ======================================================================== */

static json_object *hex_obj(const char *key, const uint8_t *p, size_t n) {
    static const char digits[] = "0123456789abcdef";
    char *hex = kvo_malloc(2 * n + 1);
    if (!hex) return NULL;
    for (size_t i = 0; i < n; i++) {
        hex[2 * i] = digits[p[i] >> 4];
        hex[2 * i + 1] = digits[p[i] & 15];
    }
    hex[2 * n] = '\0';
    json_object *o = json_object_new_object();
    json_object *s = json_object_new_string_len(hex, (int)(2 * n));
    kvo_free(hex);
    if (!o || !s || json_object_object_add(o, key, s) != 0) {
        json_object_put(o);
        json_object_put(s);
        return NULL;
    }
    return o;
}

/* The JSON of a msgpack object (depth is bounded by the pre-check). */
static kvo_status mp_to_json(const msgpack_object *o, json_object **out) {
    json_object *j = NULL;
    /* clang-format off */
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: *out = NULL; return KVO_OK;
    case MSGPACK_OBJECT_BOOLEAN: j = json_object_new_boolean(o->via.boolean); break;
    case MSGPACK_OBJECT_POSITIVE_INTEGER: j = json_object_new_uint64(o->via.u64); break;
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: j = json_object_new_int64(o->via.i64); break;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: j = json_object_new_double(o->via.f64); break;
    case MSGPACK_OBJECT_STR: /* msgpack-c gives NULL for "" */
        j = json_object_new_string_len(o->via.str.ptr ? o->via.str.ptr : "",
                                       (int)o->via.str.size);
        break;
    case MSGPACK_OBJECT_BIN:
        j = hex_obj("bin", (const uint8_t *)o->via.bin.ptr, o->via.bin.size);
        break;
    case MSGPACK_OBJECT_EXT: {
        j = hex_obj("ext", (const uint8_t *)o->via.ext.ptr, o->via.ext.size);
        json_object *t = json_object_new_int(o->via.ext.type);
        if (!j || !t || json_object_object_add(j, "ext_type", t) != 0) {
            json_object_put(t);
            json_object_put(j);
            return KVO_ENOMEM;
        }
        break;
    }
    /* clang-format on */
    case MSGPACK_OBJECT_ARRAY:
        j = json_object_new_array_ext((int)o->via.array.size);
        if (!j) return KVO_ENOMEM;
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            json_object *e;
            if (mp_to_json(&o->via.array.ptr[i], &e) != KVO_OK ||
                json_object_array_add(j, e) != 0) {
                json_object_put(j);
                return KVO_ENOMEM;
            }
        }
        break;
    case MSGPACK_OBJECT_MAP:
        j = json_object_new_object();
        if (!j) return KVO_ENOMEM;
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            json_object *k = NULL, *v = NULL;
            char *key = NULL;
            if (kv->key.type == MSGPACK_OBJECT_STR) {
                const char *ks = kv->key.via.str.ptr;
                key = kvo_strndup(ks ? ks : "", kv->key.via.str.size);
            } else if (mp_to_json(&kv->key, &k) == KVO_OK) {
                /* JSON keys are strings: use the key's JSON text. */
                key = kvo_strdup(k ? json_object_to_json_string_ext(
                                         k, JSON_C_TO_STRING_PLAIN)
                                   : "null");
                json_object_put(k);
            }
            if (!key || mp_to_json(&kv->val, &v) != KVO_OK ||
                json_object_object_add(j, key, v) != 0) {
                kvo_free(key);
                json_object_put(v);
                json_object_put(j);
                return KVO_ENOMEM;
            }
            kvo_free(key);
        }
        break;
    default: return KVO_EPROTO;
    }
    if (!j) return KVO_ENOMEM;
    *out = j;
    return KVO_OK;
}

static kvo_status raw_to_json(wire_raw raw, json_object **out) {
    *out = NULL;
    if (!raw.p) return KVO_OK;
    /* A batch built by hand did not go through the decoder's pre-check. */
    if (wire_precheck(raw.p, raw.len, NULL, NULL, NULL) != KVO_OK)
        return KVO_EPROTO;
    msgpack_unpacked up;
    msgpack_unpacked_init(&up);
    size_t off = 0;
    kvo_status st = KVO_EPROTO;
    if (msgpack_unpack_next(&up, (const char *)raw.p, raw.len, &off) ==
        MSGPACK_UNPACK_SUCCESS)
        st = mp_to_json(&up.data, out);
    msgpack_unpacked_destroy(&up);
    return st;
}

static json_object *hash_json(const wire_hash *h) {
    /* clang-format off */
    switch (h->kind) {
    case WIRE_HASH_UINT: return json_object_new_uint64(h->key);
    case WIRE_HASH_INT: return json_object_new_int64((int64_t)h->key);
    case WIRE_HASH_BYTES: return hex_obj("bin", h->bytes, h->len);
    default: return NULL;
    }
    /* clang-format on */
}

static json_object *str_json(wire_str s) {
    return s.p ? json_object_new_string_len(s.p, (int)s.len) : NULL;
}

static json_object *int_json(wire_int v) {
    return v.set ? json_object_new_int64(v.v) : NULL;
}

/* The value of one named field; *out NULL = null. */
static kvo_status field_json(const wire_event *e, const char *name,
                             json_object **out) {
    json_object *j = NULL;
    *out = NULL;
    if (strcmp(name, "block_hashes") == 0) {
        j = json_object_new_array_ext((int)e->n_hashes);
        if (!j) return KVO_ENOMEM;
        for (uint32_t i = 0; i < e->n_hashes; i++) {
            json_object *h = hash_json(&e->hashes[i]);
            if (!h || json_object_array_add(j, h) != 0) {
                json_object_put(h);
                json_object_put(j);
                return KVO_ENOMEM;
            }
        }
    } else if (strcmp(name, "parent_block_hash") == 0) {
        if (e->parent.kind == WIRE_HASH_NONE) return KVO_OK;
        j = hash_json(&e->parent);
    } else if (strcmp(name, "token_ids") == 0) {
        j = json_object_new_array_ext((int)e->n_tokens);
        if (!j) return KVO_ENOMEM;
        for (uint32_t i = 0; i < e->n_tokens; i++) {
            json_object *t = json_object_new_uint64(e->token_ids[i]);
            if (!t || json_object_array_add(j, t) != 0) {
                json_object_put(t);
                json_object_put(j);
                return KVO_ENOMEM;
            }
        }
    } else if (strcmp(name, "block_size") == 0) {
        if (!e->block_size.set) return KVO_OK;
        j = int_json(e->block_size);
    } else if (strcmp(name, "lora_id") == 0) {
        if (!e->lora_id.set) return KVO_OK;
        j = int_json(e->lora_id);
    } else if (strcmp(name, "group_idx") == 0) {
        if (!e->group_idx.set) return KVO_OK;
        j = int_json(e->group_idx);
    } else if (strcmp(name, "kv_cache_spec_sliding_window") == 0) {
        if (!e->kv_cache_spec_sliding_window.set) return KVO_OK;
        j = int_json(e->kv_cache_spec_sliding_window);
    } else if (strcmp(name, "extra_keys") == 0) {
        return raw_to_json(e->extra_keys, out);
    } else if (strcmp(name, "metadata") == 0) {
        return raw_to_json(e->metadata, out);
    } else {
        const wire_str *s = NULL;
        if (strcmp(name, "medium") == 0)
            s = &e->medium;
        else if (strcmp(name, "lora_name") == 0)
            s = &e->lora_name;
        else if (strcmp(name, "kv_cache_spec_kind") == 0)
            s = &e->kv_cache_spec_kind;
        else if (strcmp(name, "locality") == 0)
            s = &e->locality;
        else if (strcmp(name, "ownership") == 0)
            s = &e->ownership;
        else if (strcmp(name, "session_id") == 0)
            s = &e->session_id;
        else if (strcmp(name, "cache_salt") == 0)
            s = &e->cache_salt;
        else if (strcmp(name, "origin") == 0)
            s = &e->origin;
        if (!s) return KVO_EINVAL;
        if (!s->p) return KVO_OK;
        j = str_json(*s);
    }
    if (!j) return KVO_ENOMEM;
    *out = j;
    return KVO_OK;
}

static kvo_status add_field(json_object *o, const wire_event *e,
                            const char *name) {
    json_object *v;
    kvo_status st = field_json(e, name, &v);
    if (st != KVO_OK) return st;
    if (json_object_object_add(o, name, v) != 0) {
        json_object_put(v);
        return KVO_ENOMEM;
    }
    return KVO_OK;
}

static kvo_status event_json(const wire_event *e, json_object **out) {
    if (e->type < WIRE_EV_STORED || e->type > WIRE_EV_CLEARED)
        return KVO_EINVAL;
    json_object *o = json_object_new_object();
    json_object *t = json_object_new_string(wire_ev_type_name(e->type));
    kvo_status st = KVO_ENOMEM;
    if (!o || !t || json_object_object_add(o, "type", t) != 0) {
        json_object_put(t);
        goto done;
    }
    const char *const *names = NULL;
    size_t n = 0;
    bool map = e->layout == WIRE_LAYOUT_MAP;
    uint32_t positions = e->array_len ? e->array_len - 1 : 0;
    if (e->type == WIRE_EV_STORED) {
        names = stored_fields;
        n = map ? KVO_ARRAY_LEN(stored_fields)
                : (positions < STORED_ARRAY_NAMES ? positions
                                                  : STORED_ARRAY_NAMES);
    } else if (e->type == WIRE_EV_REMOVED) {
        names = removed_fields;
        n = map ? KVO_ARRAY_LEN(removed_fields)
                : (positions < REMOVED_ARRAY_NAMES ? positions
                                                   : REMOVED_ARRAY_NAMES);
    }
    for (size_t i = 0; i < n; i++)
        if ((st = add_field(o, e, names[i])) != KVO_OK) goto done;
    if (e->type == WIRE_EV_STORED) {
        if (e->cache_salt.p && (st = add_field(o, e, "cache_salt")) != KVO_OK)
            goto done;
        if (e->origin.p && (st = add_field(o, e, "origin")) != KVO_OK)
            goto done;
        if (e->metadata.p && (st = add_field(o, e, "metadata")) != KVO_OK)
            goto done;
    }
    st = KVO_OK;
done:
    if (st == KVO_OK)
        *out = o;
    else
        json_object_put(o);
    return st;
}

kvo_status wire_batch_to_json(const wire_batch *b, json_object **out) {
    if (!b || !out || (b->n_events && !b->events)) return KVO_EINVAL;
    kvo_status st = KVO_ENOMEM;
    json_object *o = json_object_new_object();
    json_object *ts = json_object_new_double(b->ts);
    json_object *evs = json_object_new_array_ext((int)b->n_events);
    if (!o || !ts || json_object_object_add(o, "ts", ts) != 0) {
        json_object_put(ts);
        json_object_put(evs);
        goto done;
    }
    if (!evs || json_object_object_add(o, "events", evs) != 0) {
        json_object_put(evs);
        goto done;
    }
    for (uint32_t i = 0; i < b->n_events; i++) {
        json_object *e;
        if ((st = event_json(&b->events[i], &e)) != KVO_OK) goto done;
        if (json_object_array_add(evs, e) != 0) {
            json_object_put(e);
            st = KVO_ENOMEM;
            goto done;
        }
    }
    st = KVO_ENOMEM;
    if (b->batch_len != 2) {
        json_object *r = int_json(b->dp_rank);
        if ((b->dp_rank.set && !r) ||
            json_object_object_add(o, "data_parallel_rank", r) != 0) {
            json_object_put(r);
            goto done;
        }
    }
    st = KVO_OK;
done:
    if (st == KVO_OK)
        *out = o;
    else
        json_object_put(o);
    return st;
}

/* ======================================================================== */
/* JSON -> batch                                                             */
/* ======================================================================== */

typedef struct jdec {
    wire_batch *b;
    kvo_err *err;
    uint32_t ev;
    kvo_buf scratch; /* msgpack of raw values before they go to the arena */
} jdec;

static kvo_status jfail(jdec *d, const char *field, long idx,
                        const char *what) {
    char path[96] = "";
    if (field && idx >= 0)
        snprintf(path, sizeof(path), "events[%" PRIu32 "].%s[%ld]", d->ev,
                 field, idx);
    else if (field)
        snprintf(path, sizeof(path), "events[%" PRIu32 "].%s", d->ev, field);
    else
        snprintf(path, sizeof(path), "events[%" PRIu32 "]", d->ev);
    return kvo_err_set(d->err, KVO_EPROTO, 0, "%s: %s", path, what);
}

static kvo_status jnomem(jdec *d) {
    return kvo_err_set(d->err, KVO_ENOMEM, 0, "out of memory");
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* {"bin": "<hex>"} -> arena bytes: 1 = done, 0 = not a bin object,
 * -1 = out of memory. */
static int bin_of(jdec *d, json_object *j, const uint8_t **p, uint32_t *len) {
    json_object *h;
    if (!json_object_is_type(j, json_type_object) ||
        json_object_object_length(j) != 1 ||
        !json_object_object_get_ex(j, "bin", &h) ||
        !json_object_is_type(h, json_type_string))
        return 0;
    const char *s = json_object_get_string(h);
    size_t n = (size_t)json_object_get_string_len(h);
    if (n % 2 || n / 2 > UINT32_MAX) return 0;
    for (size_t i = 0; i < n; i++)
        if (hexval(s[i]) < 0) return 0;
    uint8_t *out = kvo_arena_alloc(&d->b->arena, n / 2 + 1);
    if (!out) return -1;
    for (size_t i = 0; i < n / 2; i++)
        out[i] = (uint8_t)(hexval(s[2 * i]) << 4 | hexval(s[2 * i + 1]));
    *p = out;
    *len = (uint32_t)(n / 2);
    return 1;
}

static bool int_of(json_object *j, bool *neg, uint64_t *v) {
    if (!json_object_is_type(j, json_type_int)) return false;
    int64_t s = json_object_get_int64(j);
    *neg = s < 0;
    *v = *neg ? (uint64_t)s : json_object_get_uint64(j);
    return true;
}

static kvo_status jhash(jdec *d, json_object *j, const char *field, long idx,
                        wire_hash *h) {
    memset(h, 0, sizeof(*h));
    bool neg;
    uint64_t v;
    if (int_of(j, &neg, &v)) {
        h->kind = neg ? WIRE_HASH_INT : WIRE_HASH_UINT;
        h->key = v;
        return KVO_OK;
    }
    const uint8_t *p;
    uint32_t n;
    int got = bin_of(d, j, &p, &n);
    if (got < 0) return jnomem(d);
    if (got == 0)
        return jfail(d, field, idx, "expected an integer or {\"bin\": hex}");
    h->kind = WIRE_HASH_BYTES;
    h->bytes = p;
    h->len = n;
    h->key = wire_be(p + (n > 8 ? n - 8 : 0), n > 8 ? 8 : n);
    return KVO_OK;
}

static kvo_status jstr(jdec *d, json_object *j, const char *field,
                       wire_str *out) {
    if (!j) return KVO_OK;
    if (!json_object_is_type(j, json_type_string))
        return jfail(d, field, -1, "expected a string or null");
    size_t n = (size_t)json_object_get_string_len(j);
    char *s = kvo_arena_alloc(&d->b->arena, n + 1);
    if (!s) return jnomem(d);
    memcpy(s, json_object_get_string(j), n);
    s[n] = '\0';
    out->p = s;
    out->len = (uint32_t)n;
    return KVO_OK;
}

static kvo_status jint(jdec *d, json_object *j, const char *field,
                       wire_int *out) {
    if (!j) return KVO_OK;
    bool neg;
    uint64_t v;
    if (!int_of(j, &neg, &v) || (!neg && v > (uint64_t)INT64_MAX))
        return jfail(d, field, -1, "expected a signed 64-bit integer or null");
    out->set = true;
    out->v = (int64_t)v;
    return KVO_OK;
}

static int buf_write(void *data, const char *p, size_t n) {
    return kvo_buf_append(data, p, n) == KVO_OK ? 0 : -1;
}

/* Generic JSON -> msgpack (the inverse of mp_to_json). */
static kvo_status pack_json(jdec *d, msgpack_packer *pk, json_object *j,
                            int depth) {
    if (depth > JSON_MAX_DEPTH) return KVO_ETOOBIG;
    int rc = 0;
    bool neg = false;
    uint64_t v = 0;
    const uint8_t *bp;
    uint32_t bn;
    switch (json_object_get_type(j)) {
    case json_type_null: rc = msgpack_pack_nil(pk); break;
    case json_type_boolean:
        rc = json_object_get_boolean(j) ? msgpack_pack_true(pk)
                                        : msgpack_pack_false(pk);
        break;
    case json_type_int:
        int_of(j, &neg, &v);
        rc = neg ? msgpack_pack_int64(pk, (int64_t)v)
                 : msgpack_pack_uint64(pk, v);
        break;
    case json_type_double:
        rc = msgpack_pack_double(pk, json_object_get_double(j));
        break;
    case json_type_string: {
        size_t n = (size_t)json_object_get_string_len(j);
        rc = msgpack_pack_str_with_body(pk, json_object_get_string(j), n);
        break;
    }
    case json_type_array: {
        size_t n = json_object_array_length(j);
        rc = msgpack_pack_array(pk, n);
        for (size_t i = 0; i < n && rc == 0; i++) {
            kvo_status st =
                pack_json(d, pk, json_object_array_get_idx(j, i), depth + 1);
            if (st != KVO_OK) return st;
        }
        break;
    }
    case json_type_object:
        switch (bin_of(d, j, &bp, &bn)) {
        case 1: rc = msgpack_pack_bin_with_body(pk, bp, bn); goto packed;
        case -1: return KVO_ENOMEM;
        default: break;
        }
        rc = msgpack_pack_map(pk, (size_t)json_object_object_length(j));
        json_object_object_foreach(j, key, val) {
            if (rc) break;
            rc = msgpack_pack_str_with_body(pk, key, strlen(key));
            if (rc) break;
            kvo_status st = pack_json(d, pk, val, depth + 1);
            if (st != KVO_OK) return st;
        }
        break;
    }
packed:
    return rc ? KVO_ENOMEM : KVO_OK;
}

static kvo_status jraw(jdec *d, json_object *j, const char *field,
                       wire_raw *out) {
    if (!j) return KVO_OK;
    kvo_buf_reset(&d->scratch);
    msgpack_packer pk;
    msgpack_packer_init(&pk, &d->scratch, buf_write);
    kvo_status st = pack_json(d, &pk, j, 0);
    if (st == KVO_ETOOBIG) return jfail(d, field, -1, "nested too deep");
    if (st != KVO_OK) return jnomem(d);
    uint8_t *p =
        kvo_arena_memdup(&d->b->arena, d->scratch.data, d->scratch.len);
    if (!p) return jnomem(d);
    out->p = p;
    out->len = (uint32_t)d->scratch.len;
    return KVO_OK;
}

static kvo_status jhashes(jdec *d, json_object *j, wire_event *e) {
    if (!json_object_is_type(j, json_type_array))
        return jfail(d, "block_hashes", -1, "expected an array");
    size_t n = json_object_array_length(j);
    wire_hash *hs = kvo_arena_alloc(&d->b->arena, n * sizeof(*hs));
    if (!hs) return jnomem(d);
    for (size_t i = 0; i < n; i++) {
        kvo_status st = jhash(d, json_object_array_get_idx(j, i),
                              "block_hashes", (long)i, &hs[i]);
        if (st != KVO_OK) return st;
    }
    e->hashes = hs;
    e->n_hashes = (uint32_t)n;
    return KVO_OK;
}

static kvo_status jtokens(jdec *d, json_object *j, wire_event *e) {
    if (!json_object_is_type(j, json_type_array))
        return jfail(d, "token_ids", -1, "expected an array");
    size_t n = json_object_array_length(j);
    uint64_t *t = kvo_arena_alloc(&d->b->arena, n * sizeof(*t));
    if (!t) return jnomem(d);
    for (size_t i = 0; i < n; i++) {
        bool neg;
        if (!int_of(json_object_array_get_idx(j, i), &neg, &t[i]) || neg)
            return jfail(d, "token_ids", (long)i,
                         "expected a non-negative integer");
    }
    e->token_ids = t;
    e->n_tokens = (uint32_t)n;
    return KVO_OK;
}

static bool is_known(const char *key) {
    static const char *const extra[] = {"type", "cache_salt", "origin",
                                        "metadata"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(stored_fields); i++)
        if (strcmp(key, stored_fields[i]) == 0) return true;
    for (size_t i = 0; i < KVO_ARRAY_LEN(extra); i++)
        if (strcmp(key, extra[i]) == 0) return true;
    return false;
}

static kvo_status jevent(jdec *d, json_object *j, wire_event *e) {
    memset(e, 0, sizeof(*e));
    e->layout = WIRE_LAYOUT_MAP;
    if (!json_object_is_type(j, json_type_object))
        return jfail(d, NULL, -1, "expected an object");
    json_object_object_foreach(j, key, val) {
        (void)val;
        if (!is_known(key)) {
            char msg[96];
            snprintf(msg, sizeof(msg), "unknown field \"%.40s\"", key);
            return jfail(d, NULL, -1, msg);
        }
    }
    json_object *t;
    const char *ts = NULL;
    if (json_object_object_get_ex(j, "type", &t) &&
        json_object_is_type(t, json_type_string))
        ts = json_object_get_string(t);
    for (int k = WIRE_EV_STORED; ts && k <= WIRE_EV_CLEARED; k++)
        if (strcmp(ts, wire_ev_type_name((wire_ev_type)k)) == 0)
            e->type = (wire_ev_type)k;
    if (!e->type)
        return jfail(d, "type", -1,
                     "expected \"BlockStored\", \"BlockRemoved\" or "
                     "\"AllBlocksCleared\"");
    if (e->type == WIRE_EV_CLEARED) return KVO_OK;
#define GET(name) json_object_object_get(j, name)
    kvo_status st;
    json_object *h;
    if (!json_object_object_get_ex(j, "block_hashes", &h))
        return jfail(d, NULL, -1, "missing block_hashes");
    if ((st = jhashes(d, h, e)) != KVO_OK) return st;
    if ((st = jstr(d, GET("medium"), "medium", &e->medium)) != KVO_OK ||
        (st = jint(d, GET("group_idx"), "group_idx", &e->group_idx)) !=
            KVO_OK ||
        (st = jstr(d, GET("locality"), "locality", &e->locality)) != KVO_OK ||
        (st = jstr(d, GET("ownership"), "ownership", &e->ownership)) != KVO_OK)
        return st;
    if (e->type == WIRE_EV_REMOVED) return KVO_OK;
    json_object *tok;
    if (!json_object_object_get_ex(j, "token_ids", &tok))
        return jfail(d, NULL, -1, "missing token_ids");
    if ((st = jtokens(d, tok, e)) != KVO_OK) return st;
    json_object *p = GET("parent_block_hash");
    if (p && (st = jhash(d, p, "parent_block_hash", -1, &e->parent)) != KVO_OK)
        return st;
    if ((st = jint(d, GET("block_size"), "block_size", &e->block_size)) !=
            KVO_OK ||
        (st = jint(d, GET("lora_id"), "lora_id", &e->lora_id)) != KVO_OK ||
        (st = jstr(d, GET("lora_name"), "lora_name", &e->lora_name)) !=
            KVO_OK ||
        (st = jraw(d, GET("extra_keys"), "extra_keys", &e->extra_keys)) !=
            KVO_OK ||
        (st = jstr(d, GET("kv_cache_spec_kind"), "kv_cache_spec_kind",
                   &e->kv_cache_spec_kind)) != KVO_OK ||
        (st = jint(d, GET("kv_cache_spec_sliding_window"),
                   "kv_cache_spec_sliding_window",
                   &e->kv_cache_spec_sliding_window)) != KVO_OK ||
        (st = jstr(d, GET("session_id"), "session_id", &e->session_id)) !=
            KVO_OK ||
        (st = jstr(d, GET("cache_salt"), "cache_salt", &e->cache_salt)) !=
            KVO_OK ||
        (st = jstr(d, GET("origin"), "origin", &e->origin)) != KVO_OK ||
        (st = jraw(d, GET("metadata"), "metadata", &e->metadata)) != KVO_OK)
        return st;
#undef GET
    return KVO_OK;
}

kvo_status wire_batch_from_json(json_object *j, wire_batch *b, kvo_err *err) {
    if (!b) return KVO_EINVAL;
    wire_batch_reset(b);
    jdec d = {.b = b, .err = err};
    kvo_buf_init(&d.scratch);
    kvo_status st;
    json_object *ts, *evs, *rank;
    if (!json_object_is_type(j, json_type_object)) {
        st = kvo_err_set(err, KVO_EPROTO, 0, "batch: expected a JSON object");
        goto done;
    }
    if (!json_object_object_get_ex(j, "ts", &ts) ||
        !(json_object_is_type(ts, json_type_double) ||
          json_object_is_type(ts, json_type_int))) {
        st = kvo_err_set(err, KVO_EPROTO, 0, "ts: expected a number");
        goto done;
    }
    b->ts = json_object_get_double(ts);
    if (!json_object_object_get_ex(j, "events", &evs) ||
        !json_object_is_type(evs, json_type_array)) {
        st = kvo_err_set(err, KVO_EPROTO, 0, "events: expected an array");
        goto done;
    }
    b->batch_len = 2;
    if (json_object_object_get_ex(j, "data_parallel_rank", &rank)) {
        b->batch_len = 3;
        bool neg;
        uint64_t v;
        if (rank &&
            (!int_of(rank, &neg, &v) || (!neg && v > (uint64_t)INT64_MAX))) {
            st = kvo_err_set(err, KVO_EPROTO, 0,
                             "data_parallel_rank: expected an integer or null");
            goto done;
        }
        if (rank) {
            b->dp_rank.set = true;
            b->dp_rank.v = (int64_t)v;
        }
    }
    size_t n = json_object_array_length(evs);
    if (n > UINT32_MAX) {
        st = kvo_err_set(err, KVO_ETOOBIG, 0, "events: too many");
        goto done;
    }
    wire_event *ev = kvo_arena_alloc(&b->arena, n * sizeof(*ev));
    if (!ev) {
        st = jnomem(&d);
        goto done;
    }
    for (d.ev = 0; d.ev < n; d.ev++) {
        st = jevent(&d, json_object_array_get_idx(evs, d.ev), &ev[d.ev]);
        if (st != KVO_OK) goto done;
    }
    b->events = ev;
    b->n_events = (uint32_t)n;
    st = KVO_OK;
done:
    kvo_buf_fini(&d.scratch);
    if (st != KVO_OK) wire_batch_reset(b);
    return st;
}
