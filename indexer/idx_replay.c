/* idx_replay.c -- kvo-indexer replay EVENTS [QUERIES]: the index offline.
 *
 * EVENTS is a capture file (DESIGN §3). Its 2-frame records are NATS
 * messages (subject, body) and go through the same feed as the service
 * (dedup, gaps, tiers); other records (ZMQ messages) are counted and
 * skipped. QUERIES is JSON lines:
 *   {"apply": K}                          apply the next K records
 *   {"token_ids": [...], "lora_name"?, "cache_salt"?} or
 *   {"tokens_hashes": [...]}              print {"query": i, "isl_blocks",
 *                                         "scores"} (i counts from 0)
 * At the end the rest is applied and {"counters", "workers", "pairs"} is
 * printed. Blank lines are skipped; anything else is an input error.
 * Lines are read as the service reads request bodies (idx_request_parse:
 * strict JSON, exact integers, valid UTF-8); "wait" and "metrics" are
 * checked and ignored. The feed never forgets a publisher here (no clock).
 */
#include "idx_int.h"

#include <stdlib.h>
#include <string.h>

typedef struct replay {
    wire_cap_reader *cap;
    idx_feed *feed;
    uint64_t records, skipped;
    bool ended; /* no more records (end, or damage) */
    char damage[200];
} replay;

/* Apply up to k records (all when k is UINT64_MAX). */
static kvo_status apply_records(replay *r, uint64_t k) {
    for (uint64_t i = 0; i < k && !r->ended; i++) {
        wire_cap_record rec;
        kvo_err werr;
        kvo_status s = wire_cap_next(r->cap, &rec, &werr);
        if (s == KVO_EOF) {
            r->ended = true;
            break;
        }
        if (s != KVO_OK) {
            r->ended = true;
            kvo_err_str(&werr, r->damage, sizeof(r->damage));
            break;
        }
        r->records++;
        if (rec.n_frames != 2) {
            r->skipped++;
            continue;
        }
        s = idx_feed_message(r->feed, rec.frames[1].data, rec.frames[1].len,
                             NULL, NULL, NULL);
        if (s == KVO_ENOMEM) return s;
    }
    return KVO_OK;
}

static kvo_status print_json(FILE *out, json_object *j) {
    if (!j) return KVO_ENOMEM;
    const char *s = json_object_to_json_string_ext(j, JSON_C_TO_STRING_PLAIN);
    int rc = s ? fprintf(out, "%s\n", s) : -1;
    json_object_put(j);
    return rc < 0 ? KVO_EIO : KVO_OK;
}

static kvo_status print_query(FILE *out, uint64_t i, const idx_scores *sc) {
    json_object *o = json_object_new_object(), *sj = idx_json_scores(sc);
    json_object *isl, *scores;
    if (!o || !sj) {
        json_object_put(o);
        json_object_put(sj);
        return KVO_ENOMEM;
    }
    json_object_object_get_ex(sj, "isl_blocks", &isl);
    json_object_object_get_ex(sj, "scores", &scores);
    json_object_object_add(o, "query", json_object_new_uint64(i));
    json_object_object_add(o, "isl_blocks", json_object_get(isl));
    json_object_object_add(o, "scores", json_object_get(scores));
    json_object_put(sj);
    return print_json(out, o);
}

static kvo_status print_final(FILE *out, replay *r) {
    json_object *o = json_object_new_object();
    json_object *c = idx_json_counters(r->feed);
    json_object *w = idx_json_workers(idx_feed_tree(r->feed));
    if (!o || !c || !w) {
        json_object_put(o);
        json_object_put(c);
        json_object_put(w);
        return KVO_ENOMEM;
    }
    json_object_object_add(c, "records", json_object_new_uint64(r->records));
    json_object_object_add(c, "skipped_records",
                           json_object_new_uint64(r->skipped));
    if (r->damage[0])
        json_object_object_add(c, "capture_error",
                               json_object_new_string(r->damage));
    idx_stats st;
    idx_tree_stats(idx_feed_tree(r->feed), &st);
    json_object_object_add(o, "counters", c);
    json_object_object_add(o, "workers", w);
    json_object_object_add(o, "pairs", json_object_new_uint64(st.pairs));
    return print_json(out, o);
}

static bool blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
            return false;
    return true;
}

kvo_status idx_replay_run(const idx_replay_cfg *cfg, FILE *out, char *err,
                          size_t errsz) {
    replay r;
    memset(&r, 0, sizeof(r));
    if (errsz) err[0] = '\0';
    FILE *qf = NULL;
    char *line = NULL;
    size_t linecap = 0;
    idx_scores sc;
    idx_scores_init(&sc);
    idx_request q;
    idx_request_init(&q);
    uint32_t bs = cfg->block_size ? cfg->block_size : IDX_BLOCK_SIZE_DEFAULT;
    kvo_status s = wire_cap_open(&r.cap, cfg->events, NULL);
    if (s != KVO_OK) {
        snprintf(err, errsz, "%s: %s", cfg->events,
                 s == KVO_EPROTO ? "not a capture file" : kvo_strerror(s));
        goto done;
    }
    if ((s = idx_feed_new(&r.feed, NULL)) != KVO_OK) {
        snprintf(err, errsz, "%s", kvo_strerror(s));
        goto done;
    }
    if (cfg->queries) {
        qf = fopen(cfg->queries, "r");
        if (!qf) {
            snprintf(err, errsz, "%s: cannot open", cfg->queries);
            s = KVO_EIO;
            goto done;
        }
        uint64_t lineno = 0, nq = 0;
        ssize_t len;
        while ((len = getline(&line, &linecap, qf)) >= 0) {
            lineno++;
            if (blank(line, (size_t)len)) continue;
            kvo_err qerr;
            s = idx_request_parse(
                &q, line, (size_t)len,
                IDX_REQ_TOKENS | IDX_REQ_HASHES | IDX_REQ_APPLY, &qerr);
            if (s != KVO_OK) {
                snprintf(err, errsz, "%s:%llu: %s", cfg->queries,
                         (unsigned long long)lineno, qerr.msg);
                goto done;
            }
            if (q.kind == IDX_REQ_APPLY) {
                s = apply_records(&r, q.apply);
            } else {
                s = idx_request_query(idx_feed_tree(r.feed), bs, &q, &sc);
                if (s == KVO_OK) s = print_query(out, nq++, &sc);
            }
            if (s != KVO_OK) {
                snprintf(err, errsz, "%s", kvo_strerror(s));
                goto done;
            }
        }
        if (ferror(qf)) {
            snprintf(err, errsz, "%s: read error", cfg->queries);
            s = KVO_EIO;
            goto done;
        }
    }
    if ((s = apply_records(&r, UINT64_MAX)) != KVO_OK ||
        (s = print_final(out, &r)) != KVO_OK) {
        snprintf(err, errsz, "%s", kvo_strerror(s));
        goto done;
    }
    fflush(out);
    if (r.damage[0]) {
        snprintf(err, errsz, "%s: damaged after %llu records: %s", cfg->events,
                 (unsigned long long)r.records, r.damage);
        s = KVO_EPROTO;
    }
done:
    free(line); /* getline's buffer comes from malloc */
    if (qf) fclose(qf);
    idx_scores_fini(&sc);
    idx_request_fini(&q);
    idx_feed_free(r.feed);
    wire_cap_free(r.cap);
    return s;
}
