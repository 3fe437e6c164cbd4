/* fuzz_batch.c -- libFuzzer target for the vLLM batch decoder.
 *
 * For every input: wire_batch_decode must return (ASan/UBSan watch it).
 * When the input decodes, these must hold (abort otherwise):
 *   - every encoder format encodes it, and that encoding decodes again to
 *     the same ts, rank, event types, hash keys and token ids;
 *   - the map encoding is a fixed point: decode + encode gives it back;
 *   - the JSON view converts back (wire_batch_from_json) to a batch whose
 *     map encoding has the same JSON view as the original's.
 *
 * Built by tests/fuzz/CMakeLists.txt (-DKVO_FUZZ=ON, CC=clang). The same
 * check runs in plain builds over the corpus and every crash file
 * (tests/wire/test_fuzz_replay.c includes this file with
 * KVO_FUZZ_REPLAY defined, which leaves out the libFuzzer entry point).
 */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(c)                                                          \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_batch: check failed: %s (line %d)\n", #c,    \
                    __LINE__);                                                 \
            abort();                                                           \
        }                                                                      \
    } while (0)

int kvo_fuzz_batch(const uint8_t *data, size_t size);

static bool same_content(const wire_batch *a, const wire_batch *b,
                         bool rank_kept) {
    if (a->n_events != b->n_events) return false;
    if (memcmp(&a->ts, &b->ts, sizeof(double)) != 0 && !(a->ts != a->ts))
        return false;
    if (rank_kept &&
        (a->dp_rank.set != b->dp_rank.set || a->dp_rank.v != b->dp_rank.v))
        return false;
    for (uint32_t i = 0; i < a->n_events; i++) {
        const wire_event *x = &a->events[i], *y = &b->events[i];
        if (x->type != y->type || x->n_hashes != y->n_hashes ||
            x->n_tokens != y->n_tokens || x->parent.key != y->parent.key ||
            x->parent.kind != y->parent.kind)
            return false;
        for (uint32_t k = 0; k < x->n_hashes; k++)
            if (x->hashes[k].key != y->hashes[k].key ||
                x->hashes[k].kind != y->hashes[k].kind)
                return false;
        if (x->n_tokens &&
            memcmp(x->token_ids, y->token_ids, x->n_tokens * sizeof(uint64_t)))
            return false;
    }
    return true;
}

/* JSON text of the view of b's map encoding (malloc'd). */
static char *map_view(const wire_batch *b) {
    kvo_buf out;
    kvo_buf_init(&out);
    wire_batch d;
    wire_batch_init(&d);
    json_object *j = NULL;
    FUZZ_CHECK(wire_batch_encode(b, WIRE_FMT_MAP, 0, &out) == KVO_OK);
    FUZZ_CHECK(wire_batch_decode(out.data, out.len, NULL, &d, NULL) == KVO_OK);
    FUZZ_CHECK(wire_batch_to_json(&d, &j) == KVO_OK);
    char *s = strdup(json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN));
    FUZZ_CHECK(s != NULL);
    json_object_put(j);
    wire_batch_fini(&d);
    kvo_buf_fini(&out);
    return s;
}

int kvo_fuzz_batch(const uint8_t *data, size_t size) {
    wire_batch b, d;
    wire_batch_init(&b);
    wire_batch_init(&d);
    kvo_buf out, again;
    kvo_buf_init(&out);
    kvo_buf_init(&again);
    kvo_err err;
    kvo_status st = wire_batch_decode(data, size, NULL, &b, &err);
    if (st != KVO_OK) {
        FUZZ_CHECK(err.status == st && err.offset <= size && b.n_events == 0);
        goto done;
    }
    for (int f = 0; f < WIRE_FMT_COUNT; f++) {
        kvo_buf_reset(&out);
        FUZZ_CHECK(wire_batch_encode(&b, (wire_format)f, 0, &out) == KVO_OK);
        FUZZ_CHECK(wire_batch_decode(out.data, out.len, NULL, &d, NULL) ==
                   KVO_OK);
        FUZZ_CHECK(same_content(&b, &d, f != WIRE_FMT_ARRAY_V0_9_0));
        if (f == WIRE_FMT_MAP) {
            kvo_buf_reset(&again);
            FUZZ_CHECK(wire_batch_encode(&d, WIRE_FMT_MAP, 0, &again) ==
                       KVO_OK);
            FUZZ_CHECK(again.len == out.len &&
                       memcmp(again.data, out.data, out.len) == 0);
        }
    }
    json_object *j = NULL;
    FUZZ_CHECK(wire_batch_to_json(&b, &j) == KVO_OK);
    FUZZ_CHECK(wire_batch_from_json(j, &d, &err) == KVO_OK);
    json_object_put(j);
    char *v1 = map_view(&b), *v2 = map_view(&d);
    FUZZ_CHECK(strcmp(v1, v2) == 0);
    free(v1);
    free(v2);
done:
    kvo_buf_fini(&out);
    kvo_buf_fini(&again);
    wire_batch_fini(&b);
    wire_batch_fini(&d);
    return 0;
}

#ifndef KVO_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return kvo_fuzz_batch(data, size);
}
#endif
