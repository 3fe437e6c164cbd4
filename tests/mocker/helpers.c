/* helpers.c -- see mt.h. */
#include "mt.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zmq.h>

void mt_on_output(void *user, const mock_output *o) {
    mt_out *out = user;
    out->callbacks++;
    if (o->has_token && o->n_output <= 4096)
        out->tokens[o->n_output - 1] = o->token;
    out->n_output = o->n_output;
    out->cached = o->cached_tokens;
    if (o->finish != MOCK_FINISH_NONE) {
        out->finish = o->finish;
        out->n_blocks_at_finish = o->n_blocks;
    }
}

void mt_cfg(mock_cfg *c, uint32_t block_size, uint32_t num_gpu_blocks) {
    mock_cfg_default(c);
    c->block_size = block_size;
    c->num_gpu_blocks = num_gpu_blocks;
}

void mt_eng_init(mt_eng *m, const mock_cfg *c, uint32_t rank) {
    memset(m, 0, sizeof(*m));
    m->cfg = *c;
    ck_assert_int_eq(
        mock_hasher_new(&m->h, c->hash_algo, c->hash_seed, c->hash_memo_log2),
        KVO_OK);
    ck_assert_int_eq(mock_engine_new(&m->e, &m->cfg, rank, m->h), KVO_OK);
    ck_assert_int_eq(mock_render_new(&m->r, &m->cfg), KVO_OK);
    wire_batch_init(&m->last);
}

void mt_eng_start(mt_eng *m, uint32_t block_size, uint32_t num_gpu_blocks) {
    mock_cfg c;
    mt_cfg(&c, block_size, num_gpu_blocks);
    mt_eng_init(m, &c, 0);
}

void mt_eng_fini(mt_eng *m) {
    mock_engine_free(m->e);
    mock_render_free(m->r);
    mock_hasher_free(m->h);
    wire_batch_fini(&m->last);
}

mock_req_in mt_req(const uint64_t *tok, uint32_t n, uint32_t max_tokens,
                   mt_out *out) {
    return (mock_req_in){.tokens = tok,
                         .n_tokens = n,
                         .max_tokens = max_tokens,
                         .on_output = mt_on_output,
                         .user = out};
}

uint64_t mt_add(mt_eng *m, const uint64_t *tok, uint32_t n, uint32_t max_tokens,
                mt_out *out) {
    mock_req_in in = mt_req(tok, n, max_tokens, out);
    uint64_t id = 0;
    ck_assert_int_eq(mock_engine_add(m->e, &in, &id), KVO_OK);
    return id;
}

mock_engine_stats mt_stats(const mt_eng *m) {
    mock_engine_stats s;
    mock_engine_stats_get(m->e, &s);
    return s;
}

mock_block_info mt_block(const mt_eng *m, uint32_t id) {
    mock_block_info bi;
    ck_assert_int_eq(mock_engine_block(m->e, id, &bi), KVO_OK);
    return bi;
}

void mt_hash(mt_eng *m, const uint64_t *tok, uint32_t n_blocks,
             mock_hash *out) {
    ck_assert_int_eq(mock_hasher_blocks(m->h, tok, m->cfg.block_size, 0,
                                        n_blocks, NULL, NULL, NULL, NULL, out),
                     KVO_OK);
}

bool mt_step(mt_eng *m, mock_step *st) {
    mock_step local;
    if (!st) st = &local;
    ck_assert_int_eq(mock_engine_schedule(m->e, 1760000000.5, st), KVO_OK);
    m->last_set = false;
    m->last_ms = st->duration_ms;
    if (st->batch) {
        const kvo_buf *pay;
        uint32_t n;
        ck_assert_int_eq(mock_render_batch(m->r, st->batch, st->aux, &pay, &n),
                         KVO_OK);
        ck_assert_uint_eq(n, 1);
        kvo_err err;
        ck_assert_msg(wire_batch_decode(pay[0].data, pay[0].len, NULL, &m->last,
                                        &err) == KVO_OK,
                      "published batch does not decode: %s", err.msg);
        m->last_set = true;
    }
    mock_engine_complete(m->e);
    return m->last_set;
}

uint32_t mt_run(mt_eng *m, mt_batch_fn fn, void *ctx) {
    uint32_t steps = 0;
    while (mock_engine_has_work(m->e) || mock_engine_has_events(m->e)) {
        ck_assert_msg(steps < 1000000, "engine never goes idle");
        if (mt_step(m, NULL) && fn) fn(ctx, &m->last);
        steps++;
    }
    return steps;
}

uint64_t mt_add_run(mt_eng *m, const uint64_t *tok, uint32_t n,
                    uint32_t max_tokens, mt_out *out, mt_rec *rec) {
    uint64_t id = mt_add(m, tok, n, max_tokens, out);
    mt_run(m, rec ? mt_record : NULL, rec);
    return id;
}

static uint32_t set_slot(mt_set *s, uint64_t k) {
    uint32_t i = (uint32_t)(k * 0x9E3779B97F4A7C15ull >> 48) & (MT_SET_CAP - 1);
    while (s->used[i] && s->key[i] != k) i = (i + 1) & (MT_SET_CAP - 1);
    if (!s->used[i]) {
        s->used[i] = true;
        s->key[i] = k;
        s->count[i] = 0;
    }
    return i;
}

void mt_set_add(mt_set *s, uint64_t k, bool has_parent, uint64_t parent) {
    uint32_t i = set_slot(s, k);
    if (s->count[i]++ > 0) return;
    s->has_parent[i] = has_parent;
    s->parent[i] = parent;
    s->distinct++;
    s->digest += kvo_block_digest(k, has_parent, parent);
}

uint32_t mt_set_del(mt_set *s, uint64_t k) {
    uint32_t i = set_slot(s, k);
    ck_assert_msg(s->count[i] > 0, "removal of a hash the engine never stored");
    if (--s->count[i] > 0) return s->count[i];
    s->distinct--;
    s->digest -= kvo_block_digest(k, s->has_parent[i], s->parent[i]);
    return 0;
}

void mt_set_clear(mt_set *s) {
    memset(s->used, 0, sizeof(s->used));
    s->distinct = s->digest = 0;
}

void mt_iota(uint64_t *t, uint32_t n, uint64_t first) {
    for (uint32_t i = 0; i < n; i++) t[i] = first + i;
}

void *mt_zsock(void *ctx, int type, const char *ep, int rcvtimeo_ms,
               int rcvhwm) {
    void *s = zmq_socket(ctx, type);
    ck_assert_ptr_nonnull(s);
    int linger = 0;
    zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_setsockopt(s, ZMQ_RCVTIMEO, &rcvtimeo_ms, sizeof(rcvtimeo_ms));
    if (rcvhwm) zmq_setsockopt(s, ZMQ_RCVHWM, &rcvhwm, sizeof(rcvhwm));
    ck_assert_msg(zmq_connect(s, ep) == 0, "connect %s: %s", ep,
                  zmq_strerror(zmq_errno()));
    return s;
}

uint64_t mt_seq(const uint8_t *p, size_t n) {
    uint64_t s;
    ck_assert_int_eq(wire_seq_get(p, n, &s), KVO_OK);
    return s;
}

void mt_replay_request(void *dealer, uint64_t start) {
    uint8_t seqb[8];
    wire_seq_put(seqb, start);
    ck_assert_int_eq(zmq_send(dealer, "", 0, ZMQ_SNDMORE), 0);
    ck_assert_int_eq(zmq_send(dealer, seqb, 8, 0), 8);
}

int mt_recv_frames(void *s, uint8_t **fr, size_t *len, int max) {
    int n = 0;
    for (;;) {
        zmq_msg_t msg;
        zmq_msg_init(&msg);
        if (zmq_msg_recv(&msg, s, 0) < 0) {
            zmq_msg_close(&msg);
            for (int i = 0; i < n && i < max; i++) kvo_free(fr[i]);
            return -1;
        }
        if (n < max) {
            len[n] = zmq_msg_size(&msg);
            fr[n] = kvo_malloc(len[n] + 1);
            memcpy(fr[n], zmq_msg_data(&msg), len[n]);
        }
        n++;
        bool more = zmq_msg_more(&msg);
        zmq_msg_close(&msg);
        if (!more) return n;
    }
}

int mt_raw_post(uint16_t port, const char *path, const char *extra_headers,
                const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    char req[1024];
    int n = snprintf(
        req, sizeof(req),
        "POST %s HTTP/1.1\r\nHost: x\r\n%s"
        "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
        path, extra_headers ? extra_headers : "", strlen(body), body);
    ck_assert(n > 0 && (size_t)n < sizeof(req));
    ck_assert_int_eq(write(fd, req, (size_t)n), n);
    return fd;
}

Suite *mt_suite(Suite *s, int timeout_s, const TTest *const *tests, size_t n) {
    TCase *tc = tcase_create("mocker");
    if (timeout_s > 0) tcase_set_timeout(tc, timeout_s);
    for (size_t i = 0; i < n; i++) tcase_add_test(tc, tests[i]);
    suite_add_tcase(s, tc);
    return s;
}

/* Kept out of line, in this file, on purpose: a GCC 12.2 wrong-code bug (not
 * UB -- clean under -O0 -fsanitize=address,undefined; correct with clang, -O1,
 * -fno-ivopts, or -fno-ipa-pure-const -fno-ipa-modref together; also with
 * -fno-strict-aliasing, which only changes ivopts' choice). When this
 * function sits static next to its callers (test_engine.c), ivopts rewrites
 * the stores r->type[r->n] ... as MEM[(T *)0B + off + (-3 * (sizetype)ctx) +
 * iv * 4] (the pointer folded into the index, base literal 0);
 * local-pure-const2 and modref2 then read those as NULL dereferences ("NULL
 * memory access; terminating BB"), find the function pure, and callers keep
 * r.n == 0 from `mt_rec r = {0}`. Standalone (gcc -O2 prints 0, expected 5):
 *
 *   #include <stdbool.h>
 *   #include <stdint.h>
 *   #include <stdio.h>
 *   #include <stdlib.h>
 *   typedef struct ev { uint32_t type, n_hashes; uint64_t *hashes;
 *                       uint32_t parent_kind; uint64_t parent_key;
 *                       char pad[264]; } ev;
 *   typedef struct batch { uint32_t n_events; ev *events; } batch;
 *   typedef struct rec { uint32_t n, type[256]; uint64_t key[256];
 *                        uint32_t nh[256]; uint64_t parent[256];
 *                        bool has_parent[256]; } rec;
 *   static void record(void *ctx, const batch *b) {
 *       rec *r = ctx;
 *       for (uint32_t i = 0; i < b->n_events && r->n < 256; i++) {
 *           const ev *e = &b->events[i];
 *           r->type[r->n] = e->type;
 *           r->nh[r->n] = e->n_hashes;
 *           r->key[r->n] = e->n_hashes ? e->hashes[0] : 0;
 *           r->has_parent[r->n] = e->parent_kind != 0;
 *           r->parent[r->n] = e->parent_key;
 *           r->n++;
 *       }
 *   }
 *   void (*volatile keep)(void *, const batch *) = record;
 *   int main(int argc, char **argv) {
 *       batch b = {(uint32_t)argc + 4, calloc(8, sizeof(ev))};
 *       rec r = {0};
 *       record(&r, &b);
 *       printf("recorded %u (expected %d)\n", r.n, argc + 4);
 *       return r.n != (uint32_t)argc + 4;
 *   }
 *
 * Across translation units (no LTO) the wrong "pure" never reaches a caller.
 * Audit of the whole tree (every file compiled at -O2 and -O3 with
 * -fdump-tree-local-pure-const2 -fdump-tree-modref2, grep "NULL memory
 * access"): this function is the only 0B-based store pattern. */
void mt_record(void *ctx, const wire_batch *b) {
    mt_rec *r = ctx;
    for (uint32_t i = 0; i < b->n_events && r->n < 256; i++) {
        const wire_event *e = &b->events[i];
        r->type[r->n] = e->type;
        r->nh[r->n] = e->n_hashes;
        r->key[r->n] = e->n_hashes ? e->hashes[0].key : 0;
        r->has_parent[r->n] = e->parent.kind != WIRE_HASH_NONE;
        r->parent[r->n] = e->parent.key;
        r->n++;
    }
}

uint16_t mt_mocker_spawn(kt_proc *p, const char *const args[]) {
    for (int attempt = 0;; attempt++) {
        uint16_t port;
        ck_assert_int_eq(kvo_free_port(&port), KVO_OK);
        char ps[16], url[64];
        snprintf(ps, sizeof(ps), "%u", port);
        const char *argv[48] = {"--port", ps};
        int n = 2;
        for (int i = 0; args && args[i] && n < 47; i++) argv[n++] = args[i];
        argv[n] = NULL;
        kt_proc_start(p, "kvo-mocker", argv);
        snprintf(url, sizeof(url), "http://127.0.0.1:%u/health", port);
        kvo_status st = kvo_wait_http(&p->proc, url, 15000);
        if (st == KVO_ESTATE && p->proc.exit_status == 2 && attempt < 4) {
            kt_guard_release(&p->guard); /* a lost port race: try again */
            continue;
        }
        kt_proc_wait_http(p, url, 15000); /* fails the test with the log */
        return port;
    }
}
