/* fuzz_plane.c -- libFuzzer target for the event-plane decoder
 * (wire_plane_decode: Dynamo envelope + RouterEvent payload).
 *
 * For every input: wire_plane_decode must return. When it decodes: the
 * JSON view builds, the message encodes, the encoding decodes again to the
 * same events, and encoding that gives the same bytes (abort otherwise).
 *
 * Built by tests/fuzz/CMakeLists.txt; replayed over the corpus and the
 * crash files by tests/wire/test_fuzz_replay.c (KVO_FUZZ_REPLAY).
 */
#include "wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_CHECK(c)                                                          \
    do {                                                                       \
        if (!(c)) {                                                            \
            fprintf(stderr, "fuzz_plane: check failed: %s (line %d)\n", #c,    \
                    __LINE__);                                                 \
            abort();                                                           \
        }                                                                      \
    } while (0)

int kvo_fuzz_plane(const uint8_t *data, size_t size);

static bool same_events(const wire_plane_msg *a, const wire_plane_msg *b) {
    if (a->n_events != b->n_events || a->publisher_id != b->publisher_id ||
        a->sequence != b->sequence || a->published_at != b->published_at)
        return false;
    for (uint32_t i = 0; i < a->n_events; i++) {
        const wire_revent *x = &a->events[i], *y = &b->events[i];
        if (x->type != y->type || x->worker_id != y->worker_id ||
            x->event_id != y->event_id || x->dp_rank != y->dp_rank ||
            x->tier != y->tier || x->n_blocks != y->n_blocks ||
            x->n_removed != y->n_removed || x->has_parent != y->has_parent ||
            (x->has_parent && x->parent_hash != y->parent_hash))
            return false;
        for (uint32_t k = 0; k < x->n_blocks; k++)
            if (x->blocks[k].block_hash != y->blocks[k].block_hash ||
                x->blocks[k].tokens_hash != y->blocks[k].tokens_hash)
                return false;
        for (uint32_t k = 0; k < x->n_removed; k++)
            if (x->removed[k] != y->removed[k]) return false;
    }
    return true;
}

int kvo_fuzz_plane(const uint8_t *data, size_t size) {
    wire_plane_msg m, d;
    wire_plane_init(&m);
    wire_plane_init(&d);
    kvo_buf out, again;
    kvo_buf_init(&out);
    kvo_buf_init(&again);
    kvo_err err;
    kvo_status st = wire_plane_decode(data, size, NULL, &m, &err);
    if (st != KVO_OK) {
        FUZZ_CHECK(err.status == st && err.offset <= size && m.n_events == 0);
        goto done;
    }
    json_object *j = NULL;
    FUZZ_CHECK(wire_plane_to_json(&m, &j) == KVO_OK);
    json_object_put(j);
    FUZZ_CHECK(wire_plane_encode(&m, &out) == KVO_OK);
    FUZZ_CHECK(wire_plane_decode(out.data, out.len, NULL, &d, NULL) == KVO_OK);
    FUZZ_CHECK(same_events(&m, &d));
    FUZZ_CHECK(wire_plane_encode(&d, &again) == KVO_OK);
    FUZZ_CHECK(again.len == out.len &&
               memcmp(again.data, out.data, out.len) == 0);
done:
    kvo_buf_fini(&out);
    kvo_buf_fini(&again);
    wire_plane_fini(&m);
    wire_plane_fini(&d);
    return 0;
}

#ifndef KVO_FUZZ_REPLAY
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return kvo_fuzz_plane(data, size);
}
#endif
