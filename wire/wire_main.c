/* kvo-wire: the codec as a tool (DESIGN §3).
 *
 *   kvo-wire decode FILE|-                 payload -> normalized JSON view
 *   kvo-wire encode --format F [FILE|-]    JSON view -> payload bytes
 *   kvo-wire hash --algo A [--seed S] --block-size N [--lora NAME]
 *                 [--salt SALT] TOKEN...   one line per full block
 *   kvo-wire cat FILE                      capture records, decoded
 *
 * cat prints one JSON object per record: "record" (index), "offset",
 * "time" (UTC, ns), "unix_ns", "sizes" (frame lengths), "transport" and
 * then, for a ZMQ message (3 frames), "topic", "seq" and "batch" (the
 * decode view) or "end_of_replay"; for a NATS message (2 frames),
 * "subject" and "message" (wire_plane_to_json); or "error" when the record
 * does not decode (cat goes on; the exit code is then 1).
 *
 * Everything it does is in the library (wire_batch_*, wire_plane_*,
 * wire_cap_*, the hashes); this file reads input, prints, and maps statuses
 * to exit codes: 0 ok, 1 the input failed (one line on stderr naming what
 * and the byte offset), 2 usage. As a filter it stays quiet on stderr at
 * the default log level; --log-level info prints the version and the
 * effective configuration first.
 */
#include "wire.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage_text[] =
    "usage: kvo-wire COMMAND [options] [ARGS]\n"
    "\n"
    "Commands:\n"
    "  decode FILE|-            one KVEventBatch payload (the 3rd ZMQ frame)\n"
    "                           -> one JSON object (the normalized view)\n"
    "  encode --format F [FILE|-]  that JSON view -> payload bytes on stdout;\n"
    "                           F: map (default), map-next, array-v0.9.0,\n"
    "                           array-v0.9.1, array-v0.10.2, array-v0.14,\n"
    "                           array-late\n"
    "  hash --algo A [--seed S] --block-size N [--lora NAME] [--salt SALT]\n"
    "       TOKEN...            one line per full block; A: sha256,\n"
    "                           sha256_cbor, xxhash, xxhash_cbor print\n"
    "                           '<digest hex> <low64>', router prints\n"
    "                           '<tokens_hash>'; S = PYTHONHASHSEED (default "
    "0)\n"
    "  cat FILE                 every record of a capture (KVOCAP1) as one\n"
    "                           JSON line: time, frames, decoded batch or\n"
    "                           event-plane message, or the decode error\n"
    "\n"
    "Options:\n"
    "  --pretty                 indented JSON (decode, cat)\n"
    "  --reverse-keys           encode: map keys in reverse order\n"
    "  --max-bytes N --max-elems N --max-total N --max-depth N --max-str N\n"
    "                           decoder limits (decode, cat; defaults 64 MiB,\n"
    "                           1048576, 4194304, 32, 1 MiB)\n"
    "  --log-level L            error|warn|info|debug (default warn)\n"
    "  -h, --help               this text\n"
    "  -V, --version            print the version\n"
    "\n"
    "Every option also reads KVO_<NAME> from the environment.\n"
    "Exit: 0 ok, 1 the input failed (one line on stderr), 2 usage error.\n";

enum {
    OPT_FORMAT = 256,
    OPT_ALGO,
    OPT_SEED,
    OPT_BLOCK_SIZE,
    OPT_LORA,
    OPT_SALT,
    OPT_PRETTY,
    OPT_REVERSE,
    OPT_MAX_BYTES,
    OPT_MAX_ELEMS,
    OPT_MAX_TOTAL,
    OPT_MAX_DEPTH,
    OPT_MAX_STR,
    OPT_LOG_LEVEL
};

static const struct option options[] = {
    {"help", no_argument, NULL, 'h'},
    {"version", no_argument, NULL, 'V'},
    {"format", required_argument, NULL, OPT_FORMAT},
    {"algo", required_argument, NULL, OPT_ALGO},
    {"seed", required_argument, NULL, OPT_SEED},
    {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
    {"lora", required_argument, NULL, OPT_LORA},
    {"salt", required_argument, NULL, OPT_SALT},
    {"pretty", no_argument, NULL, OPT_PRETTY},
    {"reverse-keys", no_argument, NULL, OPT_REVERSE},
    {"max-bytes", required_argument, NULL, OPT_MAX_BYTES},
    {"max-elems", required_argument, NULL, OPT_MAX_ELEMS},
    {"max-total", required_argument, NULL, OPT_MAX_TOTAL},
    {"max-depth", required_argument, NULL, OPT_MAX_DEPTH},
    {"max-str", required_argument, NULL, OPT_MAX_STR},
    {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
    {NULL, 0, NULL, 0}};

typedef struct opts {
    const char *cmd;
    wire_format format;
    bool have_algo, router;
    wire_algo algo;
    const char *seed;
    uint32_t block_size;
    const char *lora, *salt;
    bool pretty, reverse, help, version;
    wire_limits lim;
    kvo_level level;
} opts;

static kvo_status bad_value(const char *opt, const char *arg) {
    fprintf(stderr, "kvo-wire: bad value for --%s: '%s'\n", opt,
            arg ? arg : "");
    return KVO_EINVAL;
}

static kvo_status set_opt(void *ctx, int code, const char *arg) {
    opts *o = ctx;
    uint64_t u;
    uint32_t u32;
    switch (code) {
    case 'h': o->help = true; return KVO_OK;
    case 'V': o->version = true; return KVO_OK;
    case OPT_FORMAT:
        return wire_format_parse(arg, &o->format) ? bad_value("format", arg)
                                                  : KVO_OK;
    case OPT_ALGO:
        o->have_algo = true;
        o->router = strcmp(arg, "router") == 0;
        if (o->router) return KVO_OK;
        return wire_algo_parse(arg, &o->algo) ? bad_value("algo", arg) : KVO_OK;
    case OPT_SEED: o->seed = arg; return KVO_OK;
    case OPT_BLOCK_SIZE:
        if (kvo_parse_u32(arg, &u32) || u32 == 0)
            return bad_value("block-size", arg);
        o->block_size = u32;
        return KVO_OK;
    case OPT_LORA: o->lora = arg; return KVO_OK;
    case OPT_SALT: o->salt = arg; return KVO_OK;
    case OPT_PRETTY: o->pretty = true; return KVO_OK;
    case OPT_REVERSE: o->reverse = true; return KVO_OK;
    case OPT_MAX_BYTES:
        if (kvo_parse_u64(arg, &u) || u == 0 || u > SIZE_MAX)
            return bad_value("max-bytes", arg);
        o->lim.max_bytes = (size_t)u;
        return KVO_OK;
    case OPT_MAX_ELEMS:
        if (kvo_parse_u32(arg, &u32)) return bad_value("max-elems", arg);
        o->lim.max_elems = u32;
        return KVO_OK;
    case OPT_MAX_TOTAL:
        if (kvo_parse_u64(arg, &u)) return bad_value("max-total", arg);
        o->lim.max_total = u;
        return KVO_OK;
    case OPT_MAX_DEPTH:
        if (kvo_parse_u32(arg, &u32)) return bad_value("max-depth", arg);
        o->lim.max_depth = u32;
        return KVO_OK;
    case OPT_MAX_STR:
        if (kvo_parse_u32(arg, &u32)) return bad_value("max-str", arg);
        o->lim.max_str = u32;
        return KVO_OK;
    case OPT_LOG_LEVEL:
        return kvo_log_level_parse(arg, &o->level) ? bad_value("log-level", arg)
                                                   : KVO_OK;
    default: return KVO_EINVAL;
    }
}

/* One line on stderr, "kvo-wire: <cmd>: <what>". */
static int fail(const opts *o, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int fail(const opts *o, int code, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "kvo-wire: %s: %s\n", o->cmd ? o->cmd : "", msg);
    return code;
}

/* Whole file (or stdin for "-"), at most max bytes. */
static kvo_status read_input(const char *path, size_t max, kvo_buf *out,
                             char *why, size_t whysz) {
    FILE *f = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!f) {
        snprintf(why, whysz, "cannot open %s: %s", path, strerror(errno));
        return KVO_EIO;
    }
    kvo_status st = KVO_OK;
    for (;;) {
        if ((st = kvo_buf_reserve(out, 65536)) != KVO_OK) {
            snprintf(why, whysz, "out of memory reading %s", path);
            break;
        }
        size_t n = fread(out->data + out->len, 1, 65536, f);
        out->len += n;
        if (out->len > max) {
            snprintf(why, whysz, "%s is larger than %zu bytes", path, max);
            st = KVO_ETOOBIG;
            break;
        }
        if (n == 0) {
            if (ferror(f)) {
                snprintf(why, whysz, "cannot read %s", path);
                st = KVO_EIO;
            }
            break;
        }
    }
    if (f != stdin) fclose(f);
    return st;
}

static int json_flags(const opts *o) {
    return (o->pretty ? JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_SPACED
                      : JSON_C_TO_STRING_PLAIN) |
           JSON_C_TO_STRING_NOSLASHESCAPE;
}

/* ---- decode
 * ----------------------------------------------------------------*/

static int cmd_decode(const opts *o, int argc, char **argv) {
    if (argc != 1) return fail(o, KVO_EXIT_USAGE, "expected one FILE or -");
    kvo_buf in;
    kvo_buf_init(&in);
    wire_batch b;
    wire_batch_init(&b);
    json_object *j = NULL;
    char why[600];
    int rc = KVO_EXIT_FAIL;
    if (read_input(argv[0], o->lim.max_bytes, &in, why, sizeof(why)) !=
        KVO_OK) {
        fail(o, rc, "%s", why);
        goto done;
    }
    kvo_err err;
    if (wire_batch_decode(in.data, in.len, &o->lim, &b, &err) != KVO_OK) {
        fail(o, rc, "%s", kvo_err_str(&err, why, sizeof(why)));
        goto done;
    }
    kvo_status st = wire_batch_to_json(&b, &j);
    if (st != KVO_OK) {
        fail(o, rc, "%s: no JSON view: %s", kvo_status_name(st),
             kvo_strerror(st));
        goto done;
    }
    printf("%s\n", json_object_to_json_string_ext(j, json_flags(o)));
    rc = fflush(stdout) == 0 ? KVO_EXIT_OK
                             : fail(o, KVO_EXIT_FAIL, "cannot write");
done:
    json_object_put(j);
    wire_batch_fini(&b);
    kvo_buf_fini(&in);
    return rc;
}

/* ---- encode
 * ----------------------------------------------------------------*/

static int cmd_encode(const opts *o, int argc, char **argv) {
    if (argc > 1)
        return fail(o, KVO_EXIT_USAGE, "expected at most one FILE or -");
    const char *path = argc ? argv[0] : "-";
    kvo_buf in, out;
    kvo_buf_init(&in);
    kvo_buf_init(&out);
    wire_batch b;
    wire_batch_init(&b);
    json_object *j = NULL;
    json_tokener *tok = json_tokener_new();
    char why[600];
    int rc = KVO_EXIT_FAIL;
    /* JSON is bigger than the msgpack it describes: allow 4x. */
    size_t max =
        o->lim.max_bytes > SIZE_MAX / 4 ? SIZE_MAX : o->lim.max_bytes * 4;
    if (!tok) {
        fail(o, rc, "out of memory");
        goto done;
    }
    if (read_input(path, max, &in, why, sizeof(why)) != KVO_OK) {
        fail(o, rc, "%s", why);
        goto done;
    }
    if (in.len > INT32_MAX) {
        fail(o, rc, "input too large for the JSON parser");
        goto done;
    }
    j = json_tokener_parse_ex(tok, (const char *)in.data, (int)in.len);
    enum json_tokener_error jerr = json_tokener_get_error(tok);
    if (jerr == json_tokener_continue) jerr = json_tokener_error_parse_eof;
    size_t end = json_tokener_get_parse_end(tok);
    if (jerr == json_tokener_success) { /* only whitespace may follow */
        while (end < in.len && strchr(" \t\r\n", in.data[end])) end++;
        if (end < in.len) {
            fail(o, rc,
                 "EPROTO at byte %zu: JSON: trailing data after the object",
                 end);
            goto done;
        }
    } else {
        fail(o, rc, "EPROTO at byte %zu: JSON: %s", end,
             json_tokener_error_desc(jerr));
        goto done;
    }
    kvo_err err;
    if (wire_batch_from_json(j, &b, &err) != KVO_OK) {
        fail(o, rc, "%s: %s", kvo_status_name(err.status), err.msg);
        goto done;
    }
    if (wire_batch_encode(&b, o->format, o->reverse ? WIRE_ENC_REVERSE_KEYS : 0,
                          &out) != KVO_OK) {
        fail(o, rc, "out of memory");
        goto done;
    }
    if (isatty(STDOUT_FILENO)) {
        rc = fail(o, KVO_EXIT_USAGE, "refusing to write binary to a terminal");
        goto done;
    }
    if (fwrite(out.data, 1, out.len, stdout) != out.len ||
        fflush(stdout) != 0) {
        fail(o, rc, "cannot write the output");
        goto done;
    }
    rc = KVO_EXIT_OK;
done:
    if (tok) json_tokener_free(tok);
    json_object_put(j);
    wire_batch_fini(&b);
    kvo_buf_fini(&in);
    kvo_buf_fini(&out);
    return rc;
}

/* ---- hash
 * ------------------------------------------------------------------*/

static int cmd_hash(const opts *o, int argc, char **argv) {
    if (!o->have_algo) return fail(o, KVO_EXIT_USAGE, "--algo is required");
    if (!o->block_size)
        return fail(o, KVO_EXIT_USAGE, "--block-size is required");
    if (argc > 1 << 24) return fail(o, KVO_EXIT_USAGE, "too many tokens");
    /* Tokens: one per argument, or several separated by commas. */
    size_t cap = (size_t)argc + 1;
    for (int i = 0; i < argc; i++)
        for (const char *p = argv[i]; *p; p++) cap += *p == ',';
    uint64_t *tokens = kvo_calloc(cap, sizeof(*tokens));
    uint64_t *hashes = kvo_calloc(cap / o->block_size + 1, sizeof(*hashes));
    kvo_buf scratch;
    kvo_buf_init(&scratch);
    int rc = KVO_EXIT_FAIL;
    size_t n = 0;
    if (!tokens || !hashes) {
        fail(o, rc, "out of memory");
        goto done;
    }
    for (int i = 0; i < argc; i++) {
        char *copy = kvo_strdup(argv[i]), *save = NULL;
        if (!copy) {
            fail(o, rc, "out of memory");
            goto done;
        }
        for (char *t = strtok_r(copy, ",", &save); t;
             t = strtok_r(NULL, ",", &save)) {
            if (kvo_parse_u64(t, &tokens[n]) != KVO_OK) {
                fail(o, KVO_EXIT_USAGE, "token '%s' is not an unsigned integer",
                     t);
                kvo_free(copy);
                rc = KVO_EXIT_USAGE;
                goto done;
            }
            n++;
        }
        kvo_free(copy);
    }
    size_t blocks = n / o->block_size;
    if (o->router) {
        uint64_t seed =
            wire_router_seed(o->lora, o->lora ? strlen(o->lora) : 0, o->salt,
                             o->salt ? strlen(o->salt) : 0);
        wire_router_hash_blocks(tokens, n, o->block_size, seed, hashes);
        for (size_t i = 0; i < blocks; i++) printf("%" PRIu64 "\n", hashes[i]);
    } else {
        wire_digest parent, d;
        const char *seed = o->seed ? o->seed : "0";
        if (wire_engine_root(o->algo, seed, &parent) != KVO_OK) {
            fail(o, rc, "cannot hash the seed");
            goto done;
        }
        for (size_t i = 0; i < blocks; i++) {
            /* The salt belongs to the first block of a prompt only. */
            wire_extra extra = {o->lora, i == 0 ? o->salt : NULL};
            bool any = extra.lora_name || extra.cache_salt;
            kvo_status st = wire_engine_block(
                o->algo, &parent, tokens + i * o->block_size, o->block_size,
                any ? &extra : NULL, &scratch, &d);
            if (st != KVO_OK) {
                fail(o, rc, "block %zu: %s", i, kvo_strerror(st));
                goto done;
            }
            for (unsigned k = 0; k < d.len; k++) printf("%02x", d.b[k]);
            printf(" %" PRIu64 "\n", wire_digest_low64(&d));
            parent = d;
        }
    }
    rc = fflush(stdout) == 0 ? KVO_EXIT_OK
                             : fail(o, KVO_EXIT_FAIL, "cannot write");
done:
    kvo_buf_fini(&scratch);
    kvo_free(tokens);
    kvo_free(hashes);
    return rc;
}

/* ---- cat
 * -------------------------------------------------------------------*/

static bool add(json_object *o, const char *key, json_object *v) {
    if (json_object_object_add(o, key, v) == 0) return true;
    json_object_put(v);
    return false;
}

static json_object *str_len(const uint8_t *p, size_t n) {
    return json_object_new_string_len((const char *)p,
                                      (int)(n > INT32_MAX ? INT32_MAX : n));
}

/* "2026-11-30T09:43:28.123456789Z" */
static json_object *time_json(uint64_t unix_ns) {
    time_t sec = (time_t)(unix_ns / 1000000000ull);
    struct tm tm;
    char s[64];
    if (!gmtime_r(&sec, &tm)) return json_object_new_string("?");
    size_t k = strftime(s, sizeof(s), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(s + k, sizeof(s) - k, ".%09" PRIu64 "Z",
             (uint64_t)(unix_ns % 1000000000u));
    return json_object_new_string(s);
}

/* A record that decoded but has no JSON view (a raw extra_keys value the
 * view's msgpack-c reader refuses, or out of memory) still says why. */
static bool view_failed(json_object *j, kvo_status st) {
    char why[96];
    snprintf(why, sizeof(why), "%s: no JSON view: %s", kvo_status_name(st),
             kvo_strerror(st));
    add(j, "error", json_object_new_string(why));
    return false;
}

/* Decode one record's frames into j; false = did not decode. */
static bool cat_record(const opts *o, const wire_cap_record *rec,
                       json_object *j, wire_batch *b, wire_plane_msg *m) {
    json_object *sizes = json_object_new_array();
    for (uint32_t i = 0; i < rec->n_frames; i++)
        json_object_array_add(sizes,
                              json_object_new_uint64(rec->frames[i].len));
    add(j, "sizes", sizes);
    kvo_err err;
    char why[600];
    json_object *view = NULL;
    if (rec->n_frames == 3) {
        /* ZMQ: [topic][seq u64 BE][payload] */
        add(j, "transport", json_object_new_string("zmq"));
        add(j, "topic", str_len(rec->frames[0].data, rec->frames[0].len));
        uint64_t seq;
        if (wire_seq_get(rec->frames[1].data, rec->frames[1].len, &seq) !=
            KVO_OK) {
            add(j, "error",
                json_object_new_string(
                    "EPROTO: the sequence frame is not 8 bytes"));
            return false;
        }
        add(j, "seq", json_object_new_uint64(seq));
        if (seq == WIRE_REPLAY_END && rec->frames[2].len == 0) {
            add(j, "end_of_replay", json_object_new_boolean(1));
            return true;
        }
        if (wire_batch_decode(rec->frames[2].data, rec->frames[2].len, &o->lim,
                              b, &err) != KVO_OK) {
            add(j, "error",
                json_object_new_string(kvo_err_str(&err, why, sizeof(why))));
            return false;
        }
        kvo_status st = wire_batch_to_json(b, &view);
        if (st != KVO_OK) return view_failed(j, st);
        add(j, "batch", view);
        return true;
    }
    if (rec->n_frames == 2) {
        /* NATS: [subject][body] */
        add(j, "transport", json_object_new_string("nats"));
        add(j, "subject", str_len(rec->frames[0].data, rec->frames[0].len));
        if (wire_plane_decode(rec->frames[1].data, rec->frames[1].len, &o->lim,
                              m, &err) != KVO_OK) {
            add(j, "error",
                json_object_new_string(kvo_err_str(&err, why, sizeof(why))));
            return false;
        }
        kvo_status st = wire_plane_to_json(m, &view);
        if (st != KVO_OK) return view_failed(j, st);
        add(j, "message", view);
        return true;
    }
    add(j, "transport", json_object_new_string("unknown"));
    add(j, "error",
        json_object_new_string(
            "EPROTO: neither a ZMQ message (3 frames) nor a NATS "
            "message (2 frames)"));
    return false;
}

static int cmd_cat(const opts *o, int argc, char **argv) {
    if (argc != 1) return fail(o, KVO_EXIT_USAGE, "expected one FILE");
    wire_cap_reader *r = NULL;
    kvo_status st = wire_cap_open(&r, argv[0], &o->lim);
    if (st != KVO_OK)
        return fail(o, KVO_EXIT_FAIL, "%s: %s", argv[0],
                    st == KVO_EPROTO ? "not a capture file (no KVOCAP1 magic)"
                                     : kvo_strerror(st));
    wire_batch b;
    wire_batch_init(&b);
    wire_plane_msg m;
    wire_plane_init(&m);
    uint64_t records = 0, bad = 0;
    int rc = KVO_EXIT_OK;
    for (;;) {
        wire_cap_record rec;
        kvo_err err;
        st = wire_cap_next(r, &rec, &err);
        if (st == KVO_EOF) break;
        if (st != KVO_OK) {
            char why[600];
            rc = fail(o, KVO_EXIT_FAIL, "%s: %s", argv[0],
                      kvo_err_str(&err, why, sizeof(why)));
            break;
        }
        json_object *j = json_object_new_object();
        if (!j) {
            rc = fail(o, KVO_EXIT_FAIL, "out of memory");
            break;
        }
        add(j, "record", json_object_new_uint64(records));
        add(j, "offset", json_object_new_uint64(rec.offset));
        add(j, "time", time_json(rec.unix_ns));
        add(j, "unix_ns", json_object_new_uint64(rec.unix_ns));
        if (!cat_record(o, &rec, j, &b, &m)) bad++;
        printf("%s\n", json_object_to_json_string_ext(j, json_flags(o)));
        json_object_put(j);
        records++;
    }
    if (rc == KVO_EXIT_OK && bad)
        rc = fail(o, KVO_EXIT_FAIL,
                  "%" PRIu64 " of %" PRIu64 " records did not decode", bad,
                  records);
    if (fflush(stdout) != 0) rc = fail(o, KVO_EXIT_FAIL, "cannot write");
    wire_plane_fini(&m);
    wire_batch_fini(&b);
    wire_cap_free(r);
    return rc;
}

/* ---- main
 * ------------------------------------------------------------------*/

int main(int argc, char **argv) {
    opts o = {.format = WIRE_FMT_MAP, .level = KVO_LOG_WARN};
    wire_limits_default(&o.lim);
    /* kvo-wire [--help|--version] COMMAND [options] ARGS */
    int cmd_at = 1;
    for (; cmd_at < argc && argv[cmd_at][0] == '-'; cmd_at++) {
        if (!strcmp(argv[cmd_at], "-h") || !strcmp(argv[cmd_at], "--help"))
            o.help = true;
        else if (!strcmp(argv[cmd_at], "-V") ||
                 !strcmp(argv[cmd_at], "--version"))
            o.version = true;
        else
            break;
    }
    if (o.help) {
        fputs(usage_text, stdout);
        return KVO_EXIT_OK;
    }
    if (o.version) {
        printf("kvo-wire %s\n", KVO_VERSION);
        return KVO_EXIT_OK;
    }
    if (cmd_at >= argc || argv[cmd_at][0] == '-') {
        fputs(usage_text, stderr);
        return KVO_EXIT_USAGE;
    }
    o.cmd = argv[cmd_at];
    int (*run)(const opts *, int, char **) = NULL;
    if (!strcmp(o.cmd, "decode"))
        run = cmd_decode;
    else if (!strcmp(o.cmd, "encode"))
        run = cmd_encode;
    else if (!strcmp(o.cmd, "hash"))
        run = cmd_hash;
    else if (!strcmp(o.cmd, "cat"))
        run = cmd_cat;
    if (!run) {
        fprintf(stderr,
                "kvo-wire: unknown command '%s' (decode, encode, hash, cat)\n",
                o.cmd);
        return KVO_EXIT_USAGE;
    }
    /* Options may come before or after the operands (the tokens of hash
     * are operands). kvo_getopt stops at the first operand, so move the
     * options (with their values) in front and parse once: the environment
     * fallbacks then apply exactly once, before the command line. */
    int sub_argc = argc - cmd_at;
    char **sub_argv = argv + cmd_at;
    char **args = kvo_calloc((size_t)sub_argc + 2, sizeof(char *));
    char **operands = kvo_calloc((size_t)sub_argc + 1, sizeof(char *));
    int n_args = 0, n_ops = 0, rc;
    if (!args || !operands) {
        fprintf(stderr, "kvo-wire: out of memory\n");
        rc = KVO_EXIT_FAIL;
        goto done;
    }
    args[n_args++] = sub_argv[0];
    for (int i = 1; i < sub_argc; i++) {
        const char *a = sub_argv[i];
        if (!strcmp(a, "--")) {
            while (++i < sub_argc) operands[n_ops++] = sub_argv[i];
            break;
        }
        if (a[0] != '-' || a[1] == '\0') { /* "-" is stdin, an operand */
            operands[n_ops++] = sub_argv[i];
            continue;
        }
        args[n_args++] = sub_argv[i];
        if (a[1] != '-' || strchr(a, '=')) continue;
        for (const struct option *op = options; op->name; op++)
            if (!strcmp(a + 2, op->name) && op->has_arg == required_argument &&
                i + 1 < sub_argc)
                args[n_args++] = sub_argv[++i];
    }
    if (kvo_getopt(n_args, args, options, set_opt, &o) != n_args) {
        rc = KVO_EXIT_USAGE; /* getopt or set_opt said why */
        goto done;
    }
    if (o.help) {
        fputs(usage_text, stdout);
        rc = KVO_EXIT_OK;
        goto done;
    }
    if (o.version) {
        printf("kvo-wire %s\n", KVO_VERSION);
        rc = KVO_EXIT_OK;
        goto done;
    }
    kvo_log_init("kvo-wire", o.level);
    kvo_info("kvo-wire %s: %s, format %s, limits bytes %zu elems %" PRIu32
             " total %" PRIu64 " depth %" PRIu32 " str %" PRIu32,
             KVO_VERSION, o.cmd, wire_format_name(o.format), o.lim.max_bytes,
             o.lim.max_elems, o.lim.max_total, o.lim.max_depth, o.lim.max_str);
    rc = run(&o, n_ops, operands);
done:
    kvo_free(args);
    kvo_free(operands);
    return rc;
}
