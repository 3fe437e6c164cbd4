/* check_trace.c -- the trace as kvo-check sees it: the Mooncake reader and
 * the prompt synthesis are kvo-mocker's (mock_trace_*), so both sides build
 * the very same prompts; this file only keeps the requests in memory with
 * 0-based line ids. */
#include "check_int.h"
#include "mock.h"

#include <string.h>

typedef struct trace_store {
    kvo_arena arena; /* hash ids of every request */
} trace_store;

kvo_status check_trace_load(check_trace *t, const char *path, uint64_t limit,
                            kvo_err *err) {
    memset(t, 0, sizeof(*t));
    trace_store *store = kvo_calloc(1, sizeof(*store));
    if (!store) return KVO_ENOMEM;
    kvo_arena_init(&store->arena);
    t->impl = store;
    mock_trace *mt = NULL;
    size_t cap = 0;
    kvo_status st = mock_trace_open(&mt, path);
    if (st != KVO_OK) {
        kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "cannot read trace %s: %s",
                    path, kvo_strerror(st));
        goto done;
    }
    while (limit == 0 || t->n < limit) {
        mock_trace_req req;
        char msg[sizeof(t->first_rejected)] = "";
        st = mock_trace_next(mt, &req, msg, sizeof(msg));
        if (st == KVO_EOF) {
            st = KVO_OK;
            break;
        }
        if (st == KVO_EPROTO || st == KVO_ETOOBIG) {
            /* counted by the reader; the caller logs the total */
            t->rejected = mock_trace_malformed(mt);
            if (t->rejected == 1)
                snprintf(t->first_rejected, sizeof(t->first_rejected), "%s",
                         msg);
            continue;
        }
        if (st != KVO_OK) {
            kvo_err_set(err, st, KVO_ERR_NO_OFFSET, "trace %s: %s", path,
                        kvo_strerror(st));
            goto done;
        }
        if ((st = kvo_grow(&t->reqs, &cap, t->n + 1, sizeof(*t->reqs), 1024)) !=
            KVO_OK)
            goto done;
        uint64_t *ids = kvo_arena_memdup(&store->arena, req.hash_ids,
                                         req.n_hash_ids * sizeof(uint64_t));
        if (!ids && req.n_hash_ids) {
            st = KVO_ENOMEM;
            goto done;
        }
        check_request *r = &t->reqs[t->n++];
        r->line = req.line - 1;
        r->timestamp_ms = req.timestamp_ms;
        r->input_length = req.input_length;
        r->output_length = req.output_length;
        r->n_hash_ids = req.n_hash_ids;
        r->hash_ids = ids;
    }
    t->rejected = mock_trace_malformed(mt);
done:
    mock_trace_free(mt);
    if (st != KVO_OK) check_trace_fini(t);
    return st;
}

void check_trace_fini(check_trace *t) {
    trace_store *store = t->impl;
    if (store) {
        kvo_arena_fini(&store->arena);
        kvo_free(store);
    }
    kvo_free(t->reqs);
    memset(t, 0, sizeof(*t));
}

kvo_status check_request_tokens(const check_request *r, kvo_buf *tokens) {
    kvo_buf_reset(tokens);
    kvo_status st =
        kvo_buf_reserve(tokens, (size_t)r->input_length * sizeof(uint64_t));
    if (st != KVO_OK) return st;
    mock_trace_tokens(r->hash_ids, r->n_hash_ids, r->input_length,
                      (uint64_t *)tokens->data);
    tokens->len = (size_t)r->input_length * sizeof(uint64_t);
    return KVO_OK;
}
